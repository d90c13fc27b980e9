"""Concatenations written in place: a kernel whose result is a concatenation gets one copy block per input, each
storing its input into its slice of the result, so that a conv in the kernel can store its outputs straight into
their slice (the register block's write-back) instead of into a buffer that a select-per-element copy reads again.
Why and the figures: docs/partitioning.md (Concatenations written in place)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: the block a legalized ``relax.concat`` computes (topi.concatenate's)
CONCAT_BLOCK = "T_concat"


def is_copy(block: str) -> bool:
    """Whether ``block`` is one of an in-place concatenation's blocks (:func:`in_place`: a copy, or a view's)."""
    return block.startswith(f"{CONCAT_BLOCK}_")


def is_view(block: str) -> bool:
    """Whether ``block`` is the opaque block of a copy into a view of its slice (:func:`in_place`)."""
    return is_copy(block) and block.endswith("_view")


@dataclass(frozen=True)
class Concat:
    """A concatenation: its inputs' shapes, stacked along ``axis``."""

    axis: int
    inputs: tuple[tuple[int, ...], ...]
    dtype: str
    index_dtype: str  # the shapes' integer type (Relax's: int64)

    @property
    def offsets(self) -> list[int]:
        """Where each input starts along the axis."""
        out, at = [], 0
        for shape in self.inputs:
            out.append(at)
            at += shape[self.axis]
        return out

    @property
    def shape(self) -> tuple[int, ...]:
        first = list(self.inputs[0])
        first[self.axis] = sum(s[self.axis] for s in self.inputs)
        return tuple(first)


def _static(param) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in param.ty.shape)  # in TVM 0.27 a PrimFunc param carries its buffer type
    except (AttributeError, TypeError):  # not a buffer, or a symbolic dimension
        return None


def concat_of(prim) -> Concat | None:
    """The concatenation ``prim`` computes (a legalized ``relax.concat``: one block, :data:`CONCAT_BLOCK`, its result
    its two or more inputs stacked along one axis, shapes static), else None."""
    import tvm
    from tvm import s_tir

    params = list(prim.params)
    shapes = [_static(p) for p in params]
    if len(params) < 3 or any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1 \
            or len({str(p.ty.dtype) for p in params}) != 1:
        return None
    *inputs, out = shapes
    axes = [d for d in range(len(out)) if any(s[d] != out[d] for s in inputs)]
    if len(axes) != 1 or sum(s[axes[0]] for s in inputs) != out[axes[0]]:
        return None
    try:
        sch = s_tir.Schedule(tvm.IRModule({"main": prim}))
        blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    except Exception:  # noqa: BLE001 - not a function of blocks
        return None
    if [b.name_hint for b in blocks] != [CONCAT_BLOCK] or sch.get_child_blocks(sch.get_sblock(CONCAT_BLOCK)):
        return None
    return Concat(axes[0], tuple(inputs), str(params[0].ty.dtype), str(params[0].ty.shape[0].ty))


def in_place(c: Concat, order: Sequence[int]):
    """``c`` as one copy block per input (``{CONCAT_BLOCK}_{i}``: ``out[…, j + offset_i, …] = x_i[…, j, …]``), in
    program order ``order`` (input indices): the inputs computed in the kernel first, so that a conv's slice follows
    its epilogue and the register block stores into it. The first copy is the result's only declared writer (what
    ``reverse_compute_inline`` needs); each other one an opaque block (``{CONCAT_BLOCK}_{i}_view``) that declares
    its reads alone and writes a view of its slice (``T.match_buffer``)."""
    from tvm.script import from_source

    def n(v: int) -> str:
        return f"T.int64({v})" if c.index_dtype == "int64" else str(v)

    def buffer(shape) -> str:
        return f'T.Buffer(({", ".join(n(d) for d in shape)},), "{c.dtype}")'

    rank = len(c.shape)
    strides = [math.prod(c.shape[d + 1:]) for d in range(rank)]  # the result's, row-major
    loops, its = [f"i{d}" for d in range(rank)], [f"v{d}" for d in range(rank)]
    params = [f"x{i}: {buffer(s)}" for i, s in enumerate(c.inputs)] + [f"out: {buffer(c.shape)}"]
    lines = ["@T.prim_func(private=True, s_tir=True)", f"def concat({', '.join(params)}):"]
    for k, i in enumerate(order):
        shape, at = c.inputs[i], c.offsets[i]
        whole = ", ".join(f"{n(0)}:{n(d)}" for d in shape)
        target, pad = "out", "    "
        if k:
            pad = "        "
            ranges = ", ".join(f"{n(at)}:{n(at + d)}" if a == c.axis else f"{n(0)}:{n(d)}" for a, d in enumerate(shape))
            lines += [f'    with T.sblock("{CONCAT_BLOCK}_{i}_view"):', f"        T.reads(x{i}[{whole}])",
                      "        T.writes()",
                      f"        view = T.match_buffer(out[{ranges}], ({', '.join(n(d) for d in shape)},), "
                      f"strides=({', '.join(n(d) for d in strides)},), elem_offset={n(at * strides[c.axis])})"]
            target = "view"
        offset = at if target == "out" else 0
        store = [f"{v} + {n(offset)}" if d == c.axis and offset else v for d, v in enumerate(its)]
        grid = ", ".join(n(d) for d in shape)
        lines += [pad + (f"for {', '.join(loops)} in T.grid({grid}):" if rank > 1 else f"for i0 in T.serial({grid}):"),
                  pad + f'    with T.sblock("{CONCAT_BLOCK}_{i}"):',
                  pad + f'        {", ".join(its)} = T.axis.remap("{"S" * rank}", [{", ".join(loops)}])',
                  pad + f"        {target}[{', '.join(store)}] = x{i}[{', '.join(its)}]"]
    return from_source("\n".join(lines) + "\n")


class InPlace:
    """The in-place form of each concatenation a group returns (:func:`in_place`), added to the module being built
    once per PrimFunc and order."""

    def __init__(self, mod, builder):
        import tvm

        self.mod, self.builder, self.call_tir = mod, builder, tvm.ir.Op.get("relax.call_tir")
        self.made: dict[tuple[str, tuple[int, ...]], object] = {}

    def rewrite(self, value, computed: Sequence[bool]):
        """``value`` (a group's binding) calling the in-place concatenation where it is a ``call_tir`` of one whose
        arguments the group computes one of (``computed``: per argument; that one's copy first, the only declared
        writer). Anything else as it is."""
        from tvm import relax

        if not (isinstance(value, relax.Call) and value.op.same_as(self.call_tir)):
            return value
        gv, args, *rest = value.args
        try:
            prim = self.mod[gv]
        except Exception:  # noqa: BLE001 - not a function of the module
            return value
        found = concat_of(prim) if type(prim).__name__ == "PrimFunc" else None
        if found is None or len(args.fields) != len(found.inputs) or list(computed).count(True) != 1:
            return value  # two computed: a schedule inlining into a view's copy makes it a writer of the result
        order = tuple(sorted(range(len(found.inputs)), key=lambda i: not computed[i]))
        key = (gv.name_hint, order)
        if key not in self.made:
            func = in_place(found, order)
            for k, v in (prim.attrs or {}).items():
                if k != "global_symbol":
                    func = func.with_attr(k, v)
            self.made[key] = self.builder.add_func(func, f"{gv.name_hint}_in_place")
        return relax.Call(value.op, [self.made[key], args, *rest], value.attrs, value.ty_args)


#: the most pieces a concatenation read along a kernel's reduction is split into (:func:`piece_of`): each piece's
#: loop is a copy of the reduction's inner loops, so code grows with them; more, and it is copied in a pass first
MAX_PIECES = 8


def piece_of(block) -> int | None:
    """The channels of each piece when a kernel's reduction reads ``block`` (a concatenation along its last axis: a
    select by the last index among loads of its inputs, each at that index less a constant) in equal pieces that
    each lie in one input — the greatest common divisor of its bounds — or None: not such a block, or more than
    :data:`MAX_PIECES` pieces. The reduction split so, each piece's select is constant and folds away: the kernel
    loads its inputs where they are, no copy of them made (docs/tuning-internals.md, Register blocks)."""
    names = [iv.var.name for iv in block.iter_vars]
    extent = int(block.iter_vars[-1].dom.extent)
    bounds = _bounds(block.body.value, names) if type(block.body).__name__ in ("BufferStore", "TensorStore") else None
    if not bounds:  # not a select among loads: one load is no concatenation
        return None
    piece = math.gcd(extent, *bounds)
    return piece if extent // piece <= MAX_PIECES else None


def _bounds(value, names: list[str]) -> set[int] | None:
    """The bounds of ``value`` along the last of ``names``: the constants its selects compare that index with and
    its loads subtract from it; None unless every leaf is a load at the other indices unchanged."""
    kind = type(value).__name__
    if kind in ("BufferLoad", "TensorLoad"):
        indices = list(value.indices)
        if _names(indices[:-1]) != names[:-1]:
            return None
        offset = _minus(indices[-1], names[-1])
        return None if offset is None else ({offset} if offset else set())
    if kind == "Select":
        condition, branches = value.condition, (value.true_value, value.false_value)
    elif kind == "Call" and getattr(value.op, "name", "").endswith("if_then_else"):
        condition, branches = value.args[0], value.args[1:]
    else:
        return None
    bound = _compared(condition, names[-1])
    parts = [_bounds(b, names) for b in branches]
    if bound is None or None in parts:
        return None
    return {bound, *parts[0], *parts[1]}


def _minus(index, name: str) -> int | None:
    """c where ``index`` is ``name`` − c (0 for ``name``), else None."""
    if getattr(index, "name", None) == name:
        return 0
    if type(index).__name__ == "Sub" and getattr(index.a, "name", None) == name and hasattr(index.b, "value"):
        return int(index.b.value)
    return None


def _compared(condition, name: str) -> int | None:
    """K where ``condition`` is index ``name`` ≥ K (in any of its forms: K ≤ i, i > K − 1, …), else None."""
    kind = type(condition).__name__
    a, b = getattr(condition, "a", None), getattr(condition, "b", None)
    if getattr(a, "name", None) == name and hasattr(b, "value"):
        shift = {"GE": 0, "LT": 0, "GT": 1, "LE": 1}.get(kind)
        return None if shift is None else int(b.value) + shift
    if getattr(b, "name", None) == name and hasattr(a, "value"):
        shift = {"LE": 0, "GT": 0, "LT": 1, "GE": 1}.get(kind)
        return None if shift is None else int(a.value) + shift
    return None


def read_in_pieces(producers, load, reduction: str) -> tuple[str, int] | None:
    """(block, :func:`piece_of`) of the producer among ``producers`` that writes what ``load`` (a kernel's data
    operand) reads when it is a concatenation that ``load`` reads along the ``reduction`` (its last index), through
    copies that move each value to the same place (a padding of none), else None."""
    if getattr(load.indices[-1], "name", None) != reduction:
        return None
    while True:
        source = (getattr(load, "buffer", None) or load.source).__chandle__()
        block = next((b for b in producers if any(w.source.__chandle__() == source for w in b.writes)), None)
        if block is None:
            return None
        value = block.body.value if type(block.body).__name__ in ("BufferStore", "TensorStore") else None
        if type(value).__name__ not in ("BufferLoad", "TensorLoad") or _names(value.indices) != _names(
                [iv.var for iv in block.iter_vars]):
            piece = piece_of(block)
            return (block.name_hint, piece) if piece else None
        load = value  # a copy in place: what it reads


def _names(indices) -> list:
    return [getattr(i, "name", None) for i in indices]
