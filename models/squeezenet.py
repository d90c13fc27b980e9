"""SqueezeNet 1.1 as an inference ONNX graph with random weights.

Architecture: Iandola et al., "SqueezeNet: AlexNet-level accuracy with 50x
fewer parameters and <0.5MB model size" (2016), version 1.1 from the
authors' repository (forresti/SqueezeNet, SqueezeNet_v1.1), as implemented by
torchvision ``squeezenet1_1``: a 3x3/2 conv (64, no padding), three
3x3/2 ceil-mode max pools, eight Fire modules, a 1x1 conv classifier to 1000
channels with ReLU, and global average pooling (torchvision's
AdaptiveAvgPool2d(1)), so every input size from 56x56 up gives [N, 1000].
SqueezeNet has no BatchNorm: convs carry their own biases.
"""

from __future__ import annotations

import onnx

from models.builder import GraphBuilder

#: (squeeze, expand1x1, expand3x3) per Fire module; "pool" marks a 3x3/2 ceil-mode max pool.
FEATURES = ("pool", (16, 64, 64), (16, 64, 64), "pool", (32, 128, 128), (32, 128, 128), "pool",
            (48, 192, 192), (48, 192, 192), (64, 256, 256), (64, 256, 256))
STEM_CHANNELS = 64
NUM_CLASSES = 1000
SEED = 4


def _fire(g: GraphBuilder, x: str, cin: int, squeeze: int, e1: int, e3: int, name: str) -> str:
    s = g.conv(x, cin, squeeze, 1, name=f"{name}_squeeze_conv", act="relu")
    a = g.conv(s, squeeze, e1, 1, name=f"{name}_expand1x1_conv", act="relu")
    b = g.conv(s, squeeze, e3, 3, name=f"{name}_expand3x3_conv", act="relu")
    return g.concat([a, b], name=f"{name}_concat")


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, _, _ = shape
    g = GraphBuilder("squeezenet-1.1", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 3, stride=2, pad=0, name="stem_conv", act="relu")
    cin, fire, pool = STEM_CHANNELS, 2, 1  # Fire modules are numbered fire2..fire9 as in the paper
    for item in FEATURES:
        if item == "pool":
            x = g.max_pool(x, 3, 2, ceil_mode=True, name=f"pool{pool}")
            pool += 1
        else:
            squeeze, e1, e3 = item
            x = _fire(g, x, cin, squeeze, e1, e3, name=f"fire{fire}")
            cin, fire = e1 + e3, fire + 1
    x = g.conv(x, cin, NUM_CLASSES, 1, name="classifier_conv", act="relu")
    x = g.op("GlobalAveragePool", [x], "classifier_gap")
    y = g.op("Flatten", [x], "classifier_flatten", outputs=["output"], axis=1)
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
