"""Output channels padded to whole vectors (toolchain/padding.py): which ops, and the same results."""

import pytest

import models
from host.devices import LocalDevice
from models.builder import GraphBuilder
from toolchain import build, onnx_import, padding
from toolchain.errors import UnsupportedModelError
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.tune.db import TuneDB
from toolchain.tune.settings import SCHEMA, TuneSettings, TuningError
from toolchain.verify import verify_artifact


def test_channels_the_vector_width_divides_or_that_are_few_are_left_alone():
    rows = padding.MIN_ROWS
    assert padding.padded_channels(1000, rows) == (1024, padding.RULES[0])  # 2.4 % more: four registers
    assert padding.padded_channels(520, rows) == (528, padding.RULES[1])  # 576 would be 11 % more: one register
    assert padding.padded_channels(1500, rows) == (1536, padding.RULES[0])
    for channels in (2000, 1024, 1008, 64, 232, 58, 3):  # divided by 16, or under every rule's minimum
        assert padding.padded_channels(channels, rows) == (channels, None)
    assert padding.padded_channels(1000, rows - 1) == (1000, None)  # a GEMV streams its weights: left alone
    assert padding.padded_channels(1000, rows, lanes=8) == (1000, None)
    chain = padding.CHAIN_RULES  # a conv's output channels on their way into a depthwise conv
    for channels, padded in ((72, 80), (120, 128), (58, 64), (116, 128), (232, 240)):
        assert padding.padded_channels(channels, rows, chain) == (padded, chain[0])
    for channels in (24, 40, 16, 144):  # 33 % / 20 % more work, or whole registers already
        assert padding.padded_channels(channels, rows, chain) == (channels, None)


def test_a_narrow_conv_is_padded_to_whole_vectors_of_the_target_where_that_saves_fmas():
    rows, rule = padding.MIN_ROWS, padding.NARROW_RULES[0]
    for channels, lanes, padded in ((24, 16, 32), (40, 16, 48), (56, 16, 64), (12, 16, 16), (12, 8, 16),
                                    (20, 8, 24), (6, 4, 8), (3, 4, 4)):
        assert padding.narrow_channels(channels, rows, lanes) == (padded, rule), (channels, lanes)
    for channels, lanes in ((24, 8), (24, 4), (40, 4), (32, 16), (8, 16),  # whole vectors already; 8 lanes: 1 FMA
                            (72, 16), (88, 16),  # more than the block's channel tile of four vectors
                            (58, 4)):  # 15 vectors (ShuffleNet's chains are CHAIN_RULES')
        assert padding.narrow_channels(channels, rows, lanes) == (channels, None), (channels, lanes)
    assert padding.narrow_channels(24, rows - 1, 16) == (24, None)  # a GEMV: its weights, not its vectors
    assert padding.narrow_channels(24, rows, 0) == (24, None)  # no target given


def test_narrow_convs_are_padded_after_the_chains_and_only_for_channels_in_vectors():
    """MobileNet-V2's 24-channel projections at AVX-512's 16 lanes: 32 computed, the slice back after them; a conv a
    chain already pads is the chain's; an NCHW build (its vectors along the rows) pads no narrow conv."""
    g = GraphBuilder("narrow", seed=3)
    x = g.input("input", (1, 16, 8, 8))
    e = g.conv(x, 16, 72, 1, name="expand", act="relu")  # into a depthwise conv: the chain's 80
    d = g.conv(e, 72, 72, 3, name="dw", groups=72, act="relu")
    p = g.conv(d, 72, 24, 1, name="project")
    proto = g.finish(g.op("Add", [p, g.conv(x, 16, 24, 1, name="side")], "sum", outputs=["output"]), (1, 24, 8, 8))
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    _, done = padding.pad_output_channels(mod, lanes=16)
    assert sorted((d.op, d.channels, d.padded) for d in done) == [
        ("conv2d", 24, 32), ("conv2d", 24, 32), ("conv2d", 72, 80)]
    assert [d.why for d in done if d.channels == 24] == [padding.NARROW_RULES[0].why] * 2
    _, done = padding.pad_output_channels(mod, lanes=8)
    assert [(d.channels, d.padded) for d in done] == [(72, 80)]
    assert [(d["channels"], d["padded"]) for d in padding.applied_ops(
        build.legalize(mod, resolve_target("host", layout="NCHW")))] == [(72, 80)]


def chain_model():
    """An MBConv-like chain (1×1 conv 24 → 72 + ReLU, 3×3 depthwise 72 + ReLU, 1×1 conv 72 → 24) whose
    depthwise output is also concatenated with a 1×1 conv's 72 channels (a concat copies: that conv is padded
    too, the concat reading its real channels); a 1×1 conv of the concat is added to the chain's end."""
    g = GraphBuilder("padded-chain", seed=7)
    x = g.input("input", (1, 24, 6, 6))
    e = g.conv(x, 24, 72, 1, name="expand", act="relu")
    d = g.conv(e, 72, 72, 3, name="dw", groups=72, act="relu")
    a = g.conv(d, 72, 24, 1, name="project")
    side = g.conv(x, 24, 72, 1, name="side", act="relu")
    b = g.conv(g.concat([d, side], name="cat"), 144, 24, 1, name="mix")
    return g.finish(g.op("Add", [a, b], "sum", outputs=["output"]), (1, 24, 6, 6))


def test_a_chain_into_a_depthwise_conv_carries_its_padded_channels_to_the_conv_that_consumes_them():
    import tvm

    proto = chain_model()
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    out, done = padding.pad_output_channels(mod)
    assert [(d.op, d.channels, d.padded) for d in done] == [("conv2d", 72, 80)] * 2  # expand, side
    shapes = weight_shapes(out)
    # expand's and side's filters and biases, the depthwise filters and bias, project's input channels: padded
    # with the chain; mix's weights (it reads the concat of the real channels) as they were
    assert {(80, 24, 1, 1), (1, 80, 1, 1), (80, 1, 3, 3), (24, 80, 1, 1), (24, 144, 1, 1)} <= set(shapes)
    assert (72, 1, 3, 3) not in shapes and (24, 72, 1, 1) not in shapes and (72, 24, 1, 1) not in shapes
    script = out["main"].script()
    assert script.count("R.strided_slice") == 2  # the concat reads the depthwise output's and side's 72 channels
    padded_bias = [c.value.numpy() for c in _constants(out)
                   if tuple(getattr(c.value, "shape", ())) == (1, 80, 1, 1)]
    assert len(padded_bias) == 3
    for bias in padded_bias:  # the padded channels repeat the last real one: finite whatever follows
        assert (bias[:, 72:] == bias[:, 71:72]).all()
    assert tvm.relax.analysis.check_well_formed(out)  # every use bound: the slice emitted before the concat
    # nothing to pad: the module is returned as it came
    plain = models.build("tiny-cnn")
    plain_mod = onnx_import.to_relax(plain, onnx_import.resolve_inputs(plain, {}))
    assert padding.pad_channel_chains(plain_mod)[0] is plain_mod


@pytest.mark.parametrize("axis,padded", [(1, True), (-3, True), (2, False)])
def test_a_conv_into_a_concat_is_padded_only_where_the_concat_joins_channels(axis, padded):
    g = GraphBuilder("into-concat", seed=3)
    x = g.input("input", (1, 24, 6, 6))
    a = g.conv(x, 24, 72, 1, name="a", act="relu")
    b = g.conv(x, 24, 72, 1, name="b")
    shape = (1, 144, 6, 6) if axis != 2 else (1, 72, 12, 6)
    proto = g.finish(g.concat([a, b], name="cat", axis=axis), shape)
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    out, done = padding.pad_output_channels(mod)
    assert [(d.channels, d.padded) for d in done] == ([(72, 80)] * 2 if padded else [])


def _constants(mod):
    import tvm
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, tvm.ir.Constant) else None)
    return found


@pytest.mark.parametrize("partition,layout", [("ago", "NHWC"), ("stock", "NHWC"), ("ago", "NCHW")])
def test_a_model_with_a_padded_chain_matches_onnxruntime(partition, layout, tmp_path):
    spec = resolve_target("host", layout=layout)
    request = CompileRequest(chain_model(), "padded-chain", spec, partition=PartitionSettings(partition))
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    lanes = build.fp_lanes(spec) if layout == "NHWC" else 0  # project's and mix's 24 channels, on AVX-512: 32
    wide, rule = padding.narrow_channels(24, 36, lanes)
    narrow = [("conv2d", 24, wide)] * 2 if rule is not None else []
    assert [(p["op"], p["channels"], p["padded"]) for p in artifact.manifest.partition_info["padded"]] == [
        ("conv2d", 72, 80)] * 2 + narrow  # recorded, with the rule's reason
    assert "ShuffleNet" in artifact.manifest.partition_info["padded"][0]["why"]
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()


def head_model():
    """A 1×1 conv to 520 channels (→ 528: 25 rows) with bias and ReLU, a depthwise conv on them (one
    group per channel: never padded); then the 520 channels of the 25 positions as 25 rows into a
    1000-class Gemm (transB: → 1024) and a MatMul (→ 1024), and pooled into one row for a Gemm (left
    alone: one row), all three added."""
    g = GraphBuilder("padded-head", seed=5)
    x = g.conv(g.input("input", (1, 16, 5, 5)), 16, 520, 1, name="expand", act="relu")
    x = g.conv(x, 520, 520, 3, name="dw", groups=520, act="relu")
    rows = g.transpose(g.reshape(x, (520, 25), name="flat"), (1, 0), name="rows")
    a = g.gemm(rows, 520, 1000, name="fc_t")
    b = g.linear(rows, 520, 1000, name="fc")
    c = g.gemm(g.global_pool_flatten(x, name="pool"), 520, 1000, name="fc_pooled")
    out = g.op("Add", [g.add(a, b, name="ab"), c], "abc", outputs=["logits"])
    return g.finish(out, (25, 1000))


def weight_shapes(mod) -> list[tuple[int, ...]]:
    """Shapes of every 2-D and 4-D constant the legalized model's kernels take (its weights)."""
    import tvm
    from tvm import relax

    shapes = []

    def visit(expr):
        if isinstance(expr, tvm.ir.Constant) and len(getattr(expr.value, "shape", ())) in (2, 4):
            shapes.append(tuple(int(d) for d in expr.value.shape))

    relax.analysis.post_order_visit(mod["main"], visit)
    return shapes


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_padded_conv_and_classifier_compute_padded_channels(layout):
    proto = head_model()
    mod = onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {}))
    _, done = padding.pad_output_channels(mod)
    assert sorted((d.op, d.channels, d.padded) for d in done) == [
        ("conv2d", 520, 528), ("matmul", 1000, 1024), ("matmul", 1000, 1024)]

    def count(shapes, channels):
        return sum(channels in shape for shape in shapes)

    padded = weight_shapes(build.legalize(mod, resolve_target("host", layout=layout)))
    # the expand conv's weight and two classifiers' padded; the depthwise conv's (520 groups) and the
    # pooled classifier's (one row) not
    assert (count(padded, 528), count(padded, 1024), count(padded, 1000)) == (1, 2, 1)
    plain = weight_shapes(build.legalize(mod, resolve_target("host", layout=layout, pad_channels=False)))
    assert (count(plain, 528), count(plain, 1024), count(plain, 1000)) == (0, 0, 3)


@pytest.mark.parametrize("partition,layout", [("ago", "NHWC"), ("stock", "NHWC"), ("ago", "NCHW")])
def test_a_model_with_padded_channels_matches_onnxruntime(partition, layout, tmp_path):
    spec = resolve_target("host", layout=layout)
    artifact = compile_model(CompileRequest(head_model(), "padded-head", spec, partition=PartitionSettings(partition)),
                             find_compiler(spec), tmp_path / "a")
    assert artifact.manifest.target["pad_channels"] is True
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()


def test_a_database_keeps_the_channels_it_was_tuned_with(tmp_path):
    """Padded and unpadded kernels are different kernels: a database made before the setting (its
    kernels unpadded) resumes only without padding, and compiles only without it — where the model has
    something to pad (the session records what the padding did, not the flag)."""
    old = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"}, "layout": "NHWC",
           "settings": TuneSettings(trials=8).to_json()}
    db = TuneDB(tmp_path)
    db.open_session(old)
    assert db.channel_padding is False
    with pytest.raises(TuningError, match="different pad channels.*--no-pad-channels"):
        db.open_session({**old, "pad_channels": True})
    db.open_session({**old, "pad_channels": False})
    spec = resolve_target("host")  # padded by default
    with pytest.raises(UnsupportedModelError, match="without padded output channels; compile with --no-pad-channels"):
        compile_model(CompileRequest(head_model(), "padded-head", spec, db=tmp_path), find_compiler(spec),
                      tmp_path / "a")
    # a model with nothing to pad is the same either way: the database serves it padded or not
    plain = models.build("tiny-cnn")
    assert not padding.applied(build.legalize(onnx_import.to_relax(plain, onnx_import.resolve_inputs(plain, {})), spec))
    assert padding.applied(build.legalize(onnx_import.to_relax(head_model(), onnx_import.resolve_inputs(
        head_model(), {})), spec))
