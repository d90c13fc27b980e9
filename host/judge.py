"""Join or minis, judged in a simulated phone cache (``agoc compile --db DIR --joins a76``).

Which build of a subgraph the reformer split is better for a phone — the joined kernel, or its
mini-subgraphs one after another — is not a latency question on this host: its 2 MiB L2 and 32 MiB L3
hide the locality fusion buys (bench/RESULTS.md: joins faster here moved more data through a 512 KiB
L2). Without a phone it is a traffic question, and the phone-cache proxy (design §5, host/proxy.py)
answers it deterministically, for the whole model:

1. the baseline: the model built from the database's kept schedules for ``host-avx2`` (valgrind
   rejects AVX-512), each join as the latency rule builds it (toolchain/tune/pairing.py);
2. then, join by join, a trial build: the current one with that join flipped (joined ↔ its minis),
   kept as the current build when it moves fewer bytes (greedy: each join is judged with the flips
   kept before it, so the build compile makes is the last one kept, and moves no more than the baseline);
3. every build checked against onnxruntime and run once under callgrind in the geometry (the runner's
   timed call, after warm-up): its DRAM bytes per inference at the geometry's smallest shared cache.

Why whole-model totals and not the kernels' own figures: callgrind charges a dirty line's write-back
to the kernel whose access evicts it, and a kernel's misses depend on what the kernels before it
left in the cache, so per-kernel bytes move between neighbours when one join changes (measured on
MobileNet-V2: per-kernel figures promised 0.73 MB less, the build moved 0.04 MB less). The total is
what the phone would move. Judging every join against the baseline and flipping the winners together
was tried first: on MnasNet-B1 with ``--keep-inside 256`` seven flips that each paid moved more
together (23.28 → 23.34 MB); hence the greedy order.

The judgements are stored per geometry in the database (``traffic.json``), keyed by the recorded
latencies of every join and mini judged (a pairing's key, toolchain/tune/pairing.py): totals depend on every
kernel, so once any of them gets a new schedule (a resumed session) all joins are judged again.
Cost: (joins + 1) builds and simulations — MnasNet-B1 @112, 14 joins: about 15 minutes on 2 cores.
"""

from __future__ import annotations

import dataclasses
import datetime
import tempfile
from pathlib import Path
from typing import Callable

from toolchain.errors import AgocError

#: How the judgements were made (a database judged otherwise is judged again).
METHOD = "whole model, one join flipped at a time, kept when it moves fewer bytes"


class JudgeError(AgocError):
    """The joins cannot be judged (a build that differs from onnxruntime, a database without joins)."""


def judgeable_joins(db_dir: Path) -> dict[str, list[str]]:
    """The joins of ``db_dir`` whose joined kernel and minis all have verified schedules, with their minis."""
    from toolchain.tune import pairing
    from toolchain.tune.db import TuneDB

    db = TuneDB(db_dir)
    verified = db.verified
    out = {}
    for joined, minis in db.layout.get("minis", {}).items():
        by_latency = pairing.choose(joined, minis, verified)
        if by_latency.joined_ms is not None and by_latency.minis_ms is not None:
            out[joined] = minis  # else only one side can be built with its schedules: nothing to judge
    return out


def pending_joins(db_dir: Path, geometry: str) -> list[str]:
    """The joins to judge in ``geometry``: every judgeable one when any lacks a current judgement (a
    judgement is a whole-model total: it depends on every kernel), else none."""
    from toolchain.tune import pairing
    from toolchain.tune.db import TuneDB

    db = TuneDB(db_dir)
    record = db.traffic.get(geometry, {})
    verified, judged = db.verified, record.get("joins", {})
    joins = judgeable_joins(db_dir)
    stale = [j for j, minis in joins.items() if pairing.current_traffic(j, minis, verified, judged) is None]
    return list(joins) if stale or (joins and record.get("method") != METHOD) else []


def judge_joins(model, model_name: str, input_shapes: dict, db_dir: Path, geometry: str,
                work_dir: Path | None = None, on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    """Judge the joins of ``db_dir`` in ``geometry`` (a name of :data:`host.proxy.GEOMETRIES`) when
    :func:`pending_joins` says so, and store the judgements in the database; returns that geometry's
    record: ``{"geometry", "method", "cache", "target", "judged", "baseline_bytes", "final_bytes", "joins":
    {join: {"joined_bytes", "minis_bytes", "cache", "of"}}}`` — the bytes are the whole model's per inference
    with the join built that way (the joins judged before it as kept); ``final_bytes``: the build kept.
    The builds go to ``work_dir`` (default: a temporary directory)."""
    from host import proxy
    from host.devices import LocalDevice
    from toolchain.tune import pairing
    from toolchain.tune.db import TuneDB
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target
    from toolchain.verify import verify_artifact

    geo = proxy.geometry(geometry)
    db = TuneDB(db_dir)
    session = db.session
    if session is None:
        raise JudgeError(f"{db_dir} is not a tuning database (no session.json); create one with `agoc tune`")
    settings = session["settings"]
    if settings.get("partition", "ago") != "ago" or not db.layout.get("minis"):
        raise JudgeError(f"{db_dir} has no joined subgraphs to judge (partition {settings.get('partition')}, "
                         "or tuned without the reformer)")
    if not pending_joins(db_dir, geometry):
        return db.traffic.get(geometry, {})
    proxy.find_valgrind()  # before minutes of building: a clear message where valgrind is missing
    cache = geo.llc[0]  # the smallest shared cache: where a phone's DRAM traffic is largest
    one_cache = dataclasses.replace(geo, llc=(cache,))  # the L2 run comes with it; the larger LLCs are not needed
    spec = resolve_target("host-avx2", num_cores=session.get("target", {}).get("num-cores"),
                          layout=db.activation_layout, pad_channels=db.channel_padding, fast_math=db.fast_math)
    joins = judgeable_joins(db_dir)
    verified = db.verified
    baseline = {j: pairing.choose(j, minis, verified).build for j, minis in joins.items()}
    other = {"joined": "minis", "minis": "joined"}

    def model_bytes(builds: dict[str, str], what: str, root: Path) -> int:
        request = CompileRequest(model, model_name, spec, input_shapes, "ago", settings["threshold"],
                                 db=Path(db_dir), keep_inside=settings.get("keep_inside", 0),
                                 join_builds=tuple(builds.items()))
        artifact = compile_model(request, find_compiler(spec), root)
        report = verify_artifact(artifact, LocalDevice())
        if not report.passed:
            raise JudgeError(f"the build with {what} differs from onnxruntime "
                             f"(max abs {max(o.max_abs for o in report.outputs):.3g}): nothing judged")
        return proxy.measure(artifact, one_cache)["model_figures"]["dram_bytes"][cache.label]

    judged = {}
    with tempfile.TemporaryDirectory(prefix="agoc-judge-") as tmp:
        root = Path(work_dir) if work_dir is not None else Path(tmp)
        on_stage(f"build 1 of {len(joins) + 1}: the baseline, simulated in {geo.name}'s caches (valgrind)")
        current, current_bytes = dict(baseline), model_bytes(baseline, "the baseline", root / "baseline")
        baseline_bytes = current_bytes
        for i, (joined, minis) in enumerate(joins.items(), start=1):
            on_stage(f"build {i + 1} of {len(joins) + 1}: {joined} flipped, simulated in {geo.name}'s caches (valgrind)")
            trial = {**current, joined: other[current[joined]]}
            trial_bytes = model_bytes(trial, f"{joined} {trial[joined]}", root / f"flip-{i}")
            by_way = {current[joined]: current_bytes, trial[joined]: trial_bytes}
            judged[joined] = {"joined_bytes": by_way["joined"], "minis_bytes": by_way["minis"], "cache": cache.label,
                              "of": pairing.pairing_key(joined, minis, verified)}
            if trial_bytes < current_bytes:  # kept: the joins after it are judged with it flipped
                current, current_bytes = trial, trial_bytes
    record = {"geometry": geo.name, "method": METHOD, "cache": cache.label, "target": spec.preset,
              "baseline_bytes": baseline_bytes, "final_bytes": current_bytes,
              "judged": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "joins": judged}
    db.save_traffic(geometry, record)
    return record
