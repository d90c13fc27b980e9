"""Only the tensor intrinsics a target can use: MetaSchedule's TuneContext otherwise imports every backend's
(CUDA, ROCm, Hexagon, …), minutes of TVMScript parsing on two cores before a CPU search starts
(docs/tuning-internals.md)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

PACKAGE = "tvm.s_tir.tensor_intrin"

#: (target kind, the start of its mtriple) -> the intrinsic modules its schedules may tensorize with, first match
MODULES = (
    ("cuda", "", ("cuda",)),
    ("llvm", "aarch64", ("arm_cpu",)),
    ("llvm", "arm", ("arm_cpu",)),
    ("llvm", "riscv", ("riscv_cpu",)),
    ("llvm", "", ("x86",)),
)


def modules_for(kind: str, mtriple: str) -> tuple[str, ...]:
    """The intrinsic modules of a target (none for a kind not listed)."""
    return next((mods for k, triple, mods in MODULES if k == kind and mtriple.startswith(triple)), ())


def load(target) -> None:
    """Register the intrinsics of ``target`` (a tvm Target) and mark the package loaded, so that a TuneContext's
    ``import tvm.s_tir.tensor_intrin`` does not load the others (they stay importable by name)."""
    import tvm.s_tir

    if PACKAGE not in sys.modules:
        package = importlib.util.module_from_spec(importlib.util.find_spec(PACKAGE))
        sys.modules[PACKAGE] = package
        tvm.s_tir.tensor_intrin = package
    mtriple = str(target.attrs.get("mtriple", "")) if "mtriple" in target.attrs else ""
    for name in modules_for(target.kind.name, mtriple):
        importlib.import_module(f"{PACKAGE}.{name}")


def tune_context(**kwargs):
    """``ms.TuneContext(**kwargs)`` with only its target's intrinsics loaded."""
    from tvm.s_tir import meta_schedule as ms

    load(kwargs["target"])
    return ms.TuneContext(**kwargs)
