"""`make bench-layout`: the same conv kernels tuned in NCHW and in NHWC, one run, same trials; the best time
of each and their ratio to a JSON file (``python -m host.bench.layout --model M --size N --trials T --out DIR``)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import tempfile
from pathlib import Path

LAYOUTS = ("NCHW", "NHWC")


def conv_kernels(model: str, size: int, spec) -> tuple[dict, dict]:
    """(kernel name → PrimFunc, kernel name → calls) of ``model``'s stock kernels holding a conv, in
    ``spec``'s layout."""
    import models
    from toolchain import build, onnx_import
    from toolchain.tune import group_kernels

    proto = models.build(model, (1, 3, size, size))
    mod = build.legalize(onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {})), spec)
    fused = build.mark_weights(build.fuse_stock(mod, spec))
    calls = {k.name: k.calls for k in build.kernels(fused)}
    funcs = {name: func for name, func in group_kernels(fused) if "conv2d" in name}
    return funcs, calls


def best_ms(func, spec, trials: int, work_dir: Path) -> float | None:
    """Best cold time (ms) of ``trials`` MetaSchedule trials of ``func`` in the stock space, searched as
    the tuner searches a kernel (``tune_trials``)."""
    from tvm.s_tir import meta_schedule as ms

    from toolchain.tune import TuneSettings, latency, records_of, tune_trials

    work_dir.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(str(work_dir / "workloads.json"), str(work_dir / "records.json"), allow_missing=True)
    tune_trials(func, spec, db, trials, TuneSettings(), intensive=False, work_dir=work_dir)
    times = [t for t in (latency(r) for r in records_of(db, func)) if math.isfinite(t)]
    return min(times) * 1e3 if times else None


def run(model: str, size: int, trials: int, kernels: int, threads: int, work_dir: Path) -> dict:
    from toolchain.targets import resolve_target

    specs = {layout: resolve_target("host", num_cores=threads, layout=layout) for layout in LAYOUTS}
    per_layout = {layout: conv_kernels(model, size, spec) for layout, spec in specs.items()}
    funcs, calls = per_layout["NCHW"]
    common = [n for n in funcs if all(n in per_layout[lay][0] for lay in LAYOUTS)]
    chosen = sorted(common, key=lambda n: (-calls.get(n, 0), common.index(n)))[:kernels]
    rows = []
    for name in chosen:
        row = {"kernel": name, "calls": calls.get(name, 0)}
        for layout in LAYOUTS:
            row[layout] = best_ms(per_layout[layout][0][name], specs[layout], trials, work_dir / layout / name)
        row["nchw_over_nhwc"] = row["NCHW"] / row["NHWC"] if row["NCHW"] and row["NHWC"] else None
        rows.append(row)
        print(f"{name}: NCHW {row['NCHW']} ms, NHWC {row['NHWC']} ms", flush=True)
    ok = [r for r in rows if r["nchw_over_nhwc"]]
    summed = {lay: sum(r[lay] * r["calls"] for r in ok) for lay in LAYOUTS}
    return {
        "suite": "layout", "model": model, "size": size, "trials_per_kernel": trials, "threads": threads,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kernels": rows,
        "geomean_nchw_over_nhwc": math.exp(sum(math.log(r["nchw_over_nhwc"]) for r in ok) / len(ok)) if ok else None,
        "summed_over_calls_ms": summed,
        "summed_nchw_over_nhwc": summed["NCHW"] / summed["NHWC"] if ok else None,
    }


def main(argv: list[str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet-v2")
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--trials", type=int, default=48)
    p.add_argument("--kernels", type=int, default=7)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--work-dir", type=Path, default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agoc-layout-") as tmp:
        result = run(a.model, a.size, a.trials, a.kernels, a.threads, a.work_dir or Path(tmp))
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"layout-{a.model}-{a.size}-{datetime.date.today().isoformat()}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"geomean NCHW ÷ NHWC {result['geomean_nchw_over_nhwc']:.2f}×, summed over calls "
          f"{result['summed_nchw_over_nhwc']:.2f}× → {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
