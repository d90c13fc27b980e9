"""Row kernels (a layer norm, a softmax): every block over the same rows, each row's reductions and elementwise
steps computed together in parallel rows, the reductions in vector partial sums; and kernels of copies alone as
parallel passes. Why and the figures:
docs/tuning-internals.md (Row kernels)."""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.tune.microkernel import as_pass, dividing_lanes, moves_one_load, own_module


@dataclass(frozen=True)
class RowKernel:
    """A kernel whose core blocks all run over the same leading rows (``rows``: their extents), each then over
    nothing (a row's mean) or one axis of ``length`` (an elementwise step, or a reduction along the row), the last of
    them elementwise over rows × length; before them copies over other domains (a reshape: inlined into their
    loads), after them spatial blocks (a transpose of the result, a row taken: one pass after the rows). Block
    names are the unscheduled function's, in program order."""

    blocks: tuple[str, ...]  # the core
    rows: tuple[int, ...]
    length: int
    reductions: tuple[str, ...]
    lead: tuple[str, ...] = ()
    rest: tuple[str, ...] = ()


def row_kernel(func) -> RowKernel | None:
    """``func``'s :class:`RowKernel`, or None: no reduction along a row, a block with nested blocks, a reduction or
    a block of more than one store outside the core, or the core's last block not elementwise over rows × length."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    if len(blocks) < 2 or any(sch.get_child_blocks(sch.get_sblock(b.name_hint)) for b in blocks):
        return None
    kinds = [[int(iv.iter_type) for iv in b.iter_vars] for b in blocks]
    extents = [tuple(int(iv.dom.extent) for iv in b.iter_vars) for b in blocks]
    first = next((i for i, k in enumerate(kinds) if 2 in k), None)
    if first is None or kinds[first].count(2) != 1 or kinds[first][-1] != 2 or len(kinds[first]) < 2:
        return None
    rows, length = extents[first][:-1], extents[first][-1]

    def core(i: int) -> bool:
        tail = kinds[i][len(rows):]
        return (extents[i][:len(rows)] == rows and not any(kinds[i][:len(rows)])
                and extents[i][len(rows):] in ((), (length,)) and tail in ([], [0], [2]))

    start = first
    while start > 0 and core(start - 1):
        start -= 1
    end = first + 1
    while end < len(blocks) and core(end):
        end += 1
    while end > first + 1 and extents[end - 1] != (*rows, length) and 2 not in kinds[end - 1]:
        end -= 1  # a block after the last step over the whole row (BERT's pooler takes one row): after the rows
    others = [*range(start), *range(end, len(blocks))]
    if any(2 in kinds[i] or type(blocks[i].body).__name__ not in ("TensorStore", "BufferStore") for i in others):
        return None
    if not all(moves_one_load(blocks[i]) for i in range(start)):
        return None  # inlined into every load of the core, arithmetic would be computed again in each
    if extents[end - 1] != (*rows, length) or 2 in kinds[end - 1]:
        return None
    names = [b.name_hint for b in blocks]
    return RowKernel(tuple(names[start:end]), rows, length,
                     tuple(n for n, k in zip(names[start:end], kinds[start:end]) if 2 in k),
                     tuple(names[:start]), tuple(names[end:]))


def schedule_rows(sch, kernel: RowKernel, lanes: int):
    """Schedule a :class:`RowKernel`: elementwise steps read by one block inlined into it, each reduction in
    ``lanes`` partial sums (``rfactor``) added once at the row's end, every block computed inside the last block's
    row loop (fused and parallel), the loop along the row in vectors of ``lanes``; the copies before inlined, the
    blocks after inlined into the last of them, a parallel pass. Returns ``sch``."""
    for name in kernel.lead:
        sch.compute_inline(sch.get_sblock(name))
    if kernel.rest:  # a chain of reshapes and transposes: one pass, its last, reading through them
        as_passes(sch, kernel.rest, lanes)
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
    *steps, last = [sch.get_sblock(n) for n in _after_rfactor(sch, kernel.blocks)]
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


def _after_rfactor(sch, core: tuple[str, ...]) -> list[str]:
    """The core's blocks as they stand now (inlined ones gone, each reduction's partial-sum block before it), in
    program order."""
    names = [sch.get(rv).name_hint for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    return [n for n in names if n in core or (n.endswith("_rf") and n[:-3] in core)]


def row_schedule(func, target):
    """``func`` scheduled as a :class:`RowKernel` for ``target`` (its float32 vector lanes), not yet
    postprocessed: (schedule, "N steps×lanes"), or (None, why not)."""
    from tvm import s_tir

    from toolchain.tune.intensive import vector_lanes

    kernel = row_kernel(func)
    if kernel is None:
        return None, "not a row kernel"
    lanes = dividing_lanes(kernel.length, vector_lanes(target))
    sch = schedule_rows(s_tir.Schedule(own_module(func)), kernel, lanes)
    return sch, f"{len(kernel.blocks)} steps×{lanes}"


def pass_schedule(func, target):
    """A kernel of spatial blocks only (reshapes, transposes, elementwise steps): each block inlined into what reads
    it where TVM can (not an output), the others parallel passes, vectorised where their innermost loop divides into
    the target's vectors. (schedule, "N pass(es)"), or (None, why not): a reduction, or nested blocks."""
    from tvm import s_tir

    from toolchain.tune.intensive import vector_lanes

    sch = s_tir.Schedule(own_module(func))
    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    if any(2 in [int(iv.iter_type) for iv in b.iter_vars] for b in blocks):
        return None, "a reduction"
    if any(sch.get_child_blocks(sch.get_sblock(b.name_hint)) for b in blocks):
        return None, "nested blocks"
    passes = as_passes(sch, [b.name_hint for b in blocks], vector_lanes(target))
    return sch, f"{passes} pass{'es' if passes > 1 else ''}"


def as_passes(sch, names, lanes: int) -> int:
    """Blocks ``names`` (program order): each but the last inlined into what reads it where TVM can, the others and
    the last parallel passes (:func:`as_pass`); how many passes."""
    kept = []
    for name in reversed(names[:-1]):
        try:
            sch.compute_inline(sch.get_sblock(name))
        except Exception:  # noqa: BLE001 - an output, or read by a block it cannot be inlined into: a pass
            kept.append(name)
    for name in [*reversed(kept), names[-1]]:
        as_pass(sch, name, lanes)
    return len(kept) + 1
