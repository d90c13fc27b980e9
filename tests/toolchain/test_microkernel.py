"""Register blocks of real kernels (toolchain/tune/microkernel.py): which kernels are matmul-like, the block's shape
per target, its numerics with the epilogue fused, and on ARM its hot loop read from the assembly (FMAs, no spills)."""

from types import SimpleNamespace

import numpy as np
import pytest

import models
from tests.toolchain.kernels import run_kernel
from toolchain import build, onnx_import
from toolchain.targets import resolve_target
from toolchain.tune import microkernel as mk
from toolchain.tune.adapter import as_built, postprocess
from toolchain.tune.plan import group_kernels
from toolchain.tune.race_check import parallel_races

HOST = resolve_target("host")
ARM = resolve_target("linux-arm64")
PW = "fused_conv2d_add_maximum_minimum"  # tiny-dwsep's expanding pointwise conv (+ bias, ReLU6)
DW = "fused_conv2d1_add_maximum_minimum"  # its depthwise conv


def _kernels(name: str, shape, spec=HOST) -> dict:
    model = models.build(name, shape)
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
    return dict(group_kernels(build.mark_weights(build.fuse_stock(mod, spec))))


def _run(func, target, seed: int = 0) -> list[np.ndarray]:
    return run_kernel(func, target, seed)


def test_pointwise_and_depthwise_convs_and_matmuls_are_blocked_spatial_convs_not():
    kernels = _kernels("tiny-dwsep", (1, 8, 12, 12))
    pw = mk.matmul_like(kernels[PW])
    assert pw is not None and pw.pointwise and pw.blocked and pw.channels == 32
    assert pw.flat and pw.width == 144  # its rows over every position
    assert not mk.matmul_like(kernels[DW]).flat
    assert pw.epilogue and all(not name.startswith("conv") for name in pw.epilogue)
    dw = mk.matmul_like(kernels[DW])  # its channel read by the data too, as its channel index alone
    assert dw is not None and dw.depthwise and dw.blocked and not dw.pointwise and dw.reduce[:2] == (3, 3)
    cnn = _kernels("tiny-cnn", (1, 3, 16, 16))
    stem = mk.matmul_like(cnn["fused_conv2d_add_relu_add1"])
    assert stem is not None and not stem.pointwise  # a 3×3 conv: the block leaves it (its padding)
    assert mk.register_block(cnn["fused_conv2d_add_relu_add1"], HOST.tvm())[0] is None
    dense = mk.matmul_like(cnn["fused_matmul_add2"])
    assert dense is not None and dense.pointwise and dense.width == 1


def test_the_block_divides_the_kernel_and_fits_the_registers():
    def kernel(width, channels):
        return mk.MatmulLike("C", (1, 1, width, channels), (1, 1, 64), (), ())

    avx512, neon = mk.UNITS["x86_64"], mk.UNITS["aarch64"]
    assert mk.choose_block(kernel(28, 96), avx512) == (7, 2, 16)  # 14 accumulators: 7 × 3 would take 1.3 KiB
    assert mk.choose_block(kernel(28, 24), avx512) == (7, 3, 8)  # 24 channels: half vectors (ymm)
    assert mk.choose_block(kernel(56, 96), neon) == (8, 3, 4)
    assert mk.choose_block(kernel(7, 6), neon) is None  # no 4-lane vector divides 6 channels
    assert mk.choose_block(kernel(28, 58), avx512) is None  # ShuffleNet's 58 channels: no 4-lane vector divides them
    assert mk.choose_block(kernel(28, 58), avx512, min_lanes=1) == (7, 1, 2)  # the last resort's narrow vectors
    assert mk.choose_block(kernel(13, 1024), avx512) == (1, 4, 16)  # a search's tiles divide: 13 is prime
    assert mk.choose_block(kernel(13, 1024), avx512, perfect=False) == (7, 2, 16)  # 13 of 14 rows used
    # a pointwise conv's rows run over every position: SqueezeNet's 13 × 13 classifier on AVX2 takes 6 rows (169 of
    # 174 used), its width of 13 alone gave 5 (13 of 15) and fewer accumulators; a depthwise conv's stay in a row
    squeeze = mk.MatmulLike("C", (1, 13, 13, 1024), (1, 1, 512), (), ())
    assert squeeze.width == 169 and mk.choose_block(squeeze, mk.UNITS["avx2"], perfect=False) == (6, 2, 8)
    assert mk.MatmulLike("C", (1, 13, 13, 1024), (3, 3), (), (), depthwise=True).width == 13
    # rows within an image row mask only at 2.5 times the accumulators: SqueezeNet's stem (111 wide, 3 channels in)
    # takes the dividing 3 × 2 on AVX2, not 6 × 2 with its last tile masked (that ran 2.3 times slower)
    stem = mk.MatmulLike("C", (1, 111, 111, 64), (3, 3, 3), (), ())
    assert not stem.flat and mk.choose_block(stem, mk.UNITS["avx2"], perfect=False) == (3, 2, 8)
    assert mk.choose_block(mk.MatmulLike("C", (1, 13, 13, 1024), (3, 3), (), (), depthwise=True), avx512,
                           perfect=False) == (7, 2, 16)  # 13 is prime: one row's 4 accumulators against 14
    rows, vectors, lanes = mk.choose_block(mk.MatmulLike("C", (1, 1000), (1280,), (), ()), avx512)
    assert (rows, lanes) == (1, 8) and vectors == 5  # a GEMV: as many independent chains as fit and divide
    for unit in (avx512, neon, mk.UNITS["avx2"]):
        for width, channels in ((56, 32), (14, 144), (4, 960), (1, 1000), (3, 40)):
            shape = mk.choose_block(kernel(width, channels), unit)
            if shape is not None:
                r, v, lanes_ = shape
                assert r * v + v + 1 <= unit.registers and width % r == 0 and channels % (v * lanes_) == 0
                assert r * v * lanes_ * 4 < mk.STACK_BYTES  # a stack array, not a workspace per tile


@pytest.mark.parametrize("shape", [(1, 8, 12, 12), (1, 8, 7, 5), (1, 8, 3, 13), (1, 8, 13, 13)])
@pytest.mark.parametrize("name", [PW, DW])
def test_the_blocked_kernel_computes_what_the_plain_one_does_without_a_race(shape, name):
    """The pointwise and the depthwise conv (its padding inlined) with bias and ReLU6 fused into the accumulators'
    write-back, the weight pre-packed by the postprocessors (as a compile stores it), at a width the rows divide,
    one (5) they divide only as 5 and one (13) whose last tile of rows is masked; the pointwise conv's rows over
    every position (13 × 13: 169, its last tile masked)."""
    func = _kernels("tiny-dwsep", shape)[name]
    sch, detail = mk.register_block(func, HOST.tvm())
    assert sch is not None and detail.count("×") == 2
    sch = postprocess(sch, HOST)
    assert sch is not None and parallel_races(sch.mod) == []
    assert "layout_rewrite_preproc" in sch.mod.script()  # the weight read as the block reads it
    blocked, plain = _run(sch.mod["main"], HOST.tvm()), _run(func, HOST.tvm())
    np.testing.assert_allclose(blocked[-1], plain[-1], rtol=1e-5, atol=1e-5)
    assert np.isfinite(blocked[-1]).all() and blocked[-1].max() <= 6.0  # the epilogue ran


def test_odd_channels_get_a_narrow_block_only_as_the_last_resort_and_compute_the_same():
    from tvm import te

    a, w = te.placeholder((28, 64), name="A"), te.placeholder((64, 58), name="W")
    k = te.reduce_axis((0, 64), name="k")
    func = te.create_prim_func([a, w, te.compute((28, 58), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="C")])
    assert mk.register_block(func, HOST.tvm())[0] is None
    sch, detail = mk.register_block(func, HOST.tvm(), spatial=True)
    assert detail.endswith("×2")
    out = _run(sch.mod["main"], HOST.tvm())
    np.testing.assert_allclose(out[-1], out[0] @ out[1], rtol=1e-4, atol=1e-4)


def test_a_gemv_is_blocked_and_computes_the_same():
    """A classifier's shape: one row, the reduction long, few outputs."""
    from tvm import te

    a, w = te.placeholder((1, 256), name="A"), te.placeholder((256, 40), name="W")
    k = te.reduce_axis((0, 256), name="k")
    c = te.compute((1, 40), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="C")
    func = te.create_prim_func([a, w, c])
    assert mk.matmul_like(func) is not None
    sch, detail = mk.register_block(func, HOST.tvm())
    assert detail.startswith("1×")
    blocked = _run(sch.mod["main"], HOST.tvm())
    np.testing.assert_allclose(blocked[-1], blocked[0] @ blocked[1], rtol=1e-4, atol=1e-4)


def test_on_arm_the_blocked_pointwise_conv_is_fmas_without_spills():
    """An expanding 1×1 conv of MobileNet-V2's shapes (24 → 96 channels at 28×28), built for linux-arm64 (never run
    here): its hottest innermost loop holds the block's vector FMAs and no stack traffic."""
    import tvm

    from toolchain import asm

    model_kernels = _kernels("tiny-dwsep", (1, 24, 28, 28), ARM)
    func = model_kernels[PW]
    kernel = mk.matmul_like(func)
    rows, vectors, lanes = mk.choose_block(kernel, mk.unit_of(ARM.tvm()))
    assert lanes == 4 and rows * vectors >= 12
    sch = postprocess(mk.register_block(func, ARM.tvm())[0], ARM)
    loop = asm.hottest(asm.innermost_loops(asm.assembly(as_built(sch.mod)["main"], ARM.tvm(), "main"), "aarch64"))
    assert loop is not None and loop.spills == 0, loop
    assert loop.fmas >= rows * vectors, loop
    assert tvm.target.Target(ARM.tvm()).attrs["mtriple"].startswith("aarch64")


@pytest.mark.parametrize("spec", [HOST, ARM], ids=["host", "arm"])
@pytest.mark.parametrize("name", [PW, DW])
def test_a_blocked_conv_allocates_no_workspace_per_tile(spec, name):
    """The accumulators of every tile are a stack array (LLVM keeps them in registers), not a heap workspace that
    TVM allocates and frees in each parallel tile: that cost a depthwise conv 2–3× its time."""
    from toolchain import asm

    func = _kernels("tiny-dwsep", (1, 48, 28, 28), spec)[name]
    sch = postprocess(mk.register_block(func, spec.tvm())[0], spec)
    assert "TVMBackendAllocWorkspace" not in asm.assembly(as_built(sch.mod)["main"], spec.tvm(), "main")


def test_the_search_space_of_a_pointwise_conv_holds_its_block_whose_tiles_a_search_varies():
    """The block beside the stock space; its trace replays with other rows and vectors (as the search's mutator
    draws them: a row tile of 1 too) and computes the same."""
    from tvm import s_tir

    from toolchain.tune import intrinsics
    from toolchain.tune.adapter import workload_module
    from toolchain.tune.space import make_space_generator

    func = _kernels("tiny-dwsep", (1, 8, 12, 12))[PW]
    choice = make_space_generator(func, HOST.tvm())
    assert choice.kind == "block+default" and "register block" in choice.reason
    ctx = intrinsics.tune_context(mod=workload_module(func), target=HOST.tvm(), space_generator=choice.generator,
                                  rand_state=1, num_threads=1)
    designs = ctx.generate_design_space()
    assert len(designs) >= 2
    trace = designs[0].trace
    tiles = [inst for inst in trace.insts if inst.kind.name == "SamplePerfectTile"]
    assert len(tiles) == 2  # the rows and the vectors
    plain = _run(func, HOST.tvm())[-1]
    for rows, vectors in ((1, 1), (12, 2), (3, 1)):
        other = trace.with_decision(tiles[0], [12 // rows, rows], True).with_decision(tiles[1], [2 // vectors, vectors],
                                                                                      True)
        sch = s_tir.Schedule(workload_module(func))
        other.apply_to_schedule(sch, remove_postproc=True)
        np.testing.assert_allclose(_run(sch.mod["main"], HOST.tvm())[-1], plain, rtol=1e-5, atol=1e-5)


def test_a_spatial_convs_search_space_and_first_seed_hold_its_block(monkeypatch):
    """tiny-cnn's 3×3 conv (3 → 8 channels, 16 wide): the block beside the stock space, replaying with another row
    tile and computing the same; and the block a new task is seeded with (a trial like any seed)."""
    from tvm import s_tir

    from toolchain.tune import compose, intrinsics
    from toolchain.tune.adapter import workload_module
    from toolchain.tune.settings import TuneSettings
    from toolchain.tune.space import make_space_generator

    func = _kernels("tiny-cnn", (1, 3, 16, 16))["fused_conv2d_add_relu_add1"]
    choice = make_space_generator(func, HOST.tvm())
    assert choice.kind == "block+default" and "register block" in choice.reason
    ctx = intrinsics.tune_context(mod=workload_module(func), target=HOST.tvm(), space_generator=choice.generator,
                                  rand_state=1, num_threads=1)
    trace = ctx.generate_design_space()[0].trace
    rows = next(inst for inst in trace.insts if inst.kind.name == "SamplePerfectTile")
    plain = _run(func, HOST.tvm())[-1]
    sch = s_tir.Schedule(workload_module(func))
    trace.with_decision(rows, [16, 1], True).apply_to_schedule(sch, remove_postproc=True)
    np.testing.assert_allclose(_run(sch.mod["main"], HOST.tvm())[-1], plain, rtol=1e-5, atol=1e-5)
    committed = []
    monkeypatch.setattr(compose, "commit_seed", lambda sch, *a: committed.append(sch) or True)
    task, plan = SimpleNamespace(name="conv"), SimpleNamespace(funcs={"conv": func})
    assert compose.seed_from_block(task, plan, None, HOST, {}, TuneSettings()) == "8×1×8" and len(committed) == 1


def test_an_epilogue_over_another_domain_stays_in_bounds_and_the_static_check_sees_what_fusing_it_would_write():
    """SqueezeNet's classifier: a conv padded to 1008 output channels, sliced to 1000, then ReLU. TVM lets the
    ReLU be inlined into the accumulators' write-back over the padded tile and writes past the output's end (the
    model then gave 1e23): the static check reports such writes; the block computes the slice and what follows it
    within bounds, and the same — the slice and a bias added after it inlined into the ReLU that reads them, which
    runs in the block's tile from its accumulators where one tile holds every channel (below: 16)."""
    from tvm import s_tir, te

    from toolchain.tune.schedule_check import out_of_bounds_writes

    a, w = te.placeholder((4, 8), name="A"), te.placeholder((8, 16), name="W")
    k = te.reduce_axis((0, 8), name="k")
    c = te.compute((4, 16), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="C")
    sliced = te.compute((4, 12), lambda i, j: c[i, j], name="S")
    relu = te.compute((4, 12), lambda i, j: te.max(sliced[i, j], 0.0), name="R")
    func = te.create_prim_func([a, w, relu])
    forced = mk.MatmulLike("C", (4, 16), (8,), (), ("S", "R"))
    sch = mk.block_kernel(s_tir.Schedule(mk.own_module(func)), forced, 4, 1, 4)
    (bad,) = out_of_bounds_writes(sch.mod)
    assert bad.buffer == "R" and bad.written[1] == (0, 15) and bad.shape == (4, 12)
    bias = te.placeholder((12,), name="bias")
    added = te.compute((4, 12), lambda i, j: sliced[i, j] + bias[j], name="B")
    func = te.create_prim_func([a, w, bias, te.compute((4, 12), lambda i, j: te.max(added[i, j], 0.0), name="R")])
    kernel = mk.matmul_like(func)
    assert kernel.epilogue == () and kernel.rest == ("S", "B", "R")
    sch, _ = mk.register_block(func, HOST.tvm())
    assert out_of_bounds_writes(sch.mod) == [] and parallel_races(sch.mod) == []
    left = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert "R" in left and not left & {"S", "B"}
    assert _one_parallel_nest(sch)  # R in the tile: the padded product never written
    blocked = _run(sch.mod["main"], HOST.tvm())
    expected = np.maximum((blocked[0] @ blocked[1])[:, :12] + blocked[2], 0)
    np.testing.assert_allclose(blocked[-1], expected, rtol=1e-5, atol=1e-5)
    assert out_of_bounds_writes(mk.register_block(_kernels("tiny-dwsep", (1, 8, 12, 12))[PW], HOST.tvm())[0].mod) == []


def _one_parallel_nest(sch) -> bool:
    """Whether every block of the scheduled kernel runs inside one parallel loop (no pass of its own after it)."""
    from tvm import tirx

    body = sch.get(sch.get_sblock("root")).body
    return isinstance(body, tirx.For) and body.kind == tirx.ForKind.PARALLEL


@pytest.mark.parametrize("positions", [(8, 14), (13, 13)])
def test_a_narrow_convs_padded_channels_are_sliced_off_in_the_blocks_tile(positions):
    """A 1×1 conv of 1.5 vectors of the host's output channels (AVX-512: 24) is legalized to whole vectors (32), then
    sliced back, biased and activated (toolchain/padding.py): the block computes the real channels from its
    accumulators in its own tile, in vectors, at a width its rows divide and one whose last rows are masked — one
    parallel nest, no race, the same result as the plain kernel."""
    from tvm import tirx

    from models.builder import GraphBuilder
    from toolchain import padding

    lanes = build.fp_lanes(HOST)
    channels = lanes * 3 // 2
    g = GraphBuilder("narrow-pw", seed=2)
    y = g.conv(g.input("input", (1, 16, *positions)), 16, channels, 1, name="output", act="relu6")
    model = g.finish(y, (1, channels, *positions))
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), HOST)
    assert [(d["channels"], d["padded"]) for d in padding.applied_ops(mod)] == [(channels, 2 * lanes)]
    (func,) = [f for name, f in group_kernels(build.mark_weights(build.fuse_stock(mod, HOST))) if "conv2d" in name]
    sch, detail = mk.register_block(func, HOST.tvm())
    assert detail.endswith(f"×2×{lanes}") and _one_parallel_nest(sch)
    *_, last = sch.get_loops(sch.get_sblock("T_minimum"))  # the ReLU6 after the slice: its channels in vectors
    assert sch.get(last).kind == tirx.ForKind.VECTORIZED
    sch = postprocess(sch, HOST)
    assert sch is not None and parallel_races(sch.mod) == []
    blocked, plain = _run(sch.mod["main"], HOST.tvm()), _run(func, HOST.tvm())
    np.testing.assert_allclose(blocked[-1], plain[-1], rtol=1e-5, atol=1e-5)


def test_a_channel_shuffle_after_the_block_is_inlined_into_the_outputs_it_writes():
    """ShuffleNet's branch-closing conv: its output sliced to its channels, concatenated with the other branch,
    shuffled (reshape, transpose, reshape) and split in two — blocks that only move values, each a pass of its own
    reading and writing the whole tensor again (the kernel 1.2–2× slower): inlined, one pass per output remains."""
    from tvm import te

    from toolchain.tune.schedule_check import out_of_bounds_writes

    a, w = te.placeholder((1, 4, 4, 8), name="A"), te.placeholder((8, 8), name="W")
    other = te.placeholder((1, 4, 4, 6), name="Y")
    k = te.reduce_axis((0, 8), name="k")
    conv = te.compute((1, 4, 4, 8), lambda n, h, x, f: te.sum(a[n, h, x, k] * w[k, f], axis=k), name="C")
    relu = te.compute((1, 4, 4, 8), lambda *i: te.max(conv(*i), 0.0), name="R")
    sliced = te.compute((1, 4, 4, 6), lambda *i: relu(*i), name="S")
    cat = te.compute((1, 4, 4, 12), lambda n, h, x, c: te.if_then_else(c < 6, other[n, h, x, c],
                                                                         sliced[n, h, x, te.max(c - 6, 0)]), name="cat")
    grouped = te.compute((1, 4, 4, 2, 6), lambda n, h, x, g, c: cat[n, h, x, g * 6 + c], name="reshape")
    swapped = te.compute((1, 4, 4, 6, 2), lambda n, h, x, c, g: grouped[n, h, x, g, c], name="transpose")
    flat = te.compute((1, 4, 4, 12), lambda n, h, x, c: swapped[n, h, x, c // 2, c % 2], name="reshape1")
    first = te.compute((1, 4, 4, 6), lambda n, h, x, c: flat[n, h, x, c], name="split0")
    second = te.compute((1, 4, 4, 6), lambda n, h, x, c: flat[n, h, x, c + 6], name="split1")
    func = te.create_prim_func([a, w, other, first, second])
    kernel = mk.matmul_like(func)
    assert kernel is not None and kernel.rest == ("S", "cat", "reshape", "transpose", "reshape1", "split0", "split1")
    sch, _ = mk.register_block(func, HOST.tvm())
    blocks = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    assert {"split0", "split1"} <= blocks and not blocks & {"S", "cat", "reshape", "transpose", "reshape1"}
    assert out_of_bounds_writes(sch.mod) == [] and parallel_races(sch.mod) == []
    out = _run(sch.mod["main"], HOST.tvm())
    shuffled = np.concatenate([out[2], np.maximum(out[0] @ out[1], 0)[..., :6]], axis=-1)
    shuffled = shuffled.reshape(1, 4, 4, 2, 6).transpose(0, 1, 2, 4, 3).reshape(1, 4, 4, 12)
    np.testing.assert_allclose(out[3], shuffled[..., :6], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[4], shuffled[..., 6:], rtol=1e-5, atol=1e-5)


def test_a_concatenation_feeding_a_pointwise_conv_is_copied_once_before_the_block():
    """A concatenation (two loads selected by the channel) moves values only: a parallel pass of its own before
    the block (inlined, its select would sit in every load of the block: a third of the speed)."""
    from tvm import te

    x, y = te.placeholder((1, 4, 4, 8), name="X"), te.placeholder((1, 4, 4, 8), name="Y")
    cat = te.compute((1, 4, 4, 16), lambda n, h, w, c: te.if_then_else(c < 8, x[n, h, w, c],
                                                                        y[n, h, w, te.max(c - 8, 0)]), name="cat")
    weight = te.placeholder((16, 32), name="Wt")
    r = te.reduce_axis((0, 16), name="r")
    conv = te.compute((1, 4, 4, 32), lambda n, h, w, f: te.sum(cat[n, h, w, r] * weight[r, f], axis=r), name="conv")
    func = te.create_prim_func([x, y, weight, conv])
    kernel = mk.matmul_like(func)
    assert kernel is not None and kernel.producers == kernel.gathers == ("cat",) and kernel.pointwise
    sch, _ = mk.register_block(func, HOST.tvm())
    out = _run(sch.mod["main"], HOST.tvm())
    expect = np.concatenate([out[0], out[1]], axis=-1) @ out[2]
    np.testing.assert_allclose(out[-1], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", [HOST, ARM], ids=["host", "arm"])
def test_a_concatenation_read_along_the_reduction_is_read_in_pieces_with_no_copy(spec):
    """A concatenation of unequal inputs (16 + 32 + 16 channels, as Relax legalizes one: a select by the channel
    among loads at the channel less the input's offset) behind a padding of none: the reduction split into pieces of
    16 channels, each within one input, and the concatenation inlined — no copy of it left; the same result."""
    from tvm import te, tirx

    sizes, offsets = (16, 32, 16), (0, 16, 48)
    xs = [te.placeholder((1, 5, 6, c), name=f"X{i}") for i, c in enumerate(sizes)]

    def select(n, h, w, c):
        value = xs[0][n, h, w, c]
        for x, at in zip(xs[1:], offsets[1:]):
            value = tirx.if_then_else(tirx.const(at, "int32") <= c, x[n, h, w, c - at], value)
        return value

    cat = te.compute((1, 5, 6, 64), select, name="T_concat")
    pad = te.compute((1, 5, 6, 64), lambda n, h, w, c: cat[n, h, w, c], name="pad_temp")
    weight = te.placeholder((64, 32), name="Wt")
    r = te.reduce_axis((0, 64), name="r")
    conv = te.compute((1, 5, 6, 32), lambda n, h, w, f: te.sum(pad[n, h, w, r] * weight[r, f], axis=r), name="conv")
    func = te.create_prim_func([*xs, weight, conv])
    kernel = mk.matmul_like(func)
    assert kernel is not None and kernel.pieces == ("T_concat", 16)
    sch, _ = mk.register_block(func, spec.tvm())
    assert "T_concat" not in sch.mod.script() and sch.mod.script().count("T.parallel") == 1
    if spec is HOST:
        out = _run(sch.mod["main"], spec.tvm())
        np.testing.assert_allclose(out[-1], np.concatenate(out[:3], axis=-1) @ out[3], rtol=1e-4, atol=1e-4)


def test_pooling_windows_are_blocked_like_depthwise_convs_and_compute_the_same():
    """Max pools (padding of -inf inlined) and the global mean: the data alone, a vector of outputs reading a vector
    of inputs; the big global window is not unrolled."""
    kernels = _kernels("squeezenet-1.1", (1, 3, 64, 64))
    pools = {name: f for name, f in kernels.items() if "pool" in name or "mean" in name}
    assert pools
    for name, func in pools.items():
        kernel = mk.matmul_like(func)
        assert kernel is not None and kernel.depthwise and kernel.blocked, name
        sch = postprocess(mk.register_block(func, HOST.tvm())[0], HOST)
        assert sch is not None and parallel_races(sch.mod) == []
        np.testing.assert_allclose(_run(sch.mod["main"], HOST.tvm())[-1], _run(func, HOST.tvm())[-1], rtol=1e-5,
                                   atol=1e-5)


def test_attention_batch_matmuls_of_two_activations_are_blocked_the_transposed_one_copied_once():
    """Attention's Q·Kᵀ / √d (K transposed by a copy before it) and softmax · V, per head: the second operand reads
    the head axes too (an activation, not a weight). Both are register-blocked; the transpose feeding the vectors is
    a pass of its own (read in place it would be a strided load per lane), Q's is inlined; both compute the same."""
    from tvm import te

    heads, seq, dim = 2, 24, 32
    q, k = te.placeholder((1, heads, seq, dim), name="Q"), te.placeholder((1, heads, seq, dim), name="K")
    kt = te.compute((1, heads, dim, seq), lambda b, h, d, s: k[b, h, s, d], name="KT")
    qc = te.compute((1, heads, seq, dim), lambda b, h, s, d: q[b, h, s, d], name="QC")
    r = te.reduce_axis((0, dim), name="r")
    score = te.compute((1, heads, seq, seq), lambda b, h, i, j: te.sum(qc[b, h, i, r] * kt[b, h, r, j], axis=r),
                       name="S")
    scaled = te.compute((1, heads, seq, seq), lambda b, h, i, j: score[b, h, i, j] / 8.0, name="D")
    func = te.create_prim_func([q, k, scaled])
    kernel = mk.matmul_like(func)
    assert kernel is not None and kernel.pointwise and kernel.epilogue == ("D",)
    assert kernel.gathers == ("KT",) and set(kernel.producers) == {"KT", "QC"}
    sch, detail = mk.register_block(func, HOST.tvm())
    assert sch is not None and parallel_races(sch.mod) == []
    out = _run(sch.mod["main"], HOST.tvm())
    np.testing.assert_allclose(out[-1], out[0] @ out[1].transpose(0, 1, 3, 2) / 8.0, rtol=1e-4, atol=1e-4)

    p, v = te.placeholder((1, heads, seq, seq), name="P"), te.placeholder((1, heads, seq, dim), name="V")
    s = te.reduce_axis((0, seq), name="s")
    av = te.compute((1, heads, seq, dim), lambda b, h, i, d: te.sum(p[b, h, i, s] * v[b, h, s, d], axis=s), name="O")
    func = te.create_prim_func([p, v, av])
    kernel = mk.matmul_like(func)
    assert kernel is not None and kernel.gathers == () and kernel.width == seq and kernel.channels == dim
    sch, _ = mk.register_block(func, HOST.tvm())
    out = _run(postprocess(sch, HOST).mod["main"], HOST.tvm())
    np.testing.assert_allclose(out[-1], out[0] @ out[1], rtol=1e-4, atol=1e-4)
    assert mk.matmul_like(te.create_prim_func([p, v, te.compute(
        (1, heads, seq, dim), lambda b, h, i, d: te.sum(p[b, h, i, s] * v[b, h, i, d], axis=s), name="O")])) is None


def test_late_pointwise_convs_run_their_channel_tiles_outermost_early_ones_their_positions():
    """Few positions, large weights (a late 1×1 conv, GEMV-like): each weight tile read once, the small data re-read;
    many positions, small weights: as before. Depthwise convs and batch matmuls' second activation: as before."""
    avx2 = mk.UNITS["avx2"]

    def outer(spatial, reduce, **kw):
        kernel = mk.MatmulLike("C", spatial, reduce, (), (), **kw)
        return mk.channels_outer(kernel, *mk.choose_block(kernel, avx2))

    assert outer((1, 4, 4, 1280), (1, 1, 320))  # MobileNet-V2 @112's last 1×1 conv: 1.6 MB of weights
    assert outer((1, 13, 13, 1000), (1, 1, 512))  # SqueezeNet's classifier conv
    assert not outer((1, 56, 56, 96), (1, 1, 16))  # an early expansion: 6 KiB of weights stay in L1
    assert not outer((1, 4, 4, 1280), (3, 3, 1), depthwise=True)
    assert not outer((1, 4, 4, 1280), (1, 1, 320), shared=False)
    assert not outer((1, 1280), (320,))  # one row: nothing to order


def test_a_block_with_its_channel_tiles_outermost_computes_the_same():
    from tvm import te

    a, w = te.placeholder((4, 4, 256), name="A"), te.placeholder((256, 512), name="W")
    k = te.reduce_axis((0, 256), name="k")
    c = te.compute((4, 4, 512), lambda h, x, j: te.sum(a[h, x, k] * w[k, j], axis=k), name="C")
    func = te.create_prim_func([a, w, c])
    kernel = mk.matmul_like(func)
    shape = mk.choose_block(kernel, mk.unit_of(HOST.tvm()), perfect=False)
    assert kernel.shared and mk.channels_outer(kernel, *shape)
    sch, _ = mk.register_block(func, HOST.tvm())
    fused = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("C_init"))][0]
    # parallel, the channel tiles first (the block's ax1 once its positions are fused into ax0)
    assert fused.kind == 1 and fused.loop_var.name.startswith("ax1")
    assert parallel_races(sch.mod) == []
    out = _run(sch.mod["main"], HOST.tvm())
    np.testing.assert_allclose(out[-1], np.einsum("hxk,kj->hxj", out[0], out[1]), rtol=1e-4, atol=1e-4)
