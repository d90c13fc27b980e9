"""AGO intensive operator fusion (§III-B): schedule the pair (or chain) of complex ops a kernel fuses
(toolchain/tune/pairs.py) in the Fig. 7 structure. How and why: docs/tuning-internals.md (Intensive fusion)."""

from __future__ import annotations

import os
from typing import Callable

from toolchain.tune import rolling
from toolchain.tune.pairs import CONV_AXES, IntensivePair, as_int, is_copy, tile_bounds
from toolchain.tune.tiles import TILE_FACTOR_MAX
from toolchain.tune.transfer import divisors

#: candidate auto-unroll depths (the stock ParallelizeVectorizeUnroll rule's, for CPU)
UNROLL_STEPS = (0, 16, 64, 512)
#: the annotation that keeps the postprocessor from fusing a loop of whole registers back into one wide vector (it
#: fuses the innermost loops that carry none, up to MAX_VECTORIZE_EXTENT)
WHOLE_REGISTERS = "agoc.whole_registers"
MAX_JOBS_PER_CORE = 16
MAX_VECTORIZE_EXTENT = 64
VECTOR_FACTOR_MAX = 16  # innermost (vectorised) tile factor, at most: 4 NEON registers of float32
REGISTER_FACTOR_MAX = 8  # channel / row register tile factor
OTHER_FACTOR_MAX = 4  # other spatial dims (H) in the register tile
#: float32 lanes of one vector register by the target's widest vector extension (LLVM CPU features),
#: first match; NEON (and anything not listed): 4
VECTOR_LANES = (("avx512f", 16), ("avx2", 8), ("avx", 8))


def vector_lanes(target) -> int:
    """float32 lanes of one vector register of ``target`` (a ``tvm.target.Target``): :data:`VECTOR_LANES`."""
    from tvm.target import codegen

    if str(target.kind) != "llvm" or "aarch64" in str(target.attrs.get("mtriple", "")):
        return 4
    with target:
        for feature, lanes in VECTOR_LANES:
            if codegen.llvm_cpu_has_features([feature], target):
                return lanes
    return 4


def vector_cap(lanes: int) -> int:
    """The vector's inner factor at most: four registers' worth (:data:`VECTOR_FACTOR_MAX` on NEON; 64 on
    AVX-512, where 16 would be one register and a channel-vectorised NHWC conv re-reads every input
    element once per 16 output channels)."""
    return max(VECTOR_FACTOR_MAX, 4 * lanes)


# --------------------------------------------------------------------------------------------
# The schedule


def _try(fn, *args, **kwargs) -> bool:
    from tvm.s_tir import ScheduleError

    try:
        fn(*args, **kwargs)
        return True
    except ScheduleError:
        return False


def block_exists(sch, name: str) -> bool:
    try:
        sch.get_sblock(name)
        return True
    except Exception:  # noqa: BLE001 - tvm raises a generic error for a missing block
        return False


def _has_if_then_else(block) -> bool:
    return "if_then_else" in str(getattr(block.body, "value", ""))


def _inline(sch, pair: IntensivePair) -> None:
    """Inline elementwise blocks of the pair where it duplicates no work."""
    complex_names = {pair.upstream, pair.downstream, pair.head}
    firsts = [n for n in (pair.head_input, pair.upstream_input) if n]
    names = firsts + list(pair.head_chain) + list(pair.chain) + list(pair.epilogue)
    for name in names:
        rv = sch.get_sblock(name)
        block = sch.get(rv)
        consumers = [sch.get(c).name_hint for c in sch.get_consumers(rv)]
        if not consumers:
            continue  # writes an output
        if is_copy(block):
            _try(sch.compute_inline, rv)
        elif not _has_if_then_else(block) and not any(c in complex_names for c in consumers):
            _try(sch.compute_inline, rv)


#: ``decide(role, block, iter, extent, cap)``: the inner factor a split should take instead of a
#: random sample ("tile": D's tiled dims; "vector": the innermost, vectorised dim of a register tile inside
#: the tile; "register": its rows, the dim blocked beside the vector; "other": its other dims), or the
#: auto-unroll depth ("unroll"); None leaves it to sampling. The sampled instruction records the
#: choice as its decision, so the search mutates it like any other (toolchain/tune/intensive_seed.py).
Decide = Callable[[str, str, int, int, int], "int | None"]


def _split(sch, loop, n_max: int, inner: int | None = None):
    extent = as_int(sch.get(loop).extent)
    decision = [extent // inner, inner] if inner and extent % inner == 0 and inner <= n_max else None
    factors = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=n_max, decision=decision)
    return sch.split(loop, factors=factors)


def _register_tile(sch, block_name: str, outer_loop, reg_iter: int | None, n_spatial: int,
                   decide: Decide | None = None, first_iter: int = 0, vector_max: int = VECTOR_FACTOR_MAX,
                   lanes: int = 0) -> None:
    """Inside the tile, MultiLevelTiling's "SRS": every spatial loop split (outer, inner) with a
    sampled inner factor, order [outer spatials, reductions, inner spatials]. The inner tile is the
    register tile: the last spatial dim (W / columns) is the vector, ``reg_iter`` (channels / rows)
    and the other dims (H) give accumulator reuse; a factor of 1 turns a dim's blocking off.
    ``first_iter``: the block's iterator the first loop inside the tile runs over; ``vector_max``: the
    vector's cap (:func:`vector_cap`). Where ``lanes`` divide the vector's dim, the vector is whole registers: the
    lanes split off first, the number of registers sampled (:func:`_whole_registers`)."""
    block = sch.get_sblock(block_name)
    loops = list(sch.get_loops(block))
    pos = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(outer_loop)))
    inner = loops[pos + 1:]
    spatial, reduce = inner[:n_spatial], inner[n_spatial:]
    outers, inners, vector, lane = [], [], None, None
    for k, lp in enumerate(spatial):
        extent = as_int(sch.get(lp).extent)
        if extent == 1 or (reg_iter is None and k < n_spatial - 2):
            outers.append(lp)  # unit loops, and a depthwise conv's channels (and batch)
            continue
        last = k == n_spatial - 1
        cap = vector_max if last else (REGISTER_FACTOR_MAX if k == reg_iter else OTHER_FACTOR_MAX)
        rows = k == reg_iter or (reg_iter is None and k == n_spatial - 2)  # the block's rows (a depthwise conv's W)
        role = "vector" if last else ("register" if rows else "other")
        chosen = decide(role, block_name, first_iter + k, extent, cap) if decide else None
        if last and _several_registers(extent, lanes):
            lp, lane = sch.split(lp, [None, lanes])
            cap, chosen = max(1, cap // lanes), chosen and max(1, chosen // lanes)
        o, i = _split(sch, lp, cap, chosen)
        outers.append(o)
        inners.append(i)
        if last:
            vector = i
    sch.reorder(*outers, *reduce, *inners, *([lane] if lane is not None else []))
    if lane is not None:  # whole registers: their loop unrolled, kept out of the postprocessor's vector
        _as_registers(sch, vector, lane)
        sch.unroll(vector)
    elif vector is not None:
        sch.vectorize(vector)


def _several_registers(extent: int, lanes: int) -> bool:
    """Does a loop of ``extent`` span several whole registers of ``lanes``?"""
    return lanes > 1 and extent > lanes and extent % lanes == 0


def _whole_registers(sch, loop, lanes: int) -> None:
    """``loop`` vectorised one register (``lanes``) wide, its registers' loop annotated so that the postprocessor,
    which fuses the innermost loops that carry no annotation up to :data:`MAX_VECTORIZE_EXTENT` lanes, leaves it out
    of the vector: LLVM lowers a vector of several registers that is not a power of two of them (AVX2's 24 lanes)
    through lane inserts and extracts (docs/tuning-internals.md, Whole registers)."""
    _as_registers(sch, *sch.split(loop, [None, lanes]))


def _as_registers(sch, registers, lane) -> None:
    """``lane`` (one register) vectorised, ``registers`` (its loop) annotated out of the postprocessor's fusing."""
    sch.annotate(registers, WHOLE_REGISTERS, 1)
    sch.vectorize(lane)


def _reg_iter(kind: str, n_spatial: int, layout: str = "NCHW") -> int | None:
    """The register-blocked dim of U / D besides the vector (the last dim): NCHW output channels
    (the vector is W), NHWC W (the vector is the output channels), or matmul rows. None for a
    depthwise conv, whose channels share nothing (blocking them reuses no operand): only its last two
    dims are blocked (NCHW H and W; NHWC W and the channels)."""
    if kind == "matmul":
        return n_spatial - 2
    if kind == "dw":
        return None
    channels, w = CONV_AXES[layout]
    return channels if layout == "NCHW" else w


def intensive_schedule(sch, pair: IntensivePair, num_cores: int | None = None, decide: Decide | None = None,
                       lanes: int = 4, tile_cache: int = 0) -> None:
    """Apply the Fig. 7 intensive-fusion structure of ``pair`` to ``sch`` (in place).

    All tile sizes and the unroll depth are sampling decisions of ``sch``; ``decide`` may choose them
    (:data:`Decide`), otherwise they are sampled. ``lanes``: the target's float32 vector lanes
    (:func:`vector_lanes`), which set the vector's cap. ``tile_cache``: bytes of cache lines the tile's slice
    of the intermediate may touch at most (a phone core's cache share; 0: only :data:`TILE_FACTOR_MAX`), which
    also sets a floor (:func:`tile_bounds`: a tile a line wide, a tile per core).
    """
    bounds = tile_bounds(sch.mod["main"], pair, tile_cache, num_cores or os.cpu_count() or 1)

    def tile_split(loop, it: int):
        extent = as_int(sch.get(loop).extent)
        floor, cap = bounds.get(it, (1, TILE_FACTOR_MAX))
        chosen = decide("tile", pair.downstream, it, extent, cap) if decide else None
        if floor <= 1:
            return _split(sch, loop, cap, max(k for k in divisors(extent) if k <= min(chosen, cap)) if chosen else None)
        # a whole number of floors per tile: the floor split off inside, the search over the rest; a decided
        # tile (a seed's) moved to the widest such tile not wider than it
        outer, whole = sch.split(loop, factors=[None, floor])
        wanted = None
        if chosen:
            steps, most = extent // floor, max(floor, min(chosen, cap))
            wanted = max(k for k in divisors(steps) if k * floor <= most)
        tile, inner = _split(sch, outer, cap // floor, wanted)
        return tile, sch.fuse(inner, whole)

    _inline(sch, pair)
    d_rv = sch.get_sblock(pair.downstream)
    n_sp = sum(1 for iv in sch.get(d_rv).iter_vars if int(iv.iter_type) != 2)
    spatial = list(sch.get_loops(d_rv))[:n_sp]
    kind = pair.downstream_kind
    nhwc = pair.layout == "NHWC"
    row = None  # a chain's row loop inside the tile, where U and D go one row at a time
    rolls = False  # row tiles in order on each core, the window's rows computed once (rolling.py)
    if kind == "dw" and 1 in bounds:  # NHWC, rows tiled (:func:`row_units`): inside the tile (y_i, x, f)
        n, y, x, f = spatial
        y_o, y_i = tile_split(y, 1)
        tile, rolls = rolling.per_core(sch, sch.fuse(n, y_o), num_cores or os.cpu_count() or 1)
        d_inner, d_reg = 3, None
    elif kind == "dw":  # tile f; inside the tile NCHW (f_i, y, x), NHWC (y, x, f_i)
        n, y, x, f = spatial if nhwc else (spatial[0], spatial[2], spatial[3], spatial[1])
        f_o, f_i = tile_split(f, 3 if nhwc else 1)
        sch.reorder(*((n, f_o, y, x, f_i) if nhwc else (n, f_o, f_i)))
        tile = sch.fuse(n, f_o)
        d_inner, d_reg = 3, None
    elif kind == "pw" and pair.head:  # a chain: tile y; inside the tile, row by row, U's row then D's (x, f)
        n, y, x, f = spatial
        y_o, row = tile_split(y, 1)
        tile, rolls = rolling.per_core(sch, sch.fuse(n, y_o), num_cores or os.cpu_count() or 1)
        d_inner, d_reg = 2, 0
    elif kind == "pw":  # tile y, x; inside the tile NCHW (f, y_i, x_i), NHWC (y_i, x_i, f)
        n, y, x, f = spatial if nhwc else (spatial[0], spatial[2], spatial[3], spatial[1])
        y_o, y_i = tile_split(y, 1 if nhwc else 2)
        x_o, x_i = tile_split(x, 2 if nhwc else 3)
        sch.reorder(*((n, y_o, x_o, y_i, x_i, f) if nhwc else (n, y_o, x_o, f, y_i, x_i)))
        tile = sch.fuse(n, y_o, x_o)
        d_inner, d_reg = 3, 1 if nhwc else 0
    else:  # matmul (batch..., i, j): tile batch dims and i; inside the tile (i_i, j)
        *batch, i, j = spatial
        i_o, i_i = tile_split(i, n_sp - 2)
        sch.reorder(*batch, i_o, i_i, j)
        tile = sch.fuse(*batch, i_o) if batch else i_o
        d_inner, d_reg = 2, 0
    for name in pair.epilogue:
        if block_exists(sch, name):
            sch.reverse_compute_at(sch.get_sblock(name), tile, preserve_unit_loops=True)
    at = tile if row is None else row
    for name in reversed(pair.chain):
        if block_exists(sch, name):
            sch.compute_at(sch.get_sblock(name), at, preserve_unit_loops=True)
    sch.compute_at(sch.get_sblock(pair.upstream), at, preserve_unit_loops=True)
    if pair.upstream_input and block_exists(sch, pair.upstream_input) and _input_joins_tile(pair):
        sch.compute_at(sch.get_sblock(pair.upstream_input), tile, preserve_unit_loops=True)
    vector_max = vector_cap(lanes)
    if pair.head:
        _head_into_tile(sch, pair, tile, decide, vector_max, lanes)
    if rolls:  # what the tile computes with its window's halo rows: a chain's head, a row-tiled dw pair's U
        first = (pair.head_input, pair.head) + pair.head_chain if pair.head else (pair.upstream_input, pair.upstream)
        rolling.mark(sch, [n for n in first + (() if pair.head else pair.chain) if n and block_exists(sch, n)])
    _vectorize_moves(sch, pair, lanes)
    # register tiles inside the tile loop
    u_sp = sum(1 for iv in sch.get(sch.get_sblock(pair.upstream)).iter_vars if int(iv.iter_type) != 2)
    _register_tile(sch, pair.upstream, at, _reg_iter(pair.upstream_kind, u_sp, pair.layout), u_sp, decide,
                   vector_max=vector_max, lanes=lanes)
    _register_tile(sch, pair.downstream, at, d_reg, d_inner, decide, first_iter=n_sp - d_inner,
                   vector_max=vector_max, lanes=lanes)
    _annotate_root(sch, num_cores, decide("unroll", pair.downstream, -1, 0, 0) if decide else None)


def _head_into_tile(sch, pair: IntensivePair, tile, decide: Decide | None, vector_max: int, lanes: int = 0) -> None:
    """A chain's head H (and the blocks between it and U, U's padding too) computed in D's tile: H's rows of every
    channel that the tile's rows of U read; H register-tiled as U is."""
    for name in reversed(pair.head_chain):
        if block_exists(sch, name):
            sch.compute_at(sch.get_sblock(name), tile, preserve_unit_loops=True)
    sch.compute_at(sch.get_sblock(pair.head), tile, preserve_unit_loops=True)
    if pair.head_input and block_exists(sch, pair.head_input):
        sch.compute_at(sch.get_sblock(pair.head_input), tile, preserve_unit_loops=True)
    h_sp = sum(1 for iv in sch.get(sch.get_sblock(pair.head)).iter_vars if int(iv.iter_type) != 2)
    _register_tile(sch, pair.head, tile, _reg_iter(pair.head_kind, h_sp, pair.layout), h_sp, decide,
                   vector_max=vector_max, lanes=lanes)


def _vectorize_moves(sch, pair: IntensivePair, lanes: int) -> None:
    """The pads and elementwise passes left in the tile vectorised one register wide over their innermost loop where
    it spans several (:func:`_whole_registers`): the postprocessor would make MobileNet's 96-channel rows one
    96-lane vector, and leaves those longer than :data:`MAX_VECTORIZE_EXTENT` (144, 960 channels) scalar."""
    firsts = [n for n in (pair.head_input, pair.upstream_input) if n]
    for name in firsts + list(pair.head_chain) + list(pair.chain) + list(pair.epilogue):
        if block_exists(sch, name):
            *_, last = sch.get_loops(sch.get_sblock(name))
            extent = as_int(sch.get(last).extent)
            if _several_registers(extent, lanes):
                _whole_registers(sch, last, lanes)


#: Does U's input padding go into D's tile? (upstream kind, downstream kind) → why, for the pairs
#: where each tile reads a part of U's input. Elsewhere every tile reads all of it, so copying it
#: per tile would repeat the whole copy: it stays one nest before the tile loop.
INPUT_IN_TILE: dict[tuple[str, str], str] = {
    ("dw", "dw"): "channel tiles partition U's input",
    **{(u, d): "row tiles read U's input rows plus a (kernel - stride)-row halo"
       for u in ("dw", "pw", "conv") for d in ("pw", "matmul")},
    ("matmul", "matmul"): "row tiles partition U's input rows",
}


def _input_joins_tile(pair: IntensivePair) -> bool:
    """U's input padding goes into the tile where tiles (nearly) partition it (:data:`INPUT_IN_TILE`):
    a padded copy of the whole input made before the tile loop is written and read back through
    memory — for MobileNet-V2's expand output at 112×112 that is 1.3 MB, more than a phone's L2."""
    return (pair.upstream_kind, pair.downstream_kind) in INPUT_IN_TILE


def _annotate_root(sch, num_cores: int | None, unroll: int | None = None) -> None:
    root = sch.get_sblock("root")
    cores = num_cores or os.cpu_count() or 1
    sch.annotate(root, "meta_schedule.parallel", MAX_JOBS_PER_CORE * cores)
    sch.annotate(root, "meta_schedule.vectorize", MAX_VECTORIZE_EXTENT)
    decision = UNROLL_STEPS.index(unroll) if unroll in UNROLL_STEPS else None
    step = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS), decision=decision)
    sch.annotate(root, "meta_schedule.unroll_explicit", step)
