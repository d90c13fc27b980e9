"""Timing hygiene shared by local tuning and device sessions (toolchain/timing.py)."""

import time
from types import SimpleNamespace

import pytest

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


@pytest.fixture
def quiet(monkeypatch):
    """The local evaluator's run-queue meter reading an idle machine (the suite's other worker may be busy)."""
    monkeypatch.setattr(timing, "run_queue_wait", lambda: 0.0)
    monkeypatch.setattr(timing, "_streak", [0])


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
    costs, n, _ = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0))
    assert costs == fast and n == 2 and mod.calls >= 1


def test_spread_repeats_are_measured_again_up_to_the_limit():
    noisy = [1.3, 1.9, 1.3]
    mod = FakeModule([noisy, noisy, [1.2, 1.21, 1.2], [9.0, 9.0, 9.0]])
    costs, n, _ = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0, max_spread=0.15, remeasure=2))
    assert n == 3 and costs == [1.2, 1.21, 1.2]  # the third is tight: no fourth measurement
    assert mod.measurements == [[9.0, 9.0, 9.0]]
    mod = FakeModule([noisy] * 5)
    _, n, _ = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0, measurements=1, remeasure=2))
    assert n == 3


def test_local_runner_evaluator_reads_the_config_when_no_timing_is_given(quiet):
    mod = FakeModule([[1.0, 1.0], [0.5, 0.5]])
    config = SimpleNamespace(number=1, repeat=2, min_repeat_ms=0)
    assert timing.evaluate_local(mod, DEVICE, config, [()]) == [0.5, 0.5]


def test_cold_timing_flushes_all_but_the_first_argument_before_each_single_call(quiet):
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
    costs, _, _ = timing.measure(lib.mod, dev, [args], timing.Timing(warmup_ms=0, cold=True, cold_calls=12))
    assert len(costs) == 12 and all(c > 0 for c in costs)
    np.testing.assert_array_equal(args[2].numpy(), 2.0)


def scripted_meter(deltas):
    """A run-queue meter whose readings grow by ``deltas`` (seconds waited) from one measurement to the next."""
    readings = [0.0]
    for d in deltas:
        readings += [readings[-1], readings[-1] + d]  # before and after each measurement
    readings = readings[1:]
    return lambda: readings.pop(0)


def test_a_measurement_other_programs_disturbed_is_taken_again_and_not_kept(monkeypatch):
    monkeypatch.setattr(timing, "_streak", [0])
    mod = FakeModule([[0.5] * 3, [1.0] * 3, [1.0] * 3])  # the first fast but disturbed (a fake's figures)
    kept = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0), meter=scripted_meter([1.0, 0.0, 0.0]))
    assert kept.costs == [1.0] * 3 and kept.measurements == 3 and not kept.disturbed
    assert timing._streak == [0]


def test_disturbed_retries_are_bounded_and_the_fastest_is_kept_flagged(monkeypatch):
    monkeypatch.setattr(timing, "_streak", [0])
    times = [[2.0] * 3, [1.5] * 3, [2.5] * 3, [3.0] * 3, [2.0] * 3, [9.0] * 3]
    mod = FakeModule(times)
    kept = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0, disturbed_retries=3),
                          meter=scripted_meter([1.0] * 6))
    assert kept.measurements == 5 and kept.costs == [1.5] * 3 and kept.disturbed  # 3 retries, then 2 counted
    assert mod.measurements == [[9.0] * 3] and timing._streak == [1]


def test_a_machine_that_stays_busy_is_not_waited_for(monkeypatch):
    monkeypatch.setattr(timing, "_streak", [timing.BUSY_STREAK])
    mod = FakeModule([[2.0] * 3, [2.0] * 3, [9.0] * 3])
    kept = timing.measure(mod, DEVICE, [()], timing.Timing(warmup_ms=0), meter=scripted_meter([1.0] * 3))
    assert kept.measurements == 2 and kept.disturbed and timing._streak == [timing.BUSY_STREAK + 1]
    monkeypatch.setattr(timing, "_streak", [timing.BUSY_STREAK])
    timing.measure(FakeModule([[1.0] * 3] * 2), DEVICE, [()], timing.Timing(warmup_ms=0),
                   meter=scripted_meter([0.0] * 2))
    assert timing._streak == [0]  # one clean candidate: waiting out bursts again


def test_the_local_evaluator_reports_a_candidate_timed_only_disturbed(monkeypatch, tmp_path):
    report = tmp_path / "disturbed.jsonl"
    monkeypatch.setattr(timing, "_streak", [timing.BUSY_STREAK])
    monkeypatch.setattr(timing, "run_queue_wait", scripted_meter([0.5] * 2))
    config = SimpleNamespace(number=1, repeat=3, min_repeat_ms=0)
    t = timing.Timing(warmup_ms=0, report=str(report))
    assert timing.evaluate_local(FakeModule([[1.0] * 3] * 2), DEVICE, config, [()], t) == [1.0] * 3
    monkeypatch.setattr(timing, "run_queue_wait", scripted_meter([0.0] * 2))
    timing.evaluate_local(FakeModule([[1.0] * 3] * 2), DEVICE, config, [()], t)
    (line,) = timing.disturbed_in(str(report))
    assert line["median_s"] == 1.0 and line["waited"] > timing.MAX_WAIT


def test_run_queue_wait_sees_other_programs_holding_the_cores():
    """With a busy process more than there are cores, a busy thread of this one waits on a run queue."""
    import os
    import subprocess
    import sys

    before = timing.run_queue_wait()
    assert before is not None  # Linux keeps schedstat
    hogs = [subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
            for _ in range((os.cpu_count() or 1) + 1)]
    try:
        time.sleep(0.3)
        started, waited0 = time.perf_counter(), timing.run_queue_wait()
        while time.perf_counter() - started < 1.0:
            pass
        share = (timing.run_queue_wait() - waited0) / (time.perf_counter() - started)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert share > timing.MAX_WAIT
