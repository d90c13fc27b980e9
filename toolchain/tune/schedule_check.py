"""Static checks of a scheduled PrimFunc: how often each block runs against how often it is needed
(re-computation, dropped iterations), and weights read only in part. How: docs/tuning-internals.md."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: predicates are enumerated exactly up to this many points of the loops they mention
MAX_PREDICATE_POINTS = 1 << 22


@dataclass(frozen=True)
class BlockCount:
    name: str
    executed: int  # body executions in the scheduled loop nest
    domain: int  # product of the iter var extents
    needed: int  # instances read by consumers (whole domain for output blocks)
    exact: bool = True  # False when a predicate was too large / opaque to enumerate (executed is an upper bound)

    @property
    def ratio(self) -> float:
        """executed / needed: 1 = each needed instance once; > 1 re-computation; < 1 dropped."""
        if self.needed == 0:
            return math.inf if self.executed else 1.0
        return self.executed / self.needed

    @property
    def dropped(self) -> bool:
        return self.executed < self.needed

    @property
    def recomputes(self) -> bool:
        return self.executed > self.needed


class CheckError(ValueError):
    """The function has a structure the counter cannot analyse (dynamic extents, ...)."""


# --------------------------------------------------------------------------------------------
# Expression evaluation (numpy for predicates, intervals for regions)


def _int(x) -> int:
    return int(x.value) if hasattr(x, "value") else int(x)


def _handle(obj) -> int:
    return obj.__chandle__()


_BIN = None


def _classes():
    global _BIN
    if _BIN is None:
        from tvm import tirx

        _BIN = tirx
    return _BIN


class DataDependent(CheckError):
    """An expression reads a buffer (a gather's index, ``take``): no static bound."""


def _is_load(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.ir.TensorLoad)


def free_vars(expr, out: dict | None = None) -> dict:
    """Var handle -> Var of every variable in ``expr``; :class:`DataDependent` if it reads a buffer."""
    t = _classes()
    out = {} if out is None else out
    stack = [expr]
    while stack:
        e = stack.pop()
        if _is_load(e):
            raise DataDependent(f"the expression reads {e}")
        if isinstance(e, t.Var):
            out[_handle(e)] = e
        elif isinstance(e, (t.IntImm, t.FloatImm)):
            continue
        elif isinstance(e, t.Not):
            stack.append(e.a)
        elif isinstance(e, t.Cast):
            stack.append(e.value)
        elif isinstance(e, t.Select):
            stack.extend([e.condition, e.true_value, e.false_value])
        elif hasattr(e, "a") and hasattr(e, "b"):
            stack.extend([e.a, e.b])
        else:
            raise CheckError(f"unsupported expression {type(e).__name__}: {e}")
    return out


def _np_eval(expr, env: dict):
    """Evaluate an integer / boolean expression with numpy arrays bound to var handles."""
    import numpy as np

    t = _classes()
    ev = lambda e: _np_eval(e, env)  # noqa: E731
    if isinstance(expr, t.IntImm):
        return int(expr.value)
    if isinstance(expr, t.Var):
        return env[_handle(expr)]
    if isinstance(expr, t.Cast):
        return ev(expr.value)
    if isinstance(expr, t.Not):
        return np.logical_not(ev(expr.a))
    if isinstance(expr, t.Select):
        return np.where(ev(expr.condition), ev(expr.true_value), ev(expr.false_value))
    ops = {
        t.Add: lambda a, b: a + b,
        t.Sub: lambda a, b: a - b,
        t.Mul: lambda a, b: a * b,
        t.FloorDiv: lambda a, b: np.floor_divide(a, b),
        t.FloorMod: lambda a, b: np.mod(a, b),
        t.Div: lambda a, b: np.trunc(np.true_divide(a, b)).astype(np.int64),
        t.Mod: lambda a, b: np.fmod(a, b),
        t.Min: np.minimum,
        t.Max: np.maximum,
        t.LT: lambda a, b: a < b,
        t.LE: lambda a, b: a <= b,
        t.GT: lambda a, b: a > b,
        t.GE: lambda a, b: a >= b,
        t.EQ: lambda a, b: a == b,
        t.NE: lambda a, b: a != b,
        t.And: np.logical_and,
        t.Or: np.logical_or,
    }
    fn = ops.get(type(expr))
    if fn is None:
        raise CheckError(f"unsupported expression {type(expr).__name__}: {expr}")
    return fn(ev(expr.a), ev(expr.b))


def _interval(expr, box: dict) -> tuple[int, int]:
    """Inclusive [lo, hi] of an integer expression with var handle -> (lo, hi) bounds; (-inf, inf)
    where it reads a buffer (a gather's index: any element of that dimension may be read)."""
    t = _classes()
    if _is_load(expr):
        return -math.inf, math.inf
    if isinstance(expr, t.IntImm):
        v = int(expr.value)
        return v, v
    if isinstance(expr, t.Var):
        key = _handle(expr)
        if key not in box:
            raise CheckError(f"free variable {expr} in an index expression")
        return box[key]
    if isinstance(expr, t.Cast):
        return _interval(expr.value, box)
    if not (hasattr(expr, "a") and hasattr(expr, "b")):
        raise CheckError(f"unsupported index expression {type(expr).__name__}: {expr}")
    a, b = _interval(expr.a, box), _interval(expr.b, box)
    if math.inf in (a[1], b[1]) or -math.inf in (a[0], b[0]):
        return -math.inf, math.inf  # unbounded in, unbounded out (no inf * 0)
    rules = (
        ((t.Add,), lambda a, b: (a[0] + b[0], a[1] + b[1])),
        ((t.Sub,), lambda a, b: (a[0] - b[1], a[1] - b[0])),
        ((t.Mul,), _interval_mul),
        ((t.FloorDiv, t.Div), _interval_div),
        ((t.FloorMod, t.Mod), _interval_mod),
        ((t.Min,), lambda a, b: (min(a[0], b[0]), min(a[1], b[1]))),
        ((t.Max,), lambda a, b: (max(a[0], b[0]), max(a[1], b[1]))),
    )
    for classes, rule in rules:
        if isinstance(expr, classes):
            out = rule(a, b)
            if out is not None:
                return out
            break
    raise CheckError(f"unsupported index expression {type(expr).__name__}: {expr}")


def _interval_mul(a: tuple, b: tuple) -> tuple:
    p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(p), max(p)


def _interval_div(a: tuple, b: tuple) -> tuple | None:
    """Division by a positive constant only."""
    if b[0] == b[1] and b[0] > 0:
        return a[0] // b[0], a[1] // b[0]
    return None


def _interval_mod(a: tuple, b: tuple) -> tuple | None:
    """Modulo a positive constant only: exact when ``a`` stays within one period, else the whole period."""
    if not (b[0] == b[1] and b[0] > 0):
        return None
    m = b[0]
    if a[0] // m == a[1] // m:
        return a[0] % m, a[1] % m
    return 0, m - 1


# --------------------------------------------------------------------------------------------
# Walking the statement tree


@dataclass
class _Seen:
    block: object  # tvm.s_tir.SBlock
    executed: int
    exact: bool


def _is_true(expr) -> bool:
    t = _classes()
    return isinstance(expr, t.IntImm) and int(expr.value) == 1


def _count(loops: list, preds: list) -> tuple[int, bool]:
    """Executions of a body under ``loops`` [(var, min, extent)] guarded by all ``preds``."""
    import numpy as np

    total = 1
    for _, _, ext in loops:
        total *= ext
    preds = [p for p in preds if not _is_true(p)]
    if not preds or total == 0:
        return total, True
    used: dict = {}
    try:
        for p in preds:
            free_vars(p, used)
    except DataDependent:
        return total, False  # a predicate on data: an upper bound
    by_handle = {_handle(v): (v, lo, ext) for v, lo, ext in loops}
    if any(h not in by_handle for h in used):
        return total, False  # predicate on something other than loop vars: upper bound
    mentioned = [by_handle[h] for h in by_handle if h in used]
    points = 1
    for _, _, ext in mentioned:
        points *= ext
    if points > MAX_PREDICATE_POINTS:
        return total, False
    env = {}
    for axis, (v, lo, ext) in enumerate(mentioned):
        shape = [1] * len(mentioned)
        shape[axis] = ext
        env[_handle(v)] = (lo + np.arange(ext, dtype=np.int64)).reshape(shape)
    mask = np.ones([ext for _, _, ext in mentioned], dtype=bool)
    for p in preds:
        mask &= np.broadcast_to(np.asarray(_np_eval(p, env), dtype=bool), mask.shape)
    return int(mask.sum()) * (total // points), True


def _walk(stmt, loops: list, preds: list, out: list) -> None:
    from tvm import s_tir

    t = _classes()
    if stmt is None:
        return
    if isinstance(stmt, t.For):
        try:
            ext, lo = _int(stmt.extent), _int(stmt.min)
        except (TypeError, ValueError, AttributeError) as exc:
            raise CheckError(f"loop {stmt.loop_var} has a non-constant extent") from exc
        _walk(stmt.body, loops + [(stmt.loop_var, lo, ext)], preds, out)
    elif isinstance(stmt, t.SeqStmt):
        for s in stmt.seq:
            _walk(s, loops, preds, out)
    elif isinstance(stmt, s_tir.SBlockRealize):
        inner = preds + [stmt.predicate]
        executed, exact = _count(loops, inner)
        out.append(_Seen(stmt.block, executed, exact))
        _walk(stmt.block.body, loops, inner, out)
    elif isinstance(stmt, s_tir.SBlock):
        _walk(stmt.body, loops, preds, out)
    elif isinstance(stmt, t.IfThenElse):  # rare before lowering: count both branches (upper bound)
        _walk(stmt.then_case, loops, preds, out)
        _walk(stmt.else_case, loops, preds, out)
    else:
        body = getattr(stmt, "body", None)
        if body is not None:
            _walk(body, loops, preds, out)


def _primfunc(obj):
    """A PrimFunc from a PrimFunc, an IRModule (its ``main`` or only PrimFunc) or a Schedule."""
    import tvm
    from tvm import s_tir, tirx

    if isinstance(obj, s_tir.Schedule):
        obj = obj.mod
    if isinstance(obj, tirx.PrimFunc):
        return obj
    if isinstance(obj, tvm.IRModule):
        funcs = [(gv.name_hint, f) for gv, f in obj.functions_items() if isinstance(f, tirx.PrimFunc)]
        for name, f in funcs:
            if name == "main":
                return f
        if len(funcs) == 1:
            return funcs[0][1]
        raise CheckError(f"module has {len(funcs)} PrimFuncs and none named main")
    raise TypeError(f"expected a PrimFunc, IRModule or Schedule, got {type(obj).__name__}")


# --------------------------------------------------------------------------------------------
# Needed instances (consumer's view)


def _domain(block) -> list[tuple[int, int, bool]]:
    """[(min, extent, is_reduce)] of the block's iter vars."""
    return [(_int(iv.dom.min), _int(iv.dom.extent), int(iv.iter_type) == 2) for iv in block.iter_vars]


def _full_box(block) -> dict:
    """Iter var handle -> (lo, hi) over the block's whole domain."""
    return {_handle(iv.var): (lo, lo + ext - 1) for iv, (lo, ext, _) in zip(block.iter_vars, _domain(block))}


def _region_hull(region, box: dict) -> list[tuple[float, float]]:
    """Per buffer dim, the inclusive (lo, hi) a read / write region covers with iter vars in ``box``."""
    dims = []
    for rng in region.region:
        lo, hi = _interval(rng.min, box)
        _, ext_hi = _interval(rng.extent, box)
        dims.append((lo, hi + ext_hi - 1))
    return dims


def _union(a, b):
    return b if a is None else [(min(p, r), max(q, s)) for (p, q), (r, s) in zip(a, b)]


def _seen(func) -> list:
    """Every block of a PrimFunc (program order) with its execution count; the implicit root block left out."""
    from tvm import s_tir

    body = func.body
    if isinstance(body, s_tir.SBlockRealize):
        body = body.block.body
    seen: list = []
    _walk(body, [], [], seen)
    return seen


def _write_map(region, iters: dict) -> list | None:
    """Per buffer dim: (iter var handle or None, offset), when the write index is ``v + c`` / ``c``."""
    t = _classes()
    dims = []
    for rng in region.region:
        if not isinstance(rng.extent, t.IntImm) or int(rng.extent.value) != 1:
            return None
        m = rng.min
        if isinstance(m, t.IntImm):
            dims.append((None, int(m.value)))
        elif isinstance(m, t.Var) and _handle(m) in iters:
            dims.append((_handle(m), 0))
        elif (isinstance(m, (t.Add, t.Sub)) and isinstance(m.a, t.Var) and _handle(m.a) in iters
              and isinstance(m.b, t.IntImm)):
            off = int(m.b.value)
            dims.append((_handle(m.a), off if isinstance(m, t.Add) else -off))
        else:
            return None
    return dims


def _needed_boxes(blocks: list, outputs: set[int]) -> list[dict]:
    """Per block (program order): iter var handle -> (lo, hi) needed; hi < lo = nothing.

    ``outputs``: handles of the function's parameter buffers — a block writing one is needed whole,
    whoever else reads it."""
    readers: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        for r in b.reads:
            readers.setdefault(_handle(r.source), []).append(i)
    boxes: list[dict | None] = [None] * len(blocks)
    full = [_full_box(b) for b in blocks]

    def consumers_of(i: int, buf_handle: int) -> list[int]:
        return [j for j in readers.get(buf_handle, []) if j != i]

    # consumers before producers: reverse program order, then fix up the few blocks whose
    # consumer comes earlier (a reduction's init block read by its own update block)
    order = list(range(len(blocks)))[::-1]
    pending = set(order)
    for _ in range(len(blocks) + 1):
        progressed = False
        for i in order:
            if i not in pending:
                continue
            b = blocks[i]
            if any(_handle(w.source) in outputs for w in b.writes):
                boxes[i] = dict(full[i])
                pending.discard(i)
                progressed = True
                continue
            cons = [j for w in b.writes for j in consumers_of(i, _handle(w.source))]
            if any(j in pending for j in cons):
                continue
            boxes[i] = _box_from_consumers(i, b, full[i], cons, blocks, boxes)
            pending.discard(i)
            progressed = True
        if not pending or not progressed:
            break
    for i in pending:  # a cycle through buffers (in-place updates): be conservative
        boxes[i] = dict(full[i])
    return boxes


def _box_from_consumers(i, block, full_box, cons, blocks, boxes) -> dict:
    if not cons:
        return dict(full_box)
    iters = {_handle(iv.var): None for iv in block.iter_vars}
    reduce = {_handle(iv.var) for iv in block.iter_vars if int(iv.iter_type) == 2}
    box: dict = {}
    for w in block.writes:
        wmap = _write_map(w, iters)
        buf = _handle(w.source)
        hull = None  # per dim [lo, hi] over every consumer read of this buffer
        for j in cons:
            cbox = boxes[j]
            if any(lo > hi for lo, hi in cbox.values()):
                continue  # a consumer needing nothing reads nothing
            for r in blocks[j].reads:
                if _handle(r.source) != buf:
                    continue
                hull = _union(hull, _region_hull(r, cbox))
        if wmap is None:
            return dict(full_box)  # cannot map the buffer back to iterations: whole domain
        for d, (var, off) in enumerate(wmap):
            if var is None or var in reduce:
                continue
            lo, hi = (math.inf, -math.inf) if hull is None else (hull[d][0] - off, hull[d][1] - off)
            f_lo, f_hi = full_box[var]
            lo, hi = max(lo, f_lo), min(hi, f_hi)
            if var in box:  # several written buffers / dims: the union of what they need
                p_lo, p_hi = box[var]
                if p_lo <= p_hi:
                    lo, hi = (p_lo, p_hi) if lo > hi else (min(lo, p_lo), max(hi, p_hi))
            box[var] = (lo, hi)
    for var, rng in full_box.items():
        box.setdefault(var, rng)  # reduction iters and iters not in the write index: all of them
    return {k: (int(lo), int(hi)) if lo <= hi else (0, -1) for k, (lo, hi) in box.items()}


def _box_size(box: dict) -> int:
    n = 1
    for lo, hi in box.values():
        n *= max(0, hi - lo + 1)
    return n


# --------------------------------------------------------------------------------------------
# Public API


def execution_counts(func) -> list[BlockCount]:
    """One :class:`BlockCount` per block (program order) of a PrimFunc / IRModule / Schedule."""

    func = _primfunc(func)
    seen = _seen(func)
    blocks = [s.block for s in seen]
    boxes = _needed_boxes(blocks, {_handle(p) for p in func.params})
    counts = []
    for s, box in zip(seen, boxes):
        domain = 1
        for _, ext, _ in _domain(s.block):
            domain *= ext
        counts.append(BlockCount(s.block.name_hint, s.executed, domain, _box_size(box), s.exact))
    return counts


def dropped_blocks(func) -> list[BlockCount]:
    """Blocks that run fewer instances than their consumers read: the schedule is wrong."""
    return [c for c in execution_counts(func) if c.dropped]


def format_counts(counts: Iterable[BlockCount]) -> str:
    rows = [f"{'block':32} {'executed':>12} {'needed':>12} {'domain':>12} {'ratio':>7}"]
    for c in counts:
        flag = "  DROPPED" if c.dropped else ("" if c.exact else "  (upper bound)")
        rows.append(f"{c.name:32} {c.executed:12d} {c.needed:12d} {c.domain:12d} {c.ratio:7.3f}{flag}")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Rewritten weights read whole

#: the block annotation of MetaSchedule's ``RewriteLayout``: a copy of a weight parameter into the
#: order the schedule reads it (folded on the constant at build time, ``build.prepack_weights``)
LAYOUT_REWRITE = "meta_schedule.layout_rewrite_preproc"


@dataclass(frozen=True)
class PartialRead:
    """A weight whose rewritten copy the kernel reads only in part: per dimension of the copy, the
    hull ``(lo, hi)`` the rewrite writes and the hull the kernel's blocks read."""

    weight: str
    copy: str
    written: tuple[tuple[int, int], ...]
    read: tuple[tuple[int, int], ...]


def _blocks(func) -> list:
    return [s.block for s in _seen(func)]


def _read_hull(blocks, buffer_handle: int, skip=None):
    """Hull of every read of a buffer by ``blocks`` over their whole iteration domains (None: unread)."""
    hull = None
    for b in blocks:
        if b is skip:
            continue
        for r in b.reads:
            if _handle(r.source) == buffer_handle:
                hull = _union(hull, _region_hull(r, _full_box(b)))
    return hull


def _covers(read, written) -> bool:
    return read is not None and all(lo <= w_lo and hi >= w_hi for (lo, hi), (w_lo, w_hi) in zip(read, written))


def weights_read_whole(original) -> frozenset[int]:
    """Indices of the parameters the (unscheduled) kernel reads whole."""
    original = _primfunc(original)
    blocks = _blocks(original)
    return frozenset(i for i, p in enumerate(original.params)
                     if _covers(_read_hull(blocks, _handle(p)), [(0, _int(d) - 1) for d in p.ty.shape]))


@dataclass(frozen=True)
class OutOfBounds:
    """A block that writes outside its buffer: per dimension the hull it writes and the buffer's extent."""

    block: str
    buffer: str
    written: tuple[tuple[int, int], ...]
    shape: tuple[int, ...]


def out_of_bounds_writes(func) -> list[OutOfBounds]:
    """Blocks whose write region, over their iteration domains, leaves the buffer's shape. TVM inlined a slice's
    consumer into a padded conv's write-back (1008 channels) and let it write the 1000-channel output past its end
    (tests/toolchain/test_microkernel.py); nothing else checks a write's bounds before the numbers go wrong."""
    func = _primfunc(func)
    out = []
    for b in _blocks(func):
        for w in b.writes:
            shape = tuple(_int(d) for d in w.source.shape)
            hull = _region_hull(w, _full_box(b))
            if any(lo < 0 or hi > n - 1 for (lo, hi), n in zip(hull, shape)):
                out.append(OutOfBounds(b.name_hint, w.source.name, tuple((int(lo), int(hi)) for lo, hi in hull),
                                       shape))
    return out


def _whole_set(original) -> frozenset[int] | None:
    """``original`` as :func:`weights_read_whole` gives it: None (judge every weight), already the
    set, or the unscheduled kernel to compute it from."""
    return original if original is None or isinstance(original, frozenset) else weights_read_whole(original)


def partial_weight_reads(func, original=None) -> list[PartialRead]:
    """Weights that a layout rewrite copies whole but the scheduled kernel reads only in part.

    Every element of a weight the unscheduled kernel reads must still be read once its layout is
    rewritten; a kernel reading part of the copy computes with the wrong elements. TVM did this to
    MobileViT's QKV kernel (matmul, bias, split into three): the bias copy was laid out for the first
    split block's reads, ``bias[v]``, and the bias add inlined into all three blocks, so the second and
    third read ``bias[v]`` where they needed ``bias[v + 120]`` and ``bias[v + 240]`` — every block
    still runs the right number of times, so :func:`dropped_blocks` cannot see it. Hulls, not exact
    sets (a read of every other element passes). ``original``: the unscheduled kernel, or
    :func:`weights_read_whole` of it; a weight it does not read whole itself is not judged."""
    func = _primfunc(func)
    blocks = _blocks(func)
    index = {_handle(p): i for i, p in enumerate(func.params)}  # in TVM 0.27 a param is its buffer
    whole = _whole_set(original)
    out = []
    for b in blocks:
        if LAYOUT_REWRITE not in b.annotations or len(b.reads) != 1 or len(b.writes) != 1:
            continue
        weight, copy = b.reads[0].source, b.writes[0].source
        if whole is not None and index.get(_handle(weight)) not in whole:
            continue
        written = _region_hull(b.writes[0], _full_box(b))
        read = _read_hull(blocks, _handle(copy), skip=b)
        if not _covers(read, written):
            out.append(PartialRead(weight.name, copy.name, tuple(written),
                                   tuple(read) if read is not None else ()))
    return out
