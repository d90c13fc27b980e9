"""Software prefetch of a kernel's weight panels: while a parallel task computes with one panel of pre-packed
weights, each step of its reduction also asks for the same step of the panel the next task reads, so that panel
arrives from memory while this one computes (why and the measurements: docs/tuning-internals.md, "Weight prefetch")."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: The TIR pipeline name agoc registers with TVM: the stock pipeline, then :func:`add_prefetches` per kernel.
PIPELINE = "agoc"
#: The PrimFunc attribute listing a kernel's weight parameters (``build.mark_weights`` sets it on the built module,
#: whose pre-packed kernels no longer carry TVM's ``layout_free_buffers``).
WEIGHTS_ATTR = "agoc.weights"

#: When a stream is prefetched: (rule, bound, why). Every bound must hold.
RULES = (
    ("weight_bytes", 128 << 10, "a smaller weight stays in the core's caches from one inference to the next"),
    ("tasks_per_panel", 8, "a panel read by more consecutive tasks is cached for all but the first: the "
                           "prefetches of the others are instructions for nothing"),
    ("panel_bytes", 64 << 10, "a larger next panel, fetched beside the one in use, evicts it from the core's "
                              "caches (MobileNet-V2's 1 x 1 convs over 576 and 960 channels, 74 and 123 KB panels: "
                              "slower)"),
    ("fmas_per_line", 6, "fewer vector FMAs per prefetched line and the prefetches take the load slots the "
                         "block needs (a 3 x 4 block: 4 lines for 12 FMAs measured slower)"),
)
BOUND = {name: bound for name, bound, _ in RULES}
#: Bytes per cache line (x86-64 and the ARM64 cores agoc targets): one prefetch per line a step reads.
LINE_BYTES = 64
#: llvm.prefetch(address, rw, locality, cache type): a read, kept in every cache level, data.
READ, KEEP_ALL_LEVELS, DATA = 0, 3, 1


@dataclass(frozen=True)
class Stream:
    """A weight panel an innermost reduction loop reads step by step: the flat index of a step's first element
    (valid at the body's ``position``), the elements it reads from there, and how far on the next task's panel is."""

    buffer: object
    position: int
    start: object
    width: int
    ahead: int


def weight_names(func) -> set[str]:
    """The names of a PrimFunc's weight parameters (:data:`WEIGHTS_ATTR`, else TVM's ``layout_free_buffers``) of at
    least the ``weight_bytes`` rule. Lowering flattens each into a buffer of the same name, which is how its loads
    are matched after it (TVM 0.27's lowered buffers do not point back at the parameter)."""
    attrs = func.attrs if func.attrs is not None else {}
    free = attrs.get(WEIGHTS_ATTR, None) or attrs.get("layout_free_buffers", None)
    return {func.params[int(i)].name for i in free or () if _bytes(func.params[int(i)].ty) >= BOUND["weight_bytes"]}


def _bytes(ty) -> int:
    n = 1
    for extent in getattr(ty, "shape", None) or ():
        if not hasattr(extent, "value"):
            return 0
        n *= int(extent.value)
    dtype = getattr(getattr(ty, "dtype", None), "dtype", None)  # BufferType -> PrimType -> dtype
    return n * dtype.bits * dtype.lanes // 8 if dtype is not None else 0


def _loads(expr, out: list) -> list:
    """Every tensor load inside ``expr`` (TVM 0.27 has no Python expression visitor for TIR)."""
    from tvm import ir

    if isinstance(expr, ir.TensorLoad):
        out.append(expr)
    for field in ("a", "b", "value", "base", "condition", "true_value", "false_value"):
        sub = getattr(expr, field, None)
        if isinstance(sub, ir.Expr):
            _loads(sub, out)
    for field in ("args", "indices"):
        for sub in getattr(expr, field, None) or ():
            if isinstance(sub, ir.Expr):
                _loads(sub, out)
    return out


def _first_index(load):
    """The flat index of a load's first element and how many elements it reads (None for a strided vector)."""
    from tvm import tirx

    if len(load.indices) != 1:
        return None, 0
    index = load.indices[0]
    if isinstance(index, tirx.Ramp):
        lanes = getattr(index.lanes, "value", index.lanes)
        return (index.base, int(lanes)) if getattr(index.stride, "value", None) == 1 else (None, 0)
    return index, 1


def _const(expr) -> int | None:
    value = getattr(expr, "value", None)
    return int(value) if isinstance(value, int) else None


def _dtype(expr) -> str:
    """An expression's or variable's element type and lanes, as TVM spells it (``int32``, ``float32x16``)."""
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


def _bind(analyzer, bind) -> None:
    """Let the analyzer see through an integer ``Bind`` (CSE's names for index parts); others are not indices."""
    if _dtype(bind.var).startswith(("int", "uint")):
        try:
            analyzer.bind(bind.var, bind.value, allow_override=True)
        except (TypeError, ValueError):
            pass


def _coefficient(analyzer, expr, var) -> int | None:
    from tvm import sym

    found = sym.detect_linear_equation(analyzer.simplify(expr), [var])
    return _const(found[0]) if len(found) == 2 else None


def _panel_offset(analyzer, start, loops: list) -> tuple[int, int] | None:
    """(consecutive tasks of the innermost enclosing parallel loop that read the same panel, elements from one
    panel to the next), from ``start`` at a few task indices with the loops inside the parallel one at 0."""
    from tvm import sym, tirx

    parallel = [i for i, loop in enumerate(loops) if loop.kind == tirx.ForKind.PARALLEL]
    if not parallel:
        return None
    outer, inner = loops[parallel[-1]], loops[parallel[-1] + 1:]
    full = analyzer.simplify(start)
    extent = _const(outer.extent) or 0

    def base(task: int) -> int | None:
        at = sym.Analyzer()
        at.bind(outer.loop_var, tirx.const(task, _dtype(outer.loop_var)))
        for loop in inner:
            at.bind(loop.loop_var, tirx.const(0, _dtype(loop.loop_var)))
        return _const(at.simplify(full))

    first = base(0)
    for task in range(1, min(extent, BOUND["tasks_per_panel"] + 1)):
        here = base(task)
        if here is None or first is None:
            return None
        if here != first:
            return task, here - first
    return None


def plan(loop, loops: list, analyzer, weights: set[str]) -> tuple[list[Stream], str]:
    """The weight streams of the innermost serial ``loop`` (``loops``: the loops around it, outermost first, itself
    last) worth prefetching, and why none is when none is; ``analyzer`` already holds every Bind in scope, the
    body's own included (:func:`_rewrite` binds them as it walks)."""
    from tvm import tirx

    body = loop.body.seq if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
    if any(isinstance(s, (tirx.For, tirx.While, tirx.IfThenElse)) for s in body):
        return [], "not an innermost loop"
    fmas, found = 0, {}
    for pos, stmt in enumerate(body):  # (the body's Binds are already in ``analyzer``: the walk bound them)
        if not isinstance(stmt, tirx.BufferStore):
            continue
        fmas += "x" in _dtype(stmt.value)  # a vector accumulator updated: one vector FMA
        for load in _loads(stmt.value, []):
            start, width = _first_index(load)
            if load.source.name not in weights or start is None:
                continue
            step = _coefficient(analyzer, start, loop.loop_var)
            if not step or step <= 0:
                continue
            entry = found.setdefault(load.source.name, [pos, load.source, start, step, 0, width])
            delta = _const(analyzer.simplify(start - entry[2]))
            if step == entry[3] and delta is not None:
                entry[4], entry[5] = min(entry[4], delta), max(entry[5], delta + width)
    if not found:
        return [], "no weight read step by step"
    out, why = [], ""
    for pos, buffer, start, step, lo, hi in found.values():
        bits = buffer.dtype.bits * buffer.dtype.lanes
        lines = -(-((hi - lo) * bits // 8) // LINE_BYTES)  # cache lines a step reads, rounded up
        if hi - lo < step:
            why = "the weight is read with gaps (not pre-packed): left to the hardware prefetcher"
        elif fmas < BOUND["fmas_per_line"] * lines:
            why = f"{fmas} FMAs for {lines} lines a step (fmas_per_line)"
        elif (panel := _panel_offset(analyzer, start + lo, loops)) is None:
            why = "no parallel loop moving to another panel within the tasks_per_panel bound"
        elif abs(panel[1]) * bits // 8 > BOUND["panel_bytes"]:
            why = f"a panel of {abs(panel[1]) * bits // 8} bytes (panel_bytes)"
        else:
            out.append(Stream(buffer, pos, start + lo, hi - lo, panel[1]))
    return out, why if not out else ""


def _prefetches(stream: Stream) -> list:
    """One prefetch per cache line of the step's elements, ``ahead`` elements on."""
    from tvm import tirx

    per_line = max(1, LINE_BYTES * 8 // (stream.buffer.dtype.bits * stream.buffer.dtype.lanes))
    out = []
    for line in range(-(-stream.width // per_line)):
        where = tirx.BufferLoad(stream.buffer, [stream.start + stream.ahead + line * per_line])
        call = tirx.call_llvm_intrin("void", "llvm.prefetch.p0", tirx.address_of(where), READ, KEEP_ALL_LEVELS, DATA)
        out.append(tirx.Evaluate(call))
    return out


@dataclass
class _Walk:
    weights: set
    analyzer: object
    loops: list
    streams: list


def _rewrite(stmt, walk: _Walk):
    """``stmt`` with the prefetches of :func:`plan` in each innermost loop (the same object where none is)."""
    from tvm import tirx

    if isinstance(stmt, tirx.Bind):
        _bind(walk.analyzer, stmt)
        return stmt
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_rewrite(s, walk) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(parts, stmt.seq)) else tirx.SeqStmt(parts)
    if isinstance(stmt, tirx.AttrStmt):
        body = _rewrite(stmt.body, walk)
        return stmt if body.same_as(stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    if isinstance(stmt, tirx.IfThenElse):
        then = _rewrite(stmt.then_case, walk)
        other = _rewrite(stmt.else_case, walk) if stmt.else_case is not None else None
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if not isinstance(stmt, tirx.For):
        return stmt
    walk.loops.append(stmt)
    try:
        body = _rewrite(stmt.body, walk)
        if body.same_as(stmt.body) and stmt.kind == tirx.ForKind.SERIAL:
            streams, why = plan(stmt, walk.loops, walk.analyzer, walk.weights)
            if why:
                log.debug("no weight prefetch in loop %s: %s", stmt.loop_var, why)
            if streams:
                seq = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
                for stream in sorted(streams, key=lambda s: -s.position):
                    seq[stream.position:stream.position] = _prefetches(stream)
                walk.streams += streams
                body = tirx.SeqStmt(seq)
    finally:
        walk.loops.pop()
    if body.same_as(stmt.body):
        return stmt
    return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations,
                    getattr(stmt, "step", None))


def add_prefetches(func, weights: set[str]) -> tuple[object, list[Stream]]:
    """``func`` (lowered) with the weight prefetches, and the streams that got them."""
    from tvm import sym

    if not weights:
        return func, []
    walk = _Walk(weights, sym.Analyzer(), [], [])
    body = _rewrite(func.body, walk)
    return (func if body.same_as(func.body) else func.with_body(body)), walk.streams


def prefetch_pipeline():
    """TVM's stock TIR pipeline with :func:`add_prefetches` on every PrimFunc after it (the weights read off each
    function's parameters before lowering packs them)."""
    import tvm
    from tvm import tirx
    from tvm.s_tir import pipeline as stock

    base, host, device = stock.default_s_tir_pipeline()

    @tvm.transform.module_pass(opt_level=0, name="agoc.WeightPrefetch")
    def pipeline(mod, ctx):
        weights = {gv.name_hint: weight_names(f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
        mod = base(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and weights.get(gv.name_hint):
                try:
                    new, streams = add_prefetches(func, weights[gv.name_hint])
                except Exception as exc:  # noqa: BLE001 - an optimisation: the kernel is built without it
                    log.warning("weight prefetch left out of %s: %s", gv.name_hint, exc)
                    continue
                if streams:
                    mod[gv] = new
        return mod

    return pipeline, host, device


def register() -> str:
    """Register :data:`PIPELINE` with TVM (idempotent) and return its name."""
    from tvm.tirx import compilation_pipeline

    compilation_pipeline.register_tir_pipeline(PIPELINE, prefetch_pipeline)
    return PIPELINE
