"""Finding what AGO intensive fusion (§III-B) fuses in a kernel: the pair of complex ops, or a chain of three, and
the tile bounds a cache budget sets. How and why: docs/tuning-internals.md (Intensive fusion)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from toolchain.tune.schedule_check import free_vars
from toolchain.tune.tiles import (
    CHAIN_RECOMPUTE,
    TILE_FACTOR_MAX,
    chain_rows,
    chain_share,
    row_cap,
    tile_units,
    touched,
    window_rows,
)


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


def as_int(x) -> int:
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
        spatial = [(iv.var, as_int(iv.dom.extent)) for iv in b.iter_vars if int(iv.iter_type) != 2]
        reduce = [(iv.var, as_int(iv.dom.extent)) for iv in b.iter_vars if int(iv.iter_type) == 2]
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


def is_copy(block) -> bool:
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


def find_pair(func, tile_cache: int = 0, cores: int = 1) -> IntensivePair | None:
    """The (U, D) pair for intensive fusion in a fused PrimFunc, or None.

    D is the *last* complex block that is a depthwise conv, a pointwise conv
    or a matmul whose data input is computed from another complex block U
    through elementwise / padding blocks only (every path back from D's
    data input ends at U or at a function parameter). U may be any conv or
    matmul. The blocks between them must not be read outside the pair.
    With a ``tile_cache`` (bytes), an NHWC depthwise U into a pointwise D takes the pointwise / spatial conv H that
    feeds U the same way as the chain's head (MobileNet's inverted residual: expand → depthwise → project in one row
    tile, neither intermediate written out) where H computes at most :data:`CHAIN_RECOMPUTE` of its rows twice (the
    window's halo at the seams of the widest row tile the cache holds, of each of ``cores``' runs of tiles where a line
    buffer keeps the rows two tiles share: :func:`toolchain.tune.tiles.chain_share`); else the one of the two pairs
    with the larger intermediate.
    """
    infos = block_infos(func)
    for d_idx in range(len(infos) - 1, -1, -1):
        pair = _pair_for(infos, d_idx)
        if pair is not None and tile_cache and pair.kind == "dw->pw" and pair.layout == "NHWC":
            first = _pair_for(infos, next(i for i, info in enumerate(infos) if info.name == pair.upstream))
            if first is not None and first.upstream_kind in ("pw", "conv") and first.layout == "NHWC":
                chain = replace(pair, upstream_input=None, head=first.upstream, head_kind=first.upstream_kind,
                                head_chain=first.chain, head_input=first.upstream_input, tiled=TILED["chain"])
                if chain_recompute(func, chain, tile_cache, cores) <= CHAIN_RECOMPUTE:
                    return chain
                return max((pair, first), key=lambda p: math.prod(data_shape(func, p)))
        if pair is not None:
            return pair
    return None


def chain_recompute(func, chain: IntensivePair, budget: int, cores: int = 1) -> float:
    """The share of its rows a chain's head computes twice at the widest row tile ``budget`` holds
    (:func:`toolchain.tune.tiles.chain_share`)."""
    return chain_share(*_chain_geometry(func, chain), budget, cores)


def _chain_geometry(func, chain: IntensivePair) -> tuple[int, int, int, int, int]:
    """(D's rows, bytes of U's output row, the head's padded rows U reads, bytes of one, U's window rows)."""
    _, h, w, c = data_shape(func, chain)
    _, h_in, w_in, c_in = data_shape(func, chain, chain.upstream)
    _, _, window = _window(func, chain.upstream, h_in)
    return h, w * c * 4, h_in, w_in * c_in * 4, window


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
# Tile bounds under a cache budget


def data_shape(func, pair: IntensivePair, block: str | None = None) -> tuple[int, ...] | None:
    """Shape of D's (or ``block``'s) data input in ``func``: the intermediate (padded, where D pads it) its tile
    reads."""
    for info in block_infos(func):
        if info.name == (block or pair.downstream) and info.data_buf is not None:
            for region in info.block.reads:
                if region.source.__chandle__() == info.data_buf:
                    return tuple(as_int(x) for x in region.source.shape)
    return None


def tile_bounds(func, pair: IntensivePair, budget: int, cores: int = 1) -> dict[int, tuple[int, int]]:
    """D's iterator -> (floor, cap) of its tile factor under a cache ``budget`` in bytes (0: none; no floor and
    :data:`TILE_FACTOR_MAX`): the cap, the widest tile whose lines of the intermediate fit the budget — or,
    where even one step's do not, the widest touching no more lines than one step; the floor, the widest
    tile touching no more lines than one step (a narrower one reads the same lines in more passes) that
    divides the extent and leaves a tile per core."""
    shape = data_shape(func, pair) if budget else None
    if shape is None:
        return {}
    rows = row_units(func, pair, shape, budget)
    if rows is not None:  # a line of every pixel does not fit: tiles of rows with every channel
        return {1: (1, row_cap(*rows, budget, cores))}  # a tile per core
    bounds = {}
    for it, (extent, _, lines) in tile_units(pair.downstream_kind, shape, pair.layout).items():
        steps = range(1, min(TILE_FACTOR_MAX, extent) + 1)
        one = lines(1)
        cap = max(f for f in steps if lines(f) <= max(budget, one))
        floor = max(f for f in steps if f <= cap and lines(f) <= one and extent % f == 0
                    and (f == 1 or extent // f >= cores))
        bounds[it] = (floor, cap)
    return bounds


def row_units(func, pair: IntensivePair, shape: tuple[int, ...], budget: int):
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
    if not pair.head:
        _, out, _ = window = _window(func, pair.downstream, h)
        rows = window_rows(*window)
        return out, lambda f: touched(1, rows(f) * w * c * 4, 0)
    return h, chain_rows(*_chain_geometry(func, pair), budget)[1]


def _window(func, block: str, rows_in: int) -> tuple[int, int, int]:
    """(``rows_in``, output rows, the window's rows) of the NHWC windowed conv ``block`` of ``func``."""
    b = next(info.block for info in block_infos(func) if info.name == block)
    window = next((as_int(iv.dom.extent) for iv in b.iter_vars if int(iv.iter_type) == 2), 1)
    return rows_in, as_int(b.iter_vars[1].dom.extent), window
