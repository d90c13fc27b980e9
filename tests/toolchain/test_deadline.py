"""The user's budget is the user's: a session never commits more records than ``--trials``, and with a
deadline (``--time``) it stops searching in time to verify what it found (a fake search and a fake clock)."""

from dataclasses import replace

import pytest

from tests.toolchain.test_tuning import fake_search  # noqa: F401 - the fixture
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune import adapter, candidates
from toolchain.tune.clock import Clock, parse_duration
from toolchain.tune.db import TuneDB
from toolchain.tune.events import OutOfTime, Planned
from toolchain.tune.plan import plan_tasks
from toolchain.tune.session import tune_model
from toolchain.tune.settings import TuneSettings

SPEC = resolve_target("host", layout="NCHW")
TRIAL_S, VERIFY_S = 1.0, 3.0


class FakeTime:
    """Seconds that pass only when the fake search measures (``TRIAL_S`` a trial) or verifies (``VERIFY_S``)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def timed(fake_search, monkeypatch):  # noqa: F811 - the fixture imported above
    """The fake search, each trial and each verification advancing a fake clock."""
    now = FakeTime()
    search, verify = adapter.tune_trials, candidates.verify_task

    def tune_trials(func, spec, database, n, *a, **k):
        now.t += n * TRIAL_S
        return search(func, spec, database, n, *a, **k)

    def verify_task(*a, **k):
        now.t += VERIFY_S
        return verify(*a, **k)

    monkeypatch.setattr(adapter, "tune_trials", tune_trials)
    monkeypatch.setattr(candidates, "verify_task", verify_task)
    return fake_search, now


def _used(plan, trials) -> dict[str, int]:
    return {t.name: len(trials.get(plan.funcs[t.name].script(), [])) for t in plan.tasks}


@pytest.mark.parametrize("budget", [1, 5, 8, 20, 40, 100])
def test_a_session_never_spends_more_trials_than_the_budget_and_spends_it_all_where_it_can(
        dwsep_split, tmp_path, timed, budget):
    """tiny-dwsep's subgraph needs 4 batches of 8 to give every mini and its join a first batch (32 trials):
    below that the plan reaches what it can, never more than the budget; what a task cannot use goes on."""
    mod, graph, *_ = dwsep_split
    trials, _ = timed
    settings = TuneSettings(trials=budget, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    used = _used(plan, trials)
    assert sum(used.values()) == budget  # every trial spent, none more
    (planned,) = [e for e in events if isinstance(e, Planned)]
    assert planned.total == budget and planned.floor == 32
    assert planned.unreached == sum(t.budget == 0 for t in plan.tasks) and (planned.unreached > 0) == (budget < 32)
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)  # resumed at the same budget: nothing more
    assert _used(plan, trials) == used


def test_a_deadline_stops_the_search_in_time_to_verify_what_it_found(dwsep_split, tmp_path, timed):
    mod, graph, *_ = dwsep_split
    trials, now = timed
    settings = TuneSettings(trials=256, per_iter=8, stable_window=64, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    clock = Clock(now=now, deadline=60.0, trial_s=TRIAL_S, verify_s=VERIFY_S)
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append, clock=clock)
    used = _used(plan, trials)
    assert now.t <= 60.0  # searching stopped in time for the verification that followed it
    assert 0 < sum(used.values()) < 60
    assert [e for e in events if isinstance(e, OutOfTime)]
    verified = TuneDB(tmp_path).verified
    assert all(verified[name]["status"] == "verified" and verified[name]["trials"] == n
               for name, n in used.items() if n)  # every task it reached is verified with all its records
    assert all(used.values())  # each task had its share of the time, not the first ones all of it


@pytest.mark.parametrize("open_ended", [False, True])
def test_with_the_time_alone_as_budget_a_faster_search_spends_the_time_not_the_forecast(
        dwsep_split, tmp_path, timed, open_ended):
    """``--time`` without ``--trials`` plans the trials the time is forecast to fit; when they run faster than
    forecast, rounds go on to the deadline (open-ended) instead of ending early — with ``--trials`` given, the
    trials stay the budget."""
    mod, graph, *_ = dwsep_split
    trials, now = timed
    settings = TuneSettings(trials=40, per_iter=8, stable_window=64, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    clock = Clock(now=now, deadline=200.0, trial_s=4 * TRIAL_S, verify_s=VERIFY_S)  # a forecast 4x too slow
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append, clock=clock, open_ended=open_ended)
    spent = sum(_used(plan, trials).values())
    assert now.t <= 200.0
    if open_ended:
        assert spent > 100 and [e for e in events if isinstance(e, OutOfTime) and e.allowance is None]
    else:
        assert spent == 40 and not [e for e in events if isinstance(e, OutOfTime)]


def test_no_search_is_started_when_one_call_takes_longer_than_the_time_left(dwsep_split, tmp_path, timed,
                                                                           monkeypatch):
    """A search call costs seconds however few trials it runs (its population evolved before any is built):
    with less than that left (before one is timed: the prior) none starts, and the session still ends in time."""
    mod, graph, *_ = dwsep_split
    trials, now = timed
    search = adapter.tune_trials

    def slow_call(*a, **k):  # 20 s a call on top of the trials
        now.t += 20.0
        return search(*a, **k)

    monkeypatch.setattr(adapter, "tune_trials", slow_call)
    settings = TuneSettings(trials=256, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    clock = Clock(now=now, deadline=15.0, trial_s=TRIAL_S, verify_s=VERIFY_S, call_s=14.0)
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, clock=clock)
    assert sum(_used(plan, trials).values()) == 0 and now.t <= 15.0
    now.t = 0.0
    clock = Clock(now=now, deadline=90.0, trial_s=TRIAL_S, verify_s=VERIFY_S, call_s=5.0)
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path / "b", clock=clock)
    assert clock.call_s > 20.0 and now.t <= 90.0  # learnt from its first call: later ones not started late
    assert Clock.prior("local", TuneDB(tmp_path / "b").clock).call_s == clock.call_s


def test_a_search_calls_population_shrinks_to_fit_the_time_left(dwsep_split, tmp_path, timed, monkeypatch):
    """A call's evolution costs time in proportion to its population, and a call cannot be stopped inside it: under
    a deadline the first call evolves a quarter of the population (before one is timed here), later ones what keeps
    them within a third of the time left — so a call several times slower than the prior still ends in time;
    without a deadline every call has the whole population."""
    mod, graph, *_ = dwsep_split
    trials, now = timed
    search, populations = adapter.tune_trials, []

    def evolving(func, spec, database, n, settings, *a, **k):  # 0.25 s a candidate on top of the trials
        populations.append(settings.population)
        now.t += 0.25 * settings.population
        return search(func, spec, database, n, settings, *a, **k)

    monkeypatch.setattr(adapter, "tune_trials", evolving)
    settings = TuneSettings(trials=256, per_iter=8, stable_window=64, partition=PartitionSettings(threshold=1e9))
    clock = Clock(now=now, deadline=120.0, trial_s=TRIAL_S, verify_s=VERIFY_S, call_s=5.0)  # 32 s a full call
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, clock=clock)
    assert populations[0] == 32 and max(populations) < 128 and min(populations) >= 8
    assert now.t <= 120.0 and len(populations) > 3
    assert Clock.prior("local", TuneDB(tmp_path).clock).candidate_s == clock.candidate_s  # the next session's start
    populations.clear()
    tune_model(mod, "a" * 64, SPEC, replace(settings, trials=40), tmp_path / "b")
    assert populations and set(populations) == {128}


def test_without_a_deadline_the_clock_only_learns_what_a_trial_takes(dwsep_split, tmp_path, timed):
    mod, graph, *_ = dwsep_split
    _, now = timed
    settings = TuneSettings(trials=40, per_iter=8, partition=PartitionSettings(threshold=1e9))
    clock = Clock(now=now, trial_s=9.0)
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, clock=clock)
    assert clock.trial_s == pytest.approx(TRIAL_S) and clock.verify_s == pytest.approx(VERIFY_S)
    saved = TuneDB(tmp_path).clock  # the next session's estimate starts from what this one measured
    assert Clock.prior("local", saved).trial_s == pytest.approx(TRIAL_S)


def test_the_plan_says_how_long_it_should_take(dwsep_split, tmp_path, timed):
    mod, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append, clock=Clock(now=timed[1], trial_s=2.0,
                                                                                      verify_s=5.0, pair_s=7.0))
    (planned,) = [e for e in events if isinstance(e, Planned)]
    assert planned.estimate_s == pytest.approx(64 * 2.0 + 4 * 5.0 + 1 * 7.0) and planned.deadline_s is None


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1.5h", 5400), ("1h30m", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "0", "-5m", "10x"])
def test_a_duration_that_is_not_one_is_refused_with_the_forms_named(text):
    from toolchain.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="90s, 10m or 1h30m"):
        parse_duration(text)


def test_the_estimate_says_how_many_kernels_it_leaves_out(tmp_path):
    """A kernel with no verified schedule is built on an untuned schedule: its time is not in the database's
    estimate, and the summary counts it (a demo's estimate read 1.5 ms for a model that ran 89)."""
    from toolchain.tune.db import status
    from toolchain.tune.settings import SCHEMA, Task

    db = TuneDB(tmp_path)
    db.open_session({"schema": SCHEMA, "model_sha256": "0" * 64, "target": SPEC.tvm_target, "layout": SPEC.layout,
                     "settings": TuneSettings().to_json()})
    db.save_tasks([Task("a-1", "kernel", (), None, 1.0, 16, calls=2), Task("b-2", "kernel", (), None, 1.0, 16)])
    db.save_verified({"a-1": {"status": "verified", "latency_ms": 0.25, "trials": 16}})
    summary = status(tmp_path)
    assert summary["estimate_ms"] == 0.5 and summary["unscheduled"] == 1


def test_each_task_keeps_its_seconds_per_trial_for_rounds_by_gain_per_second(dwsep_split, tmp_path, timed):
    """What ``budget.trial_seconds`` reads: every searched task's trials and the seconds its searches took."""
    from toolchain.tune.budget import trial_seconds

    mod, graph, *_ = dwsep_split
    trials, now = timed
    settings = TuneSettings(trials=40, per_iter=8, stable_window=64, partition=PartitionSettings(threshold=1e9))
    clock = Clock(now=now, deadline=200.0, trial_s=TRIAL_S, verify_s=VERIFY_S)
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, lambda e: None, clock=clock, open_ended=True)
    progress = TuneDB(tmp_path).progress
    per_trial = trial_seconds(progress, progress)
    assert per_trial and all(s == pytest.approx(TRIAL_S) for s in per_trial.values())
    assert sum(p.get("searched", 0) for p in progress.values()) > 40
