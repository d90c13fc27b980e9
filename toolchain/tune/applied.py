"""A model's kernels scheduled by their records: MetaSchedule's ApplyDatabase over an in-memory database, line buffers
rolled as every build of a kernel rolls them."""

from __future__ import annotations

from toolchain.tune.adapter import scheduled, workload_module
from toolchain.tune.rolling import rolled


def apply_records(fused_mod, kernels: list[tuple[object, object, float]], spec):
    """``fused_mod`` with each (PrimFunc, trace JSON, latency ms) of ``kernels`` applied to its kernels
    (MetaSchedule's ApplyDatabase over an in-memory database); others stay as they are."""
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    memory = ms.database.MemoryDatabase()
    for func, trace, latency_ms in kernels:
        sch = scheduled(func, trace)
        # the kernel unguarded: a block annotated not to be inlined (tune.inlining) would hash otherwise than the
        # model's kernel, and the record would never be found (its schedule is the same either way)
        workload = memory.commit_workload(workload_module(func, guard=False))
        memory.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, workload, [latency_ms / 1e3], spec.tvm(), ms.arg_info.ArgInfo.from_prim_func(func)
            )
        )
    with spec.tvm(), memory:
        return rolled(relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(fused_mod))
