"""Measuring candidates on devices for MetaSchedule: the RPC runner, its hygiene, retries, the log.

:func:`make_rpc_runner` gives MetaSchedule's own ``RPCRunner`` (its worker pool, one connection
per registered device, sessions requested from the TVM RPC tracker) with three functions of ours:

* upload: the candidate is a shared object cross-compiled for the device (:func:`export_so`),
  uploaded into the session's directory and loaded there;
* evaluate (:func:`evaluate`): measurement hygiene — the runtime's thread pool pinned to the big
  cores (``runtime.config_threadpool``), an optional cool-down before each candidate, the device's
  cpu frequencies and temperatures read before and after (``agoc.sysinfo`` of our runner), around
  the timing every agoc measurement does (:func:`toolchain.timing.measure`: warm-up by time, TVM's
  ``time_evaluator`` with a minimum repeat time, at least two measurements and more while the
  repeats spread more than ``max_spread``, the fastest kept);
* cleanup: remove the uploaded file (the runner also drops the whole session directory).

:class:`RetryingRunner` wraps it: a candidate whose measurement failed because the device went
away (connection lost, session refused) is measured again — on whichever device the tracker gives —
up to ``retries`` times; then it is recorded as failed, like any candidate that crashes, and the
search goes on. Every measurement and every failure is one JSON line in ``log`` (the tuning
database's ``measurements.jsonl``): device, latencies, spread, frequencies, temperatures.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from toolchain.timing import Timing, alloc_rpc, measure, spread

#: errors after which a candidate is worth measuring again elsewhere (the device, not the kernel, failed)
RETRYABLE = ("connection", "socket", "closed", "broken pipe", "refused", "eof", "reset by peer", "cannot find server",
             "session", "tracker")


@dataclass(frozen=True)
class Hygiene:
    timing: Timing = Timing()  # warm-up, repeats, re-measurement (shared with local tuning)
    cooldown_s: float = 0.0  # pause before each candidate (a phone's big cores cool down)
    pin: str = "big"  # runtime thread pool: big | little | none
    threads: int = 0  # 0: the runtime's default
    session_timeout_s: int = 120  # a session (upload, load, measure) is killed on the device after this

    def to_json(self) -> dict:
        return asdict(self)


def log_line(log: str | None, record: dict) -> None:
    """Append one JSON line (O_APPEND: the runner's worker processes write concurrently)."""
    if not log:
        return
    data = (json.dumps({"time": round(time.time(), 3), **record}) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_log(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def export_so(mod, compiler: str | None = None) -> str:
    """``LocalBuilder`` ``f_export``: a shared object the device's runner can load (cross-compiled
    with ``compiler`` for ARM64 targets; the stock export makes a .tar only TVM's Python server opens)."""
    from tvm.support import cc

    from toolchain import scratch

    path = os.path.join(scratch.mkdtemp("agoc-cand-"), "candidate.so")
    kwargs = {"fcompile": cc.cross_compiler(compiler)} if compiler else {}
    mod.export_library(path, **kwargs)
    return path


def _sysinfo(session) -> dict:
    try:
        return json.loads(session.get_function("agoc.sysinfo")())
    except Exception:  # not our runner (TVM's own server): no device state to read
        return {}


def upload(session, local_path: str, remote_path: str):
    session.upload(local_path, remote_path)
    return session.load_module(remote_path)


def cleanup(session, remote_path: str | None) -> None:
    if session is not None and remote_path:
        try:
            session.remove(remote_path)
        except Exception:  # the session may be gone; the runner removes its directory anyway
            pass


def evaluate(session, rt_mod, device, evaluator_config, repeated_args, hygiene: Hygiene,
             log: str | None = None, pairing: str | None = None) -> list[float]:
    """MetaSchedule ``f_run_evaluator`` with measurement hygiene; logs one line per candidate."""
    if hygiene.cooldown_s > 0:
        time.sleep(hygiene.cooldown_s)
    if hygiene.pin != "none":
        try:  # TVM's affinity modes: 1 = big cores, -1 = little cores
            session.get_function("runtime.config_threadpool")(1 if hygiene.pin == "big" else -1, hygiene.threads)
        except Exception:
            pass
    before = _sysinfo(session)
    costs, measurements, _ = measure(rt_mod, device, repeated_args, hygiene.timing)  # remote: no run-queue meter
    after = _sysinfo(session)
    log_line(log, {
        "status": "ok", "purpose": "pairing" if pairing else "candidate", **({"pairing": pairing} if pairing else {}),
        "device": after.get("device") or before.get("device", ""),
        "median_ms": statistics.median(costs) * 1e3, "spread": spread(costs), "measurements": measurements,
        "cpu_freq_khz": {"before": before.get("cpu_freq_khz", {}), "after": after.get("cpu_freq_khz", {})},
        "thermal_c": {"before": before.get("thermal_c", {}), "after": after.get("thermal_c", {})},
    })
    return costs


def time_in_one_session(tracker: tuple[str, int], key: str, hygiene: Hygiene, log: str | None,
                        paths: list[str], funcs: list, rounds: int) -> list[list[float]]:
    """``Measure.together`` over a farm: one session from the tracker (so one device), every kernel
    uploaded and loaded once, then ``rounds`` rounds of each timed in turn (order reversed every
    other round) with the same hygiene as a candidate; per round, each kernel's median ms. The log
    lines say ``"purpose": "pairing"`` (a join beside its minis, a task's best records timed again) and, in
    ``"pairing"``, which call they belong to.

    The session runs in a child process, as MetaSchedule's runner runs its own: a blocking TVM call
    holds the interpreter lock, which would stall anything this process relays for the device (the
    test suite's adb server does); and a device that stops answering costs the session timeout, not
    the tuning run."""
    import multiprocessing

    from toolchain.tune.candidates import random_args

    arrays = [random_args(func) for func in funcs]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        job = pool.apply_async(_time_in_session, (tracker, key, hygiene, log, paths, arrays, rounds))
        try:
            return job.get(timeout=hygiene.session_timeout_s + 60)
        except multiprocessing.TimeoutError:
            raise RuntimeError(f"timing kernels on a '{key}' device took more than "
                               f"{hygiene.session_timeout_s + 60} s") from None


def _time_in_session(tracker, key, hygiene: Hygiene, log, paths, arrays, rounds) -> list[list[float]]:
    import uuid

    import tvm
    from tvm import rpc

    from toolchain.tune.adapter import round_order

    session = rpc.connect_tracker(*tracker).request(key, priority=1, session_timeout=hygiene.session_timeout_s)
    device = session.cpu()
    mods, args = [], []
    for i, (path, inputs) in enumerate(zip(paths, arrays)):
        mods.append(upload(session, path, f"pair-{i}{''.join(Path(path).suffixes)}"))
        args.append([tvm.runtime.tensor(a, device) for a in inputs])
    table, call = [], uuid.uuid4().hex[:8]
    for r in range(rounds):
        row = [0.0] * len(paths)
        for i in round_order(len(paths), r):
            costs = evaluate(session, mods[i], device, None, [args[i]], hygiene, log, pairing=call)
            row[i] = statistics.median(costs) * 1e3
        table.append(row)
    return table


def make_rpc_runner(tracker: tuple[str, int], key: str, workers: int, hygiene: Hygiene, log: Path | None = None,
                    retries: int = 1):
    """MetaSchedule's RPCRunner on the tracker's ``key`` devices, with our upload/evaluate/cleanup."""
    from tvm.s_tir import meta_schedule as ms

    inner = ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(
            tracker_host=tracker[0], tracker_port=tracker[1], tracker_key=key, session_priority=1,
            session_timeout_sec=hygiene.session_timeout_s,
        ),
        evaluator_config=ms.runner.EvaluatorConfig(number=hygiene.timing.number, repeat=hygiene.timing.repeat,
                                                   min_repeat_ms=hygiene.timing.min_repeat_ms),
        f_upload_module=upload,
        f_alloc_argument=alloc_rpc,
        f_run_evaluator=functools.partial(evaluate, hygiene=hygiene, log=str(log) if log else None),
        f_cleanup=cleanup,
        max_workers=max(1, workers),
    )
    return RetryingRunner(inner, retries, str(log) if log else None)


def _last_line(message: str) -> str:
    from toolchain.build import error_line

    return error_line(RuntimeError(message)) if message.strip() else ""


def _retryable(message: str) -> bool:
    """Judged on the exception line only (a traceback mentions sessions everywhere)."""
    low = _last_line(message).lower()
    return "timeout" not in low and any(word in low for word in RETRYABLE)


def _make_classes():
    """The PyRunner / PyRunnerFuture subclasses (defined lazily: importing TVM is slow)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    @derived_object
    class RetryingFuture(PyRunnerFuture):
        def __init__(self, inner, runner_input, future, retries: int, log: str | None):
            super().__init__()
            self.inner, self.runner_input, self.future = inner, runner_input, future
            self.retries, self.log, self._result = retries, log, None

        def done(self) -> bool:
            return self._result is not None or self.future.done()

        def result(self) -> RunnerResult:
            if self._result is None:
                result = self.future.result()
                tries = 0
                while result.error_msg and _retryable(result.error_msg) and tries < self.retries:
                    tries += 1
                    log_line(self.log, {"status": "retry", "error": _last_line(result.error_msg)[:300]})
                    result = self.inner.run([self.runner_input])[0].result()
                if result.error_msg:
                    log_line(self.log, {"status": "failed", "retries": tries,
                                        "error": _last_line(result.error_msg)[:300]})
                self._result = RunnerResult(result.run_secs, result.error_msg)
            return self._result

    @derived_object
    class RetryingRunner(PyRunner):
        def __init__(self, inner, retries: int = 1, log: str | None = None):
            super().__init__()
            self.inner, self.retries, self.log = inner, retries, log

        def run(self, runner_inputs):
            futures = self.inner.run(runner_inputs)
            return [RetryingFuture(self.inner, i, f, self.retries, self.log) for i, f in zip(runner_inputs, futures)]

    return RetryingRunner


def RetryingRunner(inner, retries: int = 1, log: str | None = None):  # noqa: N802 (a class, built lazily)
    global _RETRYING
    if _RETRYING is None:
        _RETRYING = _make_classes()
    return _RETRYING(inner, retries, log)


_RETRYING = None
