"""NHWC layout clean-up: ShuffleNet's split / concat / channel shuffle and MobileNet-V3's hard activations keep no
layout transposes."""

import re

import pytest

from host.devices import LocalDevice
from models.builder import GraphBuilder
from models.mobilenet_v3 import _block
from models.shufflenet_v2 import _unit
from toolchain import onnx_import, relayout
from toolchain.build import NHWC_LAYOUTS
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.verify import verify_artifact

SHAPE = (1, 8, 12, 12)


def shuffle_model():
    """A conv, two ShuffleNet-V2 units (a downsampling one: concat + shuffle; a basic one: split, concat,
    shuffle) and a conv."""
    n, c, h, w = SHAPE
    g = GraphBuilder("shuffle-units", seed=3)
    x = g.conv(g.input("input", SHAPE), c, 16, 1, name="head", act="relu")
    x, h, w = _unit(g, x, n, 16, 32, h, w, 2, name="down")
    x, h, w = _unit(g, x, n, 32, 32, h, w, 1, name="basic")
    y = g.conv(x, 32, 8, 1, name="tail")
    return g.finish(g.op("Identity", [y], "out", outputs=["output"]), (n, 8, h, w))


def activation_transposes(mod) -> int:
    """4-D ``permute_dims`` of ``main`` left after constant folding: the layout transposes."""
    import tvm
    from tvm import relax

    count = 0

    def visit(expr):
        nonlocal count
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.permute_dims" \
                and len(expr.attrs.axes or ()) == 4 and not isinstance(expr.args[0], tvm.ir.expr.GenericConst):
            count += 1

    relax.analysis.post_order_visit(relax.transform.FoldConstant()(mod)["main"], visit)
    return count


def converted(proto):
    import tvm
    from tvm import relax

    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    with tvm.target.Target({"kind": "llvm"}):
        return relax.transform.Normalize()(relax.transform.ConvertLayout(NHWC_LAYOUTS)(mod))


def test_transposes_around_split_concat_and_shuffle_cancel():
    mod = converted(shuffle_model())
    assert activation_transposes(mod) > 2  # what ConvertLayout leaves: transposes around every reshape
    # the model's input and output keep ONNX's NCHW: one transpose each, nothing in between
    assert activation_transposes(relayout.sink_transposes(mod)) == 2


def test_rules_leave_a_module_without_transposes_alone():
    import tvm_ffi

    g = GraphBuilder("plain", seed=1)
    x = g.conv(g.input("input", SHAPE), 8, 8, 1, name="c", act="relu")
    proto = g.finish(g.op("Identity", [x], "o", outputs=["output"]), SHAPE)
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    assert tvm_ffi.structural_equal(relayout.sink_transposes(mod)["main"], mod["main"])


@pytest.mark.parametrize("partition", ["stock", "ago"])
def test_shuffle_units_in_nhwc_match_onnxruntime(partition, tmp_path):
    spec = resolve_target("host", layout="NHWC")
    request = CompileRequest(shuffle_model(), "shuffle-units", spec, partition=PartitionSettings(partition))
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    if partition == "stock":  # FuseOps leaves a transpose the rules did not cancel a kernel of its own
        layout_kernels = [k["name"] for k in artifact.manifest.kernels
                          if k["name"].replace("fused_", "").rstrip("0123456789_") == "transpose"]
        assert len(layout_kernels) == 2, layout_kernels  # the input's and the output's (3 without the rules)
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()


def hard_activation_model():
    """A hard-swish conv and two MobileNet-V3 blocks: hard-swish (``relax.clip`` inside), squeeze-excite with a
    hard-sigmoid gate (``relax.clip`` too), a residual."""
    n, c, h, w = SHAPE
    g = GraphBuilder("hard-acts", seed=4)
    x = g.conv(g.input("input", SHAPE), c, 16, 3, stride=2, name="stem", act="hardswish")
    x = _block(g, x, 16, (3, 48, 24, True, "hardswish", 1), name="b0")
    x = _block(g, x, 24, (5, 72, 24, True, "hardswish", 1), name="b1")
    return g.finish(g.op("Identity", [x], "out", outputs=["output"]), (n, 24, h // 2, w // 2))


def calls_of(mod, name: str) -> int:
    from tvm import relax

    count = 0

    def visit(expr):
        nonlocal count
        count += isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == name

    relax.analysis.post_order_visit(mod["main"], visit)
    return count


def test_hard_activations_follow_the_layout():
    import tvm
    from tvm import relax

    proto = hard_activation_model()
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    assert calls_of(mod, "relax.clip") == 1 + 2 * 2 + 2  # stem; expand + dw of each block; each block's gate
    rewritten = relayout.follow_layout(mod)
    assert calls_of(rewritten, "relax.clip") == 0
    with tvm.target.Target({"kind": "llvm"}):
        before, after = (relax.transform.Normalize()(relax.transform.ConvertLayout(NHWC_LAYOUTS)(m))
                         for m in (mod, rewritten))
    assert activation_transposes(before) > 10  # a transpose pair around every clip
    assert activation_transposes(after) == 2  # the input's and the output's


def test_a_clip_with_bounds_that_are_not_constants_is_kept():
    from tvm import relax
    from tvm import tirx as tir

    x = relax.Var("x", relax.TensorType([1, 4], "float32"))
    n = tir.Var("n", "int64")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, relax.Var("s", relax.ShapeType([n]))]):
        y = bb.emit(relax.op.clip(x, 0, n))
        bb.emit_func_output(y)
    assert calls_of(relayout.follow_layout(bb.get()), "relax.clip") == 1


@pytest.mark.parametrize("partition", ["stock", "ago"])
def test_hard_activations_in_nhwc_match_onnxruntime(partition, tmp_path):
    spec = resolve_target("host", layout="NHWC")
    request = CompileRequest(hard_activation_model(), "hard-acts", spec, partition=PartitionSettings(partition))
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    names = [k["name"] for k in artifact.manifest.kernels]
    assert not any("clip" in name for name in names), names
    # no kernel of its own for an activation: what holds no conv or pool is the input's or output's transpose
    others = [name for name in names if "conv2d" not in name and "mean" not in name]
    assert len(others) <= 2 and all(re.fullmatch(r"(fused_)?transpose\d*", name) for name in others), names
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()


def leaky_model(alpha: float):
    g = GraphBuilder("leaky", seed=6)
    x = g.conv(g.input("input", SHAPE), 8, 16, 3, name="c1")
    x = g.op("LeakyRelu", [x], "leaky", alpha=alpha)
    x = g.conv(x, 16, 8, 1, name="c2")
    return g.finish(g.op("Identity", [x], "out", outputs=["output"]), SHAPE)


@pytest.mark.parametrize("alpha, rewritten", [(0.1, True), (1.0, True), (0.0, True), (1.5, False), (-0.2, False)])
def test_leaky_relu_follows_the_layout_where_max_is_the_same(alpha, rewritten):
    proto = leaky_model(alpha)
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    out = relayout.follow_layout(mod)
    assert calls_of(out, "relax.nn.leakyrelu") == (0 if rewritten else 1)
    assert calls_of(out, "relax.maximum") == (1 if rewritten else 0)


@pytest.mark.parametrize("alpha", [0.1, 1.5])
def test_leaky_relu_in_nhwc_matches_onnxruntime(alpha, tmp_path):
    spec = resolve_target("host", layout="NHWC")
    artifact = compile_model(CompileRequest(leaky_model(alpha), "leaky", spec, partition=PartitionSettings("stock")),
                             find_compiler(spec), tmp_path / "a")
    if alpha <= 1:  # the input's and output's transposes only: the activation is fused into its conv
        assert len(artifact.manifest.kernels) == 4, [k["name"] for k in artifact.manifest.kernels]
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()
