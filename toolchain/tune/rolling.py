"""Line buffers: each core runs its row tiles in order, and the blocks a tile computes with a window's halo (a chain's
head and its padding, a row-tiled dw pair's U) compute only the rows the core's previous tile did not, into buffers
indexed modulo the window's rows. Applied to a scheduled module before it is built. Why: docs/tuning-internals.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: loop annotation: one core's serial loop over its row tiles (:func:`per_core`)
ROLL = "agoc.roll"
#: block annotation: the iterator of the rows a block's tiles overlap in, which is also the axis of the buffer it
#: writes (NHWC: 1)
ROLL_ROWS = "agoc.roll_rows"


@dataclass(frozen=True)
class Window:
    """What a block computes per tile along its rows: ``rows`` in all (its buffer's rows once rolled), ``step`` more
    than the tile before; a core's tile after its first computes the last ``step`` of them."""

    block: str
    axis: int
    rows: int
    step: int

    @property
    def overlap(self) -> int:
        return self.rows - self.step


def per_core(sch, tile, cores: int):
    """Split ``tile`` (a row tile loop) into one block of tiles per core, the core's tiles in order in an
    annotated serial loop; returns (the loop the tile's blocks go in, whether it was split). A tile loop with no
    more tiles than cores is left as it is."""
    if cores < 1 or int(sch.get(tile).extent) <= cores:
        return tile, False
    _, serial = sch.split(tile, factors=[cores, None])
    sch.annotate(serial, ROLL, 1)
    return serial, True


def mark(sch, blocks) -> None:
    """Annotate ``blocks`` (named, computed in a :func:`per_core` tile with a window's halo rows) to be rolled."""
    for name in blocks:
        sch.annotate(sch.get_sblock(name), ROLL_ROWS, 1)


def rolled(mod):
    """``mod`` (an IRModule) with every PrimFunc holding a :data:`ROLL` loop rolled (:func:`roll_func`)."""
    from tvm import tirx

    changed = {}
    for gv, func in mod.functions_items():
        new = roll_func(func) if isinstance(func, tirx.PrimFunc) else func
        if not new.same_as(func):
            changed[gv] = new
    if not changed:
        return mod
    out = mod.clone()
    for gv, func in changed.items():
        out.update_func(gv, func)
    return out


def roll_func(func):
    """``func`` with the blocks marked :data:`ROLL_ROWS` under its :data:`ROLL` loop rolled: their buffers hold one
    window of rows, indexed modulo its height; each core's first tile computes the whole window, later tiles only the
    rows past the previous window; the buffers are allocated per core (outside the serial loop). A function without
    such a loop, whose windows do not advance by a constant step, or that TVM cannot index modulo its window (logged),
    is returned as it is: built as scheduled, it computes the same values."""
    try:
        return _roll(func)
    except Exception as exc:  # noqa: BLE001 - a TVM check on a window: the schedule as it is, correct and slower
        log.info("line buffer not applied: %s", str(exc).strip().splitlines()[-1] if str(exc).strip() else exc)
        return func


def _roll(func):
    found = _find(func.body)
    if found is None:
        return func
    loop, marked = found
    windows = [w for w in (_window(r, inner, loop) for r, inner in marked) if w is not None and w.overlap > 0]
    if not windows or int(loop.extent) <= 1:
        return func
    func = _ring(func, windows)
    by_name = {w.block: w for w in windows}
    loop = _find(func.body)[0]  # the same loop, rebuilt by the layout change
    return func.with_body(_rebuild(func.body, lambda realize, inner: _skip(realize, inner, loop, by_name)))


# ---------------------------------------------------------------------------------------------------------------


def _loops_to(stmt, want, inner: list):
    """Yield (node, the loops between the start and it) for every node of ``stmt`` that ``want`` accepts."""
    from tvm import s_tir, tirx

    if want(stmt):
        yield stmt, list(inner)
    if isinstance(stmt, tirx.For):
        yield from _loops_to(stmt.body, want, inner + [stmt])
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _loops_to(s, want, inner)
    elif isinstance(stmt, s_tir.SBlockRealize):
        yield from _loops_to(stmt.block.body, want, inner)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from _loops_to(stmt.then_case, want, inner)
        if stmt.else_case is not None:
            yield from _loops_to(stmt.else_case, want, inner)


def _find(body):
    """(the ROLL loop, [(marked block realize, the loops between the ROLL loop and it)]) or None."""
    from tvm import s_tir, tirx

    loops = [node for node, _ in _loops_to(body, lambda s: isinstance(s, tirx.For) and ROLL in s.annotations, [])]
    if len(loops) != 1:
        return None
    marked = list(_loops_to(loops[0].body, lambda s: isinstance(s, s_tir.SBlockRealize)
                            and ROLL_ROWS in s.block.annotations, []))
    return loops[0], marked


def _window(realize, inner: list, loop) -> Window | None:
    """The rows the block of ``realize`` computes per tile of ``loop`` and their step, from its rows' binding with
    the loops inside ``loop`` over their ranges; None where they are not constant."""
    from tvm import sym

    axis = int(realize.block.annotations[ROLL_ROWS])
    write = realize.block.writes
    if len(write) != 1 or not write[0].region[axis].min.same_as(realize.block.iter_vars[axis].var):
        return None
    binding = realize.iter_values[axis]
    analyzer = sym.Analyzer()

    def bounds(t: int):
        dom = {**_domain(inner), loop.loop_var: sym.IntervalSet(loop.min + t, loop.min + t)}
        got = analyzer.int_set(binding, dom)
        return analyzer.simplify(got.min_value), analyzer.simplify(got.max_value)

    (lo0, hi0), (lo1, _) = bounds(0), bounds(1)
    rows, step = analyzer.simplify(hi0 - lo0 + 1), analyzer.simplify(lo1 - lo0)
    if not (hasattr(rows, "value") and hasattr(step, "value")) or int(step.value) <= 0:
        return None
    return Window(realize.block.name_hint, axis, int(rows.value), int(step.value))


def _domain(loops: list) -> dict:
    """Each loop's variable over its range."""
    from tvm import sym

    return {lp.loop_var: sym.IntervalSet(lp.min, lp.min + lp.extent - 1) for lp in loops}


def _ring(func, windows: list[Window]):
    """``func`` with each window's buffer indexed modulo its rows (MetaSchedule's layout transform)."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    for w in windows:
        sch.transform_layout(sch.get_sblock(w.block), ("write", 0), _modulo(w.axis, w.rows))
    return sch.mod["main"]


def _modulo(axis: int, rows: int):
    return lambda *index: tuple(i % rows if k == axis else i for k, i in enumerate(index))


def _skip(realize, inner: list, loop, windows: dict):
    """A marked block's realize that, past a core's first tile, computes only the rows its previous tile did not;
    bound to the serial loop by an opaque iterator too, so that its buffer is allocated outside that loop (its rows
    live from one tile to the next)."""
    from tvm import ir, s_tir, sym, tirx

    block = realize.block
    w = windows.get(block.name_hint)
    if w is None:
        return realize
    binding = realize.iter_values[w.axis]
    analyzer = sym.Analyzer()
    first = analyzer.simplify(analyzer.int_set(binding, _domain(inner)).min_value)
    t = loop.loop_var
    new_rows = tirx.Or(t < loop.min + 1, binding - first >= w.overlap)
    predicate = analyzer.simplify(tirx.And(realize.predicate, new_rows))
    tile = tirx.IterVar(ir.Range.from_min_extent(loop.min, loop.extent), tirx.Var("v_tile", loop.loop_var.ty),
                        tirx.IterVar.Opaque)
    block = s_tir.SBlock(list(block.iter_vars) + [tile], block.reads, block.writes, block.name_hint, block.body,
                         block.init, block.alloc_buffers, block.match_buffers, block.annotations)
    return s_tir.SBlockRealize(list(realize.iter_values) + [t], predicate, block)


def _rebuild(stmt, fn, inner: list | None = None):
    """``stmt`` with every block realize replaced by ``fn(realize, the loops from the ROLL loop down to it)``."""
    from tvm import s_tir, tirx

    inner = [] if inner is None else inner
    if isinstance(stmt, tirx.For):
        rolls = ROLL in stmt.annotations
        body = _rebuild(stmt.body, fn, [] if rolls else inner + [stmt])
        notes = {k: v for k, v in stmt.annotations.items() if k != ROLL}  # rolled once
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, notes,
                        getattr(stmt, "step", None))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_rebuild(s, fn, inner) for s in stmt.seq])
    if isinstance(stmt, tirx.IfThenElse):
        other = stmt.else_case
        return tirx.IfThenElse(stmt.condition, _rebuild(stmt.then_case, fn, inner),
                               None if other is None else _rebuild(other, fn, inner))
    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        body = _rebuild(block.body, fn, inner)
        if not body.same_as(block.body):
            block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                                 block.alloc_buffers, block.match_buffers, block.annotations)
            stmt = s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
        return fn(stmt, inner)
    return stmt
