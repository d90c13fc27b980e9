"""Sibling seeds: a kernel's search starts from the verified schedules of kernels like it.

MobileNet-like models repeat a handful of kernel shapes — a pointwise conv with bias and
ReLU6, a depthwise one, a linear bottleneck — at different channel counts and resolutions.
MetaSchedule starts every kernel's search from random samples, and at the budgets a model is
tuned with here (one or two batches of 16 for most of AGO's minis) its first batch is often
2-5x off what the same kernel reaches after 64 trials. A kernel whose blocks are the same as an
already verified kernel's (same block names, same iterator kinds; only the loop extents
differ) can start from that kernel's schedule instead: the trace is replayed on the new kernel
with every tile split re-fitted to the new extents (:func:`refit_tile`), measured like any
candidate, and committed as the kernel's first record, which MetaSchedule's evolutionary
search then starts from (as a join starts from its composed minis, AGO §V). Transfer-tuning
(Gibson & Cano, PACT 2022) reuses schedules across kernels the same way.

The nearest siblings in loop extents are tried first (:func:`siblings`). A seed is a
candidate like any other: it counts against the kernel's budget, and the kernel's kept
schedule is verified numerically whichever candidate it is.
"""

from __future__ import annotations

import functools
import math

from toolchain.opgraph import block_nests as _block_nests

#: a kernel's blocks, read once per PrimFunc (a session asks for every verified kernel's, per task)
block_nests = functools.lru_cache(maxsize=4096)(_block_nests)


def signature(func) -> tuple:
    """What decides whether one kernel's schedule carries over to another: every block's name,
    iterator kinds and which of its loops are unit loops, in program order (other extents left out).
    The unit loops tell a 1×1 conv from a k×k one of the same blocks: a pointwise conv's schedule
    leaves its window loops alone; on MobileNet-V2's 3×3 stem (3 input channels) it ran about 16× slower
    than the stem's own best schedule."""
    return tuple((b.block, tuple(kind for _, _, kind in b.iters), tuple(e == 1 for _, e, _ in b.iters))
                 for b in block_nests(func))


def extents(func) -> tuple[int, ...]:
    return tuple(e for b in block_nests(func) for _, e, _ in b.iters)


def distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """How far apart two kernels of one signature are: the summed log-ratio of their loop extents."""
    return sum(abs(math.log(max(x, 1)) - math.log(max(y, 1))) for x, y in zip(a, b))


def siblings(func, candidates: dict, k: int) -> list[str]:
    """The ``k`` names of ``candidates`` ({name: PrimFunc}) with ``func``'s signature, nearest in loop
    extents first (ties: in the order given)."""
    if k <= 0:
        return []
    sig, ext = signature(func), extents(func)
    same = [(distance(ext, extents(f)), i, name) for i, (name, f) in enumerate(candidates.items())
            if signature(f) == sig]
    return [name for _, _, name in sorted(same)[:k]]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def refit_tile(factors: list[int], extent: int, max_innermost: int = 0) -> list[int]:
    """A tile split of ``extent`` as close to ``factors`` (another kernel's split of its own extent)
    as divisibility allows: from the innermost factor out, the largest divisor of what is left not
    above the source's factor (the innermost also not above ``max_innermost`` when that is set);
    the outermost takes the rest. The product is always ``extent``."""
    out = [1] * len(factors)
    rest = extent
    for i in range(len(factors) - 1, 0, -1):
        cap = max(1, int(factors[i]))
        if i == len(factors) - 1 and max_innermost > 0:
            cap = min(cap, max_innermost)
        out[i] = max(d for d in _divisors(rest) if d <= cap)
        rest //= out[i]
    out[0] = rest
    return out


def transfer_schedule(src_mod, search_trace, dst_mod):
    """``search_trace`` (the search part of a verified schedule's trace JSON, postprocessing left out)
    of the kernel module ``src_mod`` replayed on ``dst_mod`` with every tile split re-fitted to its
    loops; the schedule before postprocessing, or None when it does not replay (a kernel of one
    signature may still differ in what a step needs, e.g. a stride)."""
    from tvm import s_tir

    try:
        src = s_tir.Schedule(src_mod)
        s_tir.Trace.apply_json_to_schedule(search_trace, src)
        dst = s_tir.Schedule(dst_mod)

        def refit(inst, inputs, attrs, decision):
            if inst.kind.name == "SamplePerfectTile" and decision is not None:
                extent = int(dst.get(inputs[0]).extent)
                return refit_tile([int(x) for x in decision], extent, int(attrs[1]) if len(attrs) > 1 else 0)
            return decision

        src.trace.apply_to_schedule(dst, remove_postproc=True, decision_provider=refit)
    except Exception:  # noqa: BLE001 - a schedule that does not carry over is no seed
        return None
    return dst
