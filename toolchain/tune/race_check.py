"""Static data-race check of a scheduled PrimFunc: a parallel loop writing shared memory at an element
that does not depend on its variable. Details: docs/tuning-internals.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Race:
    block: str
    buffer: str
    loop: str  # the parallel loop variable the write does not depend on

    def __str__(self) -> str:
        return f"block '{self.block}' writes shared buffer '{self.buffer}' independently of parallel loop '{self.loop}'"


def _vars(expr) -> set[int]:
    """Handles of the variables in an index expression."""
    from tvm import tirx

    found: set[int] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, tirx.Var):
            found.add(e.__chandle__())
        elif isinstance(e, (tirx.IntImm, tirx.FloatImm)):
            continue
        else:
            for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
                child = getattr(e, attr, None)
                if child is not None and not isinstance(child, (int, float, str)):
                    stack.append(child)
            for arg in getattr(e, "args", []) or []:
                stack.append(arg)
    return found


def parallel_races(func) -> list[Race]:
    """Every (block, buffer, parallel loop) write race in ``func`` (a scheduled PrimFunc or IRModule)."""
    import tvm

    if isinstance(func, tvm.IRModule):
        func = func["main"]
    walk = _RaceWalk()
    walk.stmt(func.body, [], {})
    return walk.races


class _RaceWalk:
    """One pass over a PrimFunc body. ``parallel``: [(loop var handle, name)] of the enclosing parallel loops;
    ``private``: parallel loop handle -> buffer handles allocated inside it."""

    def __init__(self) -> None:
        self.races: list[Race] = []
        self.deps: dict[int, frozenset[int]] = {}  # var handle -> loop var handles it depends on

    def dep_of(self, expr) -> frozenset[int]:
        out: set[int] = set()
        for v in _vars(expr):
            out |= self.deps.get(v, {v})
        return frozenset(out)

    def stmt(self, stmt, parallel: list, private: dict) -> None:
        from tvm import s_tir, tirx

        if stmt is None:
            return
        if isinstance(stmt, tirx.For):
            self.loop(stmt, parallel, private)
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.stmt(s, parallel, private)
        elif isinstance(stmt, s_tir.SBlockRealize):
            self.realize(stmt, parallel, private)
        elif isinstance(stmt, tirx.IfThenElse):
            self.stmt(stmt.then_case, parallel, private)
            self.stmt(stmt.else_case, parallel, private)
        else:  # SBlock, LetStmt, Allocate, ...: their body
            self.stmt(getattr(stmt, "body", None), parallel, private)

    def loop(self, stmt, parallel: list, private: dict) -> None:
        from tvm import tirx

        handle = stmt.loop_var.__chandle__()
        self.deps[handle] = frozenset({handle})
        is_parallel = int(stmt.kind) == 1 and not (isinstance(stmt.extent, tirx.IntImm) and int(stmt.extent) <= 1)
        if is_parallel:
            self.stmt(stmt.body, parallel + [(handle, stmt.loop_var.name)], {**private, handle: set()})
        else:
            self.stmt(stmt.body, parallel, private)

    def realize(self, stmt, parallel: list, private: dict) -> None:
        block = stmt.block
        for iv, value in zip(block.iter_vars, stmt.iter_values):
            self.deps[iv.var.__chandle__()] = self.dep_of(value)
        for scope in private.values():  # buffers allocated here are private to every enclosing loop
            scope.update(b.__chandle__() for b in block.alloc_buffers)  # 0.27: buffers are typed Vars
        for region in block.writes:
            buf = region.source
            index_deps: set[int] = set()
            for r in region.region:
                index_deps |= self.dep_of(r.min)
            for handle, name in parallel:
                if buf.__chandle__() not in private[handle] and handle not in index_deps:
                    self.races.append(Race(block.name_hint, buf.name, name))
        self.stmt(block.body, parallel, private)
