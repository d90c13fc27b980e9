"""Join or minis, judged in a simulated phone cache (``agoc compile --db DIR --joins a76``).

Which build of a subgraph the reformer split is better for a phone — the joined kernel, or its
mini-subgraphs one after another — is not a latency question on this host: its 2 MiB L2 and 32 MiB L3
hide the locality fusion buys (bench/RESULTS.md: joins faster here moved more data through a 512 KiB
L2). Without a phone it is a traffic question, and the phone-cache proxy (design §5, host/proxy.py)
answers it deterministically:

1. the model is built twice from the database's kept schedules, for ``host-avx2`` (valgrind rejects
   AVX-512) — every join joined, every join as its minis — and both builds are checked against
   onnxruntime;
2. each build runs once under callgrind in the geometry (the runner's timed call, after warm-up);
3. per join, the DRAM bytes per call of its joined kernel at the geometry's smallest shared cache are
   compared with those of its minis' kernels together: the side that moves fewer is built.

Measured in the whole model, each kernel finds the cache as the kernels before it left it, as it would
on the phone. Approximations, stated: a kernel the model calls at several places (the same mini
elsewhere, or two instances of one join) reads as the average of its calls; each side is measured
with every other join built the same way; a mini the lowering turns into a view (a reshape) moves 0.

A judgement is stored per geometry in the database (``traffic.json``), keyed like a latency pairing by
the recorded latencies of the join and its minis (toolchain/pairing.py): once either gets a new
schedule (a resumed session) the join is judged again; judgements still current are not re-measured.
"""

from __future__ import annotations

import datetime
import logging
import tempfile
from pathlib import Path
from typing import Callable

from toolchain.errors import AgocError

log = logging.getLogger(__name__)


class JudgeError(AgocError):
    """The joins cannot be judged (a build that differs from onnxruntime, a database without joins)."""


def pending_joins(db_dir: Path, geometry: str) -> list[str]:
    """The joins of ``db_dir`` whose joined kernel and minis all have verified schedules and whose
    judgement in ``geometry`` is missing or no longer current."""
    from toolchain import pairing, tuning

    db = tuning.TuneDB(db_dir)
    verified = db.verified
    judged = db.traffic.get(geometry, {}).get("joins", {})
    out = []
    for joined, minis in db.layout.get("minis", {}).items():
        by_latency = pairing.choose(joined, minis, verified)
        if by_latency.joined_ms is None or by_latency.minis_ms is None:
            continue  # only one side can be built with its schedules: nothing to judge
        if pairing.current_traffic(joined, minis, verified, judged) is None:
            out.append(joined)
    return out


def per_call_bytes(manifest_kernels, figures: dict, cache: str) -> dict[str, float]:
    """Simulated DRAM bytes per call (LL = ``cache``) of each tuning task a build's kernels were
    scheduled with: ``figures`` from :func:`host.proxy.measure` (per inference, all calls of a kernel)."""
    by_name = {k["name"]: k for k in figures["kernels"]}
    out: dict[str, float] = {}
    for k in manifest_kernels:
        task, seen = k.get("task"), by_name.get(k["name"])
        if task is None or seen is None:
            continue
        out[task] = out.get(task, 0.0) + seen["dram_bytes"][cache] / max(1, k["calls"])
    return out


def judge_joins(model, model_name: str, input_shapes: dict, db_dir: Path, geometry: str,
                work_dir: Path | None = None, on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    """Judge every pending join of ``db_dir`` (:func:`pending_joins`) in ``geometry`` (a name of
    :data:`host.proxy.GEOMETRIES`) and store the judgements in the database; returns that geometry's
    record: ``{"geometry", "cache", "target", "judged", "joins": {join: {"joined_bytes", "minis_bytes",
    "cache", "of"}}}``. The builds go to ``work_dir`` (default: a temporary directory)."""
    from host import proxy
    from host.devices import LocalDevice
    from toolchain import pairing, tuning
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target
    from toolchain.verify import verify_artifact

    geo = proxy.geometry(geometry)
    db = tuning.TuneDB(db_dir)
    session = db.session
    if session is None:
        raise JudgeError(f"{db_dir} is not a tuning database (no session.json); create one with `agoc tune`")
    settings = session["settings"]
    if settings.get("partition", "ago") != "ago" or not db.layout.get("minis"):
        raise JudgeError(f"{db_dir} has no joined subgraphs to judge (partition {settings.get('partition')}, "
                         "or tuned without the reformer)")
    record = db.traffic.get(geometry, {})
    pending = pending_joins(db_dir, geometry)
    if not pending:
        return record
    proxy.find_valgrind()  # before minutes of building: a clear message where valgrind is missing
    cache = geo.llc[0]  # the smallest shared cache: where a phone's DRAM traffic is largest
    spec = resolve_target("host-avx2", num_cores=session.get("target", {}).get("num-cores"),
                          layout=db.activation_layout)
    with tempfile.TemporaryDirectory(prefix="agoc-judge-") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        measured = {}
        for side in ("joined", "minis"):
            on_stage(f"building the model with every join {'joined' if side == 'joined' else 'as its minis'} "
                     f"for {spec.preset}")
            request = CompileRequest(model, model_name, spec, input_shapes, "ago", settings["threshold"],
                                     db=Path(db_dir), keep_inside=settings.get("keep_inside", 0), joins=side)
            artifact = compile_model(request, find_compiler(spec), root / side)
            on_stage(f"checking the {side} build against onnxruntime")
            report = verify_artifact(artifact, LocalDevice())
            if not report.passed:
                raise JudgeError(f"the build with every join {side} differs from onnxruntime "
                                 f"(max abs {max(o.max_abs for o in report.outputs):.3g}): nothing judged")
            on_stage(f"simulating the {side} build in {geo.name}'s caches (valgrind)")
            measured[side] = per_call_bytes(artifact.manifest.kernels, proxy.measure(artifact, geo), cache.label)
    verified, minis_of = db.verified, db.layout["minis"]
    lost = [j for j in pending if j not in measured["joined"]]
    if lost:  # the builds' kernels carry the task they were scheduled with: this is not expected
        raise JudgeError(f"{len(lost)} joined kernel(s) not found in the simulated build ({lost[0]}, ...): "
                         "nothing judged; rerun with --debug and report it")
    joins = dict(record.get("joins", {}))
    for joined in pending:
        minis = minis_of[joined]
        joins[joined] = {
            "joined_bytes": round(measured["joined"][joined]),
            "minis_bytes": round(sum(measured["minis"].get(m, 0.0) for m in minis)),
            "cache": cache.label,
            "of": pairing.pairing_key(joined, minis, verified),
        }
    record = {"geometry": geo.name, "cache": cache.label, "target": spec.preset,
              "judged": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "joins": joins}
    db.save_traffic(geometry, record)
    return record
