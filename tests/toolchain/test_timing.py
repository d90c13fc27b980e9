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

    def time_evaluator(self, name, device, number, repeat, min_repeat_ms):
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
