"""A record library's cost model: trained on every measured record it keeps and saved in it as ``cost_model.ubj``
(toolchain/tune/costmodel.py), with how well it ranks a kernel it has not seen — each of the largest workloads
left out in turn (``python -m host.bench.costmodel_fit LIBRARY_DIR [--folds 8]``)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

#: the model's file in a library directory (``Library.cost_model`` finds ``cost_model.*``)
MODEL_NAME = "cost_model.ubj"


def library_spec(library):
    """A target spec for the library's target (what the features are extracted for)."""
    from toolchain.targets import TargetSpec

    return TargetSpec(preset="library", tvm_target=dict(library.target), linker="", runs_on_host=False,
                      layout=library.layout)


def leave_one_out(groups: dict, spec, folds: int) -> list[dict]:
    """For each of the ``folds`` workloads with the most samples: a model trained on all the others ranks its
    schedules (:func:`toolchain.tune.costmodel.ranking_accuracy`; 0.5 is chance)."""
    from toolchain.tune import costmodel

    rows = []
    largest = sorted(groups, key=lambda k: -len(groups[k][1]))[:folds]
    for key in largest:
        mod, traces, secs = groups[key]
        if len(traces) < 4:
            continue
        others = [(m, t, s) for k, (m, ts, ss) in groups.items() if k != key for t, s in zip(ts, ss)]
        model = costmodel.train(others, spec)
        scores = costmodel.scores(model, mod, traces, spec)
        kept = [i for i, s in enumerate(scores) if s is not None]
        accuracy = costmodel.ranking_accuracy([scores[i] for i in kept], [secs[i] for i in kept])
        rows.append({"workload": key, "samples": len(kept), "accuracy": round(accuracy, 3)})
        print(f"  held out {key}: {len(kept)} schedules, ranking accuracy {accuracy:.3f}", flush=True)
    return rows


def fit(library_dir: Path, folds: int) -> dict:
    """Train and save the library's cost model; the leave-one-out report."""
    from toolchain.tune import costmodel
    from toolchain.tune.library import Library

    library = Library.load(library_dir)
    spec = library_spec(library)
    groups = costmodel.by_workload(library.samples())
    report = {"library": str(library_dir), "workloads": len(groups),
              "samples": sum(len(t) for _, t, _ in groups.values())}
    if folds and len(groups) > 1:
        rows = leave_one_out(groups, spec, folds)
        report["leave_one_out"] = rows
        report["mean_accuracy"] = round(statistics.mean(r["accuracy"] for r in rows), 3) if rows else None
    begun = time.perf_counter()
    model = costmodel.train([(m, t, s) for m, ts, ss in groups.values() for t, s in zip(ts, ss)], spec)
    report["train_s"] = round(time.perf_counter() - begun, 1)
    report["model"] = str(costmodel.save(model, Path(library_dir) / MODEL_NAME))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("library", type=Path)
    p.add_argument("--folds", type=int, default=8, help="workloads left out in turn (0: none, just train)")
    args = p.parse_args(argv)
    report = fit(args.library, args.folds)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
