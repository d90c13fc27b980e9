"""Row blocks (toolchain/tune/rowblock.py): which fused kernels they take and with what row tile, their numerics (a
pw → dw pair at both strides, an inverted residual with its narrow project conv's slice and residual add), one parallel
nest with no race, and an untuned build keeping a large pair as one kernel."""

import numpy as np
import pytest

from models.builder import GraphBuilder
from tests.toolchain.kernels import run_kernel
from toolchain import build, onnx_import
from toolchain.fusion import fuse_groups
from toolchain.opgraph import op_graph
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.tune import rowblock
from toolchain.tune.adapter import passes_static_checks, postprocess
from toolchain.tune.plan import group_kernels
from toolchain.tune.race_check import parallel_races

HOST = resolve_target("host")
ARM = resolve_target("linux-arm64")
CORES = 2  # the row tiles are counted for this many cores whatever the machine


def _model(kind: str, size: int, channels: int = 16, stride: int = 2):
    """pw → dw (``stride``) or an inverted residual (pw → dw → pw + the input), ``channels`` in and out, at
    ``size`` × ``size``; the ONNX model and its output shape."""
    g = GraphBuilder(f"row-{kind}", seed=3)
    x = g.input("input", (1, channels, size, size))
    mid = 4 * channels
    h = g.conv(x, channels, mid, 1, name="expand", act="relu6")
    h = g.conv(h, mid, mid, 3, name="dw", groups=mid, stride=stride, act="relu6")
    out = size // stride
    if kind == "pair":
        return g.finish(h, (1, mid, out, out)), (1, mid, out, out)
    y = g.add(g.conv(h, mid, channels, 1, name="project"), x, name="output")
    return g.finish(y, (1, channels, out, out)), (1, channels, out, out)


def _kernel(model, spec=HOST):
    """The model's ops but its first and last (the NCHW ↔ NHWC transposes) fused into one PrimFunc, weights marked as
    a build marks them."""
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
    first, *ops, last = [n.id for n in op_graph(mod).nodes]
    fused = build.mark_weights(fuse_groups(mod, [[first], ops, [last]], spec))
    return next(f for name, f in group_kernels(fused) if "conv2d" in name)


@pytest.mark.parametrize(("kind", "size", "stride", "rows"), [("pair", 28, 2, 7), ("pair", 30, 1, 15),
                                                              ("chain", 28, 1, 14)])
def test_the_row_blocks_compute_what_the_plain_kernel_does_in_one_parallel_nest(kind, size, stride, rows):
    from tvm import tirx

    func = _kernel(_model(kind, size, channels=24 if kind == "chain" else 16, stride=stride)[0])
    found = rowblock.plan(func, CORES)
    assert found is not None and found.rows == rows and len(found.stages) == (3 if kind == "chain" else 2)
    assert found.recompute == round((3 - stride) / (stride * rows), 3)
    ((sch, shape),) = rowblock.row_blocks(func, HOST.tvm(), CORES)
    assert shape.startswith("row ")
    body = sch.get(sch.get_sblock("root")).body
    assert isinstance(body, tirx.For) and body.kind == tirx.ForKind.PARALLEL  # every conv inside the row tile
    sch = postprocess(sch, HOST)
    assert sch is not None and passes_static_checks(sch, func) and parallel_races(sch.mod) == []
    blocked, plain = run_kernel(sch.mod["main"], HOST.tvm()), run_kernel(func, HOST.tvm())
    np.testing.assert_allclose(blocked[-1], plain[-1], rtol=1e-4, atol=1e-4)


def test_a_stem_in_the_models_layout_is_row_blocked_with_its_transpose_and_padding_in_its_loads():
    """A 3 × 3 stride-2 conv from the NCHW input (the transpose to NHWC fused in) → depthwise → pointwise: every conv
    in the row tile, the transpose and the padding read in the stem's loads (no block before the tile), exact."""
    from tvm import tirx

    g = GraphBuilder("row-stem", seed=3)
    x = g.input("input", (1, 3, 56, 56))
    h = g.conv(x, 3, 16, 3, name="stem", stride=2, act="relu6")
    h = g.conv(h, 16, 16, 3, name="dw", groups=16, act="relu6")
    model = g.finish(g.conv(h, 16, 8, 1, name="project"), (1, 8, 28, 28))
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), HOST)
    *ops, last = [n.id for n in op_graph(mod).nodes]
    func = next(f for name, f in group_kernels(build.mark_weights(fuse_groups(mod, [ops, [last]], HOST)))
                if "conv2d" in name)
    found = rowblock.plan(func, CORES)
    assert found is not None and found.rows == 14 and len(found.stages) == 3 and not found.stages[0].depthwise
    assert len(found.inputs) == 2  # the stem's padding and the input's layout transpose
    ((sch, _),) = rowblock.row_blocks(func, HOST.tvm(), CORES)
    body = sch.get(sch.get_sblock("root")).body
    assert isinstance(body, tirx.For) and body.kind == tirx.ForKind.PARALLEL
    sch = postprocess(sch, HOST)
    assert sch is not None and passes_static_checks(sch, func) and parallel_races(sch.mod) == []
    blocked, plain = run_kernel(sch.mod["main"], HOST.tvm()), run_kernel(func, HOST.tvm())
    np.testing.assert_allclose(blocked[-1], plain[-1], rtol=1e-4, atol=1e-4)


def test_kernels_the_row_blocks_do_not_take():
    func = _kernel(_model("pair", 28)[0])
    assert rowblock.plan(func, CORES, budget=4096) is None  # no row tile within the budget
    assert rowblock.plan(_kernel(_model("pair", 30)[0]), CORES) is None  # 15 output rows: no tile per core evenly
    g = GraphBuilder("row-pw-pw", seed=3)
    x = g.input("input", (1, 16, 28, 28))
    model = g.finish(g.conv(g.conv(x, 16, 64, 1, name="a", act="relu"), 64, 16, 1, name="b"), (1, 16, 28, 28))
    assert rowblock.plan(_kernel(model), CORES) is None  # pw → pw: no window, nothing to tile by rows


def test_on_arm_the_row_blocks_hot_loop_is_fmas_without_spills():
    """An inverted residual built for linux-arm64 (never run here; a zoo build runs under qemu in the e2e tests): its
    hottest innermost loop holds a block's vector FMAs (NEON's four lanes) and no stack traffic."""
    from toolchain import asm
    from toolchain.tune.adapter import as_built

    func = _kernel(_model("chain", 28, channels=24, stride=1)[0], ARM)
    ((sch, shape),) = rowblock.row_blocks(func, ARM.tvm(), CORES)
    rows, vectors, lanes = map(int, shape.removeprefix("row ").split("×"))
    assert lanes == 4
    sch = postprocess(sch, ARM)
    loop = asm.hottest(asm.innermost_loops(asm.assembly(as_built(sch.mod)["main"], ARM.tvm(), "main"), "aarch64"))
    assert loop is not None and loop.spills == 0, loop
    assert loop.fmas >= rows * vectors, loop


def test_an_untuned_build_keeps_a_pair_over_a_large_tensor_as_one_row_blocked_kernel(tmp_path):
    """Without a database a join is built as its minis — but a pw → dw pair whose expanded tensor would not stay in
    a core's cache between two kernels (over the row tile's budget) is one kernel, row-blocked, checked."""
    model, _ = _model("pair", 56)  # a 56 × 56 × 64 expansion: 784 KiB
    ago = PartitionSettings(method="ago", threshold=1e9)
    spec = resolve_target("host", num_cores=CORES)
    art = compile_model(CompileRequest(model, "row-pair", spec, partition=ago), find_compiler(spec), tmp_path / "a")
    assert art.manifest.partition_info["unfused"] == [] and art.manifest.check["status"] == "passed"
    given = [g for g in art.manifest.untuned["given"] if "conv2d" in g["kernel"]]
    assert len(given) == 1 and given[0]["detail"].startswith("row ")
