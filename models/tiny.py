"""Small built-in models: the demo and the fast tests.

Each covers an op family the compiler must get right: conv/relu/add/gemm
(``tiny_cnn``), matmul/softmax/layernorm (``tiny_transformer``) and the
pointwise → depthwise → pointwise chain that intensive fusion targets
(``tiny_dwsep``). Weights come from a fixed seed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models.registry import IR_VERSION, OPSET


def _model(name, nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="agoc.models",
    )
    onnx.checker.check_model(model)
    return model


def _init(rng, name, shape, fan_in) -> onnx.TensorProto:
    data = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    return numpy_helper.from_array(data, name)


def tiny_cnn(shape: tuple[int, ...]) -> onnx.ModelProto:
    n, c, h, w = shape
    rng = np.random.default_rng(0)
    cout, classes = 8, 10
    inits = [
        _init(rng, "conv_w", (cout, c, 3, 3), c * 9),
        _init(rng, "conv_b", (cout,), 1),
        _init(rng, "fc_w", (cout * h * w, classes), cout * h * w),
        _init(rng, "fc_b", (classes,), 1),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv_w", "conv_b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Add", ["relu", "conv"], ["residual"], name="add"),
        helper.make_node("Flatten", ["residual"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["output"], name="fc"),
    ]
    return _model(
        "tiny-cnn",
        nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [n, classes])],
        inits,
    )


def tiny_transformer(shape: tuple[int, ...]) -> onnx.ModelProto:
    """Single-head self-attention + residual + LayerNorm on a (batch, seq, hidden) input."""
    b, s, d = shape
    rng = np.random.default_rng(1)
    inits = [_init(rng, f"w_{p}", (d, d), d) for p in "qkvo"]
    inits += [
        numpy_helper.from_array(np.array(1.0 / np.sqrt(d), np.float32), "scale"),
        numpy_helper.from_array(np.ones(d, np.float32), "ln_gamma"),
        numpy_helper.from_array(np.zeros(d, np.float32), "ln_beta"),
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w_q"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["input", "w_k"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["input", "w_v"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="pv"),
        helper.make_node("MatMul", ["ctx", "w_o"], ["attn"], name="o_proj"),
        helper.make_node("Add", ["attn", "input"], ["res"], name="residual"),
        helper.make_node(
            "LayerNormalization", ["res", "ln_gamma", "ln_beta"], ["output"], name="layernorm", axis=-1, epsilon=1e-5
        ),
    ]
    return _model(
        "tiny-transformer",
        nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(shape))],
        inits,
    )


def tiny_dwsep(shape: tuple[int, ...]) -> onnx.ModelProto:
    """pw conv (expand ×4) → relu6 → dw 3×3 → relu6 → pw conv (project) → + input."""
    n, c, h, w = shape
    rng = np.random.default_rng(2)
    e = 4 * c
    inits = [
        _init(rng, "pw1_w", (e, c, 1, 1), c),
        _init(rng, "pw1_b", (e,), 1),
        _init(rng, "dw_w", (e, 1, 3, 3), 9),
        _init(rng, "dw_b", (e,), 1),
        _init(rng, "pw2_w", (c, e, 1, 1), e),
        _init(rng, "pw2_b", (c,), 1),
        numpy_helper.from_array(np.array(0.0, np.float32), "clip_min"),
        numpy_helper.from_array(np.array(6.0, np.float32), "clip_max"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "pw1_w", "pw1_b"], ["pw1"], name="pw1"),
        helper.make_node("Clip", ["pw1", "clip_min", "clip_max"], ["pw1_act"], name="pw1_relu6"),
        helper.make_node("Conv", ["pw1_act", "dw_w", "dw_b"], ["dw"], name="dw", group=e, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["dw", "clip_min", "clip_max"], ["dw_act"], name="dw_relu6"),
        helper.make_node("Conv", ["dw_act", "pw2_w", "pw2_b"], ["pw2"], name="pw2"),
        helper.make_node("Add", ["pw2", "input"], ["output"], name="residual"),
    ]
    return _model(
        "tiny-dwsep",
        nodes,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(shape))],
        inits,
    )
