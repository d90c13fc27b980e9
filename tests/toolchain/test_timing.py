"""Timing hygiene shared by local tuning and device sessions (toolchain/timing.py)."""

import time
from types import SimpleNamespace

from toolchain import timing


class FakeModule:
    """A runtime module whose evaluator replays scripted repeats; counts warm-up calls."""

    entry_name = "main"

    def __init__(self, measurements):
        self.measurements = list(measurements)
        self.calls = 0
        self.timed = 0

    def __getitem__(self, name):
        assert name == "main"

        def call(*args):
            self.calls += 1

        return call

    def time_evaluator(self, name, device, number, repeat, min_repeat_ms, **kwargs):
        self.evaluator = {"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms, **kwargs}

        def evaluate(*args):
            self.timed += 1
            return SimpleNamespace(results=self.measurements.pop(0))

        return evaluate


DEVICE = SimpleNamespace(sync=lambda: None)


def test_warm_up_runs_for_the_given_time_and_at_least_the_given_calls():
    mod = FakeModule([])
    started = time.perf_counter()
    made = timing.warm_up(mod["main"], DEVICE, [()], warmup_ms=30, calls=2)
    assert time.perf_counter() - started >= 0.03
    assert made == mod.calls >= 2
    assert timing.warm_up(mod["main"], DEVICE, [(), ()], warmup_ms=0, calls=3) == 3


def test_the_fastest_of_two_measurements_is_kept():
    slow, fast = [2.0, 2.1, 2.0], [1.0, 1.05, 1.0]  # a whole measurement at half speed (second core late)
    mod = FakeModule([slow, fast])
    costs, n = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0))
    assert costs == fast and n == 2 and mod.calls >= 1


def test_spread_repeats_are_measured_again_up_to_the_limit():
    noisy = [1.3, 1.9, 1.3]
    mod = FakeModule([noisy, noisy, [1.2, 1.21, 1.2], [9.0, 9.0, 9.0]])
    costs, n = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0, max_spread=0.15, remeasure=2))
    assert n == 3 and costs == [1.2, 1.21, 1.2]  # the third is tight: no fourth measurement
    assert mod.measurements == [[9.0, 9.0, 9.0]]
    mod = FakeModule([noisy] * 5)
    _, n = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0, measurements=1, remeasure=2))
    assert n == 3


def test_local_runner_evaluator_reads_the_config_when_no_timing_is_given():
    mod = FakeModule([[1.0, 1.0], [0.5, 0.5]])
    config = SimpleNamespace(number=1, repeat=2, min_repeat_ms=0)
    assert timing.evaluate_local(mod, DEVICE, config, [()]) == [0.5, 0.5]


def test_cold_timing_flushes_all_but_the_first_argument_before_each_single_call():
    mod = FakeModule([[1.0] * 30, [1.0] * 30])
    timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0, cold=True, cold_calls=30))
    assert mod.evaluator == {"number": 1, "repeat": 30, "min_repeat_ms": 0,
                             "f_preproc": "cache_flush_cpu_non_first_arg"}
    warm = FakeModule([[1.0] * 3] * 2)
    timing.measure(warm, DEVICE, [()], timing.Timing(warmup_ms=0))
    assert warm.evaluator == {"number": 3, "repeat": 3, "min_repeat_ms": 20}
    config = SimpleNamespace(number=1, repeat=2, min_repeat_ms=0, enable_cpu_cache_flush=True)
    cold = FakeModule([[1.0] * 30] * 2)
    timing.evaluate_local(cold, DEVICE, config, [()])
    assert cold.evaluator["f_preproc"] == "cache_flush_cpu_non_first_arg"


def test_spread_of_many_single_calls_ignores_the_odd_interrupted_one():
    calls = [1.0] * 28 + [1.02, 5.0]  # one call of thirty preempted
    assert timing.spread(calls) < 0.05
    assert timing.spread([1.0, 1.0, 1.5]) == 0.5  # a few averaged repeats: their whole range


def test_cold_timing_runs_on_the_tvm_runtime():
    """TVM's flush hook is found and called by the real evaluator (the tuning default)."""
    import numpy as np
    import tvm
    from tvm import te

    a, b = te.placeholder((4096,), name="a"), te.placeholder((4096,), name="b")
    c = te.compute((4096,), lambda i: a[i] + b[i], name="c")
    lib = tvm.compile(te.create_prim_func([a, b, c]), target="llvm")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.ones(4096, "float32"), dev) for _ in range(3)]
    costs, _ = timing.measure(lib.mod, dev, [args], timing.Timing(warmup_ms=0, cold=True, cold_calls=12))
    assert len(costs) == 12 and all(c > 0 for c in costs)
    np.testing.assert_array_equal(args[2].numpy(), 2.0)
