"""Which of a task's candidates is kept: each checked numerically against the unscheduled kernel in a
fresh process (:mod:`toolchain.tune.check_candidate`), best first, until one passes."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import math
import os
import subprocess
import sys

from toolchain.targets import resolve_target
from toolchain.tune import phases
from toolchain.tune.adapter import latency, records_of, workload_module
from toolchain.tune.check_candidate import CHECK_ENV
from toolchain.tune.rolling import rolled
from toolchain.tune.settings import Task, TuneSettings
from toolchain.tune.traces import plain


def check_target(spec) -> dict:
    """The target a candidate is checked on: its own when it runs here; otherwise this machine's
    (the schedule — the trace — is what is checked: the known wrong candidates are wrong in TIR,
    on every target; the final model is verified on the device itself against onnxruntime)."""
    if spec.runs_on_host:
        return spec.tvm_target
    host = dict(resolve_target("host").tvm_target)
    host["num-cores"] = spec.num_cores
    return host


#: checks this process has run to the end, by request: a task's best candidate is checked again after every
#: search of the task otherwise (the check is deterministic: same kernel, schedule, target and seed, same answer)
_CHECKED: dict[str, dict] = {}


def check_candidate(func, record, spec, seed: int = 0, timeout: float = 300) -> dict:
    """Numeric check of one record in a fresh process (see :mod:`toolchain.tune.check_candidate`); a candidate
    checked before in this process is not checked again."""
    import tvm

    request = {
        "workload": tvm.ir.save_json(workload_module(func)),
        "trace": plain(record.trace.as_json()),
        "target": check_target(spec),
        "seed": seed,
    }
    key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    if key not in _CHECKED:
        result = _check_isolated(request, spec, timeout)
        if result.get("ok") or "max_abs" in result:  # an answer, not a crash or a timeout: kept
            _CHECKED[key] = result
        return result
    return _CHECKED[key]


def _check_isolated(request: dict, spec, timeout: float) -> dict:
    """The check in a child of this process's check server (:func:`check_server`), or, where the server does
    not answer, in a process of its own."""
    server = check_server(spec.num_cores)
    answer = server.ask(request, timeout)
    if answer is not None:
        return answer
    check_server.cache_clear()  # a server that died or hung is replaced next time
    server.close()
    env = {**os.environ, **CHECK_ENV, "TVM_NUM_THREADS": str(spec.num_cores)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "toolchain.tune.check_candidate"], input=json.dumps(request), capture_output=True,
            text=True, env=env, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"check timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"ok": False, "reason": f"checker crashed (exit {done.returncode}): {done.stderr.strip()[-200:]}"}
    return json.loads(lines[-1])


class CheckServer:
    """``python -m toolchain.tune.check_candidate --serve`` with the check's environment: each check in a child
    it forks (a fresh process's memory without a fresh process's 2 s of imports). Ends with its stdin."""

    #: seconds the server may take beyond a check's own timeout before it counts as hung
    MARGIN_S = 30.0

    def __init__(self, num_cores: int):
        env = {**os.environ, **CHECK_ENV, "TVM_NUM_THREADS": str(num_cores)}
        self.proc = subprocess.Popen([sys.executable, "-m", "toolchain.tune.check_candidate", "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)

    def ask(self, request: dict, timeout: float) -> dict | None:
        """The answer to ``request``; None when the server is gone or does not answer in time."""
        import select

        try:
            self.proc.stdin.write(json.dumps({**request, "timeout": timeout}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + self.MARGIN_S)
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line.startswith("{") else None

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


@functools.cache
def check_server(num_cores: int) -> CheckServer:
    """The check server of this process for kernels on ``num_cores`` threads, started on first use and closed
    when the process exits."""
    server = CheckServer(num_cores)
    atexit.register(server.close)
    return server


#: a task's best records by the search's single measurements, timed again together (alternated rounds) before the
#: best is verified: one measurement of SqueezeNet's 27 × 27 expand conv put a schedule twice as slow as its register
#: block ahead of it (0.48 against 0.61 ms), and the tuned model ran 0.88× the untuned one (bench/RESULTS.md)
RETIME_TOP = 3
#: ...those within this factor of the best's measurement (a gap wider than a noisy measurement's is not re-timed)
RETIME_SPREAD = 1.5


def retimed(func, records: list, spec, settings: TuneSettings, measure=None) -> tuple[list, dict[int, float]]:
    """``records`` (best first) with their first :data:`RETIME_TOP` within :data:`RETIME_SPREAD` of the best
    re-ranked by their medians timed together, and {index in the returned list: that median in ms}; as they were
    where fewer than two are that close or they cannot be timed."""
    import statistics

    from toolchain.tune.adapter import PAIR_ROUNDS, time_together

    front = [r for r in records[:RETIME_TOP] if latency(r) <= RETIME_SPREAD * latency(records[0]) < math.inf]
    if len(front) < 2:
        return records, {}
    try:
        rounds = time_together([(func, plain(r.trace.as_json())) for r in front], spec, settings, measure,
                               rounds=PAIR_ROUNDS)
    except RuntimeError:
        return records, {}
    medians = [statistics.median(row[i] for row in rounds) for i in range(len(front))]
    order = sorted(range(len(front)), key=medians.__getitem__)
    return [front[i] for i in order] + records[len(front):], {k: medians[i] for k, i in enumerate(order)}


@phases.timing("verify")
def verify_task(task: Task, func, database, spec, settings: TuneSettings, measure=None) -> dict:
    """Check candidates best-first (the front timed again: :func:`retimed`) until one passes; returns the
    verified.json entry of the task."""
    records, again = retimed(func, sorted(records_of(database, func), key=latency), spec, settings, measure)
    rejected = []
    for index, record in enumerate(records[: settings.verify_top]):
        if latency(record) == math.inf:
            break
        result = check_candidate(func, record, spec, seed=settings.seed)
        entry = {"latency_ms": again.get(index, latency(record) * 1e3),
                 **{k: result.get(k) for k in ("max_abs", "max_ref")}}
        if result["ok"]:
            return {
                "status": "verified",
                "trace": plain(record.trace.as_json()),
                **entry,
                "trials": len(records),
                "rejected": rejected,
            }
        rejected.append({**entry, "reason": result.get("reason", "")})
    return {"status": "unverified" if records else "untuned", "trials": len(records), "rejected": rejected}


# ----------------------------------------------------------------------------- running a kernel here


def random_args(func, seed: int = 0) -> list:
    """Numpy arrays for every parameter of ``func`` (inputs random, outputs zero)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for p in func.params:
        ty = p.ty
        shape = [int(s) for s in ty.shape]
        arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(str(ty.dtype)))
    return arrays


def run(mod_or_func, arrays: list, target) -> list:
    """Compile with ``tvm.compile`` and run ``main`` on copies of ``arrays``; returns every buffer after the call."""
    import numpy as np
    import tvm
    from tvm import tirx

    mod = mod_or_func
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod.with_attr("global_symbol", "main")})
    lib = tvm.compile(rolled(mod), target=target)
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(np.array(a), dev) for a in arrays]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]
