"""MnasNet-B1 1.0 as an inference ONNX graph with random weights.

Architecture: Tan et al., "MnasNet: Platform-Aware Neural Architecture Search
for Mobile" (CVPR 2019), the B1 variant (no squeeze-and-excitation), as
implemented by torchvision ``mnasnet1_0``: a 3x3/2 stem conv (32), a
depthwise-separable 3x3 conv to 16, six stacks of inverted residuals
(MBConv3 k3 x3, MBConv3 k5 x3, MBConv6 k5 x3, MBConv6 k3 x2, MBConv6 k5 x4,
MBConv6 k3 x1 -- 16 blocks), a 1x1 conv to 1280, global average pooling and a
1000-way linear classifier. ReLU throughout; BatchNorm folded into each conv.
"""

from __future__ import annotations

import onnx

from models.builder import GraphBuilder

#: (output channels, kernel, first stride, expansion, repeats) -- torchvision _stack() calls, alpha=1.0.
STACKS = (
    (24, 3, 2, 3, 3),
    (40, 5, 2, 3, 3),
    (80, 5, 2, 6, 3),
    (96, 3, 1, 6, 2),
    (192, 5, 2, 6, 4),
    (320, 3, 1, 6, 1),
)
STEM_CHANNELS = 32
SEPCONV_CHANNELS = 16
LAST_CHANNELS = 1280
NUM_CLASSES = 1000
SEED = 3


def _inverted_residual(g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int, t: int, name: str) -> str:
    hidden = cin * t
    residual = stride == 1 and cin == cout
    y = g.conv(x, cin, hidden, 1, name=f"{name}_expand_conv", act="relu")
    y = g.conv(y, hidden, hidden, k, stride=stride, groups=hidden, name=f"{name}_dw_conv", act="relu")
    y = g.conv(y, hidden, cout, 1, name=f"{name}_project_conv", gain=0.5 if residual else 1.0)
    return g.add(x, y, name=f"{name}_add") if residual else y


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, _, _ = shape
    g = GraphBuilder("mnasnet", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 3, stride=2, name="stem_conv", act="relu")
    # Depthwise-separable conv (SepConv 3x3), linear output like torchvision.
    x = g.conv(x, STEM_CHANNELS, STEM_CHANNELS, 3, groups=STEM_CHANNELS, name="sep_dw_conv", act="relu")
    x = g.conv(x, STEM_CHANNELS, SEPCONV_CHANNELS, 1, name="sep_pw_conv")
    cin, block = SEPCONV_CHANNELS, 0
    for cout, k, first_stride, t, repeats in STACKS:
        for i in range(repeats):
            x = _inverted_residual(g, x, cin, cout, k, first_stride if i == 0 else 1, t, name=f"block{block}")
            cin, block = cout, block + 1
    x = g.conv(x, cin, LAST_CHANNELS, 1, name="head_conv", act="relu")
    x = g.global_pool_flatten(x, name="head")
    y = g.gemm(x, LAST_CHANNELS, NUM_CLASSES, name="classifier", output="output")
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
