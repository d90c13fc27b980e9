"""A session's clock: the deadline of ``agoc tune --time``, what a trial and a verification take here, and
so how many more trials fit. Plain numbers; the session feeds it what it measures."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from toolchain.errors import UnsupportedModelError

#: Seconds a search trial takes before a session has measured its own (a database's earlier sessions
#: say better: :meth:`Clock.from_json`), by where candidates run: building on this machine is most of it
#: locally; a device adds the upload and the run through RPC. Figures: docs/tuning-internals.md (Budgets).
PRIOR_TRIAL_S = {"local": 1.2, "device": 3.0}
#: Seconds one search call takes however few trials it runs (its population sampled and evolved on the cost
#: model before a candidate is built), before a session has timed one: a search is not started when less is left
PRIOR_CALL_S = {"local": 15.0, "device": 20.0}
#: Of the time left before the deadline, the share one search call may take: its population shrinks to fit
CALL_SHARE = 3
#: Seconds a task's verification takes (its best candidates built and checked against the reference)
PRIOR_VERIFY_S = 4.0
#: Seconds each join's pairing takes (its schedules and its minis' timed in turn)
PRIOR_PAIR_S = 6.0

_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float:
    """``--time``: seconds from ``90``, ``90s``, ``10m``, ``1.5h`` or ``1h30m``."""
    parts = re.fullmatch(r"\s*((?:\d+(?:\.\d+)?[smh]?\s*)+)", text or "")
    terms = re.findall(r"(\d+(?:\.\d+)?)([smh]?)", parts.group(1)) if parts else []
    seconds = sum(float(n) * _UNITS[u or "s"] for n, u in terms)
    if not terms or seconds <= 0:
        raise UnsupportedModelError(f"--time {text!r} is not a duration: give e.g. 90s, 10m or 1h30m")
    return seconds


@dataclass
class Clock:
    """What a session knows about time: ``deadline`` (in ``now``'s seconds; None: no limit), and the
    seconds a search trial and a task's verification have taken (measured as it goes)."""

    now: Callable[[], float] = time.monotonic
    deadline: float | None = None
    trial_s: float = PRIOR_TRIAL_S["local"]
    verify_s: float = PRIOR_VERIFY_S
    pair_s: float = PRIOR_PAIR_S
    call_s: float = PRIOR_CALL_S["local"]  # the shortest search call timed so far (the prior before one)
    candidate_s: float | None = None  # a call's seconds per candidate of its population (None: no call timed)
    measured: dict = field(default_factory=lambda: {"trials": 0, "search_s": 0.0, "verifies": 0, "verify_s": 0.0})

    def left_s(self) -> float:
        """Seconds to the deadline (inf without one)."""
        return math.inf if self.deadline is None else self.deadline - self.now()

    def trials_that_fit(self, reserve_s: float = 0.0) -> int | float:
        """Search trials that fit before the deadline, ``reserve_s`` kept back (inf without a deadline)."""
        left = self.left_s() - reserve_s
        return math.inf if left == math.inf else max(0, int(left / self.trial_s))

    def searched(self, trials: int, seconds: float, call: bool = True, population: int | None = None) -> None:
        """A search (``call``, of ``population`` candidates; else seeds measured) ran ``trials`` trials in
        ``seconds``: the estimates follow what this session measures."""
        m = self.measured
        m["trials"], m["search_s"] = m["trials"] + trials, m["search_s"] + seconds
        if m["trials"]:
            self.trial_s = max(m["search_s"] / m["trials"], 1e-3)
        if call:
            self.call_s = seconds if m.get("calls") is None else min(self.call_s, seconds)
            m["calls"] = m.get("calls", 0) + 1
            if population:
                per = seconds / population
                self.candidate_s = per if self.candidate_s is None else min(self.candidate_s, per)

    def population(self, full: int, least: int, reserve_s: float = 0.0) -> int:
        """The population of the next search call: ``full`` without a deadline; with one, what keeps the call within
        :data:`CALL_SHARE` of the time left (``reserve_s`` kept back) at the rate calls took here, never below
        ``least``. Before a call is timed, a quarter (a loaded machine runs a call several times the prior)."""
        if self.deadline is None:
            return full
        if self.candidate_s is None:
            return max(least, full // 4)
        fits = (self.left_s() - reserve_s) / CALL_SHARE / self.candidate_s
        return int(max(least, min(full, fits)))

    def search_fits(self, reserve_s: float = 0.0) -> bool:
        """Whether one more search call fits before the deadline, ``reserve_s`` kept back."""
        return self.left_s() - reserve_s >= self.call_s

    def verified(self, seconds: float) -> None:
        m = self.measured
        m["verifies"], m["verify_s"] = m["verifies"] + 1, m["verify_s"] + seconds
        self.verify_s = m["verify_s"] / m["verifies"]

    def estimate_s(self, trials: int, tasks: int, joins: int) -> float:
        """Seconds a session of ``trials`` trials over ``tasks`` tasks with ``joins`` joins is expected to take."""
        return trials * self.trial_s + tasks * self.verify_s + joins * self.pair_s

    def to_json(self) -> dict:
        return {"trial_s": self.trial_s, "verify_s": self.verify_s, "pair_s": self.pair_s, "call_s": self.call_s,
                "candidate_s": self.candidate_s, "measured": self.measured}

    @staticmethod
    def prior(where: str, saved: dict | None = None, now: Callable[[], float] = time.monotonic,
              deadline: float | None = None) -> Clock:
        """A session's clock: the rates an earlier session of the database measured (``saved``), else the
        prior for where candidates run (:data:`PRIOR_TRIAL_S`)."""
        saved = saved or {}
        kind = "local" if where == "local" else "device"
        return Clock(now=now, deadline=deadline, trial_s=float(saved.get("trial_s") or PRIOR_TRIAL_S[kind]),
                     verify_s=float(saved.get("verify_s") or PRIOR_VERIFY_S),
                     pair_s=float(saved.get("pair_s") or PRIOR_PAIR_S),
                     call_s=float(saved.get("call_s") or PRIOR_CALL_S[kind]),
                     candidate_s=float(saved["candidate_s"]) if saved.get("candidate_s") else None)
