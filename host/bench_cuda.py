"""``make bench-cuda``: fused (APOLLO + FusionStitching) vs stock TVM CUDA on training steps.

For every graph — BERT-tiny's training step, a MobileNet-V2 block's, and the
memory-bound subgraphs alone (LayerNorm, Softmax, bias+GELU, forward and
backward) — it compiles both pipelines for CUDA and records kernel launches
per step, groups and stitched groups, and checks the fused partition's
numerics against the unfused graph on the llvm target.

With an NVIDIA GPU (``nvidia-smi`` lists one and TVM sees ``cuda(0)``) it
also runs both on the GPU: same inputs, outputs compared, then timed in
interleaved rounds (``time_evaluator``: ``number`` calls per sample, one
sample per engine per round, random order per round); reported per graph:
median ms of each and the median / p10 of the per-round stock ÷ fused
ratios. Without a GPU it says so, writes the kernel counts, and exits 0.

Results: ``bench/results/cuda-<date>.json`` (schema ``agoc.bench-cuda/1``).
"""

from __future__ import annotations

import datetime
import json
import platform
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import numpy as np

SCHEMA = "agoc.bench-cuda/1"
GRAPHS = ("bert-tiny", "mobilenet-v2-block", "layernorm", "softmax", "bias-gelu")
MEMORY_BOUND = ("layernorm", "softmax", "bias-gelu")


def gpu_status() -> tuple[bool, str]:
    """(present, description or the reason there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False, "no NVIDIA GPU: nvidia-smi not found"
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or "GPU" not in proc.stdout:
        return False, f"no NVIDIA GPU: nvidia-smi -L says {(proc.stdout + proc.stderr).strip()[:200]!r}"
    import tvm

    if not tvm.cuda(0).exist:
        return False, "nvidia-smi lists a GPU but TVM's CUDA runtime cannot open it"
    return True, proc.stdout.strip().splitlines()[0]


def _timed(vm, args, dev, number: int) -> float:
    f = vm.time_evaluator("main", dev, number=number, repeat=1)
    return float(f(*args).results[0]) * 1e3


def run_gpu(fused_ex, stock_ex, inputs: list[np.ndarray], rounds: int, number: int, seed: int) -> dict:
    import tvm
    from tvm import relax

    from toolchain.cuda import numerics

    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    vms = {"fused": relax.VirtualMachine(fused_ex, dev), "stock": relax.VirtualMachine(stock_ex, dev)}
    outs = {k: numerics._flatten(vm["main"](*args)) for k, vm in vms.items()}
    agreement = numerics.compare(outs["fused"], outs["stock"]).to_json()
    for vm in vms.values():  # warm-up
        _timed(vm, args, dev, number)
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {"fused": [], "stock": []}
    for _ in range(rounds):
        order = list(vms)
        rng.shuffle(order)
        for k in order:
            samples[k].append(_timed(vms[k], args, dev, number))
    ratios = [s / f for s, f in zip(samples["stock"], samples["fused"])]
    return {
        "fused_ms": float(np.median(samples["fused"])),
        "stock_ms": float(np.median(samples["stock"])),
        "speedup_median": float(np.median(ratios)),
        "speedup_p10": float(np.percentile(ratios, 10)),
        "fused_vs_stock_outputs": agreement,
        "samples_ms": samples,
    }


def run(graphs=GRAPHS, arch: str = "sm_90", rounds: int = 20, number: int = 50, seed: int = 0,
        out_dir: Path = Path("bench/results"), on_event: Callable[[str], None] = print) -> tuple[dict, Path]:
    from toolchain.cuda import codegen, numerics, training
    from toolchain.cuda import compile as cuda_compile
    from toolchain.pipeline import package_versions

    present, gpu = gpu_status()
    on_event(f"GPU: {gpu}" if present else f"{gpu} -- kernel counts and llvm numerics only; timing needs a GPU")
    target = codegen.cuda_target(arch)
    doc = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "gpu": gpu if present else None},
        "gpu_present": present,
        "gpu_status": gpu,
        "target": target.to_json(),
        "protocol": {"rounds": rounds, "number": number, "seed": seed,
                     "note": "one time_evaluator sample (number calls) per engine per round, random order per round"},
        "versions": package_versions(),
        "graphs": [],
    }
    for name in graphs:
        started = time.perf_counter()
        g = training.builtin(name)
        graph = cuda_compile.Graph(g.name, g.mod, True, g.description)
        compiled = cuda_compile.compile_graph(graph, target)
        entry = {"graph": name, "description": g.description, "memory_bound": name in MEMORY_BOUND,
                 "kernel_counts": cuda_compile.kernel_report(compiled)}
        args = g.sample_args(seed)
        entry["llvm_numerics_fused_vs_unfused"] = numerics.check_fused_llvm(compiled.legalized, compiled.plan, args).to_json()
        if present:
            entry["gpu"] = run_gpu(compiled.fused_build.executable, compiled.stock_build.executable, args, rounds, number, seed)
        entry["seconds"] = round(time.perf_counter() - started, 1)
        counts = entry["kernel_counts"]
        line = (f"{name:20s} launches/step fused {counts['fused']['launches_per_step']:4d}  stock "
                f"{counts['stock']['launches_per_step']:4d}  ({counts['launch_ratio_fused_over_stock']:.2f}x)  "
                f"stitched groups {counts['fused']['stitched_groups']}  llvm max rel err "
                f"{entry['llvm_numerics_fused_vs_unfused']['max_rel']:.1e}")
        if present:
            line += f"  GPU fused {entry['gpu']['fused_ms']:.3f} ms vs stock {entry['gpu']['stock_ms']:.3f} ms ({entry['gpu']['speedup_median']:.2f}x)"
        on_event(line)
        doc["graphs"].append(entry)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = _results_path(out_dir)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc, path


def _results_path(out_dir: Path) -> Path:
    base = f"cuda-{datetime.date.today().isoformat()}"
    path, n = out_dir / f"{base}.json", 2
    while path.exists():
        path, n = out_dir / f"{base}-{n}.json", n + 1
    return path


if __name__ == "__main__":
    _, written = run()
    print(f"wrote {written}")
