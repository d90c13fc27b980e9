"""`make bench-library`: leave one out. A zoo model tuned with a record library of the other models' databases
and without one (same seed and settings, separate processes), its estimated latency after each budget, to
JSON (``python -m host.bench.library_loo --model mnasnet --budgets 24,48``)."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path


def other_databases(dbs: Path, model: str) -> list[Path]:
    """The tuning databases in ``dbs`` (``make library``'s) of every model but ``model``."""
    return sorted(p for p in dbs.iterdir() if p.is_dir() and p.name != model and (p / "session.json").is_file())


def tune_words(args, db: Path, trials: int, library: Path | None) -> list[str]:
    return ["agoc", "tune", f"zoo:{args.model}@1x3x{args.shape}x{args.shape}", "--db", str(db), "--trials",
            str(trials), "--per-iter", str(args.per_iter), "--partition", args.partition, "--seed", str(args.seed),
            "--population", str(args.population),
            *(["--library", str(library)] if library is not None else ["--no-library"])]


def run_once(args, db: Path, trials: int, library: Path | None) -> dict:
    """Tune into ``db`` up to ``trials`` (resuming what it holds): trials spent, the estimate, the kernels
    verified (latency, calls), the kernels started from a seed, the seconds the run took."""

    words = tune_words(args, db, trials, library)
    print(f"  {shlex.join(words)}", flush=True)
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).with_name("agoc")), *words[1:]], check=False,
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"agoc tune failed (exit {done.returncode})")
    return point_of(db, trials, words, seconds)


def point_of(db: Path, trials: int, words: list[str], seconds: float) -> dict:
    """What a run left in ``db`` at budget ``trials`` (see :func:`run_once`)."""
    from toolchain import tune as tuning

    summary = tuning.status(db)
    progress = tuning.TuneDB(db).progress
    rows = summary["tasks"]
    point = {"budget": trials, "trials": summary["trials"], "estimate_ms": summary["estimate_ms"],
             "verified": sum(r["status"] == "verified" for r in rows), "tasks": len(rows),
             "seeded": sum(1 for p in progress.values() if p.get("seed_ms") is not None),
             "seconds": round(seconds, 1), "command": shlex.join(words),
             "kernels": {r["task"]: {"ms": r["best_ms"], "calls": r["calls"], "trials": r["trials"]}
                         for r in rows if r["status"] == "verified"}}
    print(f"    {point['trials']} trials: estimate {point['estimate_ms']:.3f} ms ({point['verified']}/{point['tasks']} "
          f"verified, {seconds:.0f} s)", flush=True)
    return point


def compare(without: dict, with_: dict) -> dict:
    """At one budget: the kernels both runs verified, their summed latency × calls in each, and the geometric
    mean of with ÷ without over them (a small budget verifies only some kernels: the estimates alone do not
    compare)."""
    common = sorted(set(without["kernels"]) & set(with_["kernels"]))

    def total(point):
        return sum(point["kernels"][k]["ms"] * point["kernels"][k]["calls"] for k in common)

    ratios = [with_["kernels"][k]["ms"] / without["kernels"][k]["ms"] for k in common]
    return {"budget": without["budget"], "common_kernels": len(common), "without_ms": total(without),
            "with_ms": total(with_), "geomean_with_over_without": statistics.geometric_mean(ratios) if ratios else None,
            "verified_without": without["verified"], "verified_with": with_["verified"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mnasnet")
    parser.add_argument("--shape", type=int, default=56)
    parser.add_argument("--trials", type=int, default=48, help="the last budget (--budgets: every one)")
    parser.add_argument("--budgets", default=None, help="comma-separated budgets (default: TRIALS/2, TRIALS)")
    parser.add_argument("--per-iter", type=int, default=4)
    parser.add_argument("--population", type=int, default=128, help="the search's population (agoc tune's)")
    parser.add_argument("--partition", default="stock")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dbs", type=Path, default=Path("build/library-dbs"))
    parser.add_argument("--work", type=Path, default=Path("build/library-loo"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    args.budgets = ([int(b) for b in args.budgets.split(",")] if args.budgets
                    else sorted({max(1, args.trials // 2), args.trials}))

    from toolchain.tune import library

    sources = other_databases(args.dbs, args.model)
    if not sources:
        print(f"no tuning databases of other models in {args.dbs}: run `make library` first", file=sys.stderr)
        return 1
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    work = args.work / f"{args.model}-{stamp}"
    lib = library.build(sources, work / "library", command="(host.bench.library_loo)")
    print(f"library of {len(sources)} models ({', '.join(p.name for p in sources)}): {len(lib.entries)} kernels",
          flush=True)
    result = {"bench": "library-loo", "model": args.model, "shape": args.shape, "per_iter": args.per_iter,
              "partition": args.partition, "seed": args.seed, "population": args.population,
              "library": {"sources": [p.name for p in sources], "kernels": len(lib.entries), "by_op": lib.counts()},
              "target": lib.target, "date": stamp}
    result["without"], result["with"] = [], []
    for trials in args.budgets:  # the two runs in turn, budget by budget: each sees the machine as the other does
        result["without"].append(run_once(args, work / "without", trials, None))
        result["with"].append(run_once(args, work / "with", trials, work / "library"))
    result["compared"] = [compare(a, b) for a, b in zip(result["without"], result["with"])]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"library-loo-{args.model}-{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for c in result["compared"]:
        print(f"budget {c['budget']}: {c['common_kernels']} kernels verified by both: {c['without_ms']:.3f} ms "
              f"without, {c['with_ms']:.3f} ms with the library (geomean ratio {c['geomean_with_over_without']}); "
              f"verified {c['verified_without']} vs {c['verified_with']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
