"""Blocks kept out of MetaSchedule's AutoInline where inlining would copy their expression without bound: a chain
of elementwise blocks each reading its producer several times (fast-math polynomials) grows exponentially inlined."""

from __future__ import annotations

#: expression nodes a block's value may reach with its producers inlined before it is kept as a buffer of its own
#: (fast-math GELU inlined is ~200; SiLU(GELU) → tanh → exp inlined reaches ~1.5 million)
INLINE_LIMIT = 1000

ANNOTATION = "meta_schedule.inline_rule"


def heavy_blocks(func, limit: int | None = None) -> list[str]:
    """Names of ``func``'s spatial blocks whose value, their inlinable producers inlined, exceeds ``limit`` nodes
    (default :data:`INLINE_LIMIT`): each counts as one load in its consumers from then on."""
    from tvm import s_tir

    limit = INLINE_LIMIT if limit is None else limit
    sch = s_tir.Schedule(func)
    blocks = _blocks(sch)
    writer = {w.source.__chandle__(): b for b in blocks for w in b.writes}
    size: dict[str, int] = {}
    heavy: list[str] = []
    for block in blocks:
        n = _inlined_size(block.body, writer, size)
        reduces = any(int(iv.iter_type) == 2 for iv in block.iter_vars)
        if n > limit and not reduces:
            heavy.append(block.name_hint)
            n = 1
        size[block.name_hint] = 1 if reduces else n
    return heavy


def guarded(mod):
    """``mod`` (a one-kernel workload, ``main``) with :func:`heavy_blocks` annotated not to be inlined; the same
    module when none are."""
    from tvm import s_tir

    heavy = heavy_blocks(mod["main"])
    if not heavy:
        return mod
    sch = s_tir.Schedule(mod)
    for name in heavy:
        sch.annotate(sch.get_sblock(name), ANNOTATION, "disable")
    return sch.mod


def _blocks(sch) -> list:
    found: list = []

    def walk(parent):
        for rv in sch.get_child_blocks(parent):
            found.append(sch.get(rv))
            walk(rv)

    walk(sch.get_sblock("root"))
    return found


def _inlined_size(stmt, writer: dict, size: dict) -> int:
    """Nodes of a block body's expressions, a load of an earlier block's buffer counting that block's size."""
    n, stack = 0, [stmt]
    while stack:
        e = stack.pop()
        if type(e).__name__ in ("TensorLoad", "BufferLoad"):
            source = getattr(e, "buffer", None) or getattr(e, "tensor", None) or getattr(e, "source", None)
            producer = writer.get(source.__chandle__()) if source is not None else None
            n += size.get(producer.name_hint, 1) if producer is not None else 1
            continue
        n += 1
        for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(e, attr, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        stack.extend(getattr(e, "args", None) or [])
    return n
