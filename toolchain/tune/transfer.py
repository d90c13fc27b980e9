"""Sibling seeds: a kernel's search starts from the verified schedules of kernels with the same blocks,
re-fitted to its loops. Why and how: docs/tuning-internals.md (Sibling seeds)."""

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


def _epilogue_start(func) -> int | None:
    """Where a kernel's epilogue starts among its blocks: after its last reducing block (None: none reduces)."""
    last = max((i for i, b in enumerate(block_nests(func)) if b.reduce_extents), default=None)
    return None if last is None else last + 1


def epilogue(func) -> tuple[str, ...]:
    """The names of a kernel's epilogue: the spatial blocks after its last reducing block (a conv's
    bias, activation, residual add; the last one writes the output). Empty without a reducing block."""
    start = _epilogue_start(func)
    return () if start is None else tuple(b.block for b in block_nests(func)[start:])


def core_signature(func) -> tuple | None:
    """The signature up to the epilogue (None without a reducing block): kernels alike here differ only
    in what they compute on the result elementwise, which a schedule reaches through the output's one
    consumer (MetaSchedule inlines the rest), never by name."""
    start = _epilogue_start(func)
    return None if start is None else signature(func)[:start]


def extents(func) -> tuple[int, ...]:
    return tuple(e for b in block_nests(func) for _, e, _ in b.iters)


def distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """How far apart two kernels of one signature are: the summed log-ratio of their loop extents."""
    return sum(abs(math.log(max(x, 1)) - math.log(max(y, 1))) for x, y in zip(a, b))


def _core_extents(func) -> tuple[int, ...]:
    return tuple(e for b in block_nests(func)[:_epilogue_start(func)] for _, e, _ in b.iters)


def siblings(func, candidates: dict, k: int) -> list[str]:
    """The ``k`` names of ``candidates`` ({name: PrimFunc}) to start ``func``'s search from, nearest in
    loop extents first (ties: in the order given): kernels with ``func``'s signature and, where there
    are any, kernels with its core signature and another epilogue (a pointwise conv with hard-swish
    from one with bias only). With ``k`` ≥ 2 the nearest of each kind comes first: a fused epilogue's
    own search lands much wider than the plain conv's (MobileNet-V3's 1×1 hard-swish conv: its own best
    of 64 trials ran 1.6–2.5× the bias-only conv's schedule replayed on it, in three draws), so the
    plain conv's schedule is worth a trial even where same-epilogue siblings exist."""
    if k <= 0:
        return []
    sig, ext = signature(func), extents(func)
    core = core_signature(func) if epilogue(func) else None  # no epilogue: nothing to differ in
    same, alike = [], []
    for i, (name, f) in enumerate(candidates.items()):
        if signature(f) == sig:
            same.append((distance(ext, extents(f)), i, name))
        elif core is not None and core_signature(f) == core and epilogue(f):
            alike.append((distance(_core_extents(func), _core_extents(f)), i, name))
    same, alike = [n for *_, n in sorted(same)], [n for *_, n in sorted(alike)]
    first = [*same[:1], *alike[:1]] if k >= 2 else (same or alike)[:1]
    return (first + [n for n in same + alike if n not in first])[:k]


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (the tile factors a loop of ``n`` iterations splits into evenly)."""
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
        out[i] = max(d for d in divisors(rest) if d <= cap)
        rest //= out[i]
    out[0] = rest
    return out


def _lookups(trace_json, name: str) -> set[str]:
    """The variables the trace's lookups of block ``name`` bind."""
    return {o for inst in trace_json[0] if inst[0] in ("GetSBlock", "GetBlock") and inst[2] and inst[2][0] == name
            for o in inst[3] if isinstance(o, str)}


def uses_block(trace_json, name: str) -> bool:
    """Whether any step of the trace acts on block ``name`` (beyond looking it up)."""
    bound = _lookups(trace_json, name)
    return any(isinstance(x, str) and x in bound for inst in trace_json[0] for x in inst[1] or [])


def without_blocks(trace_json, names: set[str]):
    """A search trace JSON with the blocks ``names`` and every step on them left out (an epilogue's
    inlining, which the kernel it is replayed on does in its own steps first); the decisions follow
    their steps."""
    insts, decisions = trace_json
    gone: set[str] = set()
    keep: list[int] = []
    for i, inst in enumerate(insts):
        kind, inputs, attrs, outputs = (list(inst) + [[], [], []])[:4]
        named = kind in ("GetSBlock", "GetBlock") and attrs and attrs[0] in names
        if named or any(isinstance(x, str) and x in gone for x in inputs or []):
            gone.update(o for o in outputs or [] if isinstance(o, str))
            continue
        keep.append(i)
    index = {old: new for new, old in enumerate(keep)}
    return [[insts[i] for i in keep], [[index[int(d[0])], *d[1:]] for d in decisions if int(d[0]) in index]]


def transfer_schedule(src_mod, search_trace, dst_mod):
    """``search_trace`` (the search part of a verified schedule's trace JSON, postprocessing left out)
    of the kernel module ``src_mod`` replayed on ``dst_mod`` with every tile split re-fitted to its
    loops; the schedule before postprocessing, or None when it does not replay (a kernel of one
    signature may still differ in what a step needs, e.g. a stride).

    Between kernels of one core signature and other epilogues (:func:`siblings`), each side's epilogue
    is first reduced to the block that writes the output, which the schedule reaches as the result's
    one consumer: the source trace's lookups of its epilogue and the steps on all but its output block
    are left out (a step on that one by name: no seed), and the rest of ``dst_mod``'s epilogue is
    inlined into its output block, as MetaSchedule's own space would."""
    from tvm import s_tir

    src_func, dst_func = src_mod["main"], dst_mod["main"]
    inline: tuple[str, ...] = ()
    if signature(src_func) != signature(dst_func):
        src_ends, dst_ends = epilogue(src_func), epilogue(dst_func)
        if not src_ends or not dst_ends or uses_block(search_trace, src_ends[-1]):
            return None  # a step on the output block by its name has no counterpart to go to
        search_trace = without_blocks(search_trace, set(src_ends))
        inline = dst_ends[:-1]
    try:
        src = s_tir.Schedule(src_mod)
        s_tir.Trace.apply_json_to_schedule(search_trace, src)
        dst = s_tir.Schedule(dst_mod)
        for name in inline:
            dst.compute_inline(dst.get_sblock(name))

        def refit(inst, inputs, attrs, decision):
            if inst.kind.name == "SamplePerfectTile" and decision is not None:
                extent = int(dst.get(inputs[0]).extent)
                return refit_tile([int(x) for x in decision], extent, int(attrs[1]) if len(attrs) > 1 else 0)
            return decision

        src.trace.apply_to_schedule(dst, remove_postproc=True, decision_provider=refit)
    except Exception:  # noqa: BLE001 - a schedule that does not carry over is no seed
        return None
    return dst
