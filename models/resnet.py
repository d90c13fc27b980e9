"""ResNet-18 as an inference ONNX graph with random weights.

Architecture: He et al., "Deep Residual Learning for Image Recognition" (CVPR
2016), Table 1, as implemented by torchvision ``resnet18``: a 7x7/2 stem conv
(64) and a 3x3/2 max pool, four stages of two BasicBlocks (two 3x3 convs and a
residual add; 64/128/256/512 channels, the first block of stages 2-4 with
stride 2 and a 1x1/2 projection shortcut), global average pooling and a
1000-way linear classifier. BatchNorm is folded into each conv (Conv with
bias, no BatchNormalization). Its dense 3x3 stride-1 convs are what the
Winograd path takes (docs/partitioning.md).
"""

from __future__ import annotations

import onnx

from models.builder import GraphBuilder

#: (channels, blocks) per stage -- paper Table 1, the 18-layer column.
STAGES = ((64, 2), (128, 2), (256, 2), (512, 2))
STEM_CHANNELS = 64
NUM_CLASSES = 1000
SEED = 6


def _basic_block(g: GraphBuilder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    y = g.conv(x, cin, cout, 3, stride=stride, name=f"{name}_conv1", act="relu")
    # damped like a trained network's small last BN gammas, so the identity path dominates
    y = g.conv(y, cout, cout, 3, name=f"{name}_conv2", gain=0.5)
    shortcut = x if stride == 1 and cin == cout else g.conv(x, cin, cout, 1, stride=stride, name=f"{name}_down")
    return g.act(g.add(y, shortcut, name=f"{name}_add"), "relu", name)


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, _, _ = shape
    g = GraphBuilder("resnet-18", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 7, stride=2, name="stem_conv", act="relu")
    x = g.max_pool(x, 3, 2, pad=1, name="stem_pool")
    cin = STEM_CHANNELS
    for stage, (cout, blocks) in enumerate(STAGES):
        for i in range(blocks):
            x = _basic_block(g, x, cin, cout, 2 if i == 0 and stage > 0 else 1, name=f"layer{stage + 1}_{i}")
            cin = cout
    x = g.global_pool_flatten(x, name="head")
    y = g.gemm(x, cin, NUM_CLASSES, name="classifier", output="output")
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
