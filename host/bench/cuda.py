"""``make bench-cuda``: fused (APOLLO + FusionStitching) vs stock TVM CUDA on training steps, in two stages
(a bundle compiled anywhere, timed where the GPU is: ``python -m host.bench.cuda time BUNDLE``); docs/cuda.md."""

from __future__ import annotations

import datetime
import json
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from toolchain.errors import AgocError

SCHEMA = "agoc.bench-cuda/1"
BUNDLE_FILE = "bundle.json"
GRAPHS = ("bert-tiny", "mobilenet-v2-block", "layernorm", "softmax", "bias-gelu",
          "layernorm-base", "softmax-base", "bias-gelu-base")
MEMORY_BOUND = ("layernorm", "softmax", "bias-gelu", "layernorm-base", "softmax-base", "bias-gelu-base")
ENGINES = ("fused", "stock")
# GPU outputs vs the llvm reference: float32 reductions in another order
ATOL = RTOL = 1e-4
SAMPLED = 1 << 16  # reference elements kept per output in a bundle
SAMPLE_MS_MOST = 100.0  # fewer calls per sample than ``number`` when one call is slow


class BenchCudaError(AgocError):
    """A bundle that cannot be timed here: no GPU, or not a bundle."""


_cuda_runtime_error = ""  # why a runtime-only TVM could not load its CUDA runtime, if it could not


def load_cuda_runtime() -> None:
    """TVM's CUDA runtime registers itself when the full TVM loads its backends; a runtime-only TVM does not."""
    import tvm_ffi
    from tvm.base import _LOADED_LIBS, _RUNTIME_ONLY

    if not _RUNTIME_ONLY or "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    from tvm_ffi.libinfo import load_lib_ctypes

    runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
    except (OSError, FileNotFoundError, RuntimeError) as exc:  # no libcuda / libcudart: no GPU here
        global _cuda_runtime_error
        _cuda_runtime_error = str(exc)
        return
    # TVM keeps CUDA source in the exported library and compiles it when the library is loaded.
    # Its compile hook asks the compiler library for the current target, which a runtime-only
    # TVM lacks; this one asks the device instead, and uses TVM's own nvcc flags.
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", _nvcc_for_this_gpu, override=True)


def _nvcc_for_this_gpu(code: str) -> bytearray:
    import tvm

    from toolchain.cuda.codegen import nvcc_compile

    try:
        from tvm.support.nvcc import _ptxas_option_flags
        ptxas = (f"--ptxas-options={','.join(_ptxas_option_flags())}",)
    except ImportError:
        ptxas = ()
    sm = tvm.cuda(0).compute_version.replace(".", "")
    with tempfile.TemporaryDirectory(prefix="agoc-nvcc-") as tmp:
        src = Path(tmp) / "kernels.cu"
        src.write_text(code)
        out = nvcc_compile(src, f"sm_{sm}", Path(tmp) / "kernels.cubin", "cubin",
                           options=("--expt-relaxed-constexpr", "--use_fast_math", *ptxas))  # TVM's own flags
        return bytearray(out.read_bytes())


def gpu_status() -> tuple[bool, str]:
    """(present, description or the reason there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False, "no NVIDIA GPU: nvidia-smi not found"
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or "GPU" not in proc.stdout:
        return False, f"no NVIDIA GPU: nvidia-smi -L says {(proc.stdout + proc.stderr).strip()[:200]!r}"
    import tvm

    load_cuda_runtime()
    if not tvm.cuda(0).exist:
        why = _cuda_runtime_error
        return False, "nvidia-smi lists a GPU but TVM's CUDA runtime cannot open it" + (f": {why}" if why else "")
    return True, proc.stdout.strip().splitlines()[0]


# ------------------------------------------------------------------ export (no GPU)


def new_document(arch_target: dict, rounds: int, number: int, seed: int) -> dict:
    from toolchain.pipeline import package_versions

    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "gpu": None},
        "gpu_present": False,
        "gpu_status": None,
        "target": arch_target,
        "protocol": {"rounds": rounds, "number": number, "seed": seed,
                     "note": "one time_evaluator sample (number calls) per engine per round, random order per round"},
        "versions": {"compiled with": package_versions()},
        "graphs": [],
    }


def export_bundle(graphs=GRAPHS, arch: str = "sm_90", rounds: int = 20, number: int = 50, seed: int = 0,
                  bundle_dir: Path = Path("build/cuda-bundle"),
                  on_event: Callable[[str], None] = print) -> dict:
    """Compile every graph both ways for CUDA, check the fused partition on llvm, write the bundle."""
    from toolchain.cuda import codegen, numerics, training
    from toolchain.cuda import compile as cuda_compile

    target = codegen.cuda_target(arch)
    bundle_dir = Path(bundle_dir)
    if bundle_dir.is_dir() and any(bundle_dir.iterdir()) and not (bundle_dir / BUNDLE_FILE).exists():
        raise BenchCudaError(f"--bundle {bundle_dir} exists and is not a CUDA benchmark bundle; "
                             "choose a new or empty directory")
    bundle_dir.mkdir(parents=True, exist_ok=True)
    doc = new_document(target.to_json(), rounds, number, seed)
    for name in graphs:
        started = time.perf_counter()
        g = training.builtin(name)
        compiled = cuda_compile.compile_graph(cuda_compile.Graph(g.name, g.mod, True, g.description), target)
        entry = {"graph": name, "description": g.description, "memory_bound": name in MEMORY_BOUND,
                 "kernel_counts": cuda_compile.kernel_report(compiled)}
        args = g.sample_args(seed)
        entry["llvm_numerics_fused_vs_unfused"] = numerics.check_fused_llvm(
            compiled.legalized, compiled.plan, args).to_json()
        expected = numerics.run(compiled.legalized, args)
        entry["args"] = {"inputs": [[n, list(shape)] for n, shape in g.inputs],
                         "num_data": g.num_data, "num_params": g.num_params, "seed": seed}
        entry["outputs"] = [list(e.shape) for e in expected]
        gdir = bundle_dir / name
        gdir.mkdir(exist_ok=True)
        compiled.fused_build.executable.export_library(str(gdir / "fused.so"))
        compiled.stock_build.executable.export_library(str(gdir / "stock.so"))
        np.savez(gdir / "expected.npz", *[sample(e) for e in expected])
        entry["seconds_compile"] = round(time.perf_counter() - started, 1)
        counts = entry["kernel_counts"]
        on_event(f"{name:20s} launches/step fused {counts['fused']['launches_per_step']:4d}  stock "
                 f"{counts['stock']['launches_per_step']:4d}  ({counts['launch_ratio_fused_over_stock']:.2f}x)  "
                 f"stitched groups {counts['fused']['stitched_groups']}  llvm max rel err "
                 f"{entry['llvm_numerics_fused_vs_unfused']['max_rel']:.1e}")
        doc["graphs"].append(entry)
    (bundle_dir / BUNDLE_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


# ------------------------------------------------------------------ timing (GPU, runtime only)


def sample(array: np.ndarray, most: int = SAMPLED) -> np.ndarray:
    """The reference kept in a bundle: every element of a small output, ``most`` evenly spaced ones of a large."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat if flat.size <= most else flat[np.linspace(0, flat.size - 1, most).astype(np.int64)]


def _arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def _bundle_args(entry: dict) -> list[np.ndarray]:
    """The step's arguments, drawn again from the export's seed (TrainingGraph.sample_args is numpy alone)."""
    from toolchain.cuda.training import TrainingGraph

    spec = entry["args"]
    graph = TrainingGraph(entry["graph"], None, tuple((n, tuple(s)) for n, s in spec["inputs"]),
                          spec["num_data"], spec["num_params"], entry["description"])
    return graph.sample_args(spec["seed"])


def _timed(vm, args, dev, number: int) -> float:
    f = vm.time_evaluator("main", dev, number=number, repeat=1)
    return float(f(*args).results[0]) * 1e3


def run_gpu(modules: dict, inputs: list[np.ndarray], expected: list[np.ndarray],
            rounds: int, number: int, seed: int) -> dict:
    """Both engines on cuda(0): outputs against the reference, then interleaved timing rounds."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from toolchain.cuda import numerics

    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    vms = {k: VirtualMachine(modules[k], dev) for k in ENGINES}
    outs = {k: numerics.flatten(vm["main"](*args)) for k, vm in vms.items()}
    checks = {k: numerics.compare([sample(o) for o in outs[k]], expected) for k in ENGINES}
    for vm in vms.values():  # warm-up
        _timed(vm, args, dev, 1)
    slowest = max(_timed(vm, args, dev, 1) for vm in vms.values())
    number = max(1, min(number, int(SAMPLE_MS_MOST / max(slowest, 1e-6))))  # a sample lasts at most ~SAMPLE_MS_MOST
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {k: [] for k in ENGINES}
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
        "number": number,
        "speedup_p10": float(np.percentile(ratios, 10)),
        "outputs_vs_llvm_unfused": {k: {**c.to_json(), "ok": c.ok(ATOL, RTOL)} for k, c in checks.items()},
        "fused_vs_stock_outputs": (agree := numerics.compare(outs["fused"], outs["stock"])).to_json(),
        "verdict": verdict(checks, agree),
        "samples_ms": samples,
    }


def verdict(checks: dict, agree) -> str:
    """``match``: both engines agree with the llvm reference. ``match-stock``: the llvm reference is off
    by more than the tolerance for both engines alike, and the two GPU pipelines (separate kernels)
    agree with each other -- the reference's float32 sums run serially over up to millions of
    elements on the CPU, the GPU's in trees. ``wrong`` otherwise."""
    if all(c.ok(ATOL, RTOL) for c in checks.values()):
        return "match"
    if agree.ok(ATOL / 10, RTOL / 10):
        return "match-stock"
    return "wrong"


def time_bundle(bundle_dir: Path, rounds: int | None = None, number: int | None = None, seed: int | None = None,
                out_dir: Path = Path("bench/results"),
                on_event: Callable[[str], None] = print) -> tuple[dict, Path]:
    """Time an exported bundle on this machine's GPU; writes and returns the results document."""
    import tvm

    bundle_dir = Path(bundle_dir)
    if not (bundle_dir / BUNDLE_FILE).is_file():
        raise BenchCudaError(f"{bundle_dir} is not a CUDA benchmark bundle (no {BUNDLE_FILE}); "
                             "write one with `agoc bench-cuda --bundle DIR`")
    present, gpu = gpu_status()
    if not present:
        raise BenchCudaError(f"cannot time {bundle_dir}: {gpu}")
    doc = json.loads((bundle_dir / BUNDLE_FILE).read_text())
    protocol = doc["protocol"]
    for key, value in (("rounds", rounds), ("number", number), ("seed", seed)):
        if value is not None:
            protocol[key] = value
    doc["machine"].update({"gpu_host": platform.node(), "gpu": gpu})
    doc.update(gpu_present=True, gpu_status=gpu,
               timed=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    doc["versions"]["timed with"] = {"python": platform.python_version(), "tvm": tvm.__version__,
                                     "tvm runtime only": bool(tvm.base._RUNTIME_ONLY), "numpy": np.__version__}
    on_event(f"GPU: {gpu}")
    for entry in doc["graphs"]:
        gdir = bundle_dir / entry["graph"]
        started = time.perf_counter()
        modules = {k: tvm.runtime.load_module(str(gdir / f"{k}.so")) for k in ENGINES}
        entry["gpu"] = run_gpu(modules, _bundle_args(entry), _arrays(gdir / "expected.npz"),
                               protocol["rounds"], protocol["number"], protocol["seed"])
        entry["seconds_gpu"] = round(time.perf_counter() - started, 1)
        g = entry["gpu"]
        said = {"match": "outputs match llvm",
                "match-stock": f"fused = stock (to {g['fused_vs_stock_outputs']['max_rel']:.1e}); both "
                               f"{g['outputs_vs_llvm_unfused']['fused']['max_rel']:.1e} off llvm's serial float32 sums",
                "wrong": "WRONG OUTPUTS"}[g["verdict"]]
        on_event(f"{entry['graph']:20s} GPU fused {g['fused_ms']:.4f} ms vs stock {g['stock_ms']:.4f} ms "
                 f"({g['speedup_median']:.2f}x, p10 {g['speedup_p10']:.2f}x)  {said}")
    bound = [e["gpu"]["speedup_median"] for e in doc["graphs"] if e["memory_bound"]]
    if bound:
        doc["memory_bound_speedup_geomean"] = float(np.exp(np.mean(np.log(bound))))
        on_event(f"memory-bound subgraphs, stock ÷ fused geomean: {doc['memory_bound_speedup_geomean']:.2f}x")
    path = _write(doc, out_dir)
    return doc, path


# ------------------------------------------------------------------ both


def run(graphs=GRAPHS, arch: str = "sm_90", rounds: int = 20, number: int = 50, seed: int = 0,
        out_dir: Path = Path("bench/results"), on_event: Callable[[str], None] = print) -> tuple[dict, Path]:
    """Export to a scratch bundle, then time it where there is a GPU; without one the document holds
    counts and llvm numerics."""
    present, gpu = gpu_status()
    on_event(f"GPU: {gpu}" if present else f"{gpu} -- kernel counts and llvm numerics only; timing needs a GPU")
    with tempfile.TemporaryDirectory(prefix="agoc-cuda-bundle-") as tmp:
        doc = export_bundle(graphs, arch, rounds, number, seed, Path(tmp), on_event)
        if present:
            return time_bundle(Path(tmp), out_dir=out_dir, on_event=on_event)
    doc["gpu_status"] = gpu
    return doc, _write(doc, out_dir)


def _write(doc: dict, out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = _results_path(out_dir)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _results_path(out_dir: Path) -> Path:
    base = f"cuda-{datetime.date.today().isoformat()}"
    path, n = out_dir / f"{base}.json", 2
    while path.exists():
        path, n = out_dir / f"{base}-{n}.json", n + 1
    return path


def main(argv: list[str]) -> int:
    """``python -m host.bench.cuda time BUNDLE [OUT_DIR]``: time a bundle with no agoc CLI installed."""
    if len(argv) < 2 or argv[0] != "time":
        print("usage: python -m host.bench.cuda time BUNDLE [OUT_DIR]", file=sys.stderr)
        return 2
    try:
        _, written = time_bundle(Path(argv[1]), out_dir=Path(argv[2]) if len(argv) > 2 else Path("bench/results"))
    except BenchCudaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
