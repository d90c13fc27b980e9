"""The eight benchmark networks of the zoo: valid ONNX, runnable, faithful, deterministic."""

from __future__ import annotations

import functools
import math
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from models import registry
from models.builder import count_params

ZOO = ("mobilenet-v2", "mobilenet-v3-small", "mnasnet", "squeezenet-1.1", "shufflenet-v2", "resnet-18", "bert-tiny",
       "mobilevit")

#: Exact parameter counts of these builds (BN folded). The registry rows say how they relate to the papers.
EXPECTED_PARAMS = {
    "mobilenet-v2": 3_487_816,
    "mobilenet-v3-small": 2_536_800,
    "mnasnet": 4_364_352,
    "squeezenet-1.1": 1_235_496,
    "shufflenet-v2": 2_270_514,
    "resnet-18": 11_684_712,
    "bert-tiny": 4_385_920,
    "mobilevit": 2_313_624,
}

#: torchvision counts BatchNorm gamma+beta (2 per channel) on bias-free convs; folded, a conv gets one bias per
#: channel instead. So for these models, params + conv bias elements must give back the torchvision count exactly.
BN_EVERYWHERE = ("mobilenet-v2", "mnasnet", "shufflenet-v2", "resnet-18")

#: Ops the builders may emit (all in the TVM Relax ONNX importer's convert map).
ALLOWED_OPS = {
    "Conv", "Relu", "Clip", "Add", "Mul", "Sigmoid", "MatMul", "Gemm", "Reshape", "Transpose", "Concat", "Split",
    "MaxPool", "GlobalAveragePool", "Flatten", "Softmax", "LayerNormalization", "Gather", "Erf", "Div", "Tanh",
    "HardSwish", "HardSigmoid",  # MobileNet-V3 only
    "Resize",  # MobileViT only: cvnets' bilinear resize of a 7x7 map to 8x8 (and back) for 2x2 patches
}

ALL_SHAPES = [(name, shape) for name in ZOO for shape in registry.get(name).shapes]


@functools.lru_cache(maxsize=None)
def _serialized(name: str, shape: tuple[int, ...]) -> bytes:
    return registry.build(name, shape).SerializeToString()


def _model(name: str, shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    return onnx.load_from_string(_serialized(name, shape or registry.get(name).default_shape))


def _feed(model: onnx.ModelProto, shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    (inp,) = model.graph.input
    if inp.type.tensor_type.elem_type == TensorProto.INT64:
        return {inp.name: rng.integers(0, 30522, size=shape, dtype=np.int64)}
    return {inp.name: rng.standard_normal(shape).astype(np.float32)}


def _run(model: onnx.ModelProto, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (out,) = sess.run(["output"], _feed(model, shape, seed))
    return out


def _expected_output_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], 128) if name == "bert-tiny" else (shape[0], 1000)


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def _depthwise_convs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    out = []
    for node in model.graph.node:
        if node.op_type == "Conv":
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if group > 1:
                out.append(node)
    return out


def _attr(node: onnx.NodeProto, name: str):
    return onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == name))


# --------------------------------------------------------------------------- structure and validity


@pytest.mark.parametrize("name", ZOO)
def test_registry_row(name):
    spec = registry.get(name)
    assert spec.builder.startswith("models.") and spec.published_params and spec.source
    assert spec.family == ("transformer" if name in ("bert-tiny", "mobilevit") else "cnn")
    if spec.family == "cnn":
        assert spec.default_shape == (1, 3, 224, 224)


@pytest.mark.parametrize("name", ZOO)
def test_valid_onnx(name):
    model = _model(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == registry.IR_VERSION
    assert [(o.domain, o.version) for o in model.opset_import] == [("", registry.OPSET)]
    assert [o.name for o in model.graph.output] == ["output"]
    (inp,) = model.graph.input
    if name == "bert-tiny":
        assert inp.name == "input_ids" and inp.type.tensor_type.elem_type == TensorProto.INT64
    else:
        assert inp.name == "input" and inp.type.tensor_type.elem_type == TensorProto.FLOAT
    # Inference graphs: BN folded, static shapes, only importer-supported ops, readable unique node names.
    ops = _ops(model)
    assert set(ops) <= ALLOWED_OPS, set(ops) - ALLOWED_OPS
    names = [node.name for node in model.graph.node]
    assert all(names) and len(set(names)) == len(names)


@pytest.mark.parametrize("name", ZOO)
def test_param_count(name):
    spec = registry.get(name)
    model = _model(name)
    params = count_params(model)
    assert params == EXPECTED_PARAMS[name]
    assert abs(params - spec.published_params) <= spec.params_tolerance * spec.published_params
    if name in BN_EVERYWHERE:
        inits = _inits(model)
        conv_bias = sum(inits[n.input[2]].size for n in model.graph.node if n.op_type == "Conv")
        assert params + conv_bias == spec.published_params


@pytest.mark.parametrize("name", ZOO)
def test_deterministic(name):
    shape = registry.get(name).default_shape
    assert registry.build(name, shape).SerializeToString() == _serialized(name, shape)


# --------------------------------------------------------------------------- numerics in onnxruntime


@pytest.mark.parametrize(("name", "shape"), ALL_SHAPES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in ALL_SHAPES])
def test_runs_in_onnxruntime(name, shape):
    out = _run(_model(name, shape), shape)
    assert out.shape == _expected_output_shape(name, shape)
    assert out.dtype == np.float32
    assert np.all(np.isfinite(out))
    assert out.std() > 1e-2, "output is (nearly) constant"
    assert np.abs(out).max() < 1e3, "activations blew up"


@pytest.mark.parametrize("name", ZOO)
def test_output_depends_on_input(name):
    shape = registry.get(name).shapes[-1]  # the smallest listed shape
    model = _model(name, shape)
    a, b = _run(model, shape, seed=0), _run(model, shape, seed=1)
    assert not np.allclose(a, b)


# --------------------------------------------------------------------------- architecture facts


def test_mobilenet_v2_architecture():
    model = _model("mobilenet-v2")
    ops = _ops(model)
    assert len(_depthwise_convs(model)) == 17  # 17 inverted-residual blocks
    assert ops["Conv"] == 52  # stem + 2 (t=1 block) + 16 * 3 + head
    assert ops["Add"] == 10  # residual connections
    assert ops["Clip"] == 35  # ReLU6 after stem, head and 2 per block (17 dw + 16 expand)
    inits = _inits(model)
    for node in model.graph.node:
        if node.op_type == "Clip":
            assert float(inits[node.input[1]]) == 0.0 and float(inits[node.input[2]]) == 6.0
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert inits[gemm.input[1]].shape == (1000, 1280)
    widths = [inits[n.input[1]].shape[0] for n in model.graph.node if n.op_type == "Conv" and "project" in n.name]
    assert widths == [16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 160, 160, 160, 320]


def test_mobilenet_v3_small_architecture():
    model = _model("mobilenet-v3-small")
    ops = _ops(model)
    dws = _depthwise_convs(model)
    assert [_attr(n, "kernel_shape")[0] for n in dws] == [3] * 3 + [5] * 8  # 11 blocks
    assert [_attr(n, "strides")[0] for n in dws] == [2, 2, 1, 2, 1, 1, 1, 1, 2, 1, 1]
    assert ops["GlobalAveragePool"] == 9 + 1 and ops["HardSigmoid"] == 9  # squeeze-excite in 9 blocks + the head
    assert ops["HardSwish"] == 1 + 2 * 8 + 1 + 1  # stem, expand + dw of blocks 3-10, head conv, head FC
    assert ops["Relu"] == 1 + 2 * 2 + 9  # block 0 (dw), blocks 1-2 (expand + dw), one per squeeze-excite
    assert ops["Add"] == 6 + 1  # residuals (blocks 2, 4, 5, 7, 9, 10) + the head FC's bias
    inits = _inits(model)
    widths = [inits[n.input[1]].shape[0] for n in model.graph.node if n.op_type == "Conv" and "project" in n.name]
    assert widths == [16, 24, 24, 40, 40, 40, 48, 48, 96, 96, 96]
    squeeze = [inits[n.input[1]].shape[0] for n in model.graph.node if n.name.endswith("_se_fc1")]
    assert squeeze == [8, 24, 64, 64, 32, 40, 72, 144, 144]  # torchvision's _make_divisible(expanded // 4, 8)
    # torchvision's count: BN gamma+beta on the bias-free convs, the squeeze-excite convs' own bias
    bn_bias = sum(inits[n.input[2]].size for n in model.graph.node if n.op_type == "Conv" and "_se_" not in n.name)
    assert count_params(model) + bn_bias == registry.get("mobilenet-v3-small").published_params


def test_mnasnet_architecture():
    model = _model("mnasnet")
    ops = _ops(model)
    dws = _depthwise_convs(model)
    assert len(dws) == 17  # sepconv + 16 MBConv blocks
    assert [_attr(n, "kernel_shape")[0] for n in dws] == [3] * 4 + [5] * 3 + [5] * 3 + [3] * 2 + [5] * 4 + [3]
    assert ops["Conv"] == 52 and ops["Add"] == 10 and "Clip" not in ops and "Sigmoid" not in ops
    inits = _inits(model)
    widths = [inits[n.input[1]].shape[0] for n in model.graph.node if n.op_type == "Conv" and "project" in n.name]
    assert widths == [24] * 3 + [40] * 3 + [80] * 3 + [96] * 2 + [192] * 4 + [320]


def test_squeezenet_architecture():
    model = _model("squeezenet-1.1")
    ops = _ops(model)
    assert ops["Concat"] == 8  # 8 Fire modules
    assert ops["Conv"] == 26  # stem + 8 * 3 + classifier conv
    pools = [n for n in model.graph.node if n.op_type == "MaxPool"]
    assert len(pools) == 3 and all(_attr(n, "ceil_mode") == 1 for n in pools)
    assert "Gemm" not in ops and ops["GlobalAveragePool"] == 1
    # 56x56 is the smallest listed input; the last Fire module still sees a 3x3 map there.
    assert _run(_model("squeezenet-1.1", (1, 3, 56, 56)), (1, 3, 56, 56)).shape == (1, 1000)


def test_shufflenet_v2_architecture():
    model = _model("shufflenet-v2")
    ops = _ops(model)
    shuffles = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert len(shuffles) == 16 and all(_attr(n, "perm") == [0, 2, 1, 3, 4] for n in shuffles)  # 4 + 8 + 4 units
    assert ops["Split"] == 13  # stride-1 units split channels in half
    assert len(_depthwise_convs(model)) == 3 * 2 + 13  # downsampling units have two branches
    assert ops["Conv"] == 56 and "Shape" not in ops
    inits = _inits(model)
    head = next(n for n in model.graph.node if n.name == "head_conv")
    assert inits[head.input[1]].shape == (1024, 464, 1, 1)


def test_bert_tiny_architecture():
    model = _model("bert-tiny")
    ops = _ops(model)
    assert ops["Softmax"] == 2  # 2 layers
    assert ops["LayerNormalization"] == 5  # embeddings + 2 per layer
    assert ops["Erf"] == 2  # erf-GELU in each FFN
    assert ops["MatMul"] == 2 * 8 + 1  # q, k, v, scores, context, out, ffn1, ffn2 per layer + pooler
    inits = _inits(model)
    assert inits["embeddings_word.weight"].shape == (30522, 128)
    assert inits["embeddings_position.weight"].shape == (512, 128)
    assert inits["layer0_intermediate_dense.weight"].shape == (128, 512)
    heads = [n for n in model.graph.node if n.op_type == "Reshape" and "query" in n.name]
    assert len(heads) == 2 and all(inits[n.input[1]].tolist() == [1, 128, 2, 64] for n in heads)  # 2 heads of 64


def test_mobilevit_architecture():
    model = _model("mobilevit")
    ops = _ops(model)
    assert ops["Softmax"] == 2 + 4 + 3  # transformer layers in the three MobileViT blocks
    assert ops["LayerNormalization"] == 2 * 9 + 3
    assert ops["Concat"] == 3  # fusion of each MobileViT block
    assert ops["Resize"] == 2  # layer5 at 224x224: 7x7 -> 8x8 for 2x2 patches, and back
    assert len(_depthwise_convs(model)) == 7  # MV2 blocks: 1 + 3 + 3 (one before each MobileViT block)
    inits = _inits(model)
    qkv = [inits[f"layer{layer}_mvit_transformer0_qkv.weight"].shape for layer in (3, 4, 5)]
    assert qkv == [(96, 288), (120, 360), (144, 432)]
    assert inits["head_conv.weight"].shape == (384, 96, 1, 1)


# --------------------------------------------------------------------------- TVM importer


@pytest.mark.parametrize("name", ZOO)
def test_tvm_importer_accepts(name):
    from tvm.relax.frontend.onnx import from_onnx

    shape = registry.get(name).default_shape
    model = _model(name, shape)
    mod = from_onnx(model, shape_dict={model.graph.input[0].name: list(shape)})
    ret = mod["main"].ret_ty
    assert [int(d) for d in ret.shape] == list(_expected_output_shape(name, shape)) and ret.dtype == "float32"
    assert math.prod(int(d) for d in ret.shape) > 0
