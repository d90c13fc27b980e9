"""A tuning session (:func:`tune_model`): every task seeded, searched and verified in turn, budgets handed
on as tasks stop early, the rest in rounds, joins paired. Resumable; the design: docs/tuning-internals.md."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from toolchain import fastmath, padding, roofline, winograd
from toolchain.errors import first_line
from toolchain.opgraph import op_graph
from toolchain.tune import adapter, candidates, compose, pairing, phases
from toolchain.tune.adapter import Measure
from toolchain.tune.budget import (
    hand_back,
    join_yields,
    next_round,
    round_gains,
    stabilised,
    task_ms,
    trial_seconds,
    unspent,
)
from toolchain.tune.clock import Clock
from toolchain.tune.db import TuneDB, import_records, status
from toolchain.tune.events import (
    AtRoof,
    Events,
    Exhausted,
    Imported,
    JoinYields,
    OutOfTime,
    Planned,
    Round,
    SearchFailed,
    Seeded,
    Stable,
    TaskDone,
    TaskStarted,
    Trials,
    Verifying,
    ignore,
)
from toolchain.tune.plan import TaskPlan, plan_tasks
from toolchain.tune.roof import RoofMeter
from toolchain.tune.settings import SCHEMA, Task, TuneSettings

#: the trial budget of an open-ended session after its plan (``--time`` alone: the deadline bounds it)
UNBOUNDED_TRIALS = 1 << 30


def tune_model(
    mod,
    model_sha256: str,
    spec,
    settings: TuneSettings,
    db_dir: Path,
    on_event: Events = ignore,
    measure: Measure | None = None,
    base: Path | None = None,
    library=None,
    clock: Clock | None = None,
    open_ended: bool = False,
) -> dict:
    """Tune every kernel of ``mod`` (a legalized module) into ``db_dir``; resumable. Returns the summary.

    ``measure``: where candidates run (default: this machine; see :class:`Measure`). ``base``: another
    tuning database to start from (:func:`import_records`: its records of the same kernels become
    theirs, counted against the budget like their own). ``library``: a record library
    (:class:`toolchain.tune.library.Library`) whose schedules seed new kernels and whose pre-trained
    cost model the search starts from. ``clock``: the session's deadline and rates (default: no deadline, the
    rates the database's earlier sessions measured). The session never commits more records than
    ``settings.trials`` (those it starts with included), and stops searching when only the time to verify
    what it found is left; every task it finished is verified in the database whenever it stops.
    ``open_ended`` (``agoc tune --time`` without ``--trials``): with a deadline, ``settings.trials`` is only the
    plan's — once they are spent, rounds go on while the time lasts."""
    db, plan = open_session(mod, model_sha256, spec, settings, db_dir, on_event, base)
    with phases.session(db.save_phases):  # where the session's time goes, saved even when interrupted
        database = db.ms_database()
        where = measure.where if measure is not None else "local"
        clock = clock or Clock.prior(where, db.clock)
        run = Run(plan, db, database, spec, settings, measure, on_event, db.verified, db.progress,
                  library=library, clock=clock, roof=RoofMeter(spec, settings, measure))
        on_event(planned_event(plan, settings, clock, run.allowance()))
        run.cost_models = adapter.session_cost_models(plan, database, spec, pretrained=library.cost_model
                                                      if library is not None else None)
        run.given = handed_in(plan, run.tasks, run.progress)  # resumed: trials minis were handed by their joins
        if (open_ended or run.allowance() > 0) and not run.past_time():  # resumed with nothing left: no probe
            run.roof.start(on_event)
        for i, task in enumerate(plan.tasks):  # minis come first, then kernels/joined subgraphs
            if run.out_of_time:
                break
            run.first_pass(task, later=[t.budget for t in plan.tasks[i + 1:] if t.budget])
        # the rest of the budget, round by round, where it saves most: with "latency" all but the first
        # batches; with "weight" what the plan could not place (a last kernel's carry has no task after it)
        if open_ended and clock.deadline is not None:  # the time is the budget: the plan's trials were a forecast
            run.settings = replace(settings, trials=UNBOUNDED_TRIALS)
        run.rounds(run.settings.trials)
        # join or minis: decided on the kept schedules timed together (toolchain/tune/pairing.py)
        if clock.left_s() > clock.pair_s * len(plan.compositions):
            with phases.timed("pair"):
                pairing.pair_joins(plan, run.verified, spec, settings, measure, on_event)
        db.save_verified(run.verified)
        db.save_clock(clock.to_json())
    return status(db_dir)


def planned_event(plan: TaskPlan, settings: TuneSettings, clock: Clock, allowance: int) -> Planned:
    """What the session is about to do and how long it should take (``allowance``: trials it may still spend)."""
    first = sum(t.budget for t in plan.tasks)
    reached = [t for t in plan.tasks if t.budget]
    trials = min(allowance, settings.trials)
    estimate = clock.estimate_s(min(trials, clock.trials_that_fit()), len(reached), len(plan.compositions))
    left = clock.left_s()
    return Planned(tasks=[t.to_json() for t in plan.tasks], first_pass=first, total=settings.trials,
                   floor=plan.floor_trials, unreached=len(plan.tasks) - len(reached), allowance=trials,
                   estimate_s=min(estimate, left), deadline_s=None if left == math.inf else left,
                   trial_s=clock.trial_s)


def open_session(mod, model_sha256: str, spec, settings: TuneSettings, db_dir: Path, on_event: Events,
                 base: Path | None) -> tuple[TuneDB, TaskPlan]:
    """The database opened (or checked, when resumed) for this session and its plan saved in it;
    ``base``'s records of the same kernels copied in."""
    graph = op_graph(mod)
    db = TuneDB(db_dir)
    db.open_session(
        {"schema": SCHEMA, "model_sha256": model_sha256, "target": spec.tvm_target, "layout": spec.layout,
         "pad_channels": padding.applied(mod), "fast_math": fastmath.applied(mod), "winograd": winograd.applied(mod),
         "precision": spec.precision,
         "settings": settings.to_json()}
    )
    _, plan = plan_tasks(mod, graph, spec, settings)
    db.follow_renames(plan.funcs)
    db.save_tasks(plan.tasks)
    db.save_layout(plan)
    if base is not None:
        copied = import_records(db_dir, base, plan.funcs)
        on_event(Imported(base=str(base), tasks=copied))
    return db, plan


@dataclass
class Run:
    """A session while it runs: what it is tuning, where, and the budget it has carried so far (the
    database holds the rest: a resumed session rebuilds this from it)."""

    plan: TaskPlan
    db: TuneDB
    database: object  # MetaSchedule's database (adapter.open_database)
    spec: object
    settings: TuneSettings
    measure: Measure | None
    on_event: Events
    verified: dict
    progress: dict
    library: object = None  # toolchain.tune.library.Library: seeds and a pre-trained cost model
    clock: Clock = field(default_factory=Clock)  # the deadline and what a trial takes here
    out_of_time: bool = False  # the deadline came: no search starts, what was found is verified
    hashes: dict[str, str] = field(default_factory=dict)  # task -> workload hash (read once)
    cost_models: dict = field(default_factory=dict)  # adapter.session_cost_models
    given: dict[str, int] = field(default_factory=dict)  # trials minis were handed by their joins (resumed)
    spent: dict[str, int] = field(default_factory=dict)  # trials each task has used (minis may stop early)
    carry: int = 0  # trials a kernel whose search failed left: the next kernel gets them
    roof: RoofMeter | None = None  # the compute roof where candidates run

    @property
    def tasks(self) -> dict[str, Task]:
        return {t.name: t for t in self.plan.tasks}

    def latencies(self, name: str) -> list[float]:
        """A task's trial latencies, in commit order."""
        return adapter.trial_latencies(self.db.ms_dir, self.plan.funcs[name])

    @property
    def open_ended(self) -> bool:
        """Whether the deadline alone bounds the rest of the session (``tune_model``'s ``open_ended``)."""
        return self.settings.trials == UNBOUNDED_TRIALS

    def allowance(self) -> int:
        """Trials the session may still spend: the user's budget less the records its kernels hold."""
        self.hashes = self.hashes or {name: adapter.workload_hash(func) for name, func in self.plan.funcs.items()}
        held = adapter.trial_latencies_of(self.db.ms_dir, self.plan.funcs, self.hashes)
        return max(0, self.settings.trials - sum(len(v) for v in held.values()))

    def trials_now(self, wanted: int) -> int:
        """How many of ``wanted`` trials the next search may run: within the budget's allowance and what fits
        before the deadline with a verification kept back (when none fits, the session is out of time)."""
        reserve = self.clock.verify_s + (self.clock.pair_s * len(self.plan.compositions) if self.open_ended else 0)
        fit = self.clock.trials_that_fit(reserve_s=reserve)  # open-ended: the joins' pairing kept its time too
        if not self.clock.search_fits(reserve_s=reserve):  # a call runs longer than what is left
            fit = 0
        if fit <= 0 and not self.out_of_time:
            self.out_of_time = True
            self.on_event(OutOfTime(allowance=None if self.open_ended else self.allowance()))
        if self.clock.deadline is not None:  # close in on it: half of what fits (before a rate is measured
            # here, a quarter batch: under load a trial takes several times the prior)
            fit = min(fit, max(1, fit // 2) if self.clock.measured["trials"] else max(1, self.settings.per_iter // 4))
        return int(max(0, min(wanted, self.allowance(), fit)))

    def past_time(self) -> bool:
        """True when only the time to verify is left before the deadline (a search stops after its batch)."""
        return self.clock.left_s() < self.clock.verify_s

    def fit_to_time(self, search: int, later: list[int]) -> int:
        """A task's ``search`` trials scaled down when they and the ``later`` tasks' planned ones do not
        fit before the deadline (each task keeps its share; every task's verification kept back)."""
        fit = self.clock.trials_that_fit(reserve_s=self.clock.verify_s * (1 + len(later)))
        wanted = search + sum(later)
        return search if fit >= wanted or wanted <= 0 else int(search * fit / wanted)

    # ------------------------------------------------------------------------- the roof

    def at_roof(self, name: str) -> bool:
        return self.roof.reached(name, self.plan.funcs[name], self.progress.get(name, {}).get("best_ms"))

    def stop_at_roof(self, task: Task, done: int, budget: int) -> bool:
        """Whether ``task``'s search stops here: its best reaches the roof's share (recorded and said)."""
        func, best = self.plan.funcs[task.name], self.progress.get(task.name, {}).get("best_ms")
        self.roof.raise_for(task.name, func, best, self.on_event)
        if not self.roof.reached(task.name, func, best):
            return False
        share = self.roof.share(task.name, func, best)
        self.progress[task.name]["at_roof"] = round(share, 3)
        self.db.save_progress(self.progress)
        self.on_event(AtRoof(task=task.name, done=done, share=share, left=max(0, budget - done)))
        return True

    # ------------------------------------------------------------------------- the first pass

    def first_pass(self, task: Task, later: list[int] | None = None) -> None:
        """Tune ``task`` to its share of the plan (seeded first when new), verify it, and hand on what it
        leaves: a join's rest to its minis, a kernel's unspent trials to the next. ``later``: the budgets of
        the tasks after it (with a deadline, all of them scaled to what fits)."""
        lat = self.latencies(task.name)
        budget = self.budget_of(task)
        budget = len(lat) + self.fit_to_time(budget - len(lat), later or []) if budget > len(lat) else budget
        handed = self.handed_before(task)
        self.on_event(TaskStarted(task=task.name, phase=task.phase, done=len(lat), budget=budget))
        if not lat:  # a join from its minis' schedules composed (AGO §V); any task, with --transfer,
            # from the schedules of kernels like it tuned before (siblings); the seeds are its first records
            lat, budget = self.seed(task, budget)
        elif "block" not in self.progress.get(task.name, {}):  # records from before its register block (an
            lat = self.seed_block(task)  # older database, another's via --from): the block measured once too
        done = len(lat)
        started = time.perf_counter()
        if task.phase == "mini" and stabilised(lat, self.settings.stable_window, self.settings.stable_tolerance):
            budget = done  # it stabilised before the session was interrupted: resuming adds nothing
        planned = budget
        if handed is not None or self.progress.get(task.name, {}).get("exhausted"):
            budget = done  # it handed the rest of its budget to its minis, or has no schedule left to try
        done, search_error, left = self.search(task, done, budget, stop_when_stable=task.phase == "mini",
                                               check_join=task.phase == "joined" and handed is None)
        self.spent[task.name] = done - self.given.get(task.name, 0)
        if task.phase != "mini":  # what a kernel's search could not spend (failed, exhausted) and did not
            self.carry += max(0, budget - done - left)  # hand to its minis goes to the next (a mini's: its join)
        if handed is not None:  # resumed with a larger --trials: the join's growth goes where its rest went
            handed = self.grow_hand_back(task, handed,
                                         planned - done - self.progress[task.name].get("handed_trials", 0))
        elif self.progress.get(task.name, {}).get("exhausted") and task.phase != "mini":
            self.carry += max(0, planned - budget)  # an exhausted kernel's growth: to the next kernel
        self.keep(task, done, search_error, started)
        if left:
            handed = self.hand_back(task, left)
        self.tune_handed(handed or {})
        if handed and not self.progress[task.name].get("reseeded"):
            self.reseed(task)

    def budget_of(self, task: Task) -> int:
        """The trials ``task`` tunes to in the first pass: its plan's, what its stabilised minis left (a
        join), what the last kernel could not spend (not a mini), what joins handed it (resumed)."""
        budget = task.budget + (unspent(self.plan.tasks, task.name, self.spent) if task.phase == "joined" else 0)
        if task.phase != "mini":
            budget, self.carry = budget + self.carry, 0
        return budget + self.given.get(task.name, 0)  # not its own budget's (a kernel may be a mini too)

    def handed_before(self, task: Task) -> dict[str, int] | None:
        """{mini: trials it tunes to} when ``task`` is a join that handed its rest back before (resumed)."""
        handed = self.progress.get(task.name, {}).get("handed_back")
        if handed:  # a database from an older split may name minis this plan no longer has: those are gone
            current = {name for name, _ in self.plan.compositions.get(task.name, [])}
            handed = {name: n for name, n in handed.items() if name in current}
        return handed

    def seed(self, task: Task, budget: int) -> tuple[list[float], int]:
        """A new task's first records: composed from its minis (a join), from its siblings (``transfer``).
        Returns its latencies then and its budget (a join nothing composed for gets a batch at least)."""
        # seeds are trials: within the budget's allowance and time, one each for a task the plan does not reach
        if self.past_time():
            return [], budget
        cap, started = 1 if budget <= 0 else self.settings.transfer, self.clock.now()
        with phases.timed("seed"):
            left = self.allowance()  # read once: each source below reads it again after the seeds before it
            composed = task.phase == "joined" and left > 0 and compose.seed_joined(
                *self.seed_args(task, cap), limit=min(left, cap) if budget <= 0 else left)
            block = compose.seed_from_block(*self.seed_args(task, cap)) if self.settings.transfer else ""
            seeded = compose.seed_from_siblings(*self.seed_args(task, cap)) if self.settings.transfer else []
            listed = compose.seed_from_library(*self.seed_args(task, cap), self.library) if self.library else []
        lat = self.latencies(task.name) if composed or block or seeded or listed else []
        if lat:
            self.clock.searched(len(lat), self.clock.now() - started, call=False)
            seed = min(lat)
            seed_ms = seed * 1e3 if seed < math.inf else None
            self.progress[task.name] = {"trials": len(lat), "seed_ms": seed_ms, "best_ms": seed_ms,
                                        **({"siblings": seeded} if seeded else {})}
            self.on_event(Seeded(task=task.name, composed=bool(composed), siblings=list(seeded), library=list(listed),
                                 best_ms=seed_ms, block=block))
        if self.settings.transfer:  # its block was tried (its shape; "" when it has none or it failed)
            self.progress.setdefault(task.name, {})["block"] = block
        if lat or self.settings.transfer:
            self.db.save_progress(self.progress)
        if task.phase == "joined" and not composed and budget > 0:  # nothing composed: a batch of its own
            budget = max(budget, self.settings.unit)
        return lat, budget

    def seed_block(self, task: Task) -> list[float]:
        """A task resumed with records but its register block never tried: the block measured and committed as
        one more record (a trial of the budget), so that the faster of the two is kept. Its latencies then."""
        lat = self.latencies(task.name)
        if not self.settings.transfer or self.past_time() or self.allowance() <= 0:
            return lat
        started = self.clock.now()
        with phases.timed("seed"):
            block = compose.seed_from_block(*self.seed_args(task, 1))
        entry = self.progress.setdefault(task.name, {})
        entry["block"] = block
        if block:
            self.clock.searched(1, self.clock.now() - started, call=False)
            lat = self.latencies(task.name)
            best = min(lat)
            entry.update(trials=len(lat), best_ms=best * 1e3 if best < math.inf else None)
            self.on_event(Seeded(task=task.name, composed=False, siblings=[], library=[],
                                 best_ms=lat[-1] * 1e3 if lat[-1] < math.inf else None, block=block))
        self.db.save_progress(self.progress)
        return lat

    def seed_args(self, task: Task, cap: int) -> tuple:
        """The arguments of a seeding function for ``task``, its settings' ``transfer`` (seeds per source)
        at most ``cap`` and the trials the budget has left."""
        settings = replace(self.settings, transfer=min(self.settings.transfer, cap, self.allowance()))
        return task, self.plan, self.database, self.spec, self.verified, settings, self.measure

    def hand_back(self, task: Task, left: int) -> dict[str, int]:
        """A join that yielded: its ``left`` trials split over its minis, recorded in the progress file."""
        composition = self.plan.compositions.get(task.name, [])
        counts = self.record_counts([n for n, _ in composition])
        handed = hand_back(self.weights(composition), left, counts)
        self.progress[task.name] = {**self.progress.get(task.name, {}), "handed_back": handed, "handed_trials": left}
        self.db.save_progress(self.progress)
        return handed

    def tune_handed(self, handed: dict[str, int]) -> None:
        """The minis go on with their join's trials: each tuned to its target, what it leaves carried on."""
        for name, target in handed.items():
            mini, started = self.tasks[name], time.perf_counter()
            mini_done = len(self.latencies(name))
            self.on_event(TaskStarted(task=name, phase="mini", done=mini_done, budget=target))
            mini_done, error, _ = self.search(mini, mini_done, target, stop_when_stable=False, check_join=False)
            self.carry += max(0, target - mini_done)
            self.keep(mini, mini_done, error, started)

    def reseed(self, task: Task) -> None:
        """A join that handed its rest to its minis, composed once more from their better schedules."""
        args = (task, self.plan, self.database, self.spec, self.verified, self.settings, self.measure)
        with phases.timed("seed"):
            reseeded = compose.seed_joined(*args, limit=self.allowance())
        if reseeded:
            self.on_event(Seeded(task=task.name, again=True))
            self.keep(task, len(self.latencies(task.name)), None, time.perf_counter())
        self.progress[task.name]["reseeded"] = True
        self.db.save_progress(self.progress)

    def grow_hand_back(self, task: Task, handed: dict[str, int], growth: int) -> dict[str, int]:
        """A join that handed its rest to its minis, resumed with a larger budget: the ``growth`` (its
        planned budget now, less its records and what it handed back before) goes to its minis too, as
        a fresh session at this budget would have handed it. Returns the minis' new targets (records to
        tune to), recorded in the progress file."""
        if growth <= 0:
            return handed
        composition = self.plan.compositions.get(task.name, [])
        record = self.progress[task.name]
        before = record.get("handed_trials", 0)
        old, new = _shares(composition, self.tasks, before), _shares(composition, self.tasks, before + growth)
        counts = self.record_counts(list(new))
        grown = {**handed, **{n: counts[n] + k - old.get(n, 0) for n, k in new.items() if k > old.get(n, 0)}}
        self.progress[task.name] = {**record, "handed_back": grown, "handed_trials": before + growth}
        self.db.save_progress(self.progress)
        return grown

    def weights(self, composition: list) -> dict[str, float]:
        return _weights(composition, self.tasks)

    def record_counts(self, names: list[str]) -> dict[str, int]:
        """How many records each of the tasks ``names`` has: one reading of the database."""
        funcs = {n: self.plan.funcs[n] for n in names}
        return {n: len(lat) for n, lat in adapter.trial_latencies_of(self.db.ms_dir, funcs).items()}

    # ------------------------------------------------------------------------- searching one task

    def search(self, task: Task, done: int, budget: int, stop_when_stable: bool, check_join: bool):
        """Tune ``task`` until it has ``budget`` records; returns (done, search error, trials handed back).
        ``check_join``: once the joined kernel has had a batch of its own, stop and hand the rest back
        to its minis when it is still slower than they are together (by more than ``join_margin``)
        or when that batch found nothing faster than its composed seed."""
        settings = self.settings
        checked = False
        while done < budget:
            if self.stop_at_roof(task, done, budget):  # nothing left for a search to find
                break
            if check_join and not checked and done >= settings.unit:
                checked = True
                if self.join_yields(task, done, budget):
                    return done, None, budget - done
            # a join's first chunk is one batch, so that the comparison above comes early
            chunk = self.trials_now(min(budget - done, settings.unit if check_join and not checked
                                        else 2 * settings.per_iter))
            if chunk <= 0:  # the user's budget or time is spent
                break
            searched = self.clock.now()
            population = self.clock.population(settings.population, settings.per_iter, self.clock.verify_s)
            try:
                exhausted = adapter.tune_trials(
                    self.plan.funcs[task.name], self.spec, self.database, chunk,
                    replace(settings, population=population),
                    settings.intensive and settings.partition.method == "ago", self.db.root / "logs" / task.name,
                    self.measure, self.cost_models[task.phase == "joined"](), stop=self.past_time)
            except Exception as exc:  # noqa: BLE001 - a search that cannot run (e.g. a TVM space that
                # fails on this kernel's structure) ends this task, not the session; what it found stays
                error = first_line(exc)
                self.on_event(SearchFailed(task=task.name, reason=error))
                return done, error, 0
            lat = self.latencies(task.name)  # in commit order: what stabilised() reads
            self.clock.searched(len(lat) - done, self.clock.now() - searched, population=population)
            own = self.progress.setdefault(task.name, {})  # this task's seconds per trial (rounds under a deadline)
            own["searched"], own["search_s"] = (own.get("searched", 0) + len(lat) - done,
                                                own.get("search_s", 0.0) + self.clock.now() - searched)
            measured, done = len(lat) - done, len(lat)
            self.record_progress(task, lat, budget)
            if measured <= 0 and self.past_time():  # stopped for the deadline before a batch
                break
            if exhausted or measured <= 0:  # every distinct schedule measured, or none of its space passes the
                # static checks (a join whose every sample failed them: the same search again found nothing, each
                # call ~20 s, until the deadline); the rest of its budget goes on
                self.progress[task.name]["exhausted"] = True
                self.db.save_progress(self.progress)
                self.on_event(Exhausted(task=task.name, done=done, left=budget - done))
                break
            if stop_when_stable and stabilised(lat, settings.stable_window, settings.stable_tolerance):
                self.on_event(Stable(task=task.name, done=done))
                break
            if chunk <= 0:
                break
        return done, None, 0

    def record_progress(self, task: Task, lat: list[float], budget: int) -> None:
        best = min(lat) if lat else math.inf
        self.progress[task.name] = {**self.progress.get(task.name, {}), "trials": len(lat),
                                    "best_ms": best * 1e3 if best < math.inf else None}
        self.db.save_progress(self.progress)
        self.on_event(Trials(task=task.name, done=len(lat), budget=budget, best_ms=best * 1e3))

    def join_yields(self, task: Task, done: int, budget: int) -> bool:
        """Whether a join, after its first batch, hands the rest of its budget back to its minis (said)."""
        record = self.progress.get(task.name, {})
        best_ms, seed_ms = record.get("best_ms"), record.get("seed_ms")
        minis_ms = pairing.minis_ms([n for n, _ in self.plan.compositions.get(task.name, [])], self.verified)
        with phases.timed("pair"):  # timed next to its minis
            together = pairing.first_batch_vs_minis(task.name, self.plan, self.database, self.verified, self.spec,
                                                    self.settings, self.measure)
        reason = join_yields(best_ms, seed_ms, minis_ms, together["ratio"] if together is not None else None,
                             self.settings.join_margin, self.settings.stable_tolerance)
        if not (reason and self.plan.compositions.get(task.name)):
            return False
        self.on_event(JoinYields(task=task.name, best_ms=best_ms, minis_ms=minis_ms, seed_ms=seed_ms,
                                 left=budget - done, reason=reason, together=together or None))
        return True

    def keep(self, task: Task, done: int, search_error: str | None, started: float) -> None:
        """Verify the task's best candidates when it has new records (or its search failed)."""
        entry = self.verified.get(task.name, {})
        if entry.get("trials") != done or entry.get("status") != "verified" or search_error:
            self.on_event(Verifying(task=task.name))
            checked = self.clock.now()
            self.verified[task.name] = {
                **candidates.verify_task(task, self.plan.funcs[task.name], self.database, self.spec, self.settings,
                                         self.measure),
                "phase": task.phase, **({"search_error": search_error} if search_error else {})}
            self.clock.verified(self.clock.now() - checked)
            self.db.save_verified(self.verified)
        self.on_event(TaskDone(task=task.name, seconds=time.perf_counter() - started,
                               result=self.verified[task.name]))

    # ------------------------------------------------------------------------- rounds

    def rounds(self, total: int) -> None:
        """Rounds of ``per_iter`` trials to the task whose next round saves the most model time, until the
        session has spent ``total`` or no task can go on."""
        plan, settings, verified, progress = self.plan, self.settings, self.verified, self.progress
        out: set[str] = set()  # tasks whose search failed or ran dry in a round: no more rounds
        hashes = {name: adapter.workload_hash(func) for name, func in plan.funcs.items()}  # once, not every round
        while True:
            lats = adapter.trial_latencies_of(self.db.ms_dir, plan.funcs, hashes)
            left = total - sum(len(v) for v in lats.values())
            times = {n: t for n, t in model_times(plan, verified, progress).items()
                     if n not in out and not progress.get(n, {}).get("exhausted") and not self.at_roof(n)
                     and not verified.get(n, {}).get("search_error")}
            if left <= 0 or not times or self.trials_now(settings.per_iter) <= 0:
                break
            floors = None
            if settings.scheduler == "roofline":  # the gap to each task's floor at the session's best rates
                costs = {n: self.roof.cost(n, f) for n, f in plan.funcs.items()}  # counted once, kept by the meter
                peaks = roofline.peaks(costs, {n: task_ms(n, verified, progress) for n in plan.funcs})
                floors = {n: roofline.floor_ms(costs[n], peaks) / 1e3 if peaks else 0.0 for n in times}
            gains = round_gains(times, lats, settings.per_iter, floors)
            name = next_round(gains, trial_seconds(progress, times) if self.clock.deadline is not None else None)
            task, done = self.tasks[name], len(lats[name])
            target = done + self.trials_now(settings.per_iter)
            self.on_event(Round(task=name, model_ms=times[name], gain_ms=gains[name],
                                left=None if self.open_ended else left))
            self.on_event(TaskStarted(task=name, phase=task.phase, done=done, budget=target))
            started = time.perf_counter()
            now, error, _ = self.search(task, done, target, stop_when_stable=False, check_join=False)
            if error or now <= done:
                out.add(name)
            self.keep(task, now, error, started)


def _weights(composition: list, tasks: dict[str, Task]) -> dict[str, float]:
    """{mini: weight} of a join's minis, each once, in order."""
    return {n: tasks[n].weight for n in dict.fromkeys(name for name, _ in composition) if n in tasks}


def _shares(composition: list, tasks: dict[str, Task], left: int) -> dict[str, int]:
    """How a join's ``left`` handed-back trials split over its minis: {mini: trials} (budget.hand_back)."""
    return hand_back(_weights(composition, tasks), left, {})


def handed_in(plan: TaskPlan, tasks: dict[str, Task], progress: dict) -> dict[str, int]:
    """Trials each mini was handed by joins that yielded ({mini: trials}), from the progress file:
    a resumed mini tunes to its own budget plus these (they are not its own budget's)."""
    out: dict[str, int] = {}
    for join, parts in plan.compositions.items():
        record = progress.get(join, {})
        if record.get("handed_back") is not None:
            for name, k in _shares(parts, tasks, record.get("handed_trials", 0)).items():
                out[name] = out.get(name, 0) + k
    return out


def model_times(plan: TaskPlan, verified: dict, progress: dict) -> dict[str, float]:
    """Each task's time in one run of the model (ms, every call): only tasks the model is built with
    now count — a split subgraph's join or its minis, as :func:`toolchain.tune.pairing.choose` decides.
    A task's time is its verified latency, else the best it measured; a task with neither is left out."""
    out: dict[str, float] = {}
    for name in plan.group_tasks:  # one entry per subgraph instance: calls count themselves
        minis = [n for n, _ in plan.compositions.get(name, [])]
        parts = [name] if not minis or pairing.choose(name, minis, verified).build == "joined" else minis
        for part in parts:
            t = task_ms(part, verified, progress)
            if t is not None:
                out[part] = out.get(part, 0.0) + t
    return out
