"""Output channels padded to a multiple of the vector width (``--pad-channels``, on by default).

A conv's or matmul's output channels are the loop an NHWC kernel vectorises, and MetaSchedule splits a
loop only into exact factors. 1000 (every ImageNet classifier here) is 2^3 × 5^3: on AVX-512 its
innermost tile can be 8 lanes (half a register) or 20, 40, 50 — and a vector of a length that is not a
power of two compiles to code several times slower (40 or 48 lanes: 1.3–1.4 ms where 32 lanes take
0.15, SqueezeNet's classifier conv written by hand; bench/RESULTS.md, twenty-eighth session). Tuned
alike (128 trials, cold weights), the same conv with 1024 output channels ran 1.58× faster than with
1000 (1008: 1.26×), for 2.4 % more arithmetic.

So before legalizing, a conv (one group) or a matmul whose weight is a constant, whose output
channels are not a multiple of :data:`LANES` and which computes enough rows to be compute-bound
(:data:`MIN_ROWS`; a classifier matmul on one row streams its weights) computes into a padded
channel count — the weight padded with zero filters — and a ``strided_slice`` takes the real
channels back; the slice is an injective op, which fuses into the kernel's epilogue like the bias add
after it. Whether and how far to pad is :data:`RULES` (a table, first match wins), each rule with the
measurement it rests on. The model computes the same tensor (tests/toolchain/test_padding.py runs
both).

The padding does not depend on the target: a tuning database's kernels are the padded ones, and the
phone-cache proxy builds them again for AVX2 (whose 8 lanes divide 1000) from the same database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.relayout import _shape as static_shape


#: float32 lanes of the widest vector agoc builds for (AVX-512); a multiple of NEON's 4 and AVX2's 8
LANES = 16


@dataclass(frozen=True)
class PadRule:
    """Output channels of at least ``min_channels`` that :data:`LANES` does not divide are padded to the
    next multiple of ``multiple`` × :data:`LANES`, when that adds at most ``max_waste`` of the work and
    the op computes at least ``min_rows`` outputs per channel (a conv's N × H × W, a matmul's rows)."""

    min_channels: int
    multiple: int  # of LANES
    max_waste: float
    min_rows: int
    why: str


#: Below this many rows a kernel streams its weights (2 FLOP per weight and row): the vector width
#: hardly matters and the padding's extra weight bytes are the cost. MnasNet-B1's classifier matmul
#: (one row, 1280 → 1000, 5 MB of weights) alone, 128 trials each: 0.062 ms as it is, 0.093 padded to
#: 1024; SqueezeNet's classifier conv (36 rows) 1.58× faster padded.
MIN_ROWS = 16

#: First rule whose padding fits its ``max_waste`` applies; none: the op is left alone.
RULES: tuple[PadRule, ...] = (
    PadRule(512, 4, 0.05, MIN_ROWS, "1000 → 1024 on AVX-512 (64 = four registers): SqueezeNet's classifier "
                                    "conv tuned 1.58× faster (bench/RESULTS.md, twenty-eighth session)"),
    PadRule(512, 1, 0.05, MIN_ROWS, "1000 → 1008 (one AVX-512 register): 1.26× in the same measurement"),
)


def padded_channels(channels: int, rows: int, rules: tuple[PadRule, ...] = RULES,
                    lanes: int = LANES) -> tuple[int, PadRule | None]:
    """(channels to compute, the rule that chose them) for an op computing ``rows`` outputs per channel —
    ``(channels, None)`` when left alone."""
    if channels % lanes == 0:
        return channels, None
    for rule in rules:
        step = rule.multiple * lanes
        padded = -(-channels // step) * step
        if channels >= rule.min_channels and rows >= rule.min_rows and padded / channels - 1 <= rule.max_waste:
            return padded, rule
    return channels, None


@dataclass(frozen=True)
class Padded:
    """One op the pass padded, and the rule's reason."""

    op: str  # "conv2d" or "matmul"
    channels: int
    padded: int
    why: str


#: module attribute :func:`toolchain.build.legalize` sets: how many ops it padded
APPLIED_ATTR = "agoc_padded_channels"


def applied(mod) -> bool:
    """Whether a legalized module computes padded channels (its kernels differ from the unpadded
    model's). A model with nothing to pad is the same either way: a database tuned without padding
    serves it with or without."""
    return mod.attrs is not None and int(mod.attrs.get(APPLIED_ATTR, 0)) > 0


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` with zero rows appended along axis 0 up to ``rows``."""
    pad = np.zeros((rows - array.shape[0], *array.shape[1:]), dtype=array.dtype)
    return np.concatenate([array, pad], axis=0)


def pad_output_channels(mod, rules: tuple[PadRule, ...] = RULES):
    """``(mod, [Padded])``: ``mod`` (imported, before any layout conversion: NCHW convs with OIHW
    weights) with every conv / matmul :func:`padded_channels` pads computing the padded channels,
    then sliced back. Ops it cannot read (symbolic shapes, other layouts, weights computed at run time)
    are left alone."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    done: list[Padded] = []

    def constant(expr) -> np.ndarray | None:
        value = expr.value if isinstance(expr, tvm.ir.Constant) else None
        return value.numpy() if hasattr(value, "numpy") else None

    def conv(root, matched):
        x, w = matched[conv_x], constant(matched[conv_w])
        attrs = root.attrs
        shape = static_shape(root)
        if (w is None or w.ndim != 4 or int(attrs.groups) != 1 or attrs.data_layout != "NCHW"
                or attrs.kernel_layout != "OIHW" or attrs.out_layout != "NCHW" or shape is None):
            return root
        channels = w.shape[0]
        padded, rule = padded_channels(channels, shape[0] * shape[2] * shape[3], rules)
        if rule is None:
            return root
        wide = relax.op.nn.conv2d(x, relax.const(_pad_rows(w, padded)), strides=attrs.strides,
                                  padding=attrs.padding, dilation=attrs.dilation, groups=1, data_layout="NCHW",
                                  kernel_layout="OIHW", out_layout="NCHW", out_dtype=attrs.out_dtype)
        done.append(Padded("conv2d", channels, padded, rule.why))
        return relax.op.strided_slice(wide, axes=[1], begin=[0], end=[channels])

    def matmul(root, matched):
        x, shape = matched[mm_x], static_shape(root)
        if mm_t in matched:  # Gemm with transB: the weight stored (N, K), transposed into the matmul
            w, axes = constant(matched[mm_tw]), matched[mm_t].attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return root
        else:  # MatMul with a (K, N) weight
            w = constant(matched[mm_w])
            w = w.T if w is not None and w.ndim == 2 else None
        if w is None or w.ndim != 2 or shape is None:
            return root
        channels = w.shape[0]
        padded, rule = padded_channels(channels, math.prod(shape[:-1]), rules)
        if rule is None:
            return root
        wide = relax.op.matmul(x, relax.op.permute_dims(relax.const(_pad_rows(w, padded))))
        done.append(Padded("matmul", channels, padded, rule.why))
        return relax.op.strided_slice(wide, axes=[len(shape) - 1], begin=[0], end=[channels])

    conv_x, conv_w = wildcard(), is_const()
    mm_x, mm_w, mm_tw = wildcard(), is_const(), is_const()
    mm_t = is_op("relax.permute_dims")(mm_tw)
    gv = mod.get_global_var("main")
    func = rewrite_call(is_op("relax.nn.conv2d")(conv_x, conv_w), conv, mod[gv])
    func = rewrite_call(is_op("relax.matmul")(mm_x, mm_t | mm_w), matmul, func)
    if not done:
        return mod, []
    out = type(mod)(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    out[gv] = func
    return relax.transform.Normalize()(out), done
