"""What a tuning session reports as it goes: one frozen record per kind of event, handed to ``on_event(event)``
(host/progress.py renders them, one function per type)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional, Union


@dataclass(frozen=True)
class Planned:
    """The session's plan: every task's JSON (``Task.to_json``), the first pass's trials, the user's budget
    (``total``), the trials that would give every task a first batch (``floor``), the tasks the budget does
    not reach, the trials it may still spend (``allowance``: a resumed session's records count), the
    expected seconds, the seconds to the deadline (None: none) and the seconds a trial is taken to take."""

    kind: ClassVar[str] = "plan"
    tasks: list[dict]
    first_pass: int
    total: int
    floor: int = 0
    unreached: int = 0
    allowance: Optional[int] = None  # None: all of them
    estimate_s: float = 0.0
    deadline_s: Optional[float] = None
    trial_s: float = 0.0


@dataclass(frozen=True)
class Imported:
    """``--from BASE``: records copied in per kernel."""

    kind: ClassVar[str] = "imported"
    base: str
    tasks: dict[str, int]


@dataclass(frozen=True)
class TaskStarted:
    """A task (a kernel, a mini or a joined subgraph) is tuned on, from ``done`` records to ``budget``."""

    kind: ClassVar[str] = "task"
    task: str
    phase: str
    done: int
    budget: int


@dataclass(frozen=True)
class Seeded:
    """A new task's first records: composed from its minis and/or its register ``block`` (its shape) and/or from
    ``siblings`` and/or from the record ``library`` (the library's names of the kernels whose schedules were
    committed), or ``again``: a join composed once more from its minis' better schedules."""

    kind: ClassVar[str] = "seeded"
    task: str
    composed: bool = False
    siblings: list[str] = field(default_factory=list)
    library: list[str] = field(default_factory=list)
    best_ms: Optional[float] = None
    again: bool = False
    block: str = ""


@dataclass(frozen=True)
class Trials:
    """A batch measured: the task's records so far and its best latency."""

    kind: ClassVar[str] = "trials"
    task: str
    done: int
    budget: int
    best_ms: float


@dataclass(frozen=True)
class Stable:
    """A task stopped early: its best latency stopped improving."""

    kind: ClassVar[str] = "stable"
    task: str
    done: int


@dataclass(frozen=True)
class Roof:
    """The session's compute roof, measured where candidates run (``gflops``; None: the probe failed, ``reason``),
    and the share of it at which a kernel is searched no further."""

    kind: ClassVar[str] = "roof"
    gflops: Optional[float]
    share: float
    probe: str
    reason: str = ""


@dataclass(frozen=True)
class AtRoof:
    """A task stopped: its best time reaches ``share`` of the roof; ``left`` trials of its budget go on."""

    kind: ClassVar[str] = "at_roof"
    task: str
    done: int
    share: float
    left: int


@dataclass(frozen=True)
class Exhausted:
    """Every schedule of a task's space is measured; ``left`` trials go on."""

    kind: ClassVar[str] = "exhausted"
    task: str
    done: int
    left: int


@dataclass(frozen=True)
class SearchFailed:
    """A task's search could not run; what it found is kept."""

    kind: ClassVar[str] = "search_failed"
    task: str
    reason: str


@dataclass(frozen=True)
class JoinYields:
    """A join slower than its minis after a batch hands its ``left`` trials to them (``together``: the
    pairing timed next to its minis, when there is one)."""

    kind: ClassVar[str] = "join_yields"
    task: str
    best_ms: Optional[float]
    minis_ms: Optional[float]
    seed_ms: Optional[float]
    left: int
    reason: str
    together: Optional[dict] = None


@dataclass(frozen=True)
class Verifying:
    """A task's best candidates are being verified."""

    kind: ClassVar[str] = "verify"
    task: str


@dataclass(frozen=True)
class TaskDone:
    """A task's turn ended: its verified entry (status, latency, rejected candidates)."""

    kind: ClassVar[str] = "task_done"
    task: str
    seconds: float
    result: dict


@dataclass(frozen=True)
class Round:
    """A round of trials goes to the task whose next round is expected to save the most model time."""

    kind: ClassVar[str] = "round"
    task: str
    model_ms: float
    gain_ms: float
    left: int | None  # trials the budget has left (None: open-ended, the deadline bounds it)


@dataclass(frozen=True)
class OutOfTime:
    """The deadline came: no more search; what was found is verified (``allowance``: trials left unspent, None
    when the deadline alone was the budget)."""

    kind: ClassVar[str] = "out-of-time"
    allowance: int | None


@dataclass(frozen=True)
class Pairing:
    """A joined kernel is being timed next to its ``minis`` mini-subgraphs."""

    kind: ClassVar[str] = "pairing"
    task: str
    minis: int


@dataclass(frozen=True)
class Paired:
    """A join timed next to its minis: both latencies and their ratio, or the ``error`` that stopped it."""

    kind: ClassVar[str] = "paired"
    task: str
    joined_ms: Optional[float] = None
    minis_ms: Optional[float] = None
    ratio: Optional[float] = None
    error: Optional[str] = None


Event = Union[Planned, Imported, TaskStarted, Seeded, Trials, Stable, Roof, AtRoof, Exhausted, SearchFailed,
              JoinYields, Verifying, TaskDone, Round, OutOfTime, Pairing, Paired]
#: ``on_event(event)``: how a session reports an :data:`Event`
Events = Callable[[Event], None]
EVENTS = Event.__args__


def ignore(event: Event) -> None:
    """The default ``on_event``: nothing reported."""
