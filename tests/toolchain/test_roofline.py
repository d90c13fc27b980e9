"""The roofline floor: a kernel's work and bytes, counted from its PrimFunc, at the session's best rates."""

import pytest

from toolchain import roofline


def _matmul():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def matmul(a: T.Buffer((4, 8), "float32"), b: T.Buffer((8, 16), "float32"), c: T.Buffer((4, 16), "float32")):
        for i, j, k in T.grid(4, 16, 8):
            with T.sblock("c"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    c[vi, vj] = T.float32(0)
                c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]

    return matmul


def test_cost_counts_iteration_points_and_argument_bytes():
    c = roofline.cost(_matmul())
    assert c == roofline.Cost(work=4 * 16 * 8, bytes=(4 * 8 + 8 * 16 + 4 * 16) * 4)


def test_floor_is_the_slower_of_work_and_traffic_at_the_best_rates():
    costs = {"compute": roofline.Cost(1000, 10), "memory": roofline.Cost(10, 1000), "slow": roofline.Cost(100, 100)}
    peaks = roofline.peaks(costs, {"compute": 1.0, "memory": 2.0, "slow": 4.0, "unknown": 1.0})
    assert peaks == roofline.Peaks(work_per_ms=1000.0, bytes_per_ms=500.0)
    assert roofline.floor_ms(costs["slow"], peaks) == pytest.approx(0.2)  # traffic-bound: 100 / 500
    assert roofline.floor_ms(costs["compute"], peaks) == pytest.approx(1.0)  # it sets the work peak: no gap
    assert roofline.peaks(costs, {"slow": None}) is None  # nothing measured: no floor yet
