"""MetaSchedule as TVM ships it, for `make bench-tuning`'s variant (a): TVM's ONNX frontend and FuseOps, `tune_relax`
with its defaults, each measured batch logged with its time; a build from the records a checkpoint had
(``python -m host.bench.stock_ms tune|build ...``, run in a process of its own)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

WORKLOADS, RECORDS, LOG = "database_workload.json", "database_tuning_record.json", "batches.jsonl"
#: the builder's per-candidate timeout: TVM's 30 s default is shorter than a fresh build worker's import of every
#: backend's tensor intrinsics on a 2-core host, so every candidate of the first batches timed out and nothing was
#: measured in 10 minutes (docs/tuning.md, Time to quality); the only default changed
BUILD_TIMEOUT_S = 120


def _module(model_path: Path, target, fused: bool = True):
    """The model as TVM's frontend imports it (weights as constants), prepared as TVM's
    ``static_shape_tuning_pipeline`` prepares it for tuning (its zero pipeline: legalized, FuseOps) — or, not
    ``fused``, only up to that pipeline: what ``compile_relax`` takes, since it runs the same passes itself and
    they do not leave an already fused module as it was (a conv kernel's function changes, so no tuning record
    matches it: every build of this variant was untuned but for the pools and concatenations)."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    passes = [relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings()]
    with target:
        return tvm.transform.Sequential(passes + ([relax.pipeline.zero_pipeline()] if fused else []))(
            from_onnx(onnx.load(str(model_path))))


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _logger(work: Path, started: float):
    """A measure callback appending one line per measured batch to ``work/batches.jsonl``: seconds since the
    start, task, weight, mean seconds of each candidate that ran, the records the database held then."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class BatchLog(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            task = task_scheduler.tasks_[task_id]
            secs = [statistics.fmean(float(s) for s in r.run_secs) if r.error_msg is None and r.run_secs else None
                    for r in runner_results]
            line = {"t": round(time.monotonic() - started, 3), "task": int(task_id), "name": str(task.ctx.task_name),
                    "weight": float(task.task_weight), "secs": secs, "records": _lines(work / RECORDS)}
            with open(work / LOG, "a") as f:
                f.write(json.dumps(line) + "\n")

    return BatchLog()


#: TVM's task scheduler: ``gradient`` (its default) joins no batch before every task has had one — MobileNet-V2 @112's
#: 33 tasks, about 45 minutes here — so a run stopped before then has no record at all; ``round-robin`` joins each
#: batch as the next starts: the same search, records as they come
SCHEDULERS = ("gradient", "round-robin")


def tune(model_path: Path, target: dict, work: Path, trials: int, scheduler: str = "gradient") -> None:
    """``tune_relax`` with TVM's defaults (but the builder's timeout, and ``scheduler``) into ``work`` until ``trials``
    (or until the parent stops this process)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    started = time.monotonic()
    callbacks = [*ms.measure_callback.MeasureCallback.create("default"), _logger(work, started)]
    target = tvm.target.Target(target)
    ms.relax_integration.tune_relax(_module(model_path, target), {}, target, str(work), trials,
                                    measure_callbacks=callbacks, task_scheduler=scheduler,
                                    builder=ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_S))


def batches(work: Path) -> list[dict]:
    """The batches logged so far (a line cut short by the stop is dropped)."""
    out = []
    try:
        text = (work / LOG).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def tasks(work: Path) -> int | None:
    """How many tasks the run tunes (one workload each, committed before the first batch); None before that."""
    return _lines(work / WORKLOADS) or None


def estimate_ms(logged: list[dict], until: float, tasks: int | None = None) -> float | None:
    """MetaSchedule's own estimate at ``until`` seconds: Σ weight × the task's fastest candidate so far; None while
    a task (of ``tasks``, when known) has none."""
    best: dict[int, tuple[float, float]] = {}
    for b in logged:
        if b["t"] > until:
            break
        ran = [s for s in b["secs"] if s is not None]
        if ran:
            fastest = min(ran)
            if b["task"] not in best or fastest < best[b["task"]][1]:
                best[b["task"]] = (b["weight"], fastest)
    if not best or (tasks is not None and len(best) < tasks):
        return None
    return 1e3 * sum(w * s for w, s in best.values())


def records_at(logged: list[dict], until: float) -> int:
    """How many records the database held after the last batch measured by ``until`` seconds."""
    return max((b["records"] for b in logged if b["t"] <= until), default=0)


def build(model_path: Path, target: dict, work: Path, records: int, out: Path) -> None:
    """The model built with the first ``records`` records of ``work``'s database (TVM's ``compile_relax``),
    exported to ``out``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    cut = out.parent / f"{out.stem}-db"
    cut.mkdir(parents=True, exist_ok=True)
    (cut / WORKLOADS).write_bytes((work / WORKLOADS).read_bytes() if (work / WORKLOADS).exists() else b"")
    kept = (work / RECORDS).read_text().splitlines()[:records] if (work / RECORDS).exists() else []
    (cut / RECORDS).write_text("".join(line + "\n" for line in kept))
    database = ms.database.JSONDatabase(str(cut / WORKLOADS), str(cut / RECORDS), allow_missing=False)
    target = tvm.target.Target(target)
    executable = ms.relax_integration.compile_relax(database, _module(model_path, target, fused=False), target, None)
    executable.export_library(str(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("tune", "build"))
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--target", required=True, help="the TVM target as JSON")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--trials", type=int, default=100_000)
    p.add_argument("--records", type=int, default=0)
    p.add_argument("--out", type=Path)
    p.add_argument("--scheduler", choices=SCHEDULERS, default="gradient")
    args = p.parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    if args.action == "tune":
        tune(args.model, json.loads(args.target), args.work, args.trials, args.scheduler)
    else:
        build(args.model, json.loads(args.target), args.work, args.records, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
