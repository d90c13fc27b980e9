"""AGO intensive operator fusion (§III-B): find the pair of complex ops a kernel can fuse, and schedule
it in the Fig. 7 structure. How and why: docs/tuning-internals.md (Intensive fusion)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable

from toolchain.tune.schedule_check import free_vars
from toolchain.tune.tiles import tile_units, touched, window_rows
from toolchain.tune.transfer import divisors

#: candidate auto-unroll depths (the stock ParallelizeVectorizeUnroll rule's, for CPU)
UNROLL_STEPS = (0, 16, 64, 512)
MAX_JOBS_PER_CORE = 16
MAX_VECTORIZE_EXTENT = 64
VECTOR_FACTOR_MAX = 16  # innermost (vectorised) tile factor, at most: 4 NEON registers of float32
REGISTER_FACTOR_MAX = 8  # channel / row register tile factor
OTHER_FACTOR_MAX = 4  # other spatial dims (H) in the register tile
TILE_FACTOR_MAX = 64  # D's tiled-dim inner factor (the tile the intensive fusion keeps in cache)
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


@dataclass(frozen=True)
class IntensivePair:
    """Two complex blocks of one PrimFunc that intensive fusion can fuse without re-computation.

    Block names refer to the unscheduled function (they survive scheduling).
    """

    upstream: str  # U
    downstream: str  # D
    upstream_kind: str  # "pw" | "dw" | "conv" | "matmul"
    downstream_kind: str  # "dw" | "pw" | "matmul"
    chain: tuple[str, ...]  # simple blocks between U and D (program order)
    epilogue: tuple[str, ...]  # simple blocks after D that depend only on D (program order)
    upstream_input: str | None  # U's data-input producer (a padding / copy block), if in the function
    tiled: str  # what D's tile loop runs over, in words
    layout: str = "NCHW"  # the convs' activation layout (CONV_AXES); a matmul pair: NCHW
    # a chain's head H (H → U → D: a conv into a depthwise U into a pointwise D, NHWC, :func:`find_pair`), computed
    # in D's row tiles too; the simple blocks between H and U (U's input padding included), H's input producer
    head: str | None = None
    head_kind: str = ""
    head_chain: tuple[str, ...] = ()
    head_input: str | None = None

    @property
    def kind(self) -> str:
        return f"{self.head_kind}->" * bool(self.head) + f"{self.upstream_kind}->{self.downstream_kind}"

    @property
    def blocks(self) -> tuple[str, ...]:
        first = (self.head_input,) * bool(self.head_input) + (self.head,) * bool(self.head) + self.head_chain
        extra = (self.upstream_input,) if self.upstream_input else ()
        return first + extra + (self.upstream,) + self.chain + (self.downstream,) + self.epilogue


# --------------------------------------------------------------------------------------------
# Reading block signatures


def _h(obj) -> int:
    return obj.__chandle__()


def _int(x) -> int:
    return int(x.value) if hasattr(x, "value") else int(x)


@dataclass
class _Info:
    name: str
    block: object
    spatial: list  # [(var, extent)]
    reduce: list
    reads: list  # buffer handles (excluding what the block itself writes)
    writes: list
    kind: str = "simple"  # simple | reduce | pw | dw | conv | matmul
    data_buf: int | None = None  # the operand D's tiled dims index (conv input / matmul A)
    layout: str = "NCHW"  # a conv's activation layout (CONV_AXES)
    consumers: list = field(default_factory=list)
    producers: list = field(default_factory=list)


def _vars_in(expr) -> set[int]:
    return set(free_vars(expr).keys())


def _region_vars(region) -> list[set[int]]:
    return [_vars_in(r.min) | _vars_in(r.extent) for r in region.region]


#: A conv block's spatial iterators by layout: (position of the output channels, position of W).
#: NCHW: (n, f, y, x), reduce (rc, ry, rx), weight OIHW; NHWC: (n, y, x, f), reduce (ry, rx, rc),
#: weight OHWI. Either way the weight's first dim is indexed by f and the data input by x.
CONV_AXES = {"NCHW": (1, 3), "NHWC": (3, 2)}


def _conv_layout(operands, sp) -> tuple[str, object] | None:
    """(layout, data operand) of a conv block whose reads are ``operands`` and spatial vars ``sp``."""
    four = [r for r in operands if len(r.region) == 4]
    for layout, (c, x) in CONV_AXES.items():
        data = next((r for r in four if sp[x] in set().union(*_region_vars(r))), None)
        weight = next((r for r in four if r is not data), None)
        if data is not None and weight is not None and sp[c] in _region_vars(weight)[0]:
            return layout, data
    return None


def _classify(info: _Info) -> None:
    block = info.block
    if not info.reduce:
        return
    name = block.name_hint.lower()
    own = {_h(w.source) for w in block.writes}
    operands = [r for r in block.reads if _h(r.source) not in own]
    sp = [_h(v) for v, _ in info.spatial]
    if "conv" in name and len(info.spatial) == 4 and len(info.reduce) == 3 and len(operands) >= 2:
        found = _conv_layout(operands, sp)
        if found is None:
            info.kind = "reduce"
            return
        info.layout, data = found
        info.data_buf = _h(data.source)
        c = CONV_AXES[info.layout][0]
        extents = [e for _, e in info.reduce]
        rc, ry, rx = extents if info.layout == "NCHW" else (extents[2], extents[0], extents[1])
        channel_vars = _region_vars(data)[c]
        if rc == 1 and info.spatial[c][1] > 1 and sp[c] in channel_vars:
            info.kind = "dw"
        elif ry == 1 and rx == 1 and sp[c] not in channel_vars:
            info.kind = "pw"
        else:
            info.kind = "conv"
        return
    if (("matmul" in name or "dense" in name) and len(info.reduce) == 1 and len(info.spatial) >= 2
            and len(operands) >= 2):
        row = sp[-2]
        a = next((r for r in operands if row in set().union(*_region_vars(r))), None)
        if a is None:
            info.kind = "reduce"
            return
        info.data_buf = _h(a.source)
        info.kind = "matmul"
        return
    info.kind = "reduce"


def block_infos(func) -> list[_Info]:
    """Root-level blocks of an unscheduled PrimFunc with class, producers and consumers."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    infos: list[_Info] = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        b = sch.get(rv)
        spatial = [(iv.var, _int(iv.dom.extent)) for iv in b.iter_vars if int(iv.iter_type) != 2]
        reduce = [(iv.var, _int(iv.dom.extent)) for iv in b.iter_vars if int(iv.iter_type) == 2]
        writes = [_h(w.source) for w in b.writes]
        reads = [_h(r.source) for r in b.reads if _h(r.source) not in writes]
        info = _Info(b.name_hint, b, spatial, reduce, reads, writes)
        _classify(info)
        infos.append(info)
    writer: dict[int, int] = {}
    for i, info in enumerate(infos):
        for w in info.writes:
            writer[w] = i
    for i, info in enumerate(infos):
        for r in info.reads:
            j = writer.get(r)
            if j is not None and j != i and j not in info.producers:
                info.producers.append(j)
                infos[j].consumers.append(i)
    return infos


def _is_copy(block) -> bool:
    """A block whose body stores a plain load (an identity 'padding' with no padding)."""
    body = block.body
    value = getattr(body, "value", None)
    return value is not None and type(value).__name__ in ("TensorLoad", "BufferLoad")


def _writer_of(infos: list[_Info], buf: int) -> int | None:
    for i, info in enumerate(infos):
        if buf in info.writes:
            return i
    return None


# --------------------------------------------------------------------------------------------
# Finding the pair


TILED = {
    "dw": "batch × output-channel tiles (H, W whole)",
    "pw": "batch × H × W tiles (output channels whole)",
    "matmul": "batch dims × row tiles (columns whole)",
    "chain": "batch × row tiles (columns and channels whole; the head's window rows recomputed at the seams)",
}


def find_pair(func, head: bool = False) -> IntensivePair | None:
    """The (U, D) pair for intensive fusion in a fused PrimFunc, or None.

    D is the *last* complex block that is a depthwise conv, a pointwise conv
    or a matmul whose data input is computed from another complex block U
    through elementwise / padding blocks only (every path back from D's
    data input ends at U or at a function parameter). U may be any conv or
    matmul. The blocks between them must not be read outside the pair.
    ``head``: an NHWC depthwise U into a pointwise D takes the pointwise / spatial conv H that feeds U the same way
    as the chain's head (MobileNet's inverted residual: expand → depthwise → project in one row tile, neither
    intermediate written out; the head's window rows at a tile's seam are computed twice).
    """
    infos = block_infos(func)
    for d_idx in range(len(infos) - 1, -1, -1):
        pair = _pair_for(infos, d_idx)
        if pair is not None and head and pair.kind == "dw->pw" and pair.layout == "NHWC":
            first = _pair_for(infos, next(i for i, info in enumerate(infos) if info.name == pair.upstream))
            if first is not None and first.upstream_kind in ("pw", "conv") and first.layout == "NHWC":
                return replace(pair, upstream_input=None, head=first.upstream, head_kind=first.upstream_kind,
                               head_chain=first.chain, head_input=first.upstream_input, tiled=TILED["chain"])
        if pair is not None:
            return pair
    return None


def _pair_for(infos: list[_Info], d_idx: int) -> IntensivePair | None:
    d = infos[d_idx]
    if d.kind not in ("dw", "pw", "matmul") or d.data_buf is None:
        return None
    start = _writer_of(infos, d.data_buf)
    if start is None:
        return None
    chain: set[int] = set()
    ups: set[int] = set()
    frontier = [start]
    while frontier:
        i = frontier.pop()
        if i in chain or i in ups:
            continue
        info = infos[i]
        if info.kind in ("pw", "dw", "conv", "matmul"):
            ups.add(i)
            continue
        if info.kind != "simple":
            return None  # a reduction (mean, softmax) in between: not a pair
        chain.add(i)
        frontier.extend(info.producers)
    if len(ups) != 1:
        return None
    (u_idx,) = ups
    inside = chain | {d_idx}
    for i in chain | {u_idx}:
        if any(c not in inside for c in infos[i].consumers):
            return None  # an intermediate is read outside the pair
    # D's epilogue: simple blocks after D fed only by D or the epilogue itself
    epilogue: list[int] = []
    members = {d_idx}
    for i in range(d_idx + 1, len(infos)):
        info = infos[i]
        if info.kind == "simple" and info.producers and all(p in members for p in info.producers):
            epilogue.append(i)
            members.add(i)
    u = infos[u_idx]
    u_input = None
    if u.data_buf is not None:
        p = _writer_of(infos, u.data_buf)
        if p is not None and infos[p].kind == "simple" and infos[p].consumers == [u_idx]:
            u_input = infos[p].name
    return IntensivePair(
        upstream=u.name,
        downstream=d.name,
        upstream_kind=u.kind,
        downstream_kind=d.kind,
        chain=tuple(infos[i].name for i in sorted(chain)),
        epilogue=tuple(infos[i].name for i in epilogue),
        upstream_input=u_input,
        tiled=TILED[d.kind],
        layout=d.layout if d.kind != "matmul" else u.layout,
    )


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
        if _is_copy(block):
            _try(sch.compute_inline, rv)
        elif not _has_if_then_else(block) and not any(c in complex_names for c in consumers):
            _try(sch.compute_inline, rv)


#: ``decide(role, block, iter, extent, cap)``: the inner factor a split should take instead of a
#: random sample ("tile": D's tiled dims; "vector": the innermost, vectorised dim of a register tile inside
#: the tile; "register": its other dims), or the
#: auto-unroll depth ("unroll"); None leaves it to sampling. The sampled instruction records the
#: choice as its decision, so the search mutates it like any other (toolchain/tune/intensive_seed.py).
Decide = Callable[[str, str, int, int, int], "int | None"]


def _split(sch, loop, n_max: int, inner: int | None = None):
    extent = _int(sch.get(loop).extent)
    decision = [extent // inner, inner] if inner and extent % inner == 0 and inner <= n_max else None
    factors = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=n_max, decision=decision)
    return sch.split(loop, factors=factors)


def _register_tile(sch, block_name: str, outer_loop, reg_iter: int | None, n_spatial: int,
                   decide: Decide | None = None, first_iter: int = 0, vector_max: int = VECTOR_FACTOR_MAX) -> None:
    """Inside the tile, MultiLevelTiling's "SRS": every spatial loop split (outer, inner) with a
    sampled inner factor, order [outer spatials, reductions, inner spatials]. The inner tile is the
    register tile: the last spatial dim (W / columns) is the vector, ``reg_iter`` (channels / rows)
    and the other dims (H) give accumulator reuse; a factor of 1 turns a dim's blocking off.
    ``first_iter``: the block's iterator the first loop inside the tile runs over; ``vector_max``: the
    vector's cap (:func:`vector_cap`)."""
    block = sch.get_sblock(block_name)
    loops = list(sch.get_loops(block))
    pos = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(outer_loop)))
    inner = loops[pos + 1:]
    spatial, reduce = inner[:n_spatial], inner[n_spatial:]
    outers, inners, vector = [], [], None
    for k, lp in enumerate(spatial):
        if _int(sch.get(lp).extent) == 1 or (reg_iter is None and k < n_spatial - 2):
            outers.append(lp)  # unit loops, and a depthwise conv's channels (and batch)
            continue
        last = k == n_spatial - 1
        cap = vector_max if last else (REGISTER_FACTOR_MAX if k == reg_iter else OTHER_FACTOR_MAX)
        role = "vector" if last else "register"
        chosen = decide(role, block_name, first_iter + k, _int(sch.get(lp).extent), cap) if decide else None
        o, i = _split(sch, lp, cap, chosen)
        outers.append(o)
        inners.append(i)
        if k == n_spatial - 1:
            vector = i
    sch.reorder(*outers, *reduce, *inners)
    if vector is not None:
        sch.vectorize(vector)


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
    also sets a floor (:func:`_tile_bounds`: a tile a line wide, a tile per core).
    """
    bounds = _tile_bounds(sch, pair, tile_cache, num_cores or os.cpu_count() or 1)

    def tile_split(loop, it: int):
        extent = _int(sch.get(loop).extent)
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
    if kind == "dw" and 1 in bounds:  # NHWC, rows tiled (:func:`row_units`): inside the tile (y_i, x, f)
        n, y, x, f = spatial
        y_o, y_i = tile_split(y, 1)
        tile = sch.fuse(n, y_o)
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
        tile = sch.fuse(n, y_o)
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
        _head_into_tile(sch, pair, tile, decide, vector_max)
    # register tiles inside the tile loop
    u_sp = sum(1 for iv in sch.get(sch.get_sblock(pair.upstream)).iter_vars if int(iv.iter_type) != 2)
    _register_tile(sch, pair.upstream, at, _reg_iter(pair.upstream_kind, u_sp, pair.layout), u_sp, decide,
                   vector_max=vector_max)
    _register_tile(sch, pair.downstream, at, d_reg, d_inner, decide, first_iter=n_sp - d_inner,
                   vector_max=vector_max)
    _annotate_root(sch, num_cores, decide("unroll", pair.downstream, -1, 0, 0) if decide else None)


def _head_into_tile(sch, pair: IntensivePair, tile, decide: Decide | None, vector_max: int) -> None:
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
                   vector_max=vector_max)


def data_shape(func, pair: IntensivePair, block: str | None = None) -> tuple[int, ...] | None:
    """Shape of D's (or ``block``'s) data input in ``func``: the intermediate (padded, where D pads it) its tile
    reads."""
    for info in block_infos(func):
        if info.name == (block or pair.downstream) and info.data_buf is not None:
            for region in info.block.reads:
                if region.source.__chandle__() == info.data_buf:
                    return tuple(_int(x) for x in region.source.shape)
    return None


def _tile_bounds(sch, pair: IntensivePair, budget: int, cores: int = 1) -> dict[int, tuple[int, int]]:
    """D's iterator -> (floor, cap) of its tile factor under a cache ``budget`` in bytes (0: none; no floor and
    :data:`TILE_FACTOR_MAX`): the cap, the widest tile whose lines of the intermediate fit the budget — or,
    where even one step's do not, the widest touching no more lines than one step; the floor, the widest
    tile touching no more lines than one step (a narrower one reads the same lines in more passes) that
    divides the extent and leaves a tile per core."""
    shape = data_shape(sch.mod["main"], pair) if budget else None
    if shape is None:
        return {}
    rows = row_units(sch, pair, shape, budget)
    if rows is not None:  # a line of every pixel does not fit: tiles of rows with every channel
        extent, lines = rows
        cap = max([f for f in range(1, extent + 1) if lines(f) <= budget] or [1])
        cap = min(cap, max(1, extent // cores))  # a tile per core
        return {1: (1, cap)}
    bounds = {}
    for it, (extent, _, lines) in tile_units(pair.downstream_kind, shape, pair.layout).items():
        steps = range(1, min(TILE_FACTOR_MAX, extent) + 1)
        one = lines(1)
        cap = max(f for f in steps if lines(f) <= max(budget, one))
        floor = max(f for f in steps if f <= cap and lines(f) <= one and extent % f == 0
                    and (f == 1 or extent // f >= cores))
        bounds[it] = (floor, cap)
    return bounds


def row_units(sch, pair: IntensivePair, shape: tuple[int, ...], budget: int):
    """(D's output rows, bytes of the lines a tile of ``f`` of them reads from the intermediate: its rows of every
    channel, the window's halo included) where an NHWC depthwise D's channel tiles cannot keep their slice within
    ``budget`` — one line of every pixel does not fit (MobileNet-V2 @224's 112 × 112 × 96 expansion: 784 KiB a
    line-wide tile, more than an A76's L2; each of the six tiles read the whole input again, 21 MB from memory
    against 17 for stock's two kernels at a 2 MiB last level) — and for a chain (H → U → D, always rows: H's rows
    that U's window reads, and U's one row), else None. Rows re-compute the halo's rows of U (of H in a chain)
    that two tiles both read (one in 2f for a stride-2 3 × 3 window)."""
    if not budget or pair.layout != "NHWC" or (pair.downstream_kind != "dw" and not pair.head):
        return None
    _, h, w, c = shape
    if not pair.head and touched(h * w, 4, 4 * c) <= budget:
        return None
    windowed = pair.upstream if pair.head else pair.downstream
    d = sch.get(sch.get_sblock(windowed))
    out = _int(d.iter_vars[1].dom.extent)
    window = next((_int(iv.dom.extent) for iv in d.iter_vars if int(iv.iter_type) == 2), 1)  # its rows
    if not pair.head:
        rows = window_rows(h, out, window)
        return out, lambda f: touched(1, rows(f) * w * c * 4, 0)
    _, h_in, w_in, c_in = data_shape(sch.mod["main"], pair, pair.upstream)
    rows = window_rows(h_in, out, window)
    return h, lambda f: touched(1, w * c * 4, 0) + touched(1, rows(f) * w_in * c_in * 4, 0)


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


# --------------------------------------------------------------------------------------------
# The space
