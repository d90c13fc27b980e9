"""CUDA source from TVM: one kernel per stitched group, __shared__ intermediates, kernel counts vs stock;
PTX with nvcc."""

from __future__ import annotations

import re

import pytest

from toolchain.cuda import codegen

from .conftest import compiled, require_nvcc


def _stitched_kernels(c):
    names = codegen._call_order(c.fused.mod)
    return {name for name, g in zip(names, c.plan.groups) if g.stitched}


@pytest.mark.parametrize("graph", ["layernorm", "bert-tiny-block"])
def test_one_kernel_per_stitched_group_with_shared_memory(graph):
    _, c = compiled(graph)
    build = c.fused_build
    stitched = _stitched_kernels(c)
    assert stitched
    bodies = codegen._kernel_bodies(build.source)
    for func in stitched:
        assert c.fused.schedules[func] == "stitched"
        kernels = [k for k in bodies if codegen.kernel_owner(k, build.calls) == func]
        assert len(kernels) == 1, (func, kernels)
        body = bodies[kernels[0]]
        assert "__shared__" in body and "__syncthreads()" in body
        assert re.search(r"__launch_bounds__\(\d+\) " + re.escape(kernels[0]), build.source)


def test_kernel_counts_bert_block_fused_below_stock():
    _, c = compiled("bert-tiny-block")
    assert c.fused_build.launches < c.stock_build.launches
    assert c.fused_build.kernel_count <= c.stock_build.kernel_count


def test_kernel_counts_mobilenet_block_fused_below_stock():
    _, c = compiled("mobilenet-v2-block")
    assert c.fused_build.launches < c.stock_build.launches
    assert any(g.stitched for g in c.plan.groups)  # BatchNorm statistics + normalisation, rows = channels


@pytest.mark.slow
def test_kernel_counts_bert_tiny_training_step():
    _, c = compiled("bert-tiny")
    assert c.fused_build.launches < c.stock_build.launches


def test_arch_is_checked():
    from toolchain.errors import TargetError

    assert codegen.cuda_target("sm_80").tvm_target == {"kind": "cuda", "arch": "sm_80"}
    with pytest.raises(TargetError):
        codegen.cuda_target("ampere")


def test_ptx_with_nvcc(tmp_path):
    nvcc = require_nvcc()
    _, c = compiled("layernorm")
    src = tmp_path / "k.cu"
    src.write_text(c.fused_build.source)
    ptx = codegen.nvcc_compile(src, "sm_90", tmp_path / "k.ptx", "ptx", nvcc=nvcc)
    entries = codegen.ptx_entries(ptx.read_text())
    assert len(entries) == c.fused_build.kernel_count
    assert any(".shared" in line for line in ptx.read_text().splitlines())
    cubin = codegen.nvcc_compile(src, "sm_90", tmp_path / "k.cubin", "cubin", nvcc=nvcc)
    assert cubin.stat().st_size > 0


def test_feedback_splits_a_matmul_group_dlight_matmul_does_not_take():
    """BERT-tiny's weight-gradient matmuls merged with their bias gradients fell to GeneralReduction
    (2.5x slower on an H200): code generation hands such a group back, split."""
    _, c = compiled("bert-tiny")
    names = codegen._call_order(c.fused.mod)
    for name, group in zip(names, c.plan.groups):
        if group.label in codegen.TILED_LABELS and len(group.members) > 1:
            assert c.fused.schedules[name] == "Matmul", name
    split = [d for d in c.plan.decisions if d.rule == "feedback" and "not Matmul" in d.reason]
    assert len(split) >= 3
    assert c.fused_build.launches < compiled("bert-tiny")[1].stock_build.launches  # still fewer than stock


def test_feedback_peels_reductions_that_fallback_runs_serially():
    """A MobileNet-V2 block's ReLU6 backward merged with a BatchNorm gradient's per-channel sum (784
    elements each) fell to Fallback: one thread per channel (297 us on an H200, the sum alone 6 us).
    The sum leaves the group; the element-wise rest stays one kernel."""
    _, c = compiled("mobilenet-v2-block")
    peeled = [d for d in c.plan.decisions if d.rule == "feedback" and "peeled" in d.reason]
    assert peeled and any("784 elements" in d.reason for d in peeled)
    members = {m: g for g in c.plan.groups for m in g.members}
    for d in peeled:
        assert all(len(members[r].members) == 1 for r in d.producer)  # each reduction alone
        assert len({id(members[m]) for m in d.consumer}) == 1  # the rest: one group
    names = codegen._call_order(c.fused.mod)
    for name, group in zip(names, c.plan.groups):
        if group.label == "reduction" and len(group.members) > 1 and c.fused.schedules[name] == "Fallback":
            assert codegen.reduction_length(c.fused.mod[name]) < codegen.SERIAL_REDUCTION_MOST, name
    _, tiny = compiled("bert-tiny")  # peeling its bias gradients keeps it below stock's launches
    assert tiny.fused_build.launches < tiny.stock_build.launches


def test_the_loss_takes_no_producers_so_softmax_backward_stitches():
    """The MSE loss (a reduction to one element) joining its element-wise producers had swallowed the
    softmax backward's dy * y, so the row sum stood alone: 7 launches. Now one stitched group holds
    the forward softmax, dy, dy * y and the row sum."""
    _, c = compiled("softmax")
    assert any("reduction to one element" in d.reason for d in c.plan.decisions if not d.merged)
    assert c.fused_build.launches <= 4
    stitched = [g for g in c.plan.groups if g.form is not None]
    assert any(len(g.members) > 5 for g in stitched)
