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


def test_a_kernels_rate_is_its_work_per_run_over_its_time_and_a_share_of_the_peak():
    from toolchain.roofline import kernel_rates

    timed = [{"name": "conv", "calls_per_run": 2, "median_ms": 0.5}, {"name": "copy", "calls_per_run": 1,
                                                                      "median_ms": 0.1}]
    built = [{"name": "conv", "flops": 10_000_000, "arg_bytes": 1_000_000}, {"name": "copy", "flops": 0}]
    conv, copy = kernel_rates(timed, built, peak_gflops=100.0)
    assert conv["gflops"] == pytest.approx(40.0) and conv["peak_fraction"] == pytest.approx(0.4)  # 2 × 10 MFLOP
    assert conv["gbytes_s"] == pytest.approx(4.0)
    assert copy["gflops"] is None and copy["peak_fraction"] is None  # no arithmetic: no rate to compare
    assert kernel_rates(timed, built, peak_gflops=None)[0]["peak_fraction"] is None
