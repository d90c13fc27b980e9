"""Static execution counts: re-computation, dropped iterations, the consumer's view, the postproc."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from host.bench.fit_weights import Calibration, extract
from toolchain.targets import resolve_target
from toolchain.tune.intrinsics import tune_context
from toolchain.tune.schedule_check import (
    dropped_blocks,
    execution_counts,
    format_counts,
    partial_weight_reads,
)
from toolchain.tune.space import RejectDroppedIterations

SPEC = resolve_target("host", layout="NCHW")  # the hand-made schedules below name NCHW blocks
ROOT = Path(__file__).resolve().parents[2]
M56 = (1, 3, 56, 56)  # MobileNet-V2 at 56: the stem leaves 28×28


def max_recompute(func) -> float:
    """The largest executed / needed over the blocks (1.0: nothing is computed twice)."""
    return max((c.ratio for c in execution_counts(func) if c.needed > 0), default=1.0)


def fused(anchor, nth, take, model="mobilenet-v2", shape=M56):
    return extract(Calibration("test", model, shape, anchor, nth, take), SPEC).func


@pytest.fixture(scope="module")
def pw_dw():
    """Block 3: pw 24→144 + bias + relu6 → pad → dw 3×3/1 (14×14) + bias + relu6."""
    return fused("class:pointwise_conv", 3, 8)


@pytest.fixture(scope="module")
def pw_dw_s2():
    """Block 2: pw 16→96 + relu6 at 28×28 → pad to 30×30 → dw 3×3/2 (14×14)."""
    return fused("class:pointwise_conv", 1, 8)


def schedule(func):
    import tvm
    from tvm import s_tir

    return s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))


def by_name(counts):
    return {c.name: c for c in counts}


def test_unscheduled_pw_dw_runs_every_block_exactly_once(pw_dw):
    counts = execution_counts(pw_dw)
    assert [c.name for c in counts] == [
        "pad_temp", "conv2d_nchw", "T_add", "T_maximum", "T_minimum",
        "pad_temp1", "group_conv2d_nchw", "T_add1", "T_maximum1", "T_minimum1",
    ]
    assert all(c.executed == c.needed == c.domain and c.ratio == 1.0 and c.exact for c in counts), format_counts(counts)
    conv = by_name(counts)["conv2d_nchw"]
    assert conv.domain == 144 * 14 * 14 * 24  # reduction iterations count too
    assert max_recompute(pw_dw) == 1.0 and dropped_blocks(pw_dw) == []


def test_stride2_padding_needs_only_what_the_conv_reads(pw_dw_s2):
    pad = by_name(execution_counts(pw_dw_s2))["pad_temp1"]
    assert pad.domain == 96 * 30 * 30
    assert pad.needed == 96 * 29 * 29  # rows/cols 0..28: the 3×3/2 window never reaches row 29
    assert pad.executed == pad.domain and not pad.dropped  # unscheduled: computes one spare row, drops nothing


def test_upstream_conv_under_a_spatial_dw_tile_is_recomputed(pw_dw):
    """AGO Fig. 5: tile the dw conv over rows and compute the pw conv per tile: the halo rows run twice."""
    sch = schedule(pw_dw)
    n, ff, yy, xx, *_ = sch.get_loops(sch.get_sblock("group_conv2d_nchw"))
    y_o, _ = sch.split(yy, factors=[7, 2])
    for name in ["pad_temp1", "T_minimum", "T_maximum", "T_add", "conv2d_nchw"]:
        sch.compute_at(sch.get_sblock(name), y_o, preserve_unit_loops=True)
    counts = by_name(execution_counts(sch.mod))
    # a 2-row tile needs rows 2t-1 .. 2t+2 of the pw output, clipped to 0..13: 3 + 5×4 + 3 = 26 rows of 14
    conv = counts["conv2d_nchw"]
    assert conv.needed == 144 * 14 * 14 * 24
    assert conv.executed == 144 * 26 * 14 * 24
    assert conv.ratio == pytest.approx(26 / 14)
    assert counts["T_minimum"].ratio == pytest.approx(26 / 14)
    assert max_recompute(sch.mod) == pytest.approx(26 / 14)
    assert dropped_blocks(sch.mod) == []  # wasteful, not wrong
    assert counts["group_conv2d_nchw"].ratio == 1.0


def _drop_the_halo(func):
    """The reuse_write pattern: the padding block (epilogue inlined) computed where the pw conv writes."""
    sch = schedule(func)
    for name in ["T_add", "T_maximum", "T_minimum"]:
        sch.compute_inline(sch.get_sblock(name))
    _, ff, *_ = sch.get_loops(sch.get_sblock("conv2d_nchw"))
    sch.reverse_compute_at(sch.get_sblock("pad_temp1"), ff, preserve_unit_loops=True)
    return sch


def test_padding_computed_at_the_producer_drops_the_halo(pw_dw):
    sch = _drop_the_halo(pw_dw)
    (bad,) = dropped_blocks(sch.mod)
    assert (bad.name, bad.executed, bad.needed) == ("pad_temp1", 144 * 14 * 14, 144 * 16 * 16)
    assert RejectDroppedIterations().apply(sch) is False
    assert RejectDroppedIterations().apply(schedule(pw_dw)) is True


def test_stride2_padding_under_a_channel_tile_is_not_flagged(pw_dw_s2):
    """Consumer's view: the padding block runs 29×29 of its 30×30 per channel, all that the dw conv reads."""
    sch = schedule(pw_dw_s2)
    _, ff, *_ = sch.get_loops(sch.get_sblock("group_conv2d_nchw"))
    sch.compute_at(sch.get_sblock("pad_temp1"), ff, preserve_unit_loops=True)
    pad = by_name(execution_counts(sch.mod))["pad_temp1"]
    assert pad.executed == pad.needed == 96 * 29 * 29 < pad.domain
    assert not pad.dropped and pad.ratio == 1.0
    assert RejectDroppedIterations().apply(sch) is True


def test_predicates_are_counted_exactly(pw_dw):
    """A non-dividing split adds a T.where: the counter enumerates it instead of trusting loop extents."""
    sch = schedule(pw_dw)
    _, _, _, xx = sch.get_loops(sch.get_sblock("T_minimum1"))
    sch.split(xx, factors=[None, 4])  # 14 = 4 × 4 with a predicate dropping 2
    out = by_name(execution_counts(sch.mod))["T_minimum1"]
    assert out.executed == out.needed == 144 * 14 * 14 and out.exact


def test_the_check_is_a_metaschedule_postproc():
    from tvm.s_tir.meta_schedule.postproc import Postproc

    check = RejectDroppedIterations()
    assert isinstance(check, Postproc)
    postprocs = Postproc.create("llvm") + [check]
    assert len(postprocs) == len(Postproc.create("llvm")) + 1
    assert isinstance(check.clone(), Postproc)


@pytest.mark.slow  # TuneContext imports tvm.s_tir.tensor_intrin (10-20 s), plus a fresh process
def test_the_stock_space_produces_the_reuse_write_bug_and_the_check_catches_it(pw_dw, tmp_path):
    """Default MetaSchedule space on pw→dw: MultiLevelTiling's reuse_write puts the dw padding block
    (epilogue inlined) under the pw tile, so the 1-pixel halo is never written (design §3).

    The kernel is really wrong: run first in a fresh process with glibc's malloc perturbation, its
    border outputs read garbage. The static check flags it without running anything.
    """
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    mod = tvm.IRModule({"main": pw_dw.with_attr("global_symbol", "main")})
    ctx = tune_context(mod=mod, target=SPEC.tvm(), space_generator="post-order-apply",
                       search_strategy="evolutionary", num_threads=1)
    spaces = ctx.space_generator.generate_design_space(mod)
    postprocs = ms.postproc.Postproc.create("llvm")
    for p in postprocs:
        p._initialize_with_tune_context(ctx)
    buggy = None
    flagged = 0
    for space in spaces:
        sch = s_tir.Schedule(mod, seed=1)
        space.trace.apply_to_schedule(sch, remove_postproc=True,
                                      decision_provider=lambda inst, inputs, attrs, decision: None)
        assert all(p.apply(sch) for p in postprocs)  # the stock postprocs accept it
        if not RejectDroppedIterations().apply(sch):
            flagged += 1
            bad = dropped_blocks(sch.mod)
            assert [c.name for c in bad] == ["pad_temp1"]
            assert bad[0].executed == 144 * 14 * 14 and bad[0].needed == 144 * 16 * 16
            buggy = buggy or sch
    assert flagged >= 1, f"none of {len(spaces)} stock design spaces has the reuse_write halo bug any more"

    (tmp_path / "ref.py").write_text(mod.script())
    (tmp_path / "bad.py").write_text(buggy.mod.script())
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from tvm.script import from_source
        from toolchain.tune.candidates import random_args, run
        from toolchain.targets import resolve_target
        ref, bad = (from_source(open(p).read()) for p in sys.argv[1:3])
        target = resolve_target("host").tvm()
        args = random_args(ref["main"], 0)
        got = run(bad, args, target)  # first: its padding buffer is a fresh, perturbed allocation
        want = run(ref, args, target)
        print(float(np.abs(got[-1] - want[-1]).max()))
    """)
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=33554432:glibc.malloc.perturb=129",
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ref.py"), str(tmp_path / "bad.py")],
                            capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout.strip().splitlines()[-1]) > 1e-3


def test_a_gathered_intermediate_is_needed_whole_and_its_schedules_are_analysed(layer_norm_take):
    """A gather's data-dependent index (BERT's [CLS] ``take``) may read any row of the normalised
    tensor: the checker needs that block's whole domain instead of failing on the index load, and
    the kernel's postprocessed schedules are analysed (none dropped) rather than left unchecked."""

    from toolchain import build
    from toolchain.tune.adapter import postprocess, space_for, workload_module

    fused, (name, _) = layer_norm_take
    func = build.mark_weights(fused)[name]
    counts = {c.name: c for c in execution_counts(func)}
    norm = counts["T_layer_norm"]
    assert norm.needed == norm.domain == 16 * 32 and norm.executed == norm.domain
    ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), rand_state=1,
                       space_generator=space_for(func, SPEC, False).generator, num_threads=1)
    spaces = [postprocess(sch, SPEC) for sch in ctx.generate_design_space()]
    assert spaces and None not in spaces
    assert all(dropped_blocks(sch.mod) == [] for sch in spaces)


def _split_bias(second: int, third: int, rewritten: bool = True):
    """A bias add inlined into a split into three (MobileViT's QKV kernel, in small), the bias read from
    MetaSchedule's rewritten copy (``rewritten``) or from the parameter itself; the second and third
    blocks read it at ``second`` and ``third`` (right: 2 and 4)."""
    from tvm.script import tirx as T

    if not rewritten:
        @T.prim_func(s_tir=True)
        def plain(x: T.Buffer((4, 6), "float32"), bias: T.Buffer((6,), "float32"), q: T.Buffer((4, 2), "float32"),
                  k: T.Buffer((4, 2), "float32"), v: T.Buffer((4, 2), "float32")):
            for i, j in T.grid(4, 2):
                with T.sblock("T_split"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    q[vi, vj] = x[vi, vj] + bias[vj]
            for i, j in T.grid(4, 2):
                with T.sblock("T_split_1"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    k[vi, vj] = x[vi, vj + 2] + bias[vj + second]
            for i, j in T.grid(4, 2):
                with T.sblock("T_split_2"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    v[vi, vj] = x[vi, vj + 4] + bias[vj + third]
        return plain

    @T.prim_func(s_tir=True)
    def scheduled(x: T.Buffer((4, 6), "float32"), bias: T.Buffer((6,), "float32"), q: T.Buffer((4, 2), "float32"),
                  k: T.Buffer((4, 2), "float32"), v: T.Buffer((4, 2), "float32")):
        T.func_attr({"layout_free_buffers": [1]})
        bias_global = T.sblock_alloc_buffer((6,))
        for i in range(6):
            with T.sblock("bias_global"):
                vi = T.axis.spatial(6, i)
                T.sblock_attr({"meta_schedule.layout_rewrite_preproc": True})
                bias_global[vi] = bias[vi]
        for i, j in T.grid(4, 2):
            with T.sblock("T_split"):
                vi, vj = T.axis.remap("SS", [i, j])
                q[vi, vj] = x[vi, vj] + bias_global[vj]
        for i, j in T.grid(4, 2):
            with T.sblock("T_split_1"):
                vi, vj = T.axis.remap("SS", [i, j])
                k[vi, vj] = x[vi, vj + 2] + bias_global[vj + second]
        for i, j in T.grid(4, 2):
            with T.sblock("T_split_2"):
                vi, vj = T.axis.remap("SS", [i, j])
                v[vi, vj] = x[vi, vj + 4] + bias_global[vj + third]
    return scheduled


def test_a_rewritten_bias_read_in_part_is_caught_statically():
    """TVM's miscompile of MobileViT's QKV kernel: the bias copied for the first split block's reads and
    read at ``bias[v]`` by all three. Every block runs exactly its domain, so only the weight's coverage
    shows it: the copy is written whole (0..5) and read at 0..1."""
    wrong = _split_bias(0, 0)
    assert dropped_blocks(wrong) == []
    [bad] = partial_weight_reads(wrong, _split_bias(2, 4, rewritten=False))
    assert (bad.weight, bad.copy, bad.written, bad.read) == ("bias", "bias_global", ((0, 5),), ((0, 1),))
    assert [b.read for b in partial_weight_reads(_split_bias(2, 2))] == [((0, 3),)]
    assert partial_weight_reads(_split_bias(2, 4)) == []


def test_a_weight_the_unscheduled_kernel_reads_in_part_is_not_judged():
    """The check compares with the unscheduled kernel when it has it: a weight that kernel reads only
    in part (here bias[0..3]) may be read in part after the rewrite too."""
    assert partial_weight_reads(_split_bias(2, 2), _split_bias(2, 2, rewritten=False)) == []
    assert partial_weight_reads(_split_bias(0, 0), _split_bias(2, 2, rewritten=False)) == []


def test_the_postproc_rejects_a_rewritten_weight_read_in_part():
    from tvm import s_tir

    check = RejectDroppedIterations(_split_bias(2, 4, rewritten=False))
    assert check.apply(s_tir.Schedule(_split_bias(2, 4))) is True
    assert check.apply(s_tir.Schedule(_split_bias(0, 0))) is False
    assert check.clone().apply(s_tir.Schedule(_split_bias(0, 0))) is False  # the clone keeps the original


def test_metaschedule_layout_rewrites_of_a_conv_and_a_matmul_are_read_whole():
    """What RewriteLayout really makes passes: a conv weight tiled into five dimensions, a matmul weight
    split by output channel (the design spaces of every kernel of two small models that has a weight)."""

    import models
    from toolchain import build, onnx_import
    from toolchain.tune.adapter import postprocess, space_for, workload_module
    from toolchain.tune.plan import group_kernels

    spec = resolve_target("host")
    checked = 0
    for model in (models.build("tiny-cnn"), models.build("tiny-transformer")):
        mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
        marked = build.mark_weights(build.fuse_stock(mod, spec))
        for name, func in group_kernels(marked):
            if not func.attrs or "layout_free_buffers" not in func.attrs:
                continue
            ctx = tune_context(mod=workload_module(func), target=spec.tvm(), rand_state=1,
                               space_generator=space_for(func, spec, False).generator, num_threads=1)
            for sch in ctx.generate_design_space():
                sch = postprocess(sch, spec)
                if sch is None or "layout_rewrite_preproc" not in sch.mod.script():
                    continue
                assert partial_weight_reads(sch.mod, func) == [], name
                checked += 1
    assert checked
