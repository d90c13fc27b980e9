"""Numerics of fused partitions on the llvm target (what CPU-only machines can check).

The fused module is exactly what the CUDA path builds — the same groups,
outlined and merged by ``FuseTIR`` — minus the GPU schedules, compiled for
the host CPU. Its outputs are compared with the unfused legalized module
(every op its own kernel) on the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Comparison:
    outputs: int
    max_abs: float
    max_rel: float  # relative to the largest magnitude of each reference output

    def ok(self, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
        return self.max_abs <= atol or self.max_rel <= rtol

    def to_json(self) -> dict:
        return {"outputs": self.outputs, "max_abs": self.max_abs, "max_rel": self.max_rel}


def flatten(value) -> list[np.ndarray]:
    """A VM result (a tensor, or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out = []
    for v in value:
        out.extend(flatten(v))
    return out


def run(mod, args: list[np.ndarray], target: dict | None = None, device=None) -> list[np.ndarray]:
    """Build ``mod`` (already legalized/fused, unscheduled is fine on llvm) and run ``main`` once."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    t = tvm.target.Target(target or {"kind": "llvm"})
    lower = tvm.transform.Sequential(cpu.dataflow_lower_passes(t) + cpu.finalize_passes(t))
    with t:
        ex = tvm.compile(mod, t, relax_pipeline=lower)
    dev = device or tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    return flatten(vm["main"](*[tvm.runtime.tensor(a, dev) for a in args]))


def compare(actual: list[np.ndarray], expected: list[np.ndarray]) -> Comparison:
    max_abs = max_rel = 0.0
    for a, e in zip(actual, expected):
        diff = float(np.max(np.abs(a.astype(np.float64) - e))) if a.size else 0.0
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / scale if scale else diff)
    return Comparison(len(expected), max_abs, max_rel)


def check_fused_llvm(legalized, plan, args: list[np.ndarray]) -> Comparison:
    """The fused partition vs every op alone, both on llvm."""
    from toolchain import fusion
    from toolchain.cuda.compile import _HostSpec

    fused = fusion.fuse_groups(legalized, plan.group_lists, _HostSpec(), concat_in_place=False)  # as codegen
    return compare(run(fused, args), run(legalized, args))
