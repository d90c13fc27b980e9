"""A training step's loss: its gradient seed is not a folded constant, and its full reduction is one kernel."""

from __future__ import annotations

import numpy as np

from toolchain.cuda import codegen, numerics, training
from toolchain.cuda import compile as cuda_compile

from .conftest import compiled


def _constants(mod) -> list[np.ndarray]:
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.value.numpy())
                                    if type(e).__name__ == "GenericConst" else None)
    return found


def test_a_folded_uniform_constant_becomes_a_broadcast_again():
    from toolchain.build import legalize as plain_legalize

    g = training.builtin("bias-gelu")  # MSE over 128 x 512: the seed, folded, was a 65,536-element constant
    folded = plain_legalize(g.mod, cuda_compile._HostSpec())
    assert max(c.size for c in _constants(folded)) == 128 * 512
    expanded = cuda_compile.legalize(g.mod)
    assert max(c.size for c in _constants(expanded)) <= cuda_compile.UNIFORM_CONSTANT_LIMIT
    args = g.sample_args(0)
    for got, want in zip(numerics.run(expanded, args), numerics.run(folded, args)):
        np.testing.assert_array_equal(got, want)


def test_a_non_uniform_constant_stays():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 128), "float32"))
    table = np.arange(64 * 128, dtype="float32").reshape(64, 128)
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(x, relax.const(table))))
        bb.emit_func_output(out)
    mod = cuda_compile.legalize(bb.get())
    assert any(c.size == table.size for c in _constants(mod))


def test_stock_loss_mean_is_one_kernel_not_a_host_loop_of_launches():
    _, c = compiled("layernorm")
    # dlight's GeneralReduction put the loss mean's kernel in a host loop: 16,384 launches per step
    assert any("GeneralReduction on mean1 rejected" in n and "16384 launches" in n for n in c.stock.notes)
    assert c.stock.schedules["mean1"] == "FullReduction"
    for sched in (c.stock, c.fused):
        for gv, func in sched.mod.functions.items():
            if type(func).__name__ == "PrimFunc":
                assert codegen.host_launches(func.body) <= 1, gv.name_hint


def test_full_reduction_is_cross_thread_and_two_stage_when_large():
    # 1024 x 128 = 131,072 elements > FullReduction.one_block_most: partial sums per thread block first
    g = training.subgraph("layernorm", rows=1024, hidden=128, sizes="test")
    c = cuda_compile.compile_graph(cuda_compile.Graph(g.name, g.mod, True, g.description), codegen.cuda_target("sm_90"))
    small = compiled("layernorm")[1]
    assert c.fused_build.launches == small.fused_build.launches + 1  # the partial sums' kernel
    loss = next(f for f, rule in c.fused.schedules.items() if rule == "FullReduction")
    bodies = codegen._kernel_bodies(c.fused_build.source)
    mine = [b for k, b in bodies.items() if codegen.kernel_owner(k, c.fused_build.calls) == loss]
    assert any("_rf" in b and "threadIdx.x" in b for b in mine)  # partial sums, per thread
    assert any("red_buf" in b or "__shfl" in b for b in mine)  # the cross-thread reduction
    args = g.sample_args(0)
    assert numerics.check_fused_llvm(c.legalized, c.plan, args).ok()
