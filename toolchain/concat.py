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
