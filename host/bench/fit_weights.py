"""Fit the op-weight constants of AGO Eq. 1 to measured tuning budgets (docs/partitioning.md, Weight fit):

    python -m host.bench.fit_weights measure [--trials 64] [--seed 0] [--only NAME ...] [--force] | fit | show | list"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from host.bench.calibration import CALIBRATION, Calibration, calibration, extract
from toolchain.artifact import fresh_work_dir
from toolchain.tune import BUILD_TIMEOUT_S, fast_build, trial_latencies

ROOT = Path(__file__).resolve().parents[2]
BUDGETS_FILE = ROOT / "toolchain" / "data" / "weight_budgets.json"
FIT_FILE = ROOT / "toolchain" / "data" / "weight_fit.json"
WORK_ROOT = ROOT / "build" / "fit_weights"

DEFAULT_TRIALS = 64
DEFAULT_PER_ITER = 16
DEFAULT_SEED = 0
STABILITY = 0.02  # budget: later trials improve best-so-far by at most this fraction
FAILED_SECS = 1e9  # MetaSchedule records a failed build/run with a huge run time (1e10)

POOR_R2 = 0.3  # below this the fit file says so in its source line

STABILITY_RULE = (
    "budget = smallest k such that best-so-far after k trials is within 2% of the final best "
    "((best_k - best_j)/best_k <= 0.02 for all j > k); failed trials count as trials"
)


# --------------------------------------------------------------------------------------------
# Budget rule and fit (pure)


def best_so_far(latencies: Sequence[float]) -> list[float]:
    """Running minimum; failed trials (inf / nan / >= FAILED_SECS) do not count as a best."""
    out: list[float] = []
    best = math.inf
    for lat in latencies:
        if lat is not None and math.isfinite(lat) and lat < FAILED_SECS and lat < best:
            best = lat
        out.append(best)
    return out


def budget_of(latencies: Sequence[float], tolerance: float = STABILITY) -> int:
    """Trials after which best-so-far never again improves by more than ``tolerance`` (see module doc)."""
    best = best_so_far(latencies)
    if not best or not math.isfinite(best[-1]):
        raise ValueError("no trial succeeded: no budget")
    final = best[-1]
    for k, b in enumerate(best, start=1):
        if math.isfinite(b) and (b - final) / b <= tolerance + 1e-12:
            return k
    return len(best)  # unreachable: the last trial always qualifies


@dataclass(frozen=True)
class Fit:
    c: float
    b: float
    r2: float
    n: int
    forced_b0: bool  # the free fit was nonsensical (c < 0 or b < 0): refitted through b = 0
    free_c: float
    free_b: float


def _r2(ys: Sequence[float], preds: Sequence[float]) -> float:
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum((y - p) ** 2 for y, p in zip(ys, preds))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)


def _row_values(row) -> tuple[float, float, float]:
    if isinstance(row, dict):
        return float(row["loop_term_sum"]), float(row["n_ops"]), float(row["budget"])
    term, n_ops, budget = row
    return float(term), float(n_ops), float(budget)


def fit(rows: Sequence) -> Fit:
    """Least squares ``budget = c · loop_term_sum + b · n_ops`` (no intercept: b is per op).

    Rows are dicts with ``loop_term_sum``, ``n_ops``, ``budget`` or tuples in that
    order. A fit with ``c < 0`` says bigger loop nests tune faster — nonsense for
    a weight — and one with ``b < 0`` gives small ops negative weights; either
    way the constants are refitted through ``b = 0`` (``forced_b0``).
    """
    data = [_row_values(r) for r in rows]
    if len(data) < 2:
        raise ValueError(f"need at least 2 measured subgraphs to fit c and b (have {len(data)})")
    stt = sum(t * t for t, _, _ in data)
    snn = sum(n * n for _, n, _ in data)
    stn = sum(t * n for t, n, _ in data)
    sty = sum(t * y for t, _, y in data)
    sny = sum(n * y for _, n, y in data)
    det = stt * snn - stn * stn
    if abs(det) > 1e-9 * max(stt * snn, 1e-300):
        free_c = (sty * snn - sny * stn) / det
        free_b = (stt * sny - stn * sty) / det
    else:  # loop terms proportional to op counts: the two columns cannot be told apart
        free_c, free_b = -1.0, -1.0
    forced = free_c < 0 or free_b < 0
    if forced:
        c, b = (sty / stt if stt > 0 else 0.0), 0.0
    else:
        c, b = free_c, free_b
    ys = [y for _, _, y in data]
    preds = [c * t + b * n for t, n, _ in data]
    return Fit(c, b, _r2(ys, preds), len(data), forced, free_c, free_b)


def fit_constants(rows: Sequence) -> tuple[float, float, float]:
    """``(c, b, r2)`` of :func:`fit`."""
    result = fit(rows)
    return result.c, result.b, result.r2


# --------------------------------------------------------------------------------------------
# Tuning


def tune(func, spec, work_dir: Path, trials: int, per_iter: int = DEFAULT_PER_ITER,
         seed: int = DEFAULT_SEED) -> list[float]:
    """Tune one PrimFunc alone in a fresh ``work_dir``; the per-trial latencies in measurement order."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from toolchain.timing import Timing, local_runner

    os.environ.setdefault("TVM_NUM_THREADS", str(spec.num_cores))
    work_dir = fresh_work_dir(work_dir)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    builder = ms.builder.LocalBuilder(f_build=fast_build, max_workers=spec.num_cores, timeout_sec=BUILD_TIMEOUT_S)
    runner = local_runner(Timing(number=3, repeat=5, min_repeat_ms=30))
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    ms.tune_tir(
        mod,
        target=spec.tvm(),
        work_dir=str(work_dir),
        max_trials_global=trials,  # one task: >= 1 × per_iter
        num_trials_per_iter=min(per_iter, trials),
        builder=builder,
        runner=runner,
        database=database,
        num_tuning_cores=spec.num_cores,
        seed=seed,
    )
    return trial_latencies(work_dir)


# --------------------------------------------------------------------------------------------
# Records


def machine_context(spec) -> dict:
    import tvm

    from host.bench import machine_context as machine

    return {
        **machine(),
        "llvm_mcpu": spec.tvm_target.get("mcpu"),
        "num_cores_target": spec.num_cores,
        "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
        "tvm_version": tvm.__version__,
        "python": platform.python_version(),
        "tvm_target": spec.tvm_target,
    }


def load_budgets(path: Path = BUDGETS_FILE) -> dict:
    if Path(path).exists():
        return json.loads(Path(path).read_text())
    return {"schema": "agoc.weight_budgets/1", "context": {}, "subgraphs": []}


def _write_json(path: Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def measure_one(cal: Calibration, spec, trials: int, work_root: Path = WORK_ROOT,
                per_iter: int = DEFAULT_PER_ITER, seed: int = DEFAULT_SEED) -> dict:
    """Extract, tune and summarise one calibration subgraph (one row of weight_budgets.json)."""
    ex = extract(cal, spec)
    work_dir = Path(work_root) / (cal.name.replace("@", "_") + (f"_seed{seed}" if seed != DEFAULT_SEED else ""))
    load_before = _loadavg()
    start = time.monotonic()
    latencies = tune(ex.func, spec, work_dir, trials, per_iter, seed)
    seconds = time.monotonic() - start
    load_after = _loadavg()
    (work_dir / "primfunc.py").write_text(ex.func.script())
    best = best_so_far(latencies)
    return {
        "name": cal.name,
        "model": cal.model,
        "shape": list(cal.shape),
        "note": cal.note,
        "node_ids": list(ex.node_ids),
        "kernel": ex.func_name,
        "loop_term_sum": round(ex.loop_term_sum, 4),
        "n_ops": ex.n_ops,
        "n_complex": ex.n_complex,
        "trials": trials,
        "trials_measured": len(latencies),
        "failed_trials": sum(1 for lat in latencies if not math.isfinite(lat)),
        "budget": budget_of(latencies),
        "best_latency_ms": round(best[-1] * 1e3, 6),
        "first_latency_ms": (round(best[0] * 1e3, 6) if math.isfinite(best[0]) else None),
        "seconds": round(seconds, 1),
        "latencies_ms": [round(lat * 1e3, 6) if math.isfinite(lat) else None for lat in latencies],
        "seed": seed,
        "per_iter": per_iter,
        # 1-minute load average before / after: well above the tuner's own ~num-cores means
        # another process shared the cores and the latencies (hence the budget) are suspect
        "loadavg_1min": [load_before, load_after],
    }


def measure(
    names: Sequence[str] | None = None,
    trials: int = DEFAULT_TRIALS,
    force: bool = False,
    out_path: Path = BUDGETS_FILE,
    work_root: Path = WORK_ROOT,
    per_iter: int = DEFAULT_PER_ITER,
    seed: int = DEFAULT_SEED,
    echo: Callable[[str], None] = print,
) -> dict:
    """Tune every (selected) calibration subgraph not yet measured at ``trials`` with ``seed``; returns the document.

    Rows are keyed by (name, seed): measuring again with another seed adds a
    replicate, which :func:`aggregate` averages before fitting.
    """
    from toolchain.targets import resolve_target

    spec = resolve_target("host", fast_math=False)  # the anchors name the exact ops, as the shipped fit measured them
    os.environ.setdefault("TVM_NUM_THREADS", str(spec.num_cores))
    cals = [calibration(n) for n in names] if names else list(CALIBRATION)
    doc = load_budgets(out_path)
    echo(f"target {spec.tvm_target}, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}, "
         f"{trials} trials/subgraph, {per_iter}/iter, seed {seed} -> {out_path}")
    for i, cal in enumerate(cals, start=1):
        done = next((r for r in doc["subgraphs"] if _key(r) == (cal.name, seed)), None)
        if done and done.get("trials") == trials and not force:
            echo(f"[{i}/{len(cals)}] {cal.name}: already measured at {trials} trials with seed {seed} "
                 f"(budget {done['budget']}), skip")
            continue
        echo(f"[{i}/{len(cals)}] {cal.name}: tuning {trials} trials ...")
        try:
            row = measure_one(cal, spec, trials, work_root, per_iter, seed)
        except Exception as exc:  # noqa: BLE001 - one untunable subgraph must not lose the others
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            error = f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
            echo(f"[{i}/{len(cals)}] {cal.name}: FAILED, not recorded: {error}")
            failures = [f for f in doc.get("failures", []) if f["name"] != cal.name]
            doc["failures"] = failures + [{"name": cal.name, "trials": trials, "error": error,
                                           "at": datetime.datetime.now().isoformat(timespec="seconds")}]
            _write_json(out_path, doc)
            continue
        doc["failures"] = [f for f in doc.get("failures", []) if f["name"] != cal.name]
        doc["subgraphs"] = [r for r in doc["subgraphs"] if _key(r) != (cal.name, seed)] + [row]
        order = {c.name: k for k, c in enumerate(CALIBRATION)}
        doc["subgraphs"].sort(key=lambda r: (order.get(r["name"], len(order)), _key(r)[1]))
        doc["context"] = {
            **machine_context(spec),
            "trials_per_subgraph": trials,
            "num_trials_per_iter": per_iter,
            "seeds": sorted({_key(r)[1] for r in doc["subgraphs"]}),
            "stability_rule": STABILITY_RULE,
            "tuner": "tvm.s_tir.meta_schedule.tune_tir, post-order-apply space, evolutionary search, xgb cost "
                     "model, LocalBuilder(f_build=fast_build), LocalRunner(number=3, repeat=5, min_repeat_ms=30; "
                     "warmed up 100 ms, fastest of 2 measurements), median of the repeats",
            "updated_at": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        _write_json(out_path, doc)
        echo(f"[{i}/{len(cals)}] {cal.name}: loop_term {row['loop_term_sum']:.1f}, {row['n_ops']} ops "
             f"({row['n_complex']} complex), budget {row['budget']}/{row['trials_measured']}, "
             f"best {row['best_latency_ms']:.4f} ms (first {row['first_latency_ms']}), "
             f"{row['failed_trials']} failed, {row['seconds']:.0f} s")
    return doc


def _key(row: dict) -> tuple[str, int]:
    return row["name"], int(row.get("seed", DEFAULT_SEED))


def aggregate(rows: Sequence[dict]) -> list[dict]:
    """One row per subgraph: the replicates' (seeds') budgets averaged, in first-seen order."""
    by_name: dict[str, list[dict]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)
    out = []
    for reps in by_name.values():
        budgets = [r["budget"] for r in reps]
        out.append({
            **reps[0],
            "budget": sum(budgets) / len(budgets),
            "budgets": budgets,
            "seeds": [_key(r)[1] for r in reps],
            "best_latency_ms": min(r["best_latency_ms"] for r in reps),
            "seconds": sum(r["seconds"] for r in reps),
        })
    return out


def fit_file(budgets_path: Path = BUDGETS_FILE, out_path: Path = FIT_FILE, echo=print,
             threshold: float | None = None) -> Fit:
    """Fit the recorded budgets and write the fit file; ``threshold`` (trials) is stored as its
    ``default_threshold`` (the clustering Td that goes with these weights, read by
    :func:`toolchain.weights.default_threshold`); without it the key is left out."""
    doc = load_budgets(budgets_path)
    rows = aggregate(doc["subgraphs"])
    result = fit(rows)
    ctx = doc.get("context", {})
    machine = f"{ctx.get('cpu', '?')} / {ctx.get('llvm_mcpu', '?')}, {ctx.get('tvm_num_threads', '?')} threads"
    trials = sorted({r["trials"] for r in doc["subgraphs"]})
    seeds = sorted({_key(r)[1] for r in doc["subgraphs"]})
    source = (
        f"fitted by host/bench/fit_weights.py from toolchain/data/weight_budgets.json "
        f"({machine}, {'/'.join(map(str, trials))} trials/subgraph, budgets averaged over seeds "
        f"{','.join(map(str, seeds))})"
    )
    if result.forced_b0:
        source += (f"; the free fit was nonsensical (c={result.free_c:.4g}, b={result.free_b:.4g}), "
                   "refitted through b=0")
    if result.r2 < POOR_R2:
        source += (f"; WARNING: r2={result.r2:.2f}, the loop-term model explains little of the measured budgets "
                   "(see host/bench/fit_weights.py show)")
    data = {
        "c": result.c,
        "b": result.b,
        "r2": result.r2,
        "n": result.n,
        "seeds": seeds,
        "source": source,
        "fitted_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "model": "budget = c * sum(loop_term) + b * n_ops  (AGO Eq. 1 summed over a subgraph's ops)",
        "free_fit": {"c": result.free_c, "b": result.free_b},
        "forced_b0": result.forced_b0,
    }
    if threshold is not None:
        data["default_threshold"] = float(threshold)
    _write_json(out_path, data)
    echo(f"c = {result.c:.6g}, b = {result.b:.6g}, r2 = {result.r2:.3f} over {result.n} subgraphs -> {out_path}")
    if result.forced_b0:
        echo(f"(free fit c={result.free_c:.4g}, b={result.free_b:.4g} was nonsensical; refitted through b=0)")
    return result


def show(budgets_path: Path = BUDGETS_FILE, fit_path: Path = FIT_FILE, echo=print) -> None:
    doc = load_budgets(budgets_path)
    rows = aggregate(doc["subgraphs"])
    c = b = None
    if Path(fit_path).exists():
        fitted = json.loads(Path(fit_path).read_text())
        c, b = fitted["c"], fitted["b"]
        echo(f"fit: c={c:.6g} b={b:.6g} r2={fitted.get('r2', float('nan')):.3f} ({fitted.get('source', '')})")
    header = (f"{'subgraph':24} {'loop_term':>9} {'ops':>3} {'cplx':>4} {'budget':>6} {'per seed':>12} "
              f"{'predicted':>9} {'best ms':>9} {'sec':>5}")
    echo(header)
    echo("-" * len(header))
    for r in rows:
        pred = f"{c * r['loop_term_sum'] + b * r['n_ops']:9.1f}" if c is not None else f"{'-':>9}"
        per_seed = ",".join(str(x) for x in r["budgets"])
        echo(f"{r['name']:24} {r['loop_term_sum']:9.1f} {r['n_ops']:3d} {r['n_complex']:4d} "
             f"{r['budget']:6.1f} {per_seed:>12} {pred} {r['best_latency_ms']:9.4f} {r['seconds']:5.0f}")
    if rows:
        ctx = doc.get("context", {})
        echo(f"{len(rows)} subgraphs, {len(doc['subgraphs'])} runs of {ctx.get('trials_per_subgraph', '?')} trials "
             f"(budget capped by it; the 'per seed' column lists each run); {ctx.get('cpu', '?')}, "
             f"TVM {ctx.get('tvm_version', '?')}, "
             f"{sum(r['seconds'] for r in rows):.0f} s tuning; rule: {ctx.get('stability_rule', STABILITY_RULE)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.bench.fit_weights", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_measure = sub.add_parser("measure", help="tune the calibration subgraphs, record their budgets")
    p_measure.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    p_measure.add_argument("--per-iter", type=int, default=DEFAULT_PER_ITER)
    p_measure.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p_measure.add_argument("--only", nargs="*", default=None, help="calibration names (default: all)")
    p_measure.add_argument("--force", action="store_true", help="re-measure subgraphs already recorded")
    p_measure.add_argument("--out", type=Path, default=BUDGETS_FILE)
    p_measure.add_argument("--work-dir", type=Path, default=WORK_ROOT)
    p_fit = sub.add_parser("fit", help="least-squares fit of c, b to the recorded budgets")
    p_fit.add_argument("--budgets", type=Path, default=BUDGETS_FILE)
    p_fit.add_argument("--out", type=Path, default=FIT_FILE)
    p_fit.add_argument("--default-threshold", type=float, default=None,
                       help="clustering Td (trials) to store with the constants (default: none, partition's own)")
    p_show = sub.add_parser("show", help="measured budgets vs predicted weights")
    p_show.add_argument("--budgets", type=Path, default=BUDGETS_FILE)
    p_show.add_argument("--fit", type=Path, default=FIT_FILE)
    p_list = sub.add_parser("list", help="the calibration table with each group's ops (no tuning)")
    del p_list
    args = parser.parse_args(argv)

    def echo(msg: str) -> None:
        print(msg, flush=True)

    if args.command == "measure":
        if args.trials < 1 or args.per_iter < 1:
            parser.error("--trials and --per-iter must be positive")
        measure(args.only, args.trials, args.force, args.out, args.work_dir, args.per_iter, args.seed, echo)
    elif args.command == "fit":
        fit_file(args.budgets, args.out, echo, args.default_threshold)
    elif args.command == "show":
        show(args.budgets, args.fit, echo)
    elif args.command == "list":
        from toolchain.targets import resolve_target

        spec = resolve_target("host", fast_math=False)
        for cal in CALIBRATION:
            ex = extract(cal, spec)
            echo(f"{cal.name:24} {ex.n_ops:2d} ops ({ex.n_complex} complex) loop_term {ex.loop_term_sum:7.1f}  "
                 f"{ex.func_name[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
