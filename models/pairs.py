"""The four AGO micro-benchmark subgraphs (AGO §VI-B): two chained convolutions, each with
bias + ReLU6, at MobileNet-V2 shapes.

=========  ==========================================================  ====================
kind       ops                                                         MobileNet-V2 source
=========  ==========================================================  ====================
pw-dw      1×1 conv 24→144, then 3×3 depthwise 144 (stride 1)          block 3 expand + dw
dw-pw      3×3 depthwise 144, then 1×1 conv 144→24                     block 3 dw + project
dw-dw      3×3 depthwise 144, then 3×3 depthwise 144                   (AGO's dw→dw pair)
pw-pw      1×1 conv 24→144, then 1×1 conv 144→24                       expand + project
=========  ==========================================================  ====================

The input is the pair's first conv input (``1×C×H×W``; the benchmarks use 56×56, the
resolution of that MobileNet-V2 stage at 224 input). Weights come from a fixed seed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models.registry import IR_VERSION, OPSET

PAIR_KINDS = ("pw-dw", "dw-pw", "dw-dw", "pw-pw")
EXPANDED = 144  # MobileNet-V2 block 3: 24 channels expanded ×6
PROJECTED = 24


def _conv(rng, nodes, inits, x, name, cin, cout, kind):
    """conv (pw: 1×1, dw: 3×3 depthwise) + bias + ReLU6; returns (output name, output channels)."""
    if kind == "dw":
        w = rng.standard_normal((cin, 1, 3, 3)).astype(np.float32) * np.float32(np.sqrt(2.0 / 9))
        attrs = {"group": cin, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
        cout = cin
    else:
        w = rng.standard_normal((cout, cin, 1, 1)).astype(np.float32) * np.float32(np.sqrt(2.0 / cin))
        attrs = {"kernel_shape": [1, 1]}
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_conv"], name=f"{name}_conv",
                                  **attrs))
    nodes.append(helper.make_node("Clip", [f"{name}_conv", "zero", "six"], [f"{name}_relu6"], name=f"{name}_relu6"))
    return f"{name}_relu6", cout


def pair(kind: str, shape: tuple[int, ...]) -> onnx.ModelProto:
    first, second = kind.split("-")
    n, c, h, w = shape
    rng = np.random.default_rng(sum(map(ord, kind)))
    nodes: list = []
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    mid = EXPANDED if first == "pw" else c
    x, ch = _conv(rng, nodes, inits, "input", "first", c, mid, first)
    y, ch = _conv(rng, nodes, inits, x, "second", ch, PROJECTED, second)  # a pw projects to 24 channels
    nodes.append(helper.make_node("Identity", [y], ["output"], name="output"))
    graph = helper.make_graph(
        nodes, f"pair-{kind}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [n, ch, h, w])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def pw_dw(shape):
    return pair("pw-dw", shape)


def dw_pw(shape):
    return pair("dw-pw", shape)


def dw_dw(shape):
    return pair("dw-dw", shape)


def pw_pw(shape):
    return pair("pw-pw", shape)
