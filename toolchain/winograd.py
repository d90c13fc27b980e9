"""Winograd F(m×m, 3×3) for the 3×3 stride-1 convs of an NHWC model (``--winograd``, the default): the weight
transformed at compile time, the conv one kernel of input transform → batched matmul → output transform, 2.25× (m 2)
or 4× (m 4) fewer multiplications. Why, the rules and the figures: docs/partitioning.md (Winograd convs)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

#: F(m, 3)'s transforms (Lavin & Gray, interpolation points 0, ±1, ±2, ∞): B^T (the input tile's), G (the
#: weight's), A^T (the output's); a tile of m × m outputs reads (m + 2) × (m + 2) inputs
TRANSFORMS = {
    2: {"BT": ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        "G": ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
        "AT": ((1, 1, 1, 0), (0, 1, -1, -1))},
    4: {"BT": ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
               (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
        "G": ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
              (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
        "AT": ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))},
}

#: the tiles tried, largest first: the first whose matmuls have :data:`MIN_TILES` rows or more and whose
#: transformed weight is at most :data:`MAX_WEIGHT_BYTES` is taken; none: the conv stays direct
TILES = (4, 2)
#: the fewest tiles (the matmuls' rows: how often each transformed weight is used) a Winograd conv has: a 4 × 4
#: or 7 × 7 output's 4 or 16 tiles of 2 × 2 left ResNet's last 512-channel convs weight-bound, 0.75× the direct conv
MIN_TILES = 16
#: the largest transformed weight ((m + 2)² × input × output channels, float32): 4× the direct conv's at m = 4,
#: read from memory each call in a model too large for the caches (ResNet-18's 14 × 14 × 256 convs: 9.4 MB at m = 4,
#: 1.3× the direct conv; at m = 2, 4.2 MB)
MAX_WEIGHT_BYTES = 8 << 20
#: the fewest input and output channels a Winograd conv has (its matmul's depth and width: a stem's 3 input
#: channels leave the transforms most of the work)
MIN_CHANNELS = 8

#: the names of the kernel's blocks (toolchain.opgraph classes the PrimFunc by its name: a conv)
FUNC_NAME = "conv2d_winograd"
PAD, ROWS, PACK, GEMM, COLS, UNPACK, OUT = ("winograd_pad", "winograd_rows", "winograd_pack", "winograd_gemm",
                                            "winograd_cols", "winograd_unpack", "conv2d_winograd_nhwc")
#: module attribute :func:`rewrite` sets when it rewrote a conv (see :func:`applied`)
APPLIED_ATTR = "agoc_winograd"


@dataclass(frozen=True)
class Conv:
    """A 3×3 stride-1 NHWC conv :func:`rewrite` takes: its shapes, padding (top, left, bottom, right) and tile."""

    height: int
    width: int
    in_channels: int
    out_channels: int
    padding: tuple[int, int, int, int]
    m: int
    rows: int = 1  # the tiles rounded up to a multiple of this (the matmul's register block's rows: none masked)

    @property
    def out_height(self) -> int:
        return self.height + self.padding[0] + self.padding[2] - 2

    @property
    def out_width(self) -> int:
        return self.width + self.padding[1] + self.padding[3] - 2

    @property
    def tiles(self) -> int:
        """The m × m output tiles, whole and cut off at the edges: the matmuls' rows."""
        return -(-self.out_height // self.m) * -(-self.out_width // self.m)


def tile_of(out_height: int, out_width: int, in_channels: int, out_channels: int) -> int | None:
    """The m of F(m, 3) for a conv of this output and channels (:data:`TILES`), None: it stays direct."""
    def fits(m: int) -> bool:
        tiles = -(-out_height // m) * -(-out_width // m)
        return tiles >= MIN_TILES and (m + 2) ** 2 * in_channels * out_channels * 4 <= MAX_WEIGHT_BYTES

    return next((m for m in TILES if fits(m)), None)


def applied(mod) -> bool:
    """Whether ``mod`` (legalized) computes some conv as Winograd's: a tuning session records it, since its kernels,
    and so their records, differ from the direct convs'."""
    return bool(mod.attrs and APPLIED_ATTR in mod.attrs)


def holds_winograd(block_names) -> bool:
    """Whether a kernel's blocks (their names) hold a Winograd conv's matmul."""
    return any(name.startswith(GEMM) for name in block_names)


def is_winograd(func) -> bool:
    """Whether a PrimFunc (fused or not) holds a Winograd conv's blocks."""
    from tvm import s_tir

    try:
        sch = s_tir.Schedule(func)
        return holds_winograd(sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - no root block: not one
        return False


# ----------------------------------------------------------------------------- which convs, and the rewrite


def _shape(expr) -> tuple[int, ...] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(hasattr(v, "value") for v in values):
        return None
    return tuple(int(v.value) for v in values)


def conv_of(call) -> Conv | None:
    """The :class:`Conv` a Relax call is, or None: a float32 ``conv2d`` of one image in NHWC with an OHWI constant
    3×3 weight, stride 1, no dilation, one group, :data:`MIN_CHANNELS` or more each side, an output and channels
    :func:`tile_of` takes."""
    import tvm

    if getattr(getattr(call, "op", None), "name", None) != "relax.nn.conv2d":
        return None
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or "NHWC") != ("NHWC", "OHWI", "NHWC"):
        return None
    if [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1] or attrs.groups != 1:
        return None
    data, weight = call.args
    if not isinstance(weight, tvm.ir.Constant) or str(weight.value.dtype) != "float32":
        return None
    dshape, wshape = _shape(data), tuple(weight.value.shape)
    if dshape is None or len(dshape) != 4 or dshape[0] != 1 or str(getattr(data.ty, "dtype", "")) != "float32":
        return None
    if (call.attrs.out_dtype or "float32") not in ("float32", "") or wshape[1:3] != (3, 3):
        return None
    pad = [int(p) for p in attrs.padding]
    padding = tuple(pad * 2 if len(pad) == 2 else pad)
    if len(padding) != 4 or min(wshape[0], wshape[3]) < MIN_CHANNELS:
        return None
    conv = Conv(dshape[1], dshape[2], dshape[3], wshape[0], padding, 0)
    m = tile_of(conv.out_height, conv.out_width, conv.in_channels, conv.out_channels)
    return replace(conv, m=m) if m else None


def transformed_weight(weight_ohwi: np.ndarray, m: int) -> np.ndarray:
    """G · g · Gᵀ of every (output, input) channel pair, as the matmul reads it: [m+2, m+2, input, output]."""
    g = np.asarray(TRANSFORMS[m]["G"], dtype=np.float64)
    return np.einsum("er,orsi,ns->enio", g, weight_ohwi.astype(np.float64), g).astype(np.float32)


def rewrite(mod, rows_of=lambda conv: 1):
    """``mod`` with every conv :func:`conv_of` takes in its Relax functions replaced by a ``call_tir`` of its
    Winograd kernel (:func:`kernel`) on its input and its transformed weight (a constant), its tiles rounded up to a
    multiple of ``rows_of(conv)``; the number rewritten."""
    from tvm import relax
    from tvm.relax import PyExprMutator, expr_functor

    count = [0]

    @expr_functor.mutator
    class Rewriter(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            conv = conv_of(call)
            if conv is None:
                return call
            count[0] += 1
            conv = replace(conv, rows=rows_of(conv))
            # kOutEWiseFusable: its bias and activation join it; no symbol of its own (the module names it)
            func = kernel(conv).with_attr("op_pattern", 4).without_attr("global_symbol")
            gv = self.builder_.add_func(func, FUNC_NAME)
            weight = relax.const(transformed_weight(call.args[1].value.numpy(), conv.m))
            return relax.call_tir(gv, [call.args[0], weight], call.ty)

    rewriter = Rewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    out = rewriter.builder_.get()
    return (out.with_attr(APPLIED_ATTR, 1) if count[0] else out), count[0]


# ----------------------------------------------------------------------------- the kernel


def _pick(index, rows: list):
    """``rows[index]`` for a loop variable ``index``: a chain of selects that folds once the loop is unrolled."""
    from tvm import tirx

    out = rows[-1]
    for k in range(len(rows) - 2, -1, -1):
        out = tirx.Select(index == k, rows[k], out)
    return out


def _combine(coefficients, terms):
    """Σ cᵢ · termᵢ over the non-zero cᵢ (the transforms are mostly zeros and ±1)."""
    from tvm import tirx

    total = None
    for c, term in zip(coefficients, terms):
        if c == 0:
            continue
        part = term if c == 1 else -term if c == -1 else term * tirx.const(float(c), "float32")
        total = part if total is None else total + part
    return total


def kernel(conv: Conv):
    """The PrimFunc (data [1, H, W, I], transformed weight [α, α, I, O]) → [1, H', W', O] of F(m, 3), α = m + 2:
    the input padded to whole tiles, each tile's Bᵀ·d·B in two passes (rows, then columns), the α² matmuls over the
    input channels, each result's Aᵀ·M·A in two passes, the tiles' outputs gathered into NHWC."""
    from tvm import te, tirx

    m, a = conv.m, conv.m + 2
    bt, at = TRANSFORMS[m]["BT"], TRANSFORMS[m]["AT"]
    ho, wo = conv.out_height, conv.out_width
    nw = -(-wo // m)
    tiles, ci, co = -(-conv.tiles // conv.rows) * conv.rows, conv.in_channels, conv.out_channels
    nh = -(-tiles // nw)  # whole rows of tiles: those past the output read padding, and nothing reads them
    top, left = conv.padding[0], conv.padding[1]
    def shape(*dims):  # int64, as Relax's shapes are (FuseTIR matches the kernel's buffers to them)
        return tuple(tirx.IntImm("int64", d) for d in dims)

    data = te.placeholder(shape(1, conv.height, conv.width, ci), "float32", name="data")
    weight = te.placeholder(shape(a, a, ci, co), "float32", name="weight")
    zero = tirx.const(0.0, "float32")
    pad = te.compute(
        shape(nh * m + 2, nw * m + 2, ci),
        lambda y, x, c: tirx.if_then_else(
            tirx.all(y >= top, y < conv.height + top, x >= left, x < conv.width + left),
            data[0, y - top, x - left, c], zero),
        name=PAD)

    def tile(p, r, s, c):
        return pad[(p // nw) * m + r, (p % nw) * m + s, c]

    rows = te.compute(shape(a, a, tiles, ci), lambda e, s, p, c: _pick(
        e, [_combine(bt[i], [tile(p, r, s, c) for r in range(a)]) for i in range(a)]), name=ROWS)
    pack = te.compute(shape(a, a, tiles, ci), lambda e, n, p, c: _pick(
        n, [_combine(bt[i], [rows[e, s, p, c] for s in range(a)]) for i in range(a)]), name=PACK)
    k = te.reduce_axis((tirx.IntImm("int64", 0), tirx.IntImm("int64", ci)), name="k")
    gemm = te.compute(shape(a, a, tiles, co), lambda e, n, p, o: te.sum(pack[e, n, p, k] * weight[e, n, k, o], axis=k),
                      name=GEMM)
    cols = te.compute(shape(m, a, tiles, co), lambda i, n, p, o: _pick(
        i, [_combine(at[q], [gemm[e, n, p, o] for e in range(a)]) for q in range(m)]), name=COLS)
    unpack = te.compute(shape(m, m, tiles, co), lambda i, j, p, o: _pick(
        j, [_combine(at[q], [cols[i, n, p, o] for n in range(a)]) for q in range(m)]), name=UNPACK)
    out = te.compute(shape(1, ho, wo, co), lambda b, h, w, o: unpack[h % m, w % m, (h // m) * nw + w // m, o], name=OUT)
    return te.create_prim_func([data, weight, out])
