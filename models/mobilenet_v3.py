"""MobileNet-V3-Small 1.0 as an inference ONNX graph with random weights.

Architecture: Howard et al., "Searching for MobileNetV3" (ICCV 2019), Table 2, as implemented by
torchvision ``mobilenet_v3_small``: a 3x3/2 stem conv (16, hard-swish), 11 inverted-residual blocks
(:data:`BLOCKS`; ReLU in the first three, hard-swish after), nine of them with squeeze-and-excite
(global average pool → 1x1 conv → ReLU → 1x1 conv → hard-sigmoid → scale), a 1x1 conv to 576
(hard-swish), global average pooling, a 1024-wide linear layer (hard-swish) and a 1000-way classifier.
BatchNorm folded into each conv; the squeeze-and-excite convs have their own bias, as in torchvision.
Hard-swish is ONNX ``HardSwish``, hard-sigmoid ``HardSigmoid`` (alpha 1/6, beta 1/2 = torch's
``relu6(x + 3) / 6``).
"""

from __future__ import annotations

import onnx

from models.builder import GraphBuilder

#: (kernel, expanded channels, output channels, squeeze-excite, activation, stride) -- torchvision's
#: ``_mobilenet_v3_conf("mobilenet_v3_small")`` rows, width 1.0.
BLOCKS = (
    (3, 16, 16, True, "relu", 2),
    (3, 72, 24, False, "relu", 2),
    (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hardswish", 2),
    (5, 240, 40, True, "hardswish", 1),
    (5, 240, 40, True, "hardswish", 1),
    (5, 120, 48, True, "hardswish", 1),
    (5, 144, 48, True, "hardswish", 1),
    (5, 288, 96, True, "hardswish", 2),
    (5, 576, 96, True, "hardswish", 1),
    (5, 576, 96, True, "hardswish", 1),
)
STEM_CHANNELS = 16
LAST_CONV_CHANNELS = 576
LAST_CHANNELS = 1024
NUM_CLASSES = 1000
SEED = 5


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's ``_make_divisible``: round to a multiple of ``divisor``, never 10 % below ``value``."""
    out = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * value else out


def _squeeze_excite(g: GraphBuilder, x: str, channels: int, name: str) -> str:
    squeeze = make_divisible(channels // 4)
    s = g.op("GlobalAveragePool", [x], f"{name}_se_pool")
    s = g.conv(s, channels, squeeze, 1, name=f"{name}_se_fc1", act="relu")
    s = g.conv(s, squeeze, channels, 1, name=f"{name}_se_fc2")
    s = g.op("HardSigmoid", [s], f"{name}_se_gate", alpha=1.0 / 6.0, beta=0.5)
    return g.mul(x, s, name=f"{name}_se_scale")


def _block(g: GraphBuilder, x: str, cin: int, row: tuple, name: str) -> str:
    k, hidden, cout, se, act, stride = row
    y = x
    if hidden != cin:
        y = g.conv(y, cin, hidden, 1, name=f"{name}_expand_conv", act=act)
    y = g.conv(y, hidden, hidden, k, stride=stride, groups=hidden, name=f"{name}_dw_conv", act=act)
    if se:
        y = _squeeze_excite(g, y, hidden, name)
    residual = stride == 1 and cin == cout
    y = g.conv(y, hidden, cout, 1, name=f"{name}_project_conv", gain=0.5 if residual else 1.0)
    return g.add(x, y, name=f"{name}_add") if residual else y


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, _, _ = shape
    g = GraphBuilder("mobilenet-v3-small", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 3, stride=2, name="stem_conv", act="hardswish")
    cin = STEM_CHANNELS
    for i, row in enumerate(BLOCKS):
        x = _block(g, x, cin, row, name=f"block{i}")
        cin = row[2]
    x = g.conv(x, cin, LAST_CONV_CHANNELS, 1, name="head_conv", act="hardswish")
    x = g.global_pool_flatten(x, name="head")
    x = g.linear(x, LAST_CONV_CHANNELS, LAST_CHANNELS, name="head_fc", act="hardswish")
    y = g.gemm(x, LAST_CHANNELS, NUM_CLASSES, name="classifier", output="output")
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
