"""Progress on the terminal: a bar and one line per tuning event (one renderer per event type of
toolchain.tune.events), and the benchmark suite's live view."""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from toolchain.tune import events as ev


class TuneProgress:
    """``on_event`` for :func:`toolchain.tune.tune_model`: a trials bar, and a dim line for what changes the
    plan. ``trials``, ``unit`` and ``scheduler``: the session's, to say how the plan came out."""

    def __init__(self, console: Console, trials: int, unit: int, scheduler: str):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total} trials"), TimeElapsedColumn(),
                                 TextColumn("left"), TimeRemainingColumn(), console=console)
        self.trials, self.unit, self.scheduler = trials, unit, scheduler
        self.bar = None
        self.budgets: dict[str, int] = {}
        self.done: dict[str, int] = {}

    def __call__(self, event: ev.Event) -> None:
        render = RENDERERS.get(type(event))
        if render is not None:
            render(self, event)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        self.progress.console.print(text, soft_wrap=True)

    def advance(self, task: str, done: int, budget: int, description: str) -> None:
        self.done[task] = min(done, budget)
        self.progress.update(self.bar, completed=sum(self.done.values()), description=description)


def _planned(view: TuneProgress, e: ev.Planned) -> None:
    view.budgets = {t["name"]: t["budget"] for t in e.tasks}
    phases = {p: sum(t["phase"] == p for t in e.tasks) for p in ("kernel", "mini", "joined")}
    kernels = phases["kernel"] + phases["joined"]
    short = (f" (a first batch of {view.unit} for every task would take {e.floor}: the {e.unreached} the budget "
             "does not reach start from a seed or are built with an untuned schedule)") if e.unreached else ""
    resumed = f", {e.allowance} of them left" if e.allowance is not None and e.allowance < e.total else ""
    deadline = f", stopping by {duration(e.deadline_s)}" if e.deadline_s is not None else ""
    view.say(
        f"[dim]plan: {kernels} kernel{'s' * (kernels != 1)} ({phases['joined']} split into "
        f"{phases['mini']} minis), {e.total} trials{resumed}{short}"
        f"{f', {e.first_pass} of them a first batch per task' if view.scheduler == 'latency' else ''}"
        f"{f', {e.first_pass} of them planned by weight, the rest in rounds' if view.scheduler == 'roofline' else ''}"
        f"; about {duration(e.estimate_s)} ({e.trial_s:.1f} s a trial, estimated){deadline}[/dim]")
    view.bar = view.progress.add_task("tuning", total=e.total)


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``40`` -> ``40 s``; ``5400`` -> ``1 h 30 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds % 60 and seconds < 600 else "")
    return f"{seconds // 3600} h" + (f" {seconds % 3600 // 60} min" if seconds % 3600 // 60 else "")


def _out_of_time(view: TuneProgress, e: ev.OutOfTime) -> None:
    unspent = f" ({e.allowance} trials unspent)" if e.allowance is not None else ""
    view.say(f"[yellow]time is up: no more search{unspent}; what was found is verified[/yellow]")


def _round(view: TuneProgress, e: ev.Round) -> None:
    view.say(f"[dim]round for {escape(e.task)}: {e.model_ms:.4f} ms of the model, expected to save "
             f"{e.gain_ms:.4f} ms; {f'{e.left} trials left' if e.left is not None else 'until the deadline'}[/dim]")


def _task_started(view: TuneProgress, e: ev.TaskStarted) -> None:
    view.advance(e.task, e.done, e.budget, f"{e.phase} {e.task[:40]}")


def _trials(view: TuneProgress, e: ev.Trials) -> None:
    view.advance(e.task, e.done, e.budget, f"{e.task[:40]} best {e.best_ms:.4f} ms")


def _stable(view: TuneProgress, e: ev.Stable) -> None:
    left = view.budgets.get(e.task, e.done) - e.done
    view.say(f"[dim]{escape(e.task)}: stable after {e.done} trials{f', {left} left to its join' if left > 0 else ''}"
             "[/dim]")


def _roof(view: TuneProgress, e: ev.Roof) -> None:
    if e.gflops is None:
        view.say(f"[dim]no compute roof measured ({escape(e.probe)}: {escape(e.reason)}): every kernel is searched to "
                 "its budget[/dim]")
        return
    if e.reason:  # timed again
        view.say(f"[dim]roof now {e.gflops:.0f} GFLOP/s ({escape(e.reason)})[/dim]")
        return
    view.say(f"[dim]roof: {e.gflops:.0f} GFLOP/s ({escape(e.probe)}, timed here); a kernel at {e.share:.0%} of it is "
             "searched no further (--roof)[/dim]")


def _at_roof(view: TuneProgress, e: ev.AtRoof) -> None:
    left = f"; its {e.left} remaining trials go on" if e.left > 0 else ""
    view.say(f"[dim]{escape(e.task)}: at {e.share:.0%} of the roof after {e.done} trials, searched no further{left}"
             "[/dim]")


def _exhausted(view: TuneProgress, e: ev.Exhausted) -> None:
    view.say(f"[dim]{escape(e.task)}: every schedule of its space measured after {e.done} trials; {e.left} left go "
             "to the next kernel[/dim]")


def _search_failed(view: TuneProgress, e: ev.SearchFailed) -> None:
    view.say(f"[yellow]{escape(e.task)}: the search failed ({escape(e.reason)}); keeping what it found, going on"
             "[/yellow]")


def _join_yields(view: TuneProgress, e: ev.JoinYields) -> None:
    minis = f", its minis together {e.minis_ms:.4f} ms" if e.minis_ms is not None else ""
    if e.together:  # timed in turn with its minis
        minis = f"; timed next to its minis {e.together['joined_ms']:.4f} vs {e.together['minis_ms']:.4f} ms"
    view.say(f"[dim]{escape(e.task)}: {e.best_ms:.4f} ms after a batch{minis} ({e.reason}): its {e.left} remaining "
             "trials go to its minis[/dim]")


def _seeded(view: TuneProgress, e: ev.Seeded) -> None:
    parts = (["the composed mini schedules"] if e.composed else []) + (
        [f"its {e.block} register block"] if e.block else []) + (
        [f"the schedules of {len(e.siblings)} kernel(s) like it"] if e.siblings else []) + (
        [f"{len(e.library)} schedule(s) from the record library"] if e.library else [])
    best = f" (best {e.best_ms:.4f} ms)" if e.best_ms is not None else ""
    how = "composed again from its minis" if e.again else f"starts from {' and '.join(parts)}{best}"
    view.say(f"[dim]{escape(e.task)}: {how}[/dim]")


def _imported(view: TuneProgress, e: ev.Imported) -> None:
    view.say(f"[dim]from {escape(e.base)}: {sum(e.tasks.values())} records of {len(e.tasks)} kernel(s) copied in"
             f"{'' if e.tasks else ' (none: no kernel in common, or each already has records here)'}[/dim]")


def _pairing(view: TuneProgress, e: ev.Pairing) -> None:
    view.progress.update(view.bar, description=f"timing {e.task[:40]} next to its {e.minis} minis")


def _paired(view: TuneProgress, e: ev.Paired) -> None:
    verdict = (f"error: {escape(e.error)}" if e.error is not None else
               f"{e.joined_ms:.4f} ms, its minis together {e.minis_ms:.4f} ms → "
               f"{'kept' if e.ratio >= 1 else 'built as its minis'}")
    view.say(f"[dim]{escape(e.task)} timed next to its minis: {verdict}[/dim]")


def _task_done(view: TuneProgress, e: ev.TaskDone) -> None:
    r = e.result
    note = f"{r.get('latency_ms', 0):.4f} ms verified" if r.get("status") == "verified" else r.get("status")
    rejected = f", {len(r.get('rejected', []))} wrong candidates rejected" if r.get("rejected") else ""
    view.progress.console.print(f"{escape(e.task)}: {note}{rejected}")


#: event type -> its renderer (an event without one, e.g. Verifying, shows nothing)
RENDERERS: dict[type, Callable] = {
    ev.Planned: _planned, ev.OutOfTime: _out_of_time, ev.Round: _round, ev.TaskStarted: _task_started,
    ev.Trials: _trials,
    ev.Stable: _stable, ev.Roof: _roof, ev.AtRoof: _at_roof, ev.Exhausted: _exhausted,
    ev.SearchFailed: _search_failed, ev.JoinYields: _join_yields,
    ev.Seeded: _seeded, ev.Imported: _imported, ev.Pairing: _pairing, ev.Paired: _paired, ev.TaskDone: _task_done,
}


class SuiteProgress:
    """``on_event(kind, **info)`` for the benchmark suites: a bar over cases and one over the current case's
    rounds; where stderr is a log file (CI, nohup), one timestamped line per stage instead."""

    def __init__(self, console: Console, cases: int, rounds: int):
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                                 transient=True)
        self.cases, self.rounds = cases, rounds
        self.logged = not console.is_terminal

    def __enter__(self):
        self.progress.__enter__()
        self.overall = self.progress.add_task("cases", total=self.cases)
        self.current = self.progress.add_task("", total=self.rounds)
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def __call__(self, kind: str, **info) -> None:
        render = SUITE_RENDERERS.get(kind)
        if render is not None:
            render(self, info)

    def log(self, text: str) -> None:
        if self.logged:
            self.console.print(f"{time.strftime('%H:%M:%S')} {text}", soft_wrap=True)


def _case(view: SuiteProgress, info: dict) -> None:
    view.progress.update(view.current, description=info["case"], completed=0)


def _stage(view: SuiteProgress, info: dict) -> None:
    view.progress.update(view.current, description=f"{info['case']}: {info['stage']}")
    view.log(f"{escape(info['case'])}: {escape(info['stage'])}")


def _suite_round(view: SuiteProgress, info: dict) -> None:
    view.progress.update(view.current, completed=info["round"])


def _tuning(view: SuiteProgress, info: dict) -> None:
    e = info["event"]
    if isinstance(e, ev.TaskStarted):
        view.log(f"{escape(info['case'])}: tuning {info['variant']} {escape(e.task)} ({e.phase}, {e.done}/{e.budget})")
    elif isinstance(e, ev.Trials):
        view.progress.update(view.current, description=f"{info['case']}: tuning {info['variant']} "
                             f"{e.task[:24]} {e.done}/{e.budget}")


def _case_done(view: SuiteProgress, info: dict) -> None:
    view.progress.advance(view.overall)


#: a suite's event kind -> its renderer
SUITE_RENDERERS: dict[str, Callable] = {
    "case": _case, "stage": _stage, "round": _suite_round, "tuning": _tuning, "case_done": _case_done,
}
