"""Phone-cache proxy: deterministic memory-traffic figures of an artifact run under valgrind in a simulated
phone cache (design §5; the setup and the geometries: docs/proxy.md)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from toolchain.artifact import Artifact
from toolchain.errors import AgocError
from toolchain.geometry import GEOMETRIES, GEOMETRIES_BY_NAME, KIB, MIB, Cache, Geometry  # noqa: F401 - their home

SCHEMA = "agoc.proxy/1"


class ProxyError(AgocError):
    """The phone-cache proxy cannot run (no valgrind, an AVX-512 artifact, a runner without client requests)."""


#: callgrind's events with --cache-sim=yes --simulate-wb=yes (ILdmr/DLdmr/DLdmw: LL misses that
#: evicted a dirty line, i.e. a write-back to memory).
LL_MISS_EVENTS = ("ILmr", "DLmr", "DLmw")
DIRTY_EVENTS = ("ILdmr", "DLdmr", "DLdmw")

#: What the simulated process sees: nothing inherited from the caller's shell.
FIXED_ENV = ("PATH=/usr/bin:/bin", "LC_ALL=C", "TVM_NUM_THREADS=1", "OMP_NUM_THREADS=1")

KERNEL_PREFIX = "__tvm_ffi_"  # the packed entry of a fused kernel in the library (it calls *_compute_)


def geometry(name: str) -> Geometry:
    try:
        return GEOMETRIES_BY_NAME[name]
    except KeyError:
        raise ProxyError(f"unknown cache geometry '{name}'; choose one of: {', '.join(GEOMETRIES_BY_NAME)}") from None


def find_valgrind() -> str:
    path = shutil.which("valgrind")
    if not path:
        raise ProxyError("valgrind not found: the phone-cache proxy needs it; run `make setup` "
                         "(or apt-get install valgrind), then `make runner TARGET=host`")
    return path


def valgrind_version(valgrind: str) -> str:
    out = subprocess.run([valgrind, "--version"], capture_output=True, text=True, check=False, timeout=30)
    return out.stdout.strip() or "unknown"


def check_artifact(artifact: Artifact) -> None:
    """Raise :class:`ProxyError` when the artifact cannot run under valgrind on this machine."""
    from toolchain.targets import PRESETS_BY_NAME

    preset = PRESETS_BY_NAME.get(artifact.target_preset)
    if preset is None or not preset.runs_on_host:
        raise ProxyError(f"{artifact.root} was built for {artifact.target_preset}; the proxy runs host builds: "
                         "compile with --target host-avx2")
    target = artifact.manifest.target["tvm_target"]
    if platform.machine() in ("x86_64", "AMD64") and has_avx512(target):
        raise ProxyError(f"{artifact.root} was built with mcpu={target.get('mcpu')} (AVX-512), which valgrind cannot "
                         "run: compile it with --target host-avx2")


def has_avx512(tvm_target: dict) -> bool:
    """Whether LLVM emits AVX-512 for this TVM target (what valgrind 3.19 cannot run)."""
    import tvm
    from tvm.target import codegen

    return bool(codegen.llvm_cpu_has_features("avx512f", tvm.target.Target(tvm_target)))


def callgrind_command(valgrind: str, runner: Path, artifact_dir: Path, geo: Geometry, ll: Cache, out_file: Path,
                      warmup: int, calls: int) -> list[str]:
    """The argument vector of one simulation: ``env -i`` + valgrind + the runner (bench mode, one thread)."""
    return [
        "env", "-i", *FIXED_ENV,
        valgrind, "--tool=callgrind", "--cache-sim=yes", "--simulate-wb=yes", "--collect-atstart=no",
        f"--I1={geo.l1i.flag()}", f"--D1={geo.l1d.flag()}", f"--LL={ll.flag()}",
        "--compress-strings=no", "--compress-pos=no", f"--callgrind-out-file={out_file}",
        str(runner), "bench", "--artifact", str(artifact_dir), "--warmup", str(warmup), "--repeat", str(calls),
        "--threads", "1",
    ]


@dataclass(frozen=True)
class Profile:
    """One callgrind output file: event names, program totals, inclusive costs of called functions."""

    events: tuple[str, ...]
    totals: dict[str, int]  # the summary: line (falls back to totals:)
    inclusive: dict[str, dict[str, int]]  # callee name -> summed cost of every call to it


def parse_callgrind(text: str) -> Profile:
    """Read callgrind's output format (written with ``--compress-strings=no --compress-pos=no``)."""
    events: list[str] = []
    totals: list[int] | None = None
    inclusive: dict[str, list[int]] = {}
    callee: str | None = None
    take_call_cost = False
    for line in text.splitlines():
        if take_call_cost:  # the line after calls=: the call's inclusive cost (position first)
            costs = [int(x) for x in line.split()[1:]]
            acc = inclusive.setdefault(callee, [0] * len(events))
            for i, c in enumerate(costs):
                acc[i] += c
            take_call_cost = False
        elif line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            totals = [int(x) for x in line.split()[1:]]
        elif line.startswith("totals:") and totals is None:
            # totals: is the sum of the self-cost lines; with collection toggled mid-run it can
            # differ from summary: (the events counted while collecting), which is the one to use.
            totals = [int(x) for x in line.split()[1:]]
        elif line.startswith("cfn="):
            callee = _strip_id(line[4:])
        elif line.startswith("calls="):
            take_call_cost = True
    if not events or totals is None:
        raise ProxyError("callgrind wrote no events/totals (is this a callgrind output file?)")

    def named(values: list[int]) -> dict[str, int]:
        values = values + [0] * (len(events) - len(values))
        return dict(zip(events, values))

    return Profile(tuple(events), named(totals), {k: named(v) for k, v in inclusive.items()})


def _strip_id(name: str) -> str:
    """``(12) name`` → ``name`` (in case names were compressed after all)."""
    return re.sub(r"^\(\d+\)\s*", "", name.strip())


def ll_misses(costs: dict[str, int]) -> int:
    return sum(costs.get(e, 0) for e in LL_MISS_EVENTS)


def memory_bytes(costs: dict[str, int], line: int) -> int:
    """(LL misses + dirty evictions) × line: the bytes that cross the last level to memory."""
    return (ll_misses(costs) + sum(costs.get(e, 0) for e in DIRTY_EVENTS)) * line


def _figures(by_ll: dict[Cache, dict[str, int]], geo: Geometry, calls: int) -> dict:
    """Per-call figures of one cost scope (the model, or one kernel) from the runs at each LL size."""
    first = by_ll[geo.l2]

    def per_call(value: int):
        return value // calls if value % calls == 0 else value / calls

    return {
        "instructions": per_call(first.get("Ir", 0)),
        "d1_misses": per_call(first.get("D1mr", 0) + first.get("D1mw", 0)),
        "l2_misses": per_call(ll_misses(first)),
        "l2_bytes": per_call(memory_bytes(first, geo.l2.line)),
        "dram_bytes": {c.label: per_call(memory_bytes(by_ll[c], c.line)) for c in geo.llc},
    }


def weight_bytes(model_path: Path) -> int:
    """Bytes of the model's weights (ONNX initializers and Constant tensors)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path), load_external_data=False)
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    return sum(numpy_helper.to_array(t).nbytes for t in tensors)


def weights_floor(weights: int, geo: Geometry) -> dict:
    """DRAM bytes per inference that no schedule avoids, per shared-cache size: weights larger than
    the cache stream through it on every inference (read once each at best); weights that fit may
    stay in it between inferences (floor 0). Inputs and outputs are small beside them and left out."""
    return {c.label: weights if weights > c.size else 0 for c in geo.llc}


def _simulate(command: list[str], out_file: Path, timeout: float) -> tuple[Profile, dict, float]:
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ProxyError(f"the simulation ran past {timeout:.0f} s; try a smaller shape") from None
    seconds = time.perf_counter() - started
    if done.returncode != 0 or not out_file.exists():
        tail = done.stderr.strip().splitlines()
        illegal = [ln for ln in tail if "unhandled instruction" in ln or "Illegal opcode" in ln]
        if illegal:
            raise ProxyError("valgrind met an instruction it cannot simulate (AVX-512?): compile the artifact with "
                             f"--target host-avx2 ({illegal[0].strip()[:120]})")
        detail = next((ln for ln in reversed(tail) if "agoc-runner" in ln), tail[-1] if tail else "")
        raise ProxyError(f"the runner under valgrind failed (exit {done.returncode}): {detail.strip()[:300]}")
    result = json.loads(next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")))
    return parse_callgrind(out_file.read_text(errors="replace")), result, seconds


def measure(artifact: Artifact, geo: Geometry, runner: Path | None = None, warmup: int = 2, calls: int = 1,
            jobs: int | None = None, timeout: float = 3600.0) -> dict:
    """Simulate ``artifact`` on ``geo``: one callgrind run per last-level size; returns a JSON-ready dict.

    ``warmup`` uncollected calls bring the cache and the VM's memory pool to steady state (two are
    needed: the first call also allocates); ``calls`` timed calls are collected and divided out.
    """
    from host.devices import runner_build

    valgrind = find_valgrind()
    check_artifact(artifact)
    if runner is None:
        runner, _ = runner_build("host")
    sizes = [geo.l2, *[c for c in geo.llc if c != geo.l2]]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(sizes)))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agoc-proxy-") as tmp:
        commands = {
            c: callgrind_command(valgrind, Path(runner), artifact.root.resolve(), geo, c,
                                 Path(tmp) / f"callgrind.{c.label}.out", warmup, calls)
            for c in sizes
        }
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {c: pool.submit(_simulate, cmd, Path(tmp) / f"callgrind.{c.label}.out", timeout)
                       for c, cmd in commands.items()}
            runs = {c: f.result() for c, f in futures.items()}
    profiles = {c: r[0] for c, r in runs.items()}
    if all(v == 0 for v in profiles[geo.l2].totals.values()):
        raise ProxyError(f"callgrind collected nothing: {runner} was built without valgrind's client requests; "
                         "install valgrind (`make setup`) and rebuild it: `make runner TARGET=host`")
    samples = len(runs[geo.l2][1].get("samples_ms", [])) or calls

    model = _figures({c: p.totals for c, p in profiles.items()}, geo, samples)
    weights = weight_bytes(artifact.model_path)
    floor = weights_floor(weights, geo)
    model["weight_bytes"] = weights
    model["dram_beyond_weights"] = {k: max(0, v - floor[k]) for k, v in model["dram_bytes"].items()}
    kernels, not_found = [], []
    for k in artifact.manifest.kernels:
        name = k["name"]
        by_ll = {c: p.inclusive.get(KERNEL_PREFIX + name, {}) for c, p in profiles.items()}
        if not by_ll[geo.l2]:  # never called, or the manifest names it otherwise than the library
            not_found.append(name)
        figures = _figures(by_ll, geo, samples)
        if "weight_bytes" in k:  # artifacts built before kernels recorded their weights lack it
            # a kernel's weights stream in on every inference where the model's overflow the cache; what
            # it moves beyond them is activations (its own, or other kernels' written back as it evicts them)
            figures["weight_bytes"] = k["weight_bytes"]
            figures["dram_beyond_weights"] = {
                label: max(0, v - (k["weight_bytes"] if floor[label] else 0))
                for label, v in figures["dram_bytes"].items()}
        kernels.append({"name": name, **figures})
    return {
        "schema": SCHEMA,
        "geometry": geo.to_json(),
        "artifact": str(artifact.root),
        "model": artifact.manifest.model_name,
        "target": artifact.manifest.target["tvm_target"],
        "valgrind": valgrind_version(valgrind),
        "warmup": warmup,
        "calls": samples,
        "threads": 1,
        "environment": list(FIXED_ENV),
        "command": commands[geo.l2],
        "model_figures": model,
        "kernels": kernels,
        "kernels_not_found": not_found,  # listed with zero figures
        "outputs": runs[geo.l2][1].get("outputs", []),
        "events": {c.label: profiles[c].totals for c in sizes},
        "seconds": round(time.perf_counter() - started, 2),
        "run_seconds": {c.label: round(r[2], 2) for c, r in runs.items()},
    }


def ratios(result: dict, baseline: dict) -> dict:
    """``result ÷ baseline`` for the model figures (None where the baseline is 0)."""
    a, b = result["model_figures"], baseline["model_figures"]

    def div(x, y):
        return None if not y else x / y

    return {
        "instructions": div(a["instructions"], b["instructions"]),
        "d1_misses": div(a["d1_misses"], b["d1_misses"]),
        "l2_misses": div(a["l2_misses"], b["l2_misses"]),
        "dram_bytes": {k: div(v, b["dram_bytes"].get(k)) for k, v in a["dram_bytes"].items()},
        # the traffic fusion can remove: DRAM bytes above the weights floor (older results lack it)
        "dram_beyond_weights": {k: div(v, b.get("dram_beyond_weights", {}).get(k))
                                for k, v in a.get("dram_beyond_weights", {}).items()},
        "dram_floor": floor_ratio(b),
    }


def floor_ratio(baseline_figures: dict) -> dict:
    """The least ``dram_bytes`` ratio any schedule of the model could reach against this baseline: the
    weights floor alone (the same for every variant: same weights) ÷ the baseline's DRAM bytes, per
    shared-cache size ({} for results from before the floor was recorded)."""
    beyond = baseline_figures.get("dram_beyond_weights", {})
    return {k: (v - beyond[k]) / v if v else None for k, v in baseline_figures["dram_bytes"].items() if k in beyond}
