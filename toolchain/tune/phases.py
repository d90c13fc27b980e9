"""Where a tuning session's time goes: seconds per phase (search, cost-model update, build, run, verify, seed,
pair), accumulated in this process while a session runs and saved as the database's ``phases.json``.
Why and the numbers: docs/tuning-internals.md (Where a trial's time goes)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

from toolchain import scratch

#: the phases, in the order a trial meets them; ``other`` is the session's wall time that none of them took
PHASES = ("search", "predict", "update", "build", "run", "verify", "seed", "pair", "other")
#: phases that own what runs inside them: a seed's or a pairing's builds and runs count as seed / pair
#: (build and run are then the search's candidates only)
OWNERS = frozenset({"seed", "pair", "verify"})


@dataclass(frozen=True)
class Phases:
    """A session's seconds per phase (exclusive: a phase inside another counts as its own, but what runs inside
    a seed, a pairing or a verification counts as theirs: :data:`OWNERS`), how often each was entered, how many
    trials it measured and its wall time."""

    seconds: dict[str, float] = field(default_factory=dict)
    trials: int = 0
    wall_s: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    disturbed: int = 0  # candidates timed only while other programs held this machine's cores (timing.py)
    waited: float = 0.0  # their threads' median run-queue wait, a share of the wall time

    def to_json(self) -> dict:
        return {"seconds": {k: round(self.seconds.get(k, 0.0), 3) for k in PHASES}, "trials": self.trials,
                "calls": {k: self.calls[k] for k in PHASES if self.calls.get(k)},
                "wall_s": round(self.wall_s, 3),
                "s_per_trial": round(self.wall_s / self.trials, 3) if self.trials else None,
                **({"disturbed": self.disturbed, "waited": round(self.waited, 3)} if self.disturbed else {})}

    @classmethod
    def from_json(cls, data: dict) -> "Phases":
        return cls(dict(data.get("seconds", {})), int(data.get("trials", 0)), float(data.get("wall_s", 0.0)),
                   dict(data.get("calls", {})), int(data.get("disturbed", 0)), float(data.get("waited", 0.0)))

    def shares(self) -> dict[str, float]:
        """Each phase's share of the wall time."""
        return {k: self.seconds.get(k, 0.0) / self.wall_s for k in PHASES} if self.wall_s > 0 else {}


@dataclass
class _Clock:
    """The process's accumulator: seconds per phase, the stack of phases open now (for exclusive times)."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    stack: list[list] = field(default_factory=list)  # [phase, seconds its inner phases took]
    trials: int = 0
    started: float = field(default_factory=time.perf_counter)
    reported: int = 0  # candidates the report (:func:`report_path`) held when the session started


_CLOCK = _Clock()


def start() -> None:
    """Start counting a session (what was counted before is dropped)."""
    global _CLOCK
    _CLOCK = _Clock(started=time.perf_counter())


def add_trials(n: int) -> None:
    _CLOCK.trials += n


@contextlib.contextmanager
def timed(phase: str):
    """Count the time inside as ``phase``'s, less what phases opened inside it take (those count as theirs)."""
    clock = _CLOCK
    if clock.stack and clock.stack[-1][0] in OWNERS:
        yield
        return
    entry = [phase, 0.0]
    clock.stack.append(entry)
    clock.calls[phase] = clock.calls.get(phase, 0) + 1
    begun = time.perf_counter()
    try:
        yield
    finally:
        spent = time.perf_counter() - begun
        clock.stack.pop()
        clock.seconds[phase] = clock.seconds.get(phase, 0.0) + spent - entry[1]
        if clock.stack:
            clock.stack[-1][1] += spent


def timing(phase: str):
    """A decorator: every call of the function counted as ``phase`` (:func:`timed`)."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with timed(phase):
                return fn(*args, **kwargs)

        return inner

    return wrap


@functools.cache
def report_path() -> str:
    """The file this process's local runner reports candidates it could time only disturbed to (one per process:
    the kept runner's worker outlives a session); removed when the process exits."""
    scratch.sweep(tempfile.gettempdir(), REPORT_PREFIX)  # the reports of killed processes
    path = os.path.join(tempfile.gettempdir(), f"{REPORT_PREFIX}{os.getpid()}.jsonl")
    open(path, "w").close()
    atexit.register(lambda: os.path.exists(path) and os.unlink(path))
    return path


REPORT_PREFIX = "agoc-disturbed-"


def _reported() -> list[dict]:
    from toolchain.timing import disturbed_in

    return disturbed_in(report_path())


def snapshot() -> Phases:
    """What has been counted since :func:`start`; the wall time not inside any phase is ``other``."""
    wall = time.perf_counter() - _CLOCK.started
    seconds = {k: v for k, v in _CLOCK.seconds.items() if k in PHASES}
    seconds["other"] = max(0.0, wall - sum(seconds.values()))
    disturbed = _reported()[_CLOCK.reported:]
    waited = statistics.median(d["waited"] for d in disturbed) if disturbed else 0.0
    return Phases(seconds, _CLOCK.trials, wall, dict(_CLOCK.calls), len(disturbed), waited)


@contextlib.contextmanager
def session(save):
    """Count a session from here (:func:`start`) and hand what was counted to ``save`` (``TuneDB.save_phases``)
    at its end, an interrupted one's too."""
    start()
    _CLOCK.reported = len(_reported())
    try:
        yield
    finally:
        save(snapshot().to_json())
