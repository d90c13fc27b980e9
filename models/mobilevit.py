"""MobileViT-XS as an inference ONNX graph with random weights.

Architecture: Mehta & Rastegari, "MobileViT: Light-weight, General-purpose,
and Mobile-friendly Vision Transformer" (ICLR 2022), the XS model (paper
Table 4 / Fig. 1: 2.3M parameters), as implemented by apple/ml-cvnets
(``mobilevit`` v1, ``x_small`` config) and Hugging Face ``MobileViTModel``
(``apple/mobilevit-x-small``):

* stem: 3x3/2 conv to 16, SiLU;
* layer1: MV2 block 16 -> 32 (expansion 4); layer2: MV2 blocks 32 -> 48 (/2), 48, 48;
* layer3/4/5: an MV2 block (/2) to 64 / 80 / 96 channels, then a MobileViT
  block with transformer width 96 / 120 / 144, FFN 192 / 240 / 288,
  2 / 4 / 3 pre-norm transformer layers, 4 heads and 2x2 patches;
* a 1x1 conv to 384, SiLU, global average pooling, a 1000-way linear classifier.

A MobileViT block is: 3x3 conv (BN, SiLU), 1x1 conv to the transformer width
(no BN, no bias), unfold into 2x2 patches, transformer layers and a final
LayerNorm, fold back, 1x1 conv back (BN, SiLU), concat with the block input,
3x3 fusion conv (BN, SiLU). Unfold and fold repeat cvnets' Reshape/Transpose
sequence (static shapes, at most 4-D). Where the feature map is not a
multiple of the patch size (7x7 in layer5 at 224x224 input), cvnets and HF
resize bilinearly to the next multiple (8x8) and back afterwards; that is a
Resize node (linear, half_pixel, static ``sizes``) here.

SiLU is ``x * Sigmoid(x)``, BatchNorm is folded into the convs, the fused
q/k/v projection is one MatMul followed by a Split (as cvnets' ``qkv_proj``).
"""

from __future__ import annotations

import math

import onnx

from models.builder import GraphBuilder

STEM_CHANNELS = 16
EXPANSION = 4
#: MV2 layers: (output channels, blocks, first stride).
MV2_LAYERS = ((32, 1, 1), (48, 3, 2))
#: MobileViT layers: (output channels, transformer width, FFN width, transformer layers).
VIT_LAYERS = ((64, 96, 192, 2), (80, 120, 240, 4), (96, 144, 288, 3))
HEADS = 4
PATCH = 2
LAST_CHANNELS = 384
NUM_CLASSES = 1000
LN_EPS = 1e-5
SEED = 7


def _down(size: int) -> int:
    """Spatial size after a 3x3, stride-2, pad-1 conv."""
    return (size - 1) // 2 + 1


def _mv2(g: GraphBuilder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    hidden = cin * EXPANSION
    residual = stride == 1 and cin == cout
    y = g.conv(x, cin, hidden, 1, name=f"{name}_expand_conv", act="silu")
    y = g.conv(y, hidden, hidden, 3, stride=stride, groups=hidden, name=f"{name}_dw_conv", act="silu")
    y = g.conv(y, hidden, cout, 1, name=f"{name}_project_conv", gain=0.5 if residual else 1.0)
    return g.add(x, y, name=f"{name}_add") if residual else y


def _transformer(g: GraphBuilder, x: str, b: int, seq: int, d: int, ffn: int, name: str) -> str:
    """Pre-norm transformer layer on [b, seq, d]."""
    dh = d // HEADS
    h = g.layernorm(x, d, name=f"{name}_attn_layernorm", eps=LN_EPS)
    qkv = g.linear(h, d, 3 * d, name=f"{name}_qkv")
    q, k, v = g.split(qkv, (d, d, d), axis=-1, name=f"{name}_qkv_split")
    heads = (b, seq, HEADS, dh)
    q = g.transpose(g.reshape(q, heads, name=f"{name}_q_reshape"), (0, 2, 1, 3), name=f"{name}_q_transpose")
    k = g.transpose(g.reshape(k, heads, name=f"{name}_k_reshape"), (0, 2, 3, 1), name=f"{name}_k_transpose")
    v = g.transpose(g.reshape(v, heads, name=f"{name}_v_reshape"), (0, 2, 1, 3), name=f"{name}_v_transpose")
    q = g.mul(q, g.const(f"attn_scale_{dh}", 1.0 / math.sqrt(dh)), name=f"{name}_q_scaled")
    scores = g.op("MatMul", [q, k], f"{name}_scores")
    probs = g.op("Softmax", [scores], f"{name}_probs", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{name}_context")
    ctx = g.reshape(g.transpose(ctx, (0, 2, 1, 3), name=f"{name}_context_transpose"), (b, seq, d),
                    name=f"{name}_context_reshape")
    x = g.add(x, g.linear(ctx, d, d, name=f"{name}_attn_out", gain=0.5), name=f"{name}_attn_residual")
    h = g.layernorm(x, d, name=f"{name}_ffn_layernorm", eps=LN_EPS)
    h = g.linear(h, d, ffn, name=f"{name}_ffn1", act="silu")
    h = g.linear(h, ffn, d, name=f"{name}_ffn2", gain=0.5)
    return g.add(x, h, name=f"{name}_ffn_residual")


def _mobilevit_block(g: GraphBuilder, x: str, n: int, c: int, hgt: int, wid: int,
                     d: int, ffn: int, layers: int, name: str) -> str:
    res = x
    y = g.conv(x, c, c, 3, name=f"{name}_local_conv3x3", act="silu")
    y = g.conv(y, c, d, 1, name=f"{name}_local_conv1x1", bias=False)

    # cvnets/HF: resize to a multiple of the patch size when needed.
    ph = math.ceil(hgt / PATCH) * PATCH
    pw = math.ceil(wid / PATCH) * PATCH
    if (ph, pw) != (hgt, wid):
        sizes = g.const(f"resize_sizes_{n}x{d}x{ph}x{pw}", [n, d, ph, pw])
        y = g.op("Resize", [y, "", "", sizes], f"{name}_unfold_resize",
                 mode="linear", coordinate_transformation_mode="half_pixel")
    nh, nw, area = ph // PATCH, pw // PATCH, PATCH * PATCH
    seq = nh * nw

    # Unfold: [n, d, H, W] -> [n * area, seq, d] (cvnets MobileViTBlock.unfolding).
    y = g.reshape(y, (n * d * nh, PATCH, nw, PATCH), name=f"{name}_unfold_reshape1")
    y = g.transpose(y, (0, 2, 1, 3), name=f"{name}_unfold_transpose1")
    y = g.reshape(y, (n, d, seq, area), name=f"{name}_unfold_reshape2")
    y = g.transpose(y, (0, 3, 2, 1), name=f"{name}_unfold_transpose2")
    y = g.reshape(y, (n * area, seq, d), name=f"{name}_unfold_reshape3")

    for i in range(layers):
        y = _transformer(g, y, n * area, seq, d, ffn, name=f"{name}_transformer{i}")
    y = g.layernorm(y, d, name=f"{name}_layernorm", eps=LN_EPS)

    # Fold: [n * area, seq, d] -> [n, d, H, W] (cvnets MobileViTBlock.folding).
    y = g.reshape(y, (n, area, seq, d), name=f"{name}_fold_reshape1")
    y = g.transpose(y, (0, 3, 2, 1), name=f"{name}_fold_transpose1")
    y = g.reshape(y, (n * d * nh, nw, PATCH, PATCH), name=f"{name}_fold_reshape2")
    y = g.transpose(y, (0, 2, 1, 3), name=f"{name}_fold_transpose2")
    y = g.reshape(y, (n, d, ph, pw), name=f"{name}_fold_reshape3")
    if (ph, pw) != (hgt, wid):
        sizes = g.const(f"resize_sizes_{n}x{d}x{hgt}x{wid}", [n, d, hgt, wid])
        y = g.op("Resize", [y, "", "", sizes], f"{name}_fold_resize",
                 mode="linear", coordinate_transformation_mode="half_pixel")

    y = g.conv(y, d, c, 1, name=f"{name}_proj_conv", act="silu")
    y = g.concat([res, y], name=f"{name}_concat")
    return g.conv(y, 2 * c, c, 3, name=f"{name}_fusion_conv", act="silu")


def build(shape: tuple[int, ...] = (1, 3, 224, 224)) -> onnx.ModelProto:
    n, c, hgt, wid = shape
    g = GraphBuilder("mobilevit", seed=SEED)
    x = g.input("input", shape)
    x = g.conv(x, c, STEM_CHANNELS, 3, stride=2, name="stem_conv", act="silu")
    hgt, wid = _down(hgt), _down(wid)
    cin = STEM_CHANNELS
    for layer, (cout, blocks, first_stride) in enumerate(MV2_LAYERS, start=1):
        for i in range(blocks):
            stride = first_stride if i == 0 else 1
            x = _mv2(g, x, cin, cout, stride, name=f"layer{layer}_mv2_{i}")
            if stride == 2:
                hgt, wid = _down(hgt), _down(wid)
            cin = cout
    for layer, (cout, d, ffn, layers) in enumerate(VIT_LAYERS, start=3):
        x = _mv2(g, x, cin, cout, 2, name=f"layer{layer}_mv2")
        hgt, wid = _down(hgt), _down(wid)
        x = _mobilevit_block(g, x, n, cout, hgt, wid, d, ffn, layers, name=f"layer{layer}_mvit")
        cin = cout
    x = g.conv(x, cin, LAST_CHANNELS, 1, name="head_conv", act="silu")
    x = g.global_pool_flatten(x, name="head")
    y = g.gemm(x, LAST_CHANNELS, NUM_CLASSES, name="classifier", output="output")
    return g.finish(y, (n, NUM_CLASSES), doc=__doc__)
