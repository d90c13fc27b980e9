"""What a tuning session is told and what it plans: its settings, its tasks, its error.
(The design of a session: docs/tuning-internals.md.)"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from toolchain.errors import AgocError
from toolchain.settings import PartitionSettings

SCHEMA = "agoc.tunedb/1"


class TuningError(AgocError):
    """A tuning session cannot start or continue (bad database, settings mismatch)."""


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 256  # whole-model budget
    partition: PartitionSettings = field(default_factory=PartitionSettings)  # how the kernels are cut
    tile_cache: int = 0  # bytes an intensive tile's slice of its intermediate may take
    # (intensive.intensive_schedule's tile_cache); 0: TILE_FACTOR_MAX alone
    intensive: bool = True  # False: AGO-NI
    reformer: bool = True  # False: AGO-NR
    split_fraction: float = 0.5  # share of a subgraph's budget spent on its minis first
    per_iter: int = 16  # candidates per search batch
    population: int = 128  # MetaSchedule's evolutionary search: candidates the cost model scores and
    # evolves (genetic rounds) before each batch is picked for measuring (why not its 512: docs/tuning-internals.md)
    stable_window: int = 16  # minis stop early when the last window of trials ...
    stable_tolerance: float = 0.02  # ... improved the best latency by less than this
    verify_top: int = 5  # candidates checked, best first, before giving up on a task
    cold_weights: bool = True  # time candidates with all arguments but the first flushed from cache
    # (toolchain/timing.py: in a model a kernel's weights come from memory); False: timed warm
    join_margin: float = 0.10  # a join still this much slower than its minis together after its first
    # batch hands the rest of its budget back to them (it would be built as its minis anyway)
    seed: int = 0
    scheduler: str = "weight"  # how the budget is spread over the tasks (SCHEDULERS)
    warmup: int = 8  # "latency" scheduler: the first batch every task gets (a split subgraph: one per
    # mini and one for its join) before the rest goes round by round where it saves the most model time
    prepack: bool = True  # weights layout-free: a schedule may store each weight in the order it reads
    # it (MetaSchedule's RewriteLayout; folded at build time, build.prepack_weights)
    transfer: int = 2  # a kernel's search starts from the verified schedules of up to this many kernels
    # with the same blocks, re-fitted to its loops (toolchain/tune/transfer.py; each one a trial of its budget)
    roof_share: float = 0.85  # a kernel whose best reaches this share of the session's compute roof (a register-
    # blocked matmul measured where candidates run: roofline.ROOF_PROBE) is searched no further; 0: never stops so
    search_threads: int = 1  # threads of MetaSchedule's evolutionary search; 1: the same seed, budget and library
    # give the same database (more sample candidates in whichever thread is free: faster, not reproducible); 0: all

    @property
    def unit(self) -> int:
        """A task's first batch: what its floor is counted in."""
        return self.warmup if self.scheduler == "latency" else self.per_iter

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> TuneSettings:
        """A session's settings, either form (:func:`upgraded`); a setting missing takes its default, one this
        agoc does not know is a :class:`TuningError`."""
        d = upgraded(d)
        unknown = sorted(known_settings(d) - known_settings(TuneSettings().to_json()))
        if unknown:
            raise TuningError(f"settings {', '.join(unknown)} are not known to this agoc; upgrade agoc")
        return TuneSettings(**{**d, "partition": PartitionSettings.from_json(d.get("partition", {}))})


#: a session's settings before the partition knobs were one record: flat, ``keep_inside`` (bytes) meaning both
#: the locality unit and the tile cache cap
FLAT_PARTITION_KEYS = ("partition", "threshold", "keep_inside")


def upgraded(settings: dict) -> dict:
    """A session's settings JSON in the current form: a flat one (:data:`FLAT_PARTITION_KEYS`) nested into
    ``partition`` and ``tile_cache``; the current form as it is."""
    if isinstance(settings.get("partition"), dict) or not set(FLAT_PARTITION_KEYS) & set(settings):
        return dict(settings)
    flat = {k: settings[k] for k in FLAT_PARTITION_KEYS if k in settings}
    keep = flat.get("keep_inside", 0)
    rest = {k: v for k, v in settings.items() if k not in FLAT_PARTITION_KEYS}
    partition = PartitionSettings(flat.get("partition", "ago"), flat.get("threshold"), keep)
    return {**rest, "partition": partition.to_json(), "tile_cache": keep}


def known_settings(settings: dict) -> set[str]:
    """The names of a session's settings JSON (either form), ``partition.X`` for the partition's."""
    d = upgraded(settings)
    nested = {f"partition.{k}" for k in d.get("partition", {})}
    return (set(d) - {"partition"}) | nested


@dataclass(frozen=True)
class Task:
    name: str  # kernel name + structural hash: identical kernels share one task
    phase: str  # "kernel" (final kernel, tuned directly), "mini" (reformer phase 1), "joined" (phase 2)
    members: tuple[str, ...]  # op-graph node ids (of the first instance)
    parent: str | None  # for minis: the joined task they belong to
    weight: float
    budget: int
    calls: int = 1  # how many times the model calls this kernel

    def to_json(self) -> dict:
        return {**asdict(self), "members": list(self.members)}

    @staticmethod
    def from_json(d: dict) -> "Task":
        return Task(**{**d, "members": tuple(d["members"])})
