"""MobileNet-V2 (width 1.0) as an inference ONNX graph with random weights.

Architecture: Sandler et al., "MobileNetV2: Inverted Residuals and Linear
Bottlenecks" (CVPR 2018), Table 2, as implemented by torchvision
``mobilenet_v2``: a 3x3/2 stem conv (32), 17 inverted-residual blocks, a 1x1
conv to 1280, global average pooling and a 1000-way linear classifier.
BatchNorm is folded into each conv (Conv with bias, no BatchNormalization),
ReLU6 is ``Clip(x, 0, 6)``.
"""

from __future__ import annotations

import onnx

from models.builder import GraphBuilder

#: (expansion t, output channels c, repeats n, first stride s) -- paper Table 2.
SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
STEM_CHANNELS = 32
LAST_CHANNELS = 1280
NUM_CLASSES = 1000
SEED = 2


def _inverted_residual(g: GraphBuilder, x: str, cin: int, cout: int, stride: int, t: int, name: str) -> str:
    hidden = cin * t
    residual = stride == 1 and cin == cout
    y = x
    if t != 1:
        y = g.conv(y, cin, hidden, 1, name=f"{name}_expand_conv", act="relu6")
    y = g.conv(y, hidden, hidden, 3, stride=stride, groups=hidden, name=f"{name}_dw_conv", act="relu6")
    # Linear bottleneck; damped on residual blocks so the identity path dominates.
    y = g.conv(y, hidden, cout, 1, name=f"{name}_project_conv", gain=0.5 if residual else 1.0)
    return g.add(x, y, name=f"{name}_add") if residual else y


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, _, _ = shape
    g = GraphBuilder("mobilenet-v2", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 3, stride=2, name="stem_conv", act="relu6")
    cin, block = STEM_CHANNELS, 0
    for t, cout, repeats, first_stride in SETTINGS:
        for i in range(repeats):
            x = _inverted_residual(g, x, cin, cout, first_stride if i == 0 else 1, t, name=f"block{block}")
            cin, block = cout, block + 1
    x = g.conv(x, cin, LAST_CHANNELS, 1, name="head_conv", act="relu6")
    x = g.global_pool_flatten(x, name="head")
    y = g.gemm(x, LAST_CHANNELS, NUM_CLASSES, name="classifier", output="output")
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
