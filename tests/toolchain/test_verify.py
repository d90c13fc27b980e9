"""The comparison rule of `agoc verify`."""

import numpy as np

from toolchain.verify import compare


def test_identical_outputs_pass_with_zero_error():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    check = compare("y", x, x.copy(), atol=0, rtol=0)
    assert check.passed and check.max_abs == 0 and check.max_rel == 0


def test_error_is_scaled_by_the_largest_reference_magnitude():
    ref = np.array([100.0, 0.0, -1e-9], np.float32)
    near = ref + np.array([0.005, 0.005, 0.005], np.float32)
    check = compare("y", near, ref, atol=1e-5, rtol=1e-4)
    assert check.passed  # 0.005 <= 1e-5 + 1e-4 * 100
    assert abs(check.max_rel - 5e-5) < 1e-6


def test_border_errors_fail():
    ref = np.ones((1, 4, 8, 8), np.float32)
    bad = ref.copy()
    bad[..., 0, :] = 0.3  # a wrong first row, the known wrong-schedule symptom
    check = compare("y", bad, ref, atol=1e-5, rtol=1e-4)
    assert not check.passed
    assert abs(check.max_abs - 0.7) < 1e-6


def test_nan_shape_and_integer_mismatches_fail():
    ref = np.zeros(4, np.float32)
    assert compare("y", np.array([0, np.nan, 0, 0], np.float32), ref, 1, 1).nonfinite == 1
    assert not compare("y", np.array([0, np.nan, 0, 0], np.float32), ref, 1, 1).passed
    assert not compare("y", np.zeros(5, np.float32), ref, 1, 1).passed
    assert not compare("i", np.array([1, 2]), np.array([1, 3]), 10, 10).passed
    assert compare("i", np.array([1, 2]), np.array([1, 2]), 0, 0).passed
