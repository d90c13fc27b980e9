"""APOLLO op typing (Definitions 1-4) from per-dimension extents of legalized PrimFuncs."""

from __future__ import annotations

import pytest

from toolchain.cuda import optype


def _typed(build):
    """Legalize a one-op Relax function built by ``build(bb, x, y)`` and type its PrimFunc."""
    import tvm
    from tvm import relax

    from toolchain.cuda.compile import legalize

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8, 16], "float32"))
    y = relax.Var("y", relax.TensorType([16], "float32"))
    w = relax.Var("w", relax.TensorType([16, 32], "float32"))
    with bb.function("main", [x, y, w]):
        with bb.dataflow():
            out = bb.emit_output(build(relax.op, x, y, w))
        bb.emit_func_output(out)
    mod = legalize(bb.get())
    prims = [(gv.name_hint, f) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 1
    return optype.type_func(*prims[0])


@pytest.mark.parametrize(
    "build, label",
    [
        (lambda op, x, y, w: op.exp(x), "element-wise"),
        (lambda op, x, y, w: op.add(x, x), "element-wise"),
        (lambda op, x, y, w: op.add(x, y), "broadcast"),  # y injective along dims 0, 1
        (lambda op, x, y, w: op.sum(x, axis=[2]), "reduction"),
        (lambda op, x, y, w: op.mean(x, axis=[-1], keepdims=True), "reduction"),  # sum + divide, opened
        (lambda op, x, y, w: op.nn.softmax(x, axis=-1), "reduction"),  # max, exp, sum, divide
        (lambda op, x, y, w: op.matmul(x, w), "matmul"),  # injective + surjective: a contraction
        (lambda op, x, y, w: op.permute_dims(x, [0, 2, 1]), "transpose"),
        (lambda op, x, y, w: op.reshape(x, (32, 16)), "reshape"),
    ],
)
def test_op_types(build, label):
    assert _typed(build).label == label


def test_row_form_of_reductions():
    inner = _typed(lambda op, x, y, w: op.sum(x, axis=[2]))
    assert inner.row_form and inner.rows == (4, 8) and inner.reduce_extent == 16
    outer = _typed(lambda op, x, y, w: op.sum(x, axis=[0]))  # x-reduce: the reduced dim is outermost
    assert outer.kind == "reduction" and not outer.row_form
    soft = _typed(lambda op, x, y, w: op.nn.softmax(x, axis=-1))
    assert soft.rows == (4, 8) and soft.reduce_extent == 16 and "opened" in soft.reason


def test_broadcast_dims_are_recorded():
    t = _typed(lambda op, x, y, w: op.add(x, y))
    (rel,) = [r for r in t.relations if r.kind == "injective"]
    assert rel.broadcast_dims == (0, 1)
