"""Row kernels (toolchain/tune/rows.py): which kernels are row kernels, and their schedule — every step inside the
row's parallel loop, reductions in vector partial sums — computes what the plain kernel does, on real layer norms
and softmaxes and on row lengths no vector divides."""

import numpy as np
import pytest

from tests.toolchain.kernels import run_kernel
from toolchain.targets import resolve_target
from toolchain.tune import rows
from toolchain.tune.race_check import parallel_races
from toolchain.tune.untuned import rows_schedule

HOST = resolve_target("host")


def _run(func, seed: int = 0) -> list[np.ndarray]:
    return run_kernel(func, HOST.tvm(), seed)


def _legalized(op: str, shape: tuple[int, ...]):
    """TOPI's ``op`` (layer_norm, softmax or fast_softmax over the last axis, as relax legalizes them) as a
    PrimFunc."""
    from tvm import te, topi

    x = te.placeholder(shape, name="x")
    if op == "layer_norm":
        g, b = te.placeholder((shape[-1],), name="g"), te.placeholder((shape[-1],), name="b")
        return te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[-1], epsilon=1e-5)])
    return te.create_prim_func([x, getattr(topi.nn, op)(x, axis=-1)])


@pytest.mark.parametrize("shape", [(1, 24, 64), (2, 3, 40), (5, 7)])
@pytest.mark.parametrize("op", ["layer_norm", "softmax", "fast_softmax"])
def test_layer_norms_and_softmaxes_are_row_kernels_and_compute_the_same(op, shape):
    func = _legalized(op, shape)
    kernel = rows.row_kernel(func)
    assert kernel is not None and kernel.rows == shape[:-1] and kernel.length == shape[-1]
    assert len(kernel.reductions) == 2  # the mean and the variance; the maximum and the sum of exponentials
    sch, detail = rows_schedule(func, HOST)
    assert sch is not None and detail.endswith(("×16", "×8", "×1")) and parallel_races(sch.mod) == []
    assert "T.parallel" in sch.mod.script()
    if shape[-1] % 8 == 0:
        assert "T.vectorized" in sch.mod.script()
    out, plain = _run(sch.mod["main"]), _run(func)
    np.testing.assert_allclose(out[-1], plain[-1], rtol=1e-5, atol=1e-5)


def test_kernels_over_other_domains_are_not_row_kernels():
    from tvm import te

    a, w = te.placeholder((8, 16), name="A"), te.placeholder((16, 4), name="W")
    k = te.reduce_axis((0, 16), name="k")
    matmul = te.create_prim_func([a, w, te.compute((8, 4), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k))])
    assert rows.row_kernel(matmul) is None  # its reduction runs beside an axis of another length
    relu = te.create_prim_func([a, te.compute((8, 16), lambda i, j: te.max(a[i, j], 0.0))])
    assert rows.row_kernel(relu) is None  # no reduction
    r = te.reduce_axis((0, 8), name="r")
    col = te.compute((16,), lambda j: te.sum(a[r, j], axis=r), name="col")
    scaled = te.create_prim_func([a, te.compute((8, 16), lambda i, j: a[i, j] / col[j], name="out")])
    assert rows.row_kernel(scaled) is None  # a reduction down the columns, not along the rows


def test_a_row_schedule_postprocessed_on_arm_is_parallel_and_vectorised():
    arm = resolve_target("linux-arm64")
    sch, detail = rows_schedule(_legalized("layer_norm", (1, 16, 32)), arm)
    assert sch is not None and detail.endswith("×4")


def test_a_reshape_before_and_a_transpose_after_the_rows_are_inlined_and_a_pass():
    """MobileViT's unfold → layer norm → fold: the reshape over another domain inlined into the core's loads, the
    transpose and reshape of the result one parallel pass after the rows; both compute the same."""
    from tvm import te, topi

    x = te.placeholder((1, 32, 4, 6), name="x")
    flat = topi.transpose(topi.reshape(x, (1, 32, 24)), (0, 2, 1))  # the reshape over another domain than the rows
    g, b = te.placeholder((32,), name="g"), te.placeholder((32,), name="b")
    norm = topi.nn.layer_norm(flat, g, b, axis=[-1], epsilon=1e-5)
    func = te.create_prim_func([x, g, b, topi.reshape(topi.transpose(norm, (0, 2, 1)), (1, 32, 4, 6))])
    kernel = rows.row_kernel(func)
    assert kernel is not None and len(kernel.lead) == 1 and len(kernel.rest) == 2 and kernel.rows == (1, 24)
    sch, _ = rows_schedule(func, HOST)
    assert sch is not None and parallel_races(sch.mod) == []
    out, plain = _run(sch.mod["main"]), _run(func)
    np.testing.assert_allclose(out[-1], plain[-1], rtol=1e-5, atol=1e-5)
    scaled = topi.transpose(topi.multiply(topi.reshape(x, (1, 32, 24)), 2.0), (0, 2, 1))  # arithmetic, not a copy
    assert rows.row_kernel(te.create_prim_func([x, g, b, topi.nn.layer_norm(scaled, g, b, axis=[-1])])) is None


def test_a_kernel_of_copies_is_a_parallel_pass_and_computes_the_same():
    """A reshape mini of an attention join (no reduction: no search reaches it): its blocks inlined into the last,
    one parallel, vectorised pass; what the tuner commits as its first record so the join can be composed."""
    from tvm import te, topi

    x = te.placeholder((1, 32, 2, 16), name="x")
    func = te.create_prim_func([x, topi.add(topi.transpose(topi.reshape(x, (1, 32, 32)), (0, 2, 1)), 1.0)])
    sch, detail = rows.pass_schedule(func, HOST.tvm())
    assert detail == "1 pass" and "T.parallel" in sch.mod.script() and "T.vectorized" in sch.mod.script()
    np.testing.assert_allclose(_run(sch.mod["main"])[-1], _run(func)[-1], rtol=1e-6)
    assert rows.pass_schedule(_legalized("softmax", (4, 16)), HOST.tvm())[0] is None  # a reduction: not a pass
    assert rows_schedule(func, HOST)[0] is None and rows_schedule(func, HOST, passes=True)[0] is not None


def test_a_row_taken_after_the_norm_is_a_pass_after_the_rows_even_over_the_rows_extents():
    """BERT's pooler: a layer norm over 32 rows of 32, then row 0 taken — a block whose extents (1, 32) happen to be
    the rows' is not a step of each row but a pass after them; the kernel computes the same."""
    from tvm import te, topi

    x = te.placeholder((1, 32, 32), name="x")
    g, b = te.placeholder((32,), name="g"), te.placeholder((32,), name="b")
    norm = topi.nn.layer_norm(x, g, b, axis=[-1], epsilon=1e-5)
    func = te.create_prim_func([x, g, b, te.compute((1, 32), lambda n, j: norm[n, 0, j], name="take")])
    kernel = rows.row_kernel(func)
    assert kernel is not None and kernel.rest == ("take",) and kernel.blocks[-1] != "take"
    sch, _ = rows_schedule(func, HOST)
    np.testing.assert_allclose(_run(sch.mod["main"])[-1], _run(func)[-1], rtol=1e-5, atol=1e-5)
