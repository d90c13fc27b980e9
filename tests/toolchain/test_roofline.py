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
    assert c == roofline.Cost(work=4 * 16 * 8, bytes=(4 * 8 + 8 * 16 + 4 * 16) * 4, reduce=4 * 16 * 8)


def test_the_roofs_measure_is_multiply_adds_not_the_epilogue():
    """A conv of few input channels with a bias and a relu: its elementwise blocks are work, not multiply-adds."""
    from tvm import te, topi

    x, w = te.placeholder((1, 3, 16, 16), name="x"), te.placeholder((8, 3, 3, 3), name="w")
    y = topi.nn.relu(topi.nn.conv2d_nchw(x, w, 1, 1, 1) + 1.0)
    c = roofline.cost(te.create_prim_func([x, w, y]))
    macs = 8 * 16 * 16 * 3 * 3 * 3
    assert c.reduce == macs and c.work > macs  # padding, add and relu counted as work
    assert roofline.roof_share(c, 1.0, macs / 2) == pytest.approx(2.0)
    assert roofline.roof_share(c, None, 1.0) is None and roofline.roof_share(c, 1.0, None) is None
    assert roofline.gflops(1e6) == pytest.approx(2.0)  # a multiply-add is two flops


@pytest.mark.parametrize("target", ["host", "linux-arm64"])
def test_the_roof_probe_is_a_matmul_with_a_register_block_on_every_target(target):
    from toolchain.targets import resolve_target
    from toolchain.tune.untuned import block_schedule

    probe = roofline.roof_probe()
    m, k, n = roofline.ROOF_PROBE
    assert roofline.cost(probe).reduce == m * k * n
    sch, shape = block_schedule(probe, resolve_target(target))
    assert sch is not None and shape.count("×") == 2


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
