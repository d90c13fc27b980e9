"""Join or minis, judged by the whole model's simulated DRAM traffic in a phone's caches (valgrind): one
join flipped at a time, kept when it moves fewer bytes. Why and what it measured: docs/proxy.md.
``judge_joins`` only reads the database; ``keep_judgement`` (``python -m host.bench.judge``) writes it."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from toolchain.errors import AgocError

#: How the judgements were made (a database judged otherwise is judged again).
METHOD = "whole model, one join flipped at a time, kept when it moves fewer bytes"


class JudgeError(AgocError):
    """The joins cannot be judged (a build that differs from onnxruntime, a database without joins)."""


def judgeable_joins(db_dir: Path) -> dict[str, list[str]]:
    """The joins of ``db_dir`` whose joined kernel and minis all have verified schedules, with their minis."""
    from toolchain.tune import TuneDB, choose

    db = TuneDB(db_dir)
    verified = db.verified
    out = {}
    for joined, minis in db.layout.get("minis", {}).items():
        by_latency = choose(joined, minis, verified)
        if by_latency.joined_ms is not None and by_latency.minis_ms is not None:
            out[joined] = minis  # else only one side can be built with its schedules: nothing to judge
    return out


def pending_joins(db_dir: Path, geometry: str) -> list[str]:
    """The joins to judge in ``geometry``: every judgeable one when any lacks a current judgement (a
    judgement is a whole-model total: it depends on every kernel), else none."""
    from toolchain.tune import TuneDB, current_traffic

    db = TuneDB(db_dir)
    record = db.traffic.get(geometry, {})
    verified, judged = db.verified, record.get("joins", {})
    joins = judgeable_joins(db_dir)
    stale = [j for j, minis in joins.items() if current_traffic(j, minis, verified, judged) is None]
    return list(joins) if stale or (joins and record.get("method") != METHOD) else []


def current_judgement(db_dir: Path, geometry: str) -> dict | None:
    """The judgement ``db_dir`` keeps for ``geometry`` when it is current (:func:`pending_joins` empty), else None."""
    from toolchain.tune import TuneDB

    return None if pending_joins(db_dir, geometry) else TuneDB(db_dir).traffic.get(geometry, {})


def judge_joins(model, model_name: str, input_shapes: dict, db_dir: Path, geometry: str,
                work_dir: Path | None = None, on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    """The judgement of ``db_dir``'s joins in ``geometry`` (a name of :data:`host.bench.proxy.GEOMETRIES`): the
    one the database keeps when current, else made now and returned, not written (:func:`keep_judgement`
    writes it): ``{"geometry", "method", "cache", "target", "judged", "baseline_bytes", "final_bytes", "joins":
    {join: {"joined_bytes", "minis_bytes", "cache", "of"}}}`` — the bytes are the whole model's per inference
    with the join built that way (the joins judged before it as kept); ``final_bytes``: the build kept.
    The builds go to ``work_dir`` (default: a temporary directory)."""
    from host.bench import proxy
    from host.devices import LocalDevice
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target
    from toolchain.tune import TuneDB, choose, pairing_key
    from toolchain.verify import verify_artifact

    geo = proxy.geometry(geometry)
    db = TuneDB(db_dir)
    session = db.session
    if session is None:
        raise JudgeError(f"{db_dir} is not a tuning database (no session.json); create one with `agoc tune`")
    settings = db.settings
    if settings.partition.method != "ago" or not db.layout.get("minis"):
        raise JudgeError(f"{db_dir} has no joined subgraphs to judge (partition {settings.partition.method}, "
                         "or tuned without the reformer)")
    kept = current_judgement(db_dir, geometry)
    if kept is not None:
        return kept
    proxy.find_valgrind()  # before minutes of building: a clear message where valgrind is missing
    cache = geo.llc[0]  # the smallest shared cache: where a phone's DRAM traffic is largest
    one_cache = dataclasses.replace(geo, llc=(cache,))  # the L2 run comes with it; the larger LLCs are not needed
    spec = resolve_target("host-avx2", num_cores=session.get("target", {}).get("num-cores"),
                          layout=db.activation_layout, pad_channels=db.channel_padding, fast_math=db.fast_math)
    joins = judgeable_joins(db_dir)
    verified = db.verified
    baseline = {j: choose(j, minis, verified).build for j, minis in joins.items()}
    other = {"joined": "minis", "minis": "joined"}

    def model_bytes(builds: dict[str, str], what: str, root: Path) -> int:
        request = CompileRequest(model, model_name, spec, input_shapes, settings.partition, db=Path(db_dir),
                                 join_builds=tuple(builds.items()), untuned="plain")
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
            on_stage(f"build {i + 1} of {len(joins) + 1}: {joined} flipped, "
                     f"simulated in {geo.name}'s caches (valgrind)")
            trial = {**current, joined: other[current[joined]]}
            trial_bytes = model_bytes(trial, f"{joined} {trial[joined]}", root / f"flip-{i}")
            by_way = {current[joined]: current_bytes, trial[joined]: trial_bytes}
            judged[joined] = {"joined_bytes": by_way["joined"], "minis_bytes": by_way["minis"], "cache": cache.label,
                              "of": pairing_key(joined, minis, verified)}
            if trial_bytes < current_bytes:  # kept: the joins after it are judged with it flipped
                current, current_bytes = trial, trial_bytes
    record = {"geometry": geo.name, "method": METHOD, "cache": cache.label, "target": spec.preset,
              "baseline_bytes": baseline_bytes, "final_bytes": current_bytes,
              "judged": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "joins": judged}
    return record


def keep_judgement(model, model_name: str, input_shapes: dict, db_dir: Path, geometry: str,
                   work_dir: Path | None = None, on_stage: Callable[[str], None] = lambda stage: None) -> dict:
    """:func:`judge_joins`, the judgement written into the database (``traffic.json``) when it is new: the
    explicit step after which ``agoc compile --db DIR --joins GEOMETRY`` reads it instead of judging."""
    from toolchain.tune import TuneDB

    fresh = current_judgement(db_dir, geometry) is None
    record = judge_joins(model, model_name, input_shapes, db_dir, geometry, work_dir, on_stage)
    if fresh and record.get("joins"):
        TuneDB(db_dir).save_traffic(geometry, record)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m host.bench.judge --db DIR --geometry a76 MODEL``: judge the joins and keep the judgement."""
    from host.source import load_source

    parser = argparse.ArgumentParser(prog="python -m host.bench.judge", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the model the database was tuned for: zoo:NAME[@SHAPE] or an ONNX file")
    parser.add_argument("--db", type=Path, required=True, help="the tuning database")
    parser.add_argument("--geometry", default="a76", help="a cache geometry of host.bench.proxy (default a76)")
    args = parser.parse_args(argv)
    proto, label, _ = load_source(args.model, [])
    record = keep_judgement(proto, label, {}, args.db, args.geometry, on_stage=print)
    print(f"{len(record.get('joins', {}))} join(s) judged in {args.geometry}: {record.get('baseline_bytes')} → "
          f"{record.get('final_bytes')} DRAM bytes per inference, kept in {args.db}/traffic.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
