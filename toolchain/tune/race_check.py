"""Static data-race check of a scheduled PrimFunc: a parallel loop writing shared memory at an element
that does not depend on its variable, or writing an argument where two of its iterations overlap. Details:
docs/tuning-internals.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Race:
    block: str
    buffer: str
    loop: str  # the parallel loop variable the write does not depend on (or whose iterations' writes overlap)
    overlap: bool = False  # it depends on it, but two neighbouring iterations write the same elements

    def __str__(self) -> str:
        if self.overlap:
            return (f"block '{self.block}' writes argument '{self.buffer}' where iterations of parallel loop "
                    f"'{self.loop}' overlap")
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
    walk = _RaceWalk({p.__chandle__() for p in func.params})  # 0.27: a param is its buffer
    walk.stmt(func.body, [], {})
    return walk.races


class _RaceWalk:
    """One pass over a PrimFunc body. ``parallel``: [(loop var handle, name)] of the enclosing parallel loops;
    ``private``: parallel loop handle -> buffer handles allocated inside it."""

    def __init__(self, arguments: set[int] | None = None) -> None:
        self.races: list[Race] = []
        self.deps: dict[int, frozenset[int]] = {}  # var handle -> loop var handles it depends on
        self.arguments = arguments or set()  # handles of the function's argument buffers
        self.loops: list = []  # the enclosing loops (For nodes), outermost first
        self.binds: list = []  # (block var, the value it is bound to) of the enclosing blocks

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
        self.loops.append(stmt)
        if is_parallel:
            self.stmt(stmt.body, parallel + [(handle, stmt.loop_var.name)], {**private, handle: set()})
        else:
            self.stmt(stmt.body, parallel, private)
        self.loops.pop()

    def realize(self, stmt, parallel: list, private: dict) -> None:
        block = stmt.block
        for iv, value in zip(block.iter_vars, stmt.iter_values):
            self.deps[iv.var.__chandle__()] = self.dep_of(value)
        self.binds.append([(iv.var, value) for iv, value in zip(block.iter_vars, stmt.iter_values)])
        try:
            self.check_writes(block, parallel, private)
            self.stmt(block.body, parallel, private)
        finally:
            self.binds.pop()

    def check_writes(self, block, parallel: list, private: dict) -> None:
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
            if parallel and buf.__chandle__() in self.arguments and parallel[-1][0] in index_deps \
                    and self.neighbours_overlap(parallel[-1][0], [r.min for r in region.region], buf):
                self.races.append(Race(block.name_hint, buf.name, parallel[-1][1], overlap=True))

    def neighbours_overlap(self, loop: int, index: list, buf=None) -> bool:
        """Whether iterations 0 and 1 of the parallel loop ``loop`` write a common element at ``index`` (one
        expression per dimension), every loop inside it over its whole range: all dimensions' ranges meet, and
        so do the ranges of the element's offset in ``buf`` (row-major; a fused loop split into vectors that
        cross a row — 64 lanes over 96 channels — has dimension ranges that meet, offsets that do not)."""
        from tvm import ir, sym

        index = list(index) + ([_offset(index, buf.shape)] if buf is not None and _static(buf.shape) else [])
        inner = False
        ranges = []
        for i in range(2):
            analyzer = sym.Analyzer()
            for node in self.loops:
                var = node.loop_var
                if var.__chandle__() == loop:
                    analyzer.bind(var, node.min + i)
                    inner = True
                elif inner:
                    analyzer.bind(var, ir.Range.from_min_extent(node.min, node.extent))
            for binds in self.binds:
                for var, value in binds:
                    analyzer.bind(var, value)
            bounds = [analyzer.const_int_bound(analyzer.simplify(e)) for e in index]
            ranges.append([(int(b.min_value), int(b.max_value)) for b in bounds])
        return all(lo0 <= hi1 and lo1 <= hi0 for (lo0, hi0), (lo1, hi1) in zip(*ranges))


def _static(shape) -> bool:
    return all(hasattr(d, "value") or isinstance(d, int) for d in shape)


def _offset(index: list, shape):
    """The row-major offset of the element at ``index`` in a buffer of ``shape``."""
    offset, stride = 0, 1
    for e, d in reversed(list(zip(index, shape))):
        offset = offset + e * stride
        stride *= int(d)
    return offset
