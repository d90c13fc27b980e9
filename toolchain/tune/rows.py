"""Row kernels (a layer norm, a softmax, a row's mean): every block over the same rows, each row's reductions and
elementwise steps computed together in parallel rows, the reductions in vector partial sums. Why and the figures:
docs/tuning-internals.md (Row kernels)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowKernel:
    """A kernel whose blocks all run over the same leading rows (``rows``: their extents), each then over nothing
    (a row's mean) or one axis of ``length`` (an elementwise step, or a reduction along the row); its last block is
    elementwise over rows × length. Block names are the unscheduled function's, in program order."""

    blocks: tuple[str, ...]
    rows: tuple[int, ...]
    length: int
    reductions: tuple[str, ...]


def row_kernel(func) -> RowKernel | None:
    """``func``'s :class:`RowKernel`, or None: no reduction, a block with nested blocks, or a block over another
    domain than rows (× one axis of the row's length)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    if len(blocks) < 2 or any(sch.get_child_blocks(sch.get_sblock(b.name_hint)) for b in blocks):
        return None
    last = blocks[-1]
    extents = [int(iv.dom.extent) for iv in last.iter_vars]
    if len(extents) < 2 or any(int(iv.iter_type) != 0 for iv in last.iter_vars):
        return None
    rows, length = tuple(extents[:-1]), extents[-1]
    reductions = []
    for b in blocks:
        kinds = [int(iv.iter_type) for iv in b.iter_vars]
        ext = tuple(int(iv.dom.extent) for iv in b.iter_vars)
        if ext[:len(rows)] != rows or any(kinds[:len(rows)]) or ext[len(rows):] not in ((), (length,)):
            return None
        if kinds[len(rows):] == [2]:
            reductions.append(b.name_hint)
        elif kinds[len(rows):] not in ([], [0]):
            return None
    if not reductions:
        return None
    return RowKernel(tuple(b.name_hint for b in blocks), rows, length, tuple(reductions))


def schedule_rows(sch, kernel: RowKernel, lanes: int):
    """Schedule a :class:`RowKernel`: elementwise steps read by one block inlined into it, each reduction in
    ``lanes`` partial sums (``rfactor``) added once at the row's end, every block computed inside the last block's
    row loop (fused and parallel), the loop along the row in vectors of ``lanes``. Returns ``sch``."""
    for name in reversed(kernel.blocks[:-1]):
        block = sch.get_sblock(name)
        if name not in kernel.reductions and len(sch.get_consumers(block)) == 1:
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 - not inlinable (TVM says why): it stays a step of the row
                pass
    if kernel.length % lanes == 0 and lanes > 1:
        for name in kernel.reductions:
            *_, along = sch.get_loops(sch.get_sblock(name))
            sch.rfactor(sch.split(along, [None, lanes])[1], len(kernel.rows))
    root = sch.get_sblock("root")
    *steps, last = sch.get_child_blocks(root)
    *row_loops, _ = sch.get_loops(last)
    row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    for block in reversed(steps):
        sch.compute_at(block, row, preserve_unit_loops=True)
    for block in steps:
        _vectorize_step(sch, block, lanes)
    *_, along = sch.get_loops(last)
    if kernel.length % lanes == 0 and lanes > 1:
        sch.vectorize(sch.split(along, [None, lanes])[1])
    sch.parallel(row)
    return sch


def _vectorize_step(sch, block, lanes: int) -> None:
    """A step computed at the row (its loops there one per iter var, in order, unit loops kept): its one spatial
    loop longer than 1 — along the row, or a reduction's partial sums — moved innermost and vectorised in ``lanes``."""
    kinds = [int(iv.iter_type) for iv in sch.get(block).iter_vars]
    loops = sch.get_loops(block)[1:]
    extents = [int(sch.get(lp).extent) for lp in loops]
    spatial = [i for i, (k, e) in enumerate(zip(kinds, extents)) if k == 0 and e > 1]
    if len(loops) != len(kinds) or len(spatial) != 1 or extents[spatial[0]] % lanes or lanes < 2:
        return
    along = loops[spatial[0]]
    sch.reorder(*[lp for i, lp in enumerate(loops) if i != spatial[0]], along)
    sch.vectorize(along if extents[spatial[0]] == lanes else sch.split(along, [None, lanes])[1])


def _exists(sch, name: str) -> bool:
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - inlined away
        return False
    return True


def row_schedule(func, target):
    """``func`` scheduled as a :class:`RowKernel` for ``target`` (its float32 vector lanes), not yet
    postprocessed: (schedule, "rows×lanes"), or (None, why not)."""
    from tvm import s_tir

    from toolchain.tune.intensive import vector_lanes
    from toolchain.tune.microkernel import own_module

    kernel = row_kernel(func)
    if kernel is None:
        return None, "not a row kernel"
    lanes = vector_lanes(target)
    while lanes > 1 and kernel.length % lanes:
        lanes //= 2
    sch = schedule_rows(s_tir.Schedule(own_module(func)), kernel, lanes)
    return sch, f"{len(kernel.blocks)} steps×{lanes}"
