"""The schedule of a Winograd conv's kernel (toolchain/winograd.py): its transforms as parallel vectorised passes over
the tiles, the α² matmuls as one register block over (α², tiles, output channels), the epilogue fused into the last
pass. Why and the figures: docs/partitioning.md (Winograd convs)."""

from __future__ import annotations

from toolchain import winograd as wg
from toolchain.tune.microkernel import (
    MAX_ROWS,
    MAX_VECTORS,
    _factors,
    as_pass,
    block_for,
    dividing_lanes,
    own_module,
    unit_of,
)
from toolchain.tune.rows import as_passes


def schedule(func, target):
    """``func`` (a Winograd conv, with what its kernel fused before and after it) scheduled: (schedule, its matmul's
    "rows×vectors×lanes"), or (None, why not)."""
    from tvm import s_tir

    sch = s_tir.Schedule(own_module(func))
    shape = apply(sch, unit_of(target))  # the space's own point: a search starts from its trace
    return (sch, "×".join(map(str, shape))) if isinstance(shape, tuple) else (None, shape)


def space_fn(target):
    """The function a MetaSchedule ``ScheduleFn`` calls on a Winograd conv: :func:`apply` with the matmul's rows
    and vectors as tile samples (a search varies them; the structure and the lanes stay)."""
    unit = unit_of(target)

    def fn(sch):
        found = apply(sch, unit)
        if not isinstance(found, tuple):
            raise ValueError(found)
        return [sch]

    return fn


def apply(sch, unit):
    """Schedule a Winograd conv's kernel in ``sch``, its matmul's rows and vectors as tile samples whose decisions
    are the register block's: its (rows, vectors, lanes), or why not (a string)."""
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    parts = [_named(names, stem) for stem in (wg.PAD, wg.ROWS, wg.PACK, wg.GEMM, wg.COLS, wg.UNPACK, wg.OUT)]
    if None in parts:
        return "not one Winograd conv"
    pad, rows, pack, gemm, cols, unpack, out = parts
    before, after = names[:names.index(pad)], names[names.index(out) + 1:]
    for name in reversed(before):  # what computes its input (a layout change, an activation): into its loads
        _inline_or_pass(sch, name, unit.lanes)
    sch.compute_inline(sch.get_sblock(pad))
    _transform(sch, pack, rows, unit.lanes)
    shape = _matmul(sch, gemm, unit)
    if shape is None:
        return "no vector divides its output channels"
    _transform(sch, unpack, cols, unit.lanes)
    # the tiles' outputs gathered into NHWC and the epilogue (bias, activation, a residual add, a concatenation's
    # view): each inlined into what reads it, the rest (the last, what another kernel reads) parallel passes
    as_passes(sch, [out, *after], unit.lanes)
    return shape


def tile_rows(conv, target) -> int:
    """The rows of the register block a Winograd conv's matmuls get on ``target`` (:func:`block_for`, the last tile
    masked where that uses the registers better): what :func:`toolchain.winograd.rewrite` rounds its tiles up to, so
    that no tile of rows is masked (a masked block spilled on AVX2's 16 registers)."""
    shape = block_for(conv.out_channels, conv.tiles, unit_of(target), perfect=False)
    return shape[0] if shape else 1


def _named(names: list[str], stem: str) -> str | None:
    """The one block called ``stem`` (a fused kernel's names may carry a number after it), None unless one."""
    hits = [n for n in names if n == stem or (n.startswith(stem) and n[len(stem):].isdigit())]
    return hits[0] if len(hits) == 1 else None


def _inline_or_pass(sch, name: str, lanes: int) -> None:
    try:
        sch.compute_inline(sch.get_sblock(name))
    except Exception:  # noqa: BLE001 - read by more than its consumer, or not inlinable: a pass of its own
        as_pass(sch, name, lanes)


def _transform(sch, name: str, first: str, lanes: int) -> None:
    """A two-pass transform (``first`` then ``name``, loops (α or m, α, tiles, channels)) as one pass over the
    tiles: per tile and vector of channels, ``first``'s values computed in a small buffer and ``name``'s from them,
    the transform loops unrolled (their selects fold), the channels vectorised."""
    block = sch.get_sblock(name)
    e, n, p, c = sch.get_loops(block)
    width = dividing_lanes(int(sch.get(c).extent), lanes)
    co, ci = sch.split(c, [None, width])
    sch.reorder(p, co, e, n, ci)
    sch.parallel(p)
    producer = sch.get_sblock(first)
    sch.compute_at(producer, e)  # one row of it at a time: under 1 KiB, a stack array (a larger one is a heap
    *unrolled, inner = sch.get_loops(producer)[3:]  # workspace allocated in every tile)
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(inner)
    sch.unroll(e)
    sch.unroll(n)
    sch.vectorize(ci)


def _matmul(sch, name: str, unit) -> tuple[int, int, int] | None:
    """The α² matmuls (loops α, α, tiles, output channels, input channels) as one register block: rows of tiles ×
    vectors of output channels held in registers across the input channels, all (α², row, vector) tiles parallel;
    the rows and vectors tile samples starting from that block (a search's mutator varies them)."""
    block = sch.get_sblock(name)
    e, n, p, o, k = sch.get_loops(block)
    tiles, channels = int(sch.get(p).extent), int(sch.get(o).extent)
    shape = block_for(channels, tiles, unit)  # rows dividing the tiles: no mask
    if shape is None:
        return None
    rows, vectors, lanes = shape
    batch = sch.fuse(e, n)
    io, ii = sch.split(p, _factors(sch, p, [tiles // rows, rows], MAX_ROWS, sampled=True))
    jo, jv = sch.split(o, [None, lanes])
    jo, jj = sch.split(jo, _factors(sch, jo, [channels // lanes // vectors, vectors], MAX_VECTORS,
                                        sampled=True))
    sch.reorder(batch, io, jo, k, ii, jj, jv)
    acc = sch.cache_write(block, 0, "global")  # a stack array (microkernel.block_matmul)
    sch.reverse_compute_at(acc, jo, preserve_unit_loops=True)  # its loops as many whatever the tiles (a trace replays)
    sch.parallel(sch.fuse(batch, io, jo))  # before the reduction is split into init and update
    sch.unroll(ii)
    sch.unroll(jj)
    sch.vectorize(jv)
    sch.decompose_reduction(block, k)
    *_, last = sch.get_loops(acc)
    sch.vectorize(sch.split(last, [None, lanes])[1])
    return shape
