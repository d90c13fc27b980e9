"""A register-blocked inner block for matmul-like kernels (convs, matmuls, pools): rows × vectors of accumulators
held in registers across the reduction, shaped from the target's vector registers (the MLAS / XNNPACK micro-kernel),
the epilogue fused into their write-back. Why and the figures: docs/tuning-internals.md (Register blocks)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from toolchain import winograd
from toolchain.concat import is_view, read_in_pieces


@dataclass(frozen=True)
class VectorUnit:
    registers: int  # architectural vector registers
    lanes: int  # lanes per register of the element type (FP32 in UNITS)
    element_bytes: int = 4
    # the largest depthwise or pooling window unrolled around the block (a global pool's is not): an FMA that takes
    # a memory operand (x86) leaves the unrolled window's loads out of the registers; NEON's FMLA needs each in one,
    # and a 5 × 5 window around a 7 × 3 block spilled (docs/tuning-internals.md, Register blocks)
    window: int = 49

    def of(self, dtype: str) -> VectorUnit:
        """The same registers holding ``dtype`` (float16: twice the FP32 lanes, NEON's ``fmla v.8h``)."""
        nbytes = dtype_bytes(dtype)
        return replace(self, lanes=self.lanes * self.element_bytes // nbytes, element_bytes=nbytes)


def dtype_bytes(dtype: str) -> int:
    return max(1, int("".join(c for c in dtype if c.isdigit()) or 32) // 8)


#: the vector units of the targets' ISAs (the key: toolchain.asm's architecture, or "avx2" for x86 without AVX-512)
UNITS = {
    "aarch64": VectorUnit(32, 4, window=9),  # NEON: v0–v31, 128 bits
    "x86_64": VectorUnit(32, 16),  # AVX-512: zmm0–zmm31
    "avx2": VectorUnit(16, 8),  # ymm0–ymm15
}

#: the most float32 lanes of any unit's vector: input channels that fill a vector on every target
WIDEST_LANES = max(unit.lanes for unit in UNITS.values())
MAX_ROWS, MAX_VECTORS = 8, 4
#: a tile's accumulators must take fewer bytes than this (TVM's ``kMaxStackAlloca``) to be a stack array, which LLVM
#: keeps in registers; at or above it, or in "local" scope whatever its size, TVM lowers the buffer to a heap workspace
#: allocated and freed per tile (docs/tuning-internals.md, Register blocks)
STACK_BYTES = 1024
#: a block whose last tile's rows are masked (their test inside the reduction loop: LLVM keeps those rows'
#: accumulators in memory) only where it uses this many times the accumulators of the best block that divides
MASKED_GAIN = 1.5
#: the same where the rows run within one image row (not :attr:`MatmulLike.flat`: a stem, a pool, a depthwise conv),
#: whose masked rows measured slower than the dividing block at twice its accumulators (docs/tuning-internals.md,
#: Register blocks)
MASKED_GAIN_ROW = 2.5
#: what re-reading one byte of an operand costs in the tile loops, by the cache its bytes fit in: (at most this many
#: bytes, cost) — within half a small core's L2 (Cortex-A76's 256 KiB) a re-read hides behind the block's FMAs, beyond
#: it comes from the shared cache or memory. The tiles run the output channels' vectors outermost where re-reading
#: the data costs less than re-reading the weights (late pointwise convs, GEMV-like: few positions, large weights):
#: docs/tuning-internals.md (Tile order)
REREAD_COST = ((128 << 10, 0), (math.inf, 1))


def block_shape(unit: VectorUnit) -> tuple[int, int]:
    """(rows, vectors) of accumulators: the most that leave a register for each vector of the other operand and one
    for the broadcast row value (rows · vectors + vectors + 1 ≤ registers) and stay a stack array
    (:data:`STACK_BYTES`), the rows the more when they tie."""
    fits = [(r * v, r, v) for r in range(1, MAX_ROWS + 1) for v in range(1, MAX_VECTORS + 1)
            if r * v + v + 1 <= unit.registers and r * v * unit.lanes * unit.element_bytes < STACK_BYTES]
    _, rows, vectors = max(fits)
    return rows, vectors


def block_matmul(sch, block: str, rows: int, vectors: int, lanes: int, parallel: bool = True):
    """Schedule ``block`` (C[i, j] += A[i, k] · B[k, j], spatial loops i, j then the reduction k) with a ``rows`` ×
    ``vectors``·``lanes`` register block: accumulators written to a local buffer inside the (i, j) tile, the row and
    vector loops unrolled around a vectorised lane loop, innermost under k; the tiles in parallel. Returns ``sch``."""
    c = sch.get_sblock(block)
    i, j, k = sch.get_loops(c)[-3:]
    io, ii = sch.split(i, [None, rows])
    jo, jj, jv = sch.split(j, [None, vectors, lanes])
    sch.reorder(io, jo, k, ii, jj, jv)
    acc = sch.cache_write(c, 0, "global")  # a stack array below STACK_BYTES (a "local" one is a heap workspace)
    sch.reverse_compute_at(acc, jo)
    if parallel:  # before the reduction is split into init and update: parallel needs one complete block
        sch.parallel(sch.fuse(io, jo))
    sch.unroll(ii)
    sch.unroll(jj)
    sch.vectorize(jv)
    sch.decompose_reduction(c, k)
    sch.vectorize(sch.get_loops(acc)[-1])
    return sch


# ----------------------------------------------------------------------------- a kernel's matmul-like block


@dataclass(frozen=True)
class MatmulLike:
    """A kernel whose one reduction is C[s…, j] += A[s…, r…] · W[j | r…] (a pointwise or spatial conv in NHWC, a
    matmul; W may read the spatial axes outside the rows, a batch matmul of two activations): ``j`` the output's
    innermost axis, read by the weight only, so a vector of outputs shares one broadcast value of A; or,
    ``depthwise``, C[s…, j] += A[s…(r), j] · W[j | r…] (a depthwise conv: a vector of outputs reads a vector of A)
    or C[s…, j] = max(C[s…, j], A[s…(r), j]) (a pooling window, max or sum). Block names are the unscheduled
    function's."""

    block: str
    spatial: tuple[int, ...]  # extents of C's spatial loops, the channel loop last
    reduce: tuple[int, ...]  # extents of its reduction loops
    producers: tuple[str, ...]  # blocks before it (padding, copies): inlined into its reads
    epilogue: tuple[str, ...]  # elementwise blocks after it (bias, activation, residual add), program order
    depthwise: bool = False
    # spatial blocks after the epilogue over another domain (a slice, a channel shuffle): those that only move values
    # into the kernel's own buffers inlined into their readers, the others (its outputs) a pass each after it
    rest: tuple[str, ...] = ()
    # producers that are not a one-load copy (a concatenation, a scaling) or that write the weight operand (a batch
    # matmul's transposed activation: read in vectors, it is copied once in the layout the block reads): passes first
    gathers: tuple[str, ...] = ()
    dtype: str = "float32"  # what the block accumulates in (its vectors' lanes: VectorUnit.of)
    shared: bool = True  # the weight reads none of the tiles' axes (False: a batch matmul's second activation)
    pieces: tuple[str, int] | None = None  # a concatenation the reduction reads in pieces of channels (no copy)

    @property
    def channels(self) -> int:
        return self.spatial[-1]

    @property
    def pointwise(self) -> bool:
        """No reduction but the channels' (a 1×1 conv, a matmul): no padding to inline into the block's loads."""
        return not self.depthwise and all(e == 1 for e in self.reduce[:-1])

    @property
    def blocked(self) -> bool:
        """Whether the register block takes it: pointwise, or depthwise (its padding inlined into the block's loads
        costs less than a padded copy: docs/tuning-internals.md); not a spatial conv."""
        return self.pointwise or self.depthwise

    @property
    def flat(self) -> bool:
        """Whether the block's rows run over every output position (the spatial loops before the channels fused:
        a 13 × 13 layer's 169 positions take 6 rows, 97 % of them used, where its width of 13 took 5 with 87 %):
        a conv whose weight the tiles share, pointwise or with its padding a pass before the block (input channels
        that fill a vector); a stem's padding tested in its loads would be tested per position (NEON spilled), and
        a depthwise or pooling window's rows stay within one image row, where neighbouring rows share its loads."""
        return not self.depthwise and self.shared and len(self.spatial) > 2 and (
            self.pointwise or self.reduce[-1] >= WIDEST_LANES)

    @property
    def width(self) -> int:
        """The extent of the loop the block's rows run over: every position's (:attr:`flat`), else the one before
        the channels (1 when none)."""
        if self.flat:
            return math.prod(self.spatial[:-1])
        return self.spatial[-2] if len(self.spatial) > 1 else 1


#: TIR node kinds by class name (TVM 0.27 exposes some node constructors as functions, not classes)
LOADS, STORES = ("TensorLoad", "BufferLoad"), ("TensorStore", "BufferStore")


def _is(node, kinds) -> bool:
    return type(node).__name__ in ((kinds,) if isinstance(kinds, str) else kinds)


def _vars(expr) -> set[str]:
    from toolchain.tune.schedule_check import free_vars

    return {v.name for v in free_vars(expr).values()}


def _loads(expr) -> list:
    """The loads in ``expr`` (not inside their own indices)."""
    found, stack = [], [expr]
    while stack:
        e = stack.pop()
        if _is(e, LOADS):
            found.append(e)
            continue
        stack.extend(c for c in (getattr(e, a, None) for a in ("a", "b", "value", "condition", "true_value",
                                                               "false_value")) if c is not None)
        stack.extend(getattr(e, "args", None) or [])
    return found


def matmul_like(func) -> MatmulLike | None:
    """``func``'s matmul-like block (:class:`MatmulLike`), or None: not exactly one reduction, or its output channel
    read by the data operand other than as a depthwise conv reads it (its channel index alone), or blocks other than
    copies before it and elementwise ones after it."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    reducing = [i for i, b in enumerate(blocks) if any(int(iv.iter_type) == 2 for iv in b.iter_vars)]
    if winograd.holds_winograd(b.name_hint for b in blocks):  # a batch matmul between transforms: its own
        return None  # schedule (tune/winograd.py), never a block that recomputes them in its loads
    if len(reducing) != 1 or any(sch.get_child_blocks(sch.get_sblock(b.name_hint)) and not is_view(b.name_hint)
                                 for b in blocks):
        return None
    at = reducing[0]
    block = blocks[at]
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if kinds != sorted(kinds) or kinds.count(0) < 1 or not _is(block.body, STORES):
        return None  # spatial then reduction iter vars, one store
    names = [iv.var.name for iv in block.iter_vars]
    spatial, reduce = names[:kinds.count(0)], set(names[kinds.count(0):])
    store = block.body
    if [getattr(i, "name", None) for i in store.indices] != spatial:
        return None
    value = store.value
    if _is(value, "Add") and _is(value.b, "Mul"):
        operands = [value.b.a, value.b.b]
    elif _is(value, ("Max", "Min", "Add")) and _is(value.b, LOADS):
        operands = [value.b]  # a pooling window: the data alone, read as a depthwise conv reads it
    else:
        return None
    if not all(_is(o, LOADS) for o in operands):
        return None
    channel = spatial[-1]
    batch = set(spatial[:-2])  # the tiles' axes: a batch matmul's second operand reads them too (attention's V)
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    units = {n for n, e in zip(names, extents) if n in reduce and e == 1}
    uses = [set().union(*(_vars(i) for i in o.indices)) for o in operands]
    weight = [i for i, u in enumerate(uses) if u <= reduce | batch | {channel} and channel in u]
    if len(operands) == 1:
        data, depthwise = operands[0], True
    elif len(weight) == 1:
        data, depthwise = operands[1 - weight[0]], channel in uses[1 - weight[0]]
    else:
        return None
    if depthwise and (any(channel in _vars(i) for i in data.indices[:-1])
                      or not _vars(data.indices[-1]) <= {channel} | units):
        return None
    spatial_extents = tuple(extents[:len(spatial)])
    if not all(_is_copy(b) for b in blocks[:at]):
        return None
    end = at + 1
    while end < len(blocks) and _is_elementwise(blocks[end], spatial_extents, blocks[at:end]):
        end += 1
        if _stores_a_slice(blocks[end - 1]):  # into the kernel's result (a concatenation): nothing reads it after
            break
    if any(int(iv.iter_type) == 2 for b in blocks[end:] for iv in b.iter_vars):
        return None
    fed = _buffer(operands[weight[0]]).__chandle__() if len(operands) == 2 else None
    shared = not depthwise and not uses[weight[0]] & batch
    return MatmulLike(block.name_hint, spatial_extents, tuple(extents[len(spatial):]), _names(blocks[:at]),
                      _names(blocks[at + 1:end]), depthwise, _names(blocks[end:]),
                      _names(b for b in blocks[:at] if not moves_one_load(b)
                             or any(w.source.__chandle__() == fed for w in b.writes)),
                      str(store.buffer.dtype), shared,
                      None if depthwise else read_in_pieces(blocks[:at], data, names[-1]))


def _buffer(load):
    return getattr(load, "buffer", None) or getattr(load, "source", None)


def _names(blocks) -> tuple[str, ...]:
    return tuple(b.name_hint for b in blocks)


def _is_copy(block) -> bool:
    """A spatial block of one store: one that moves values (a padding, inlined into the block's loads) or another
    (a concatenation, a scaling by a squeeze-excitation's factors: a pass of its own before the block)."""
    return not any(int(iv.iter_type) == 2 for iv in block.iter_vars) and _is(block.body, STORES)


def moves_one_load(block) -> bool:
    """Whether ``block`` stores one loaded value as it is (a reshape, a transpose, a padding's select of a load and a
    constant): inlined into its readers it adds no arithmetic to their loads."""
    return _moves(block.body.value) and len(_loads(block.body.value)) == 1


def _moves(value) -> bool:
    """Whether ``value`` is a load or a constant, or a select between such (no arithmetic on the values)."""
    if _is(value, LOADS) or _is(value, ("FloatImm", "IntImm")):
        return True
    if _is(value, "Select"):
        return _moves(value.true_value) and _moves(value.false_value)
    op = getattr(getattr(value, "op", None), "name", "")
    return _is(value, "Call") and op.endswith("if_then_else") and all(_moves(a) for a in value.args[1:])


def _is_elementwise(block, extents: tuple[int, ...], chain: list) -> bool:
    """A spatial block over the reduction's output domain (``extents``) that reads what the ``chain`` before it
    writes, every such load indexed by its iter vars in order, and stores there too (bias, activation, residual add)
    or at a constant offset (its slice of a concatenation written in place); not a slice, a concatenation's
    select or a transpose, whose domain or indices differ, nor a block of another input alone."""
    if any(int(iv.iter_type) == 2 for iv in block.iter_vars) or not _is(block.body, STORES):
        return False
    if tuple(int(iv.dom.extent) for iv in block.iter_vars) != extents:
        return False
    order = [iv.var.name for iv in block.iter_vars]
    written = {w.source.__chandle__() for b in chain for w in b.writes}
    reads_chain = False
    for load in _loads(block.body.value):
        if _buffer(load).__chandle__() in written:
            if [getattr(i, "name", None) for i in load.indices] != order:
                return False
            reads_chain = True
    return reads_chain and [_offset_var(i)[0] for i in block.body.indices] == order


def _offset_var(index) -> tuple[str | None, int]:
    """(the var, the constant offset) of a store index ``v`` or ``v + c`` (a slice of a concatenation written in
    place, toolchain/concat.py); (None, 0) for anything else."""
    if _is(index, "Var"):
        return index.name, 0
    if _is(index, "Add") and _is(index.a, "Var") and _is(index.b, "IntImm"):
        return index.a.name, int(index.b.value)
    return None, 0


def _stores_a_slice(block) -> bool:
    return any(_offset_var(i)[1] for i in block.body.indices)


def choose_block(kernel: MatmulLike, unit: VectorUnit, perfect: bool = True,
                 min_lanes: int = 4) -> tuple[int, int, int] | None:
    """(rows, vectors, lanes) of the register block for ``kernel``: :func:`block_for` its output channels and width."""
    gain = MASKED_GAIN if kernel.flat else MASKED_GAIN_ROW
    return block_for(kernel.channels, kernel.width, unit, perfect, min_lanes, gain)


def block_for(channels: int, width: int, unit: VectorUnit, perfect: bool = True,
              min_lanes: int = 4, gain: float = MASKED_GAIN) -> tuple[int, int, int] | None:
    """(rows, vectors, lanes) of a register block over ``channels`` (the vectorised dim) × ``width`` (the rows):
    lanes the unit's, halved until they divide the channels (at least 4); vectors dividing the channels' vectors,
    rows at most :data:`MAX_ROWS` — dividing the width when ``perfect`` (a search's tile sample must), else the last
    tile's rows masked where that puts ``gain`` (:data:`MASKED_GAIN`) times the accumulators to use (a width of 13:
    7 rows, 13 of 14 used, not 1) — the most accumulators in use that fit the registers (:func:`block_shape`'s
    bound) and stay a stack array (:data:`STACK_BYTES`: 15 vectors of AVX-512, every NEON block); a kernel of one
    row, a GEMV, takes as many vectors as fit: its only independent FMA chains. None when no vector divides the channels
    (``min_lanes`` lanes or more)."""
    lanes = dividing_lanes(channels, unit.lanes)
    if lanes < min_lanes:
        return None

    def used(r: int) -> float:  # the share of the rows' slots that hold a row of the kernel
        return width / (-(-width // r) * r)

    fits = [(r * v * used(r), used(r), r * v, v, r) for r in range(1, min(MAX_ROWS, width) + 1)
            for v in range(1, unit.registers)
            if r * v + v + 1 <= unit.registers and r * v * lanes * unit.element_bytes < STACK_BYTES
            and (channels // lanes) % v == 0 and (v <= MAX_VECTORS or width == 1)]
    whole = max(f for f in fits if width % f[-1] == 0)  # rows 1 always divide
    best = max(fits)
    if perfect or best[0] < gain * whole[0]:
        best = whole
    *_, vectors, rows = best
    return rows, vectors, lanes


def _reread(nbytes: float) -> int:
    return next(cost for size, cost in REREAD_COST if nbytes <= size)


def channels_outer(kernel: MatmulLike, rows: int, vectors: int, lanes: int) -> bool:
    """Whether the block's tiles run the output channels' vectors outermost, each tile's weights then read once
    while the data is re-read for every vector tile — rather than the positions outermost, the weights re-read for
    every tile of rows: where the re-read bytes cost less so (:data:`REREAD_COST`). Only for a weight the tiles
    share (not a depthwise conv's or a batch matmul's)."""
    if kernel.depthwise or not kernel.shared or len(kernel.spatial) < 2:
        return False
    size = dtype_bytes(kernel.dtype)
    weights = kernel.channels * math.prod(kernel.reduce) * size
    data = math.prod(kernel.spatial[:-1]) * kernel.reduce[-1] * size
    position_tiles = (1 if kernel.flat else math.prod(kernel.spatial[:-2])) * -(-kernel.width // rows)
    channel_tiles = kernel.channels // (vectors * lanes)
    return (channel_tiles - 1) * data * _reread(data) < (position_tiles - 1) * weights * _reread(weights)


def dividing_lanes(extent: int, lanes: int) -> int:
    """The widest vector of ``lanes`` halved until it divides ``extent`` (1 at the least)."""
    while lanes > 1 and extent % lanes:
        lanes //= 2
    return lanes


def block_kernel(sch, kernel: MatmulLike, rows: int, vectors: int, lanes: int, sampled: bool = False,
                 window: int = UNITS["x86_64"].window):
    """Schedule a :class:`MatmulLike` kernel with a ``rows`` × ``vectors``·``lanes`` register block: its producers
    inlined, its accumulators in a local buffer per tile, its epilogue fused into their write-back, the tiles (every
    loop outside the block) in parallel, the output channels' tiles outermost where :func:`channels_outer` says
    (the order chosen from the given shape, kept when a search varies it). ``sampled``: the rows and vectors as
    tile samples (their decisions the given ones) that a search's mutator varies, the lanes fixed. Returns ``sch``."""
    concat, piece = kernel.pieces or ("", 0)
    for name in kernel.producers:  # a padding inlined into the block's loads, but a spatial conv's of a vector of
        # input channels or more (its bounds tests cost more than one padded copy: docs/tuning-internals.md); other
        # producers than copies a pass before it, but a concatenation read in pieces (its select folds in each)
        if name != concat and (name in kernel.gathers or (not kernel.blocked and kernel.reduce[-1] >= lanes)):
            as_pass(sch, name, lanes)
        else:
            sch.compute_inline(sch.get_sblock(name))
    for name in kernel.epilogue[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    c = sch.get_sblock(kernel.block)
    ranks = len(kernel.spatial)
    if kernel.flat:  # the rows over every position: one iter var of the block, so that a tile's accumulators
        # (written at the fused position) compact to rows × vectors
        index = str(sch.get(c).iter_vars[0].var.ty)
        sch.transform_block_layout(c, _flat_positions(kernel.spatial, index, len(kernel.reduce)))
        positions, ranks = _flat_positions(kernel.spatial, index), 2
    loops = sch.get_loops(c)
    spatial, reduce = loops[:ranks], loops[ranks:]
    if piece:  # each piece of the reduction within one input of the concatenation: a copy of its loop per piece
        reduce = [*reduce[:-1], *sch.split(reduce[-1], [None, piece])]
    outer, (w, j) = list(spatial[:-2]), ([None, spatial[0]] if len(spatial) == 1 else spatial[-2:])
    tiles, inner = outer, []
    if w is not None:
        wo, wi = sch.split(w, _factors(sch, w, [-(-kernel.width // rows), rows], MAX_ROWS, sampled))
        tiles, inner = [*outer, wo], [wi]
    j, jv = sch.split(j, [None, lanes])
    jo, jj = sch.split(j, _factors(sch, j, [kernel.channels // lanes // vectors, vectors], MAX_VECTORS, sampled))
    order = [jo, *tiles] if channels_outer(kernel, rows, vectors, lanes) else [*tiles, jo]
    sch.reorder(*order, *reduce, *inner, jj, jv)
    acc = sch.cache_write(c, 0, "global")  # a stack array below STACK_BYTES (a "local" one is a heap workspace)
    if kernel.epilogue:
        sch.reverse_compute_inline(sch.get_sblock(kernel.epilogue[-1]))
    if kernel.flat:  # the accumulators and their write-back over the fused positions too
        sch.transform_layout(c, ("write", 0), positions)
        sch.transform_block_layout(acc, positions)
    # its loops as many whatever the tiles (a trace replays)
    sch.reverse_compute_at(acc, order[-1], preserve_unit_loops=True)
    left = _inline_moves(sch, kernel.rest)
    sliced = _slice_epilogue(sch, kernel, acc, left, order[-1], kernel.channels // (vectors * lanes))
    for name in left:  # what is left a pass each (an output's reads stay in its bounds)
        if name != sliced:
            as_pass(sch, name, lanes)
    sch.parallel(sch.fuse(*order))
    unrolled = reduce if kernel.depthwise and math.prod(kernel.reduce) <= window else []
    if piece:  # the pieces' loop: each copy's select folds
        unrolled = reduce[-2:-1]
    for loop in inner + unrolled:  # a depthwise or pooling window unrolled: neighbouring rows share its loads
        sch.unroll(loop)
    sch.unroll(jj)
    sch.vectorize(jv)
    sch.decompose_reduction(c, reduce[0])
    if sliced is None:
        *_, last = sch.get_loops(acc)
        _, lane = sch.split(last, [None, lanes])
        sch.vectorize(lane)
    else:  # the slice's channels in the widest vector that divides them
        *_, last = sch.get_loops(sch.get_sblock(sliced))
        width = dividing_lanes(int(sch.get(last).extent), lanes)
        if width > 1:
            sch.vectorize(sch.split(last, [None, width])[1])
    return sch


def _slice_epilogue(sch, kernel: MatmulLike, acc, names: list[str], tile, channel_tiles: int) -> str | None:
    """The block of ``names`` that reads the accumulators' write-back over a slice of its channels (a padded conv's
    real channels, with their bias and activation: toolchain/padding.py), fused into the tile: computed from the
    accumulators there, the padded tensor never written; its name, or None where there is none or the tiles split
    the channels (a tile's share of the slice would need a bounds test in its vector loop)."""
    from tvm.s_tir import ScheduleError

    consumers = [sch.get(c) for c in sch.get_consumers(acc)]
    if channel_tiles != 1 or len(consumers) != 1 or consumers[0].name_hint not in names:
        return None
    block, written = consumers[0], sch.get(acc).writes[0].source.__chandle__()
    extents = tuple(int(iv.dom.extent) for iv in block.iter_vars)
    order = [iv.var.name for iv in block.iter_vars]
    loads = [x for x in _loads(block.body.value) if _buffer(x).__chandle__() == written]
    if (extents[:-1] != kernel.spatial[:-1] or extents[-1] > kernel.channels or not loads
            or any([getattr(i, "name", None) for i in x.indices] != order for x in loads)):
        return None
    rv = sch.get_sblock(block.name_hint)
    try:
        if kernel.flat:  # over the positions the tile's rows run over, as the accumulators are
            index = str(block.iter_vars[0].var.ty)
            sch.transform_layout(acc, ("write", 0), _flat_positions(kernel.spatial, index))
            sch.transform_block_layout(rv, _flat_positions(extents, index))
        sch.reverse_compute_at(rv, tile, preserve_unit_loops=True)
        sch.compute_inline(acc)
    except ScheduleError:
        return None
    return block.name_hint


def _flat_positions(extents: tuple[int, ...], dtype: str, reductions: int = 0):
    """The index map of ``extents`` (positions…, channels) then ``reductions`` axes to (position, channel, the
    reductions…): a buffer's or a block's iter vars with the positions fused (indices of ``dtype``)."""
    from tvm import tirx

    def flat(*index):
        position = index[0]
        for axis, extent in zip(index[1:len(extents) - 1], extents[1:-1]):
            position = position * tirx.const(extent, dtype) + axis
        return (position, *index[len(extents) - 1:])

    return tirx.IndexMap.from_func(flat, ndim=len(extents) + reductions, index_dtype=dtype)


def _inline_moves(sch, names: tuple[str, ...]) -> list[str]:
    """``names`` (blocks after the epilogue) less those inlined into their readers: a block that only moves values
    (a slice, a concatenation's select, a reshape, a transpose: ShuffleNet's channel shuffle) or computes each value
    of its own from its loads (a bias and an activation after a padded conv's slice: SqueezeNet's classifier) into a
    buffer of the kernel's own, which as a pass of its own would read and write the whole tensor once more. An
    arithmetic block only where no reader computes it twice (:func:`_read_once`)."""
    from tvm.s_tir import ScheduleError

    own = {b.__chandle__() for b in sch.get(sch.get_sblock("root")).alloc_buffers}
    left = []
    for name in names:
        rv = sch.get_sblock(name)
        block = sch.get(rv)
        if is_view(name) or not _is(block.body, STORES) \
                or not (_moves(block.body.value) or _read_once(sch, rv, block)) \
                or any(w.source.__chandle__() not in own for w in block.writes):
            left.append(name)
            continue
        try:
            sch.compute_inline(rv)
        except ScheduleError:  # a reader TVM cannot inline into (checked before anything changes): a pass then
            left.append(name)
    return left


def _read_once(sch, rv, block) -> bool:
    """Whether every reader of ``block``'s buffer loads it once per value it computes, over no more values than
    ``block`` computes: inlined there, ``block``'s arithmetic is done no more often than as a pass."""
    written = block.body.buffer.__chandle__()
    size = math.prod(int(iv.dom.extent) for iv in block.iter_vars)
    for consumer in (sch.get(c) for c in sch.get_consumers(rv)):
        if not _is(consumer.body, STORES):
            return False
        loads = [x for x in _loads(consumer.body.value) if _buffer(x).__chandle__() == written]
        if len(loads) != 1 or math.prod(int(iv.dom.extent) for iv in consumer.iter_vars) > size:
            return False
    return True


def as_pass(sch, name: str, lanes: int) -> None:
    """Block ``name`` as a pass of its own: its outer loops fused and parallel, its innermost vectorised where it
    divides into vectors."""
    block = sch.get_sblock(name)
    if is_view(name):  # a concatenation's copy into a view of its slice (toolchain/concat.py): the loops inside
        block = sch.get_child_blocks(block)[0]
    *outer, last = sch.get_loops(block)
    if outer:
        sch.parallel(sch.fuse(*outer))
    if int(sch.get(last).extent) % lanes == 0:
        sch.vectorize(sch.split(last, [None, lanes])[1])


def _factors(sch, loop, decision: list[int], most: int, sampled: bool) -> list:
    """A two-way split's factors: ``decision`` as it is, or as a tile sample that starts from it."""
    if not sampled:
        return [None, decision[1]]
    return list(sch.sample_perfect_tile(loop, n=2, max_innermost_factor=max(most, decision[1]), decision=decision))


def block_space_fn(kernel: MatmulLike, shape: tuple[int, int, int], window: int):
    """The function a MetaSchedule ``ScheduleFn`` calls: the register block of ``shape`` (:func:`choose_block`) with
    its rows and vectors as tile samples (a search varies them; the lanes and the structure stay)."""

    def apply(sch):
        return [block_kernel(sch, kernel, *shape, sampled=True, window=window)]

    return apply


def unit_of(target) -> VectorUnit:
    """The vector unit of ``target`` (a ``tvm.target.Target``): by its float32 lanes, AArch64 as NEON; a target with
    4-lane vectors otherwise as SSE (16 registers)."""
    from toolchain.tune.intensive import vector_lanes

    lanes = vector_lanes(target)
    if "aarch64" in str(target.attrs.get("mtriple", "")) or str(target.kind) != "llvm":
        return UNITS["aarch64"]
    return {16: UNITS["x86_64"], 8: UNITS["avx2"]}.get(lanes, VectorUnit(16, lanes))


def register_block(func, target, spatial: bool = False):
    """``func``'s workload scheduled with its register block (:func:`block_kernel`, shape by :func:`choose_block`),
    not yet postprocessed: (schedule, "rows×vectors×lanes"), or (None, why not). ``spatial``: a spatial conv's too
    (its padding a pass before the block, or in its loads for a stem's few channels), and vectors narrower than 4
    lanes where no wider one divides the channels (ShuffleNet's 58: 2 lanes)."""
    from tvm import s_tir

    if winograd.is_winograd(func):  # its matmul is one block of several: its own schedule
        from toolchain.tune import winograd as winograd_schedule

        return winograd_schedule.schedule(func, target)
    kernel = matmul_like(func)
    if kernel is None:
        return None, "not a matmul-like kernel"
    if not (kernel.blocked or spatial):
        return None, "a spatial conv (its padding would sit in the block's loads)"
    unit = unit_of(target).of(kernel.dtype)
    shape = choose_block(kernel, unit, perfect=False, min_lanes=1 if spatial else 4)
    if shape is None:
        return None, f"{kernel.channels} output channels: no vector of 4 lanes or more divides them"
    return block_kernel(s_tir.Schedule(own_module(func)), kernel, *shape, window=unit.window), "×".join(map(str, shape))


def own_module(func):
    """``func`` alone in a module of its own copy (a schedule edits a module nothing else holds in place)."""
    import tvm

    return tvm.IRModule({"main": tvm.ir.load_json(tvm.ir.save_json(func)).with_attr("global_symbol", "main")})
