"""ShuffleNet-V2 1.0x as an inference ONNX graph with random weights.

Architecture: Ma et al., "ShuffleNet V2: Practical Guidelines for Efficient
CNN Architecture Design" (ECCV 2018), Table 5, as implemented by torchvision
``shufflenet_v2_x1_0``: a 3x3/2 conv (24) and a 3x3/2 max pool, three stages
of 4 / 8 / 4 units with 116 / 232 / 464 channels (the first unit of each
stage downsamples with two branches, the others split the channels in half),
a 1x1 conv to 1024, global average pooling and a 1000-way linear classifier.
BatchNorm is folded into each conv. The channel split is a Split node and the
channel shuffle is Reshape -> Transpose -> Reshape with static shapes.
"""

from __future__ import annotations

import onnx

from models.builder import GraphBuilder

STAGE_REPEATS = (4, 8, 4)
STAGE_CHANNELS = (116, 232, 464)
STEM_CHANNELS = 24
LAST_CHANNELS = 1024
NUM_CLASSES = 1000
SEED = 5


def _down(size: int) -> int:
    """Spatial size after a 3x3, stride-2, pad-1 conv or pool."""
    return (size - 1) // 2 + 1


def _channel_shuffle(g: GraphBuilder, x: str, n: int, c: int, h: int, w: int, name: str, groups: int = 2) -> str:
    x = g.reshape(x, (n, groups, c // groups, h, w), name=f"{name}_shuffle_reshape_in")
    x = g.transpose(x, (0, 2, 1, 3, 4), name=f"{name}_shuffle_transpose")
    return g.reshape(x, (n, c, h, w), name=f"{name}_shuffle_reshape_out")


def _unit(g: GraphBuilder, x: str, n: int, cin: int, cout: int, h: int, w: int, stride: int,
          name: str) -> tuple[str, int, int]:
    """One ShuffleNet-V2 unit; returns (output, out height, out width)."""
    half = cout // 2
    if stride == 1:
        left, right = g.split(x, (cin // 2, cin // 2), name=f"{name}_split")
        right_in = cin // 2
    else:
        left = g.conv(x, cin, cin, 3, stride=2, groups=cin, name=f"{name}_branch1_dw_conv")
        left = g.conv(left, cin, half, 1, name=f"{name}_branch1_pw_conv", act="relu")
        right, right_in = x, cin
    right = g.conv(right, right_in, half, 1, name=f"{name}_branch2_pw1_conv", act="relu")
    right = g.conv(right, half, half, 3, stride=stride, groups=half, name=f"{name}_branch2_dw_conv")
    right = g.conv(right, half, half, 1, name=f"{name}_branch2_pw2_conv", act="relu")
    if stride == 2:
        h, w = _down(h), _down(w)
    y = g.concat([left, right], name=f"{name}_concat")
    return _channel_shuffle(g, y, n, cout, h, w, name), h, w


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, h, w = shape
    g = GraphBuilder("shufflenet-v2", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 3, stride=2, name="stem_conv", act="relu")
    x = g.max_pool(x, 3, 2, pad=1, name="stem_pool")
    h, w = _down(_down(h)), _down(_down(w))
    cin = STEM_CHANNELS
    for stage, (repeats, cout) in enumerate(zip(STAGE_REPEATS, STAGE_CHANNELS), start=2):
        for i in range(repeats):
            x, h, w = _unit(g, x, n, cin, cout, h, w, 2 if i == 0 else 1, name=f"stage{stage}_unit{i}")
            cin = cout
    x = g.conv(x, cin, LAST_CHANNELS, 1, name="head_conv", act="relu")
    x = g.global_pool_flatten(x, name="head")
    y = g.gemm(x, LAST_CHANNELS, NUM_CLASSES, name="classifier", output="output")
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
