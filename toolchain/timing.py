"""Timing one kernel the way every measurement in agoc does: warm up by time, then TVM's
``time_evaluator``, and measure again when the repeats disagree.

Why warm up by time and not by a call count: on these 2-vCPU machines the runtime's second
worker thread runs at full speed only some tens of milliseconds after the first parallel call
(an idle vCPU is woken slowly), so the first repeats of a freshly loaded kernel ran at one-core
speed — 2x slow, and MetaSchedule averages them in. Measured on a tuned MobileNet-V2 pointwise
conv (0.030 ms): in one process the first 2 of 30 repeats ran at 0.062 ms; measured cold in fresh
runner processes (as MetaSchedule's LocalRunner may), all 10 measurements came out 1.35-1.9x slow,
and with this warm-up and the fastest of two measurements 1 of 10 (1.8x). Candidates used to be
measured cold, so the tuner learned from, and kept, schedules partly by luck.

:func:`evaluate_local` is a MetaSchedule ``f_run_evaluator`` for ``LocalRunner``; the device
path (``host/measure.py``) wraps :func:`measure` with its own hygiene (pinning, cool-down,
frequency logging). No TVM import at module level: the runner's worker processes unpickle it.

Why weights are timed cold (``Timing.cold``, the default for tuning): in a model a kernel's weights
were last touched one whole inference ago, so they come from memory; timed warm — the same call
over and over — they sit in cache, and the tuner ranks schedules by a cost the model never sees.
Measured on MobileNet-V2 (e2e-12, README): the late 960-channel expand conv's warm-best candidate
ran at 0.23 ms with its weights flushed, the third-best at 0.09; in the model the AGO build lost
0.34 vs 0.11 ms there. Cold timing flushes every argument but the first (TVM's
``cache_flush_cpu_non_first_arg``; the first is the input activation, which the previous kernel
just wrote) before each call and times single calls.

Why a measurement is checked for other programs (``MAX_WAIT``): a kernel's pool threads are pinned one per
core, so a program busy on one core holds the timed kernel's thread there: with one core kept busy a
0.19 ms conv timed 0.39 ms warm and 3.9 ms cold (its threads waited ~95 % of the wall time on a run
queue); on an idle machine they waited 0-2.5 %. A measurement whose threads waited longer is timed again
after a pause, and one still disturbed is reported (``Timing.report``) so the session can say its times
are too slow (docs/tuning.md, Timing candidates).
"""

from __future__ import annotations

import glob
import json
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

#: a kernel runs this long (and at least WARMUP_CALLS times) before it is timed
WARMUP_MS = 100.0
WARMUP_CALLS = 1
#: a measurement whose threads waited on a run queue (runnable, another program on their core) longer
#: than this share of its wall time was disturbed
MAX_WAIT = 0.05
#: a wait shorter than this is a thread's wake-up latency (a futex wake, a migration), not another program (which holds
#: a core for a scheduler slice: milliseconds)
MIN_WAIT_S = 0.25e-3
#: seconds to let another program's burst pass before a disturbed measurement is taken again
DISTURBED_PAUSE_S = 0.05
#: after this many disturbed candidates in a row the machine is taken as busy for good: no more pauses
BUSY_STREAK = 3


@dataclass(frozen=True)
class Timing:
    number: int = 3  # calls per repeat
    repeat: int = 3
    min_repeat_ms: int = 20  # each repeat runs at least this long (number grows)
    warmup_ms: float = WARMUP_MS
    warmup_calls: int = WARMUP_CALLS
    measurements: int = 2  # timed measurements at least; the fastest (lowest median) is kept
    max_spread: float = 0.15  # repeats spread (:func:`spread`) more than this: measure again
    remeasure: int = 2  # at most this many extra measurements
    cold: bool = False  # flush all arguments but the first before each timed call (see above)
    cold_calls: int = 30  # cold: single calls timed per measurement
    disturbed_retries: int = 3  # extra measurements (after a pause) while other programs disturb them
    report: str = ""  # a file each candidate timed only while disturbed is reported to (a JSON line)


def spread(costs: list[float]) -> float:
    """How much repeats disagree, relative to their median: the full range of a few repeats (each an
    average of calls), the range between the first and ninth decile of many (single cold calls, of
    which a few are always interrupted)."""
    med = statistics.median(costs)
    if med <= 0:
        return 0.0
    if len(costs) >= 10:
        deciles = statistics.quantiles(costs, n=10, method="inclusive")
        return (deciles[-1] - deciles[0]) / med
    return (max(costs) - min(costs)) / med


#: TVM's pre-call hook (in every runtime, phones' included) that flushes all arguments but the first
COLD_PREPROC = "cache_flush_cpu_non_first_arg"


def evaluator_of(rt_mod, device, timing: Timing):
    """``rt_mod``'s TVM ``time_evaluator`` as ``timing`` says: warm repeats of ``number`` calls (at
    least ``min_repeat_ms`` each), or ``cold_calls`` single calls each after a flush."""
    if timing.cold:
        return rt_mod.time_evaluator(rt_mod.entry_name, device, number=1, repeat=timing.cold_calls, min_repeat_ms=0,
                                     f_preproc=COLD_PREPROC)
    return rt_mod.time_evaluator(
        rt_mod.entry_name, device, number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms
    )


def warm_up(func, device, repeated_args, warmup_ms: float, calls: int) -> int:
    """Call ``func`` on every argument set until ``warmup_ms`` have passed (at least ``calls`` times
    each); the number of calls made."""
    made = 0
    deadline = time.perf_counter() + warmup_ms / 1e3
    while True:
        for args in repeated_args:
            func(*args)
        device.sync()
        made += 1
        if made >= calls and time.perf_counter() >= deadline:
            return made


class Measured(NamedTuple):
    costs: list[float]  # the kept measurement's repeats (s)
    measurements: int  # measurements taken
    waited: float  # the kept measurement's run-queue wait, a share of its wall time (0: not known)

    @property
    def disturbed(self) -> bool:
        return self.waited > MAX_WAIT


def run_queue_wait(exclude: frozenset[int] = frozenset()) -> float | None:
    """Seconds this process's threads (but those whose ids are in ``exclude``) have spent runnable but not running
    (another program held their core): the second field of ``/proc/self/task/*/schedstat``; None where the kernel
    does not keep it."""
    total, found = 0, False
    for path in glob.glob("/proc/self/task/*/schedstat"):
        if exclude and int(path.split("/")[-2]) in exclude:
            continue
        try:
            with open(path) as f:
                total += int(f.read().split()[1])
            found = True
        except (OSError, IndexError, ValueError):  # a thread gone meanwhile
            pass
    return total / 1e9 if found else None


#: disturbed candidates in a row in this process (:data:`BUSY_STREAK`)
_streak = [0]


def measure(rt_mod, device, repeated_args, timing: Timing, meter=None) -> Measured:
    """Warm up, time ``timing.measurements`` times, and again (up to ``timing.remeasure`` more) while
    the repeats spread more than ``timing.max_spread``; keep the fastest measurement (lowest median:
    slowness here is interference, never the kernel). ``meter`` (:func:`run_queue_wait` where the
    kernel runs in this process) tells disturbed measurements, which are taken again after a pause (up
    to ``timing.disturbed_retries`` more, none once the machine has stayed busy) and kept only when no
    undisturbed one was taken."""
    warm_up(rt_mod[rt_mod.entry_name], device, repeated_args, timing.warmup_ms, timing.warmup_calls)
    evaluator = evaluator_of(rt_mod, device, timing)
    attempts: list[Measured] = []
    retries, counted = (timing.disturbed_retries if _streak[0] < BUSY_STREAK else 0), 0
    while True:
        waited_before, started = (meter() if meter else None), time.perf_counter()
        costs = []
        for args in repeated_args:
            device.sync()
            costs += [float(c) for c in evaluator(*args).results]
        waited_after = meter() if meter else None
        waited = 0.0
        if waited_before is not None and waited_after is not None:
            waited = (waited_after - waited_before) / max(time.perf_counter() - started, 1e-9)
        attempts.append(Measured(costs, 0, waited))
        if attempts[-1].disturbed and retries > 0:  # not counted: taken again once the burst has passed
            retries -= 1
            time.sleep(DISTURBED_PAUSE_S)
            continue
        counted += 1
        if counted >= timing.measurements and spread(costs) <= timing.max_spread:
            break
        if counted >= max(1, timing.measurements) + timing.remeasure:
            break
    clean = [a for a in attempts if not a.disturbed]
    kept = min(clean or attempts, key=lambda a: statistics.median(a.costs))
    _streak[0] = _streak[0] + 1 if kept.disturbed else 0
    return kept._replace(measurements=len(attempts))


def evaluate_local(rt_mod, device, evaluator_config, repeated_args, timing: Timing | None = None) -> list[float]:
    """MetaSchedule ``f_run_evaluator`` (LocalRunner's signature): :func:`measure` with ``timing``
    (default: ``evaluator_config``'s number / repeat / min_repeat_ms / cache flush)."""
    if timing is None:
        timing = Timing(int(evaluator_config.number), int(evaluator_config.repeat), int(evaluator_config.min_repeat_ms),
                        cold=bool(getattr(evaluator_config, "enable_cpu_cache_flush", False)))
    measured = measure(rt_mod, device, repeated_args, timing, meter=run_queue_wait)
    if measured.disturbed and timing.report:
        report_disturbed(timing.report, measured)
    return measured.costs


def report_disturbed(path: str, measured: Measured) -> None:
    """One JSON line in ``path`` for a candidate timed only while other programs held its cores."""
    with open(path, "a") as f:
        f.write(json.dumps({"waited": round(measured.waited, 3), "median_s": statistics.median(measured.costs)}) + "\n")


def disturbed_in(path: str) -> list[dict]:
    """The candidates :func:`report_disturbed` wrote to ``path``."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def fill_for_measure(f_random_fill, device, args_info, alloc_repeat: int) -> list:
    """MetaSchedule's argument allocation (``alloc_argument_common``), but integer tensors are zeros:
    an integer argument is an index (a gather's: BERT's token ids, its [CLS] position), and the
    random fill writes values far outside any table, so every candidate of such a kernel read out of
    bounds and failed — BERT-tiny's embedding kernels were built untuned. Zero is in range of any
    table; floating-point arguments are filled at random as before."""
    import numpy as np
    import tvm

    repeated = []
    for _ in range(alloc_repeat):
        args = []
        for info in args_info:
            kind, dtype, shape = info[0], str(info[1]), [int(d) for d in info[2]]
            if kind != "TENSOR":
                raise NotImplementedError(info)
            arg = tvm.runtime.empty(shape=shape, dtype=dtype, device=device)
            if dtype.startswith(("int", "uint")):
                arg.copyfrom(np.zeros(shape, dtype))
            else:
                f_random_fill(arg)
            args.append(arg)
        repeated.append(args)
    return repeated


def alloc_local(device, args_info, alloc_repeat: int) -> list:
    """``LocalRunner``'s ``f_alloc_argument``: :func:`fill_for_measure` in the worker process."""
    from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

    fill = get_global_func_with_default_on_worker("tvm.contrib.random.random_fill_for_measure", None)
    return fill_for_measure(fill, device, args_info, alloc_repeat)


def alloc_rpc(session, device, args_info, alloc_repeat: int) -> list:
    """``RPCRunner``'s ``f_alloc_argument``: :func:`fill_for_measure` on the device."""
    from tvm.s_tir.meta_schedule.utils import get_global_func_on_rpc_session

    fill = get_global_func_on_rpc_session(session, "tvm.contrib.random.random_fill_for_measure",
                                          "the device's runtime has no random fill")
    return fill_for_measure(fill, device, args_info, alloc_repeat)


def local_runner(timing: Timing | None = None, timeout_sec: int = 60):
    """MetaSchedule's ``LocalRunner`` (this machine) timing every candidate with :func:`measure`."""
    import functools

    from tvm.s_tir import meta_schedule as ms

    timing = timing or Timing()
    return ms.runner.LocalRunner(
        evaluator_config=ms.runner.EvaluatorConfig(
            number=timing.number, repeat=timing.repeat, min_repeat_ms=timing.min_repeat_ms,
            enable_cpu_cache_flush=timing.cold,
        ),
        timeout_sec=timeout_sec,
        f_alloc_argument=alloc_local,
        f_run_evaluator=functools.partial(evaluate_local, timing=timing),
    )
