"""How a session spreads its trial budget: plain numbers in, decisions out (no TVM).
The reasons behind each rule: docs/tuning-internals.md (Budgets, Schedulers)."""

from __future__ import annotations

import math
import statistics

#: How a session spreads its trial budget over the tasks of a model.
SCHEDULERS = {
    "weight": "planned up front in proportion to AGO's weights (each task at least one batch of --per-iter); "
              "what the plan cannot place (the last kernels' unspent trials) goes round by round as with latency",
    "latency": "a first batch of --warmup per task, then rounds of --per-iter to the task whose next round "
               "is expected to save the most model time (its share of the model × expected gain, Ansor-style)",
    "roofline": "three quarters of the budget planned by weight, the last quarter in rounds of --per-iter to "
                "the task whose time in the model is furthest above its roofline floor (its work and bytes at "
                "the best rates the session measured) × the share of that gap a round is expected to close",
}


#: ``roofline``: the share of the budget that goes round by round (the rest is planned by weight, so
#: every task has its batches before any round is decided on measured times)
ROUND_SHARE = 0.25


def budgets(weights: list[float], total: int, minimum: int, floors: list[int] | None = None,
            cap: int | None = None) -> list[int]:
    """Split ``total`` trials in whole batches of ``minimum`` in proportion to ``weights`` (largest
    remainder), each kernel at least its floor in batches (default one), never more than ``cap`` trials in
    all (default ``total``): the user's budget. When the floors need more than ``cap``, the batches there
    are go by weight alone (:func:`short_of_floors`). Trials short of a whole batch go to the heaviest
    kernel given any, so the sum is exactly ``min(total, cap)`` — or, with ``total`` 0 (the latency
    scheduler plans only first batches), the first batches the cap allows."""
    if not weights:
        return []
    floors = floors or [1] * len(weights)
    cap = total if cap is None else cap
    units = min(max(total // minimum, sum(floors)), cap // minimum)
    if units < sum(floors):
        alloc = [a * minimum for a in short_of_floors(weights, units)]
        if not units and cap > 0:  # not one whole batch: what there is, to the heaviest kernel
            alloc[max(range(len(weights)), key=lambda i: (weights[i], -i))] = cap
    else:
        alloc = [a * minimum for a in _proportional(weights, units, floors)]
    short = max(0, min(total, cap) - sum(alloc))
    if short and any(alloc):
        heaviest = max((i for i, a in enumerate(alloc) if a), key=lambda i: weights[i])
        alloc[heaviest] += short
    return alloc


def short_of_floors(weights: list[float], units: int) -> list[int]:
    """``units`` batches, fewer than the floors need: in proportion to weight with no floor, so the kernels
    that hold most of the model's time get batches and the lightest none (they start from a library or
    sibling seed, or get an untuned schedule at compile time: toolchain.tune.untuned); a split subgraph tunes
    the minis its batches reach and is built from them."""
    return _proportional(weights, units, [0] * len(weights))


def _proportional(weights: list[float], units: int, floors: list[int]) -> list[int]:
    """``units`` batches in proportion to ``weights`` (largest remainder), each at least its floor."""
    alloc = [0] * len(weights)
    free, left = list(range(len(weights))), units
    while True:  # kernels whose share is under their floor get the floor; the rest share what is left
        scale = sum(weights[i] for i in free) or 1.0
        shares = {i: left * (weights[i] or 1e-12) / scale for i in free}
        low = [i for i in free if shares[i] < floors[i]]
        if not low:
            break
        for i in low:
            alloc[i], left = floors[i], left - floors[i]
            free.remove(i)
    for i in free:
        alloc[i] = int(shares[i])
    spare = units - sum(alloc)
    for i in sorted(free, key=lambda i: shares[i] - int(shares[i]), reverse=True)[:spare]:
        alloc[i] += 1
    return alloc


def stabilised(latencies: list[float], window: int, tolerance: float) -> bool:
    """True when the best latency improved by less than ``tolerance`` over the last ``window`` trials."""
    finite = [x for x in latencies]
    if len(finite) < 2 * window:
        return False
    before = min(finite[:-window])
    after = min(finite)
    return before < math.inf and after >= before * (1 - tolerance)


#: The latency scheduler's optimism: a task's next round of ``per_iter`` trials is expected to gain
#: PRIOR_GAIN × per_iter / (trials so far + per_iter) of its time before its own record says otherwise
#: (a fresh search gains most; Ansor's forward estimate plays this part).
PRIOR_GAIN = 0.5


def share_closed(latencies: list[float], per_iter: int, floor_s: float) -> float:
    """The share of the distance from a task's best time down to ``floor_s`` its next round is expected
    to close: the mean of what its last ``per_iter`` trials closed (the search as it goes now) and the
    prior (:data:`PRIOR_GAIN`, falling with trials); the prior alone before it has two rounds."""
    prior = PRIOR_GAIN * per_iter / (len(latencies) + per_iter)
    if len(latencies) <= per_iter:
        return prior
    before, now = min(latencies[:-per_iter]), min(latencies)
    closed = (before - now) / (before - floor_s) if math.inf > before > floor_s else prior
    return (closed + prior) / 2


def expected_gain(latencies: list[float], per_iter: int) -> float:
    """The share of a task's time its next round is expected to save (the latency scheduler: no floor)."""
    return share_closed(latencies, per_iter, 0.0)


def roofline_gain(latencies: list[float], per_iter: int, floor_s: float) -> float:
    """``roofline``: the share of a task's time its next round is expected to save — its gap (the share of
    its best time above its roofline floor, ``floor_s``) × the share of that gap a round is expected to
    close (:func:`share_closed`). A task at its floor gains nothing, however slow; one far above it keeps
    its rounds while they pay."""
    now = min(latencies, default=math.inf)
    if not math.inf > now > floor_s:
        return 0.0
    return (now - floor_s) / now * share_closed(latencies, per_iter, floor_s)


def task_ms(name: str, verified: dict, progress: dict) -> float | None:
    """A task's latency for one call: verified, else the best it measured, else None."""
    entry = verified.get(name, {})
    if entry.get("status") == "verified":
        return entry["latency_ms"]
    best = progress.get(name, {}).get("best_ms")
    return best if best is not None and best < math.inf else None


def first_pass(trials: int, scheduler: str) -> int:
    """The trials a session plans up front: all of them ("weight"), none but the first batches
    ("latency"), or all but :data:`ROUND_SHARE` ("roofline")."""
    return {"latency": 0, "roofline": int(trials * (1 - ROUND_SHARE))}.get(scheduler, trials)


def split_budget(budget: int, mini_weights: list[float], split_fraction: float, unit: int) -> tuple[list[int], int]:
    """A split subgraph's ``budget`` over its new minis and its join: (the minis' budgets, the join's).
    The minis get ``split_fraction`` of it, at least a batch each while the budget lasts; the join the
    rest (its composed seeds are trials of it). Nothing for any of them when the subgraph got nothing."""
    if budget <= 0:
        return [0] * len(mini_weights), 0
    share = min(budget, max(split_fraction * budget, unit * len(mini_weights)))
    minis = budgets(mini_weights, int(share), unit, cap=budget)
    return minis, budget - sum(minis)


def hand_back(weights: dict[str, float], left: int, done: dict[str, int]) -> dict[str, int]:
    """A joined kernel's remaining ``left`` trials split over its minis ({mini: weight}) in proportion to
    their weight (largest remainder): {mini: the number of records it tunes to} (``done`` + its share)."""
    names = list(weights)
    if not names or left <= 0:
        return {}
    ws = [weights[n] or 1e-12 for n in names]
    exact = [left * w / sum(ws) for w in ws]
    share = [int(x) for x in exact]
    for i in sorted(range(len(names)), key=lambda i: share[i] - exact[i])[: left - sum(share)]:
        share[i] += 1
    return {n: done.get(n, 0) + k for n, k in zip(names, share) if k > 0}


def unspent(tasks, joined: str, spent: dict[str, int]) -> int:
    """Trials the minis of ``joined`` (``tasks``: records with name, phase, parent, budget) left when their
    tuning stabilised early: they go to the join. A mini shared by several subgraphs belongs to the first
    (its ``parent``)."""
    return sum(max(0, t.budget - spent.get(t.name, t.budget)) for t in tasks
               if t.phase == "mini" and t.parent == joined)


def join_yields(best_ms: float | None, seed_ms: float | None, minis_ms: float | None, ratio: float | None,
                join_margin: float, stable_tolerance: float) -> str | None:
    """Why a join's first batch hands the rest of its budget back to its minis, or None: still slower than
    its minis together by more than ``join_margin`` (``ratio``: minis ÷ join timed together, when it was;
    else the recorded times), or no better than its composed seed."""
    if ratio is not None:
        slower = ratio * (1 + join_margin) < 1
    else:
        slower = None not in (minis_ms, best_ms) and best_ms > minis_ms * (1 + join_margin)
    stuck = None not in (seed_ms, best_ms) and best_ms >= seed_ms * (1 - stable_tolerance)
    if slower:
        return "slower than its minis"
    return "no gain on its seed" if stuck else None


def round_gains(times: dict[str, float], latencies: dict[str, list[float]], per_iter: int,
                floors: dict[str, float] | None = None) -> dict[str, float]:
    """Model time (ms) each task's next round is expected to save: its time in the model × its expected
    gain (:func:`expected_gain`; with ``floors`` in s, :func:`roofline_gain`)."""
    if floors is not None:
        return {n: t * roofline_gain(latencies[n], per_iter, floors[n]) for n, t in times.items()}
    return {n: t * expected_gain(latencies[n], per_iter) for n, t in times.items()}


def next_round(gains: dict[str, float], trial_s: dict[str, float] | None = None) -> str:
    """The task whose next round saves the most — per second of tuning when each task's seconds per trial are
    given (``trial_s``; under a deadline the time is the budget, and a big kernel's trials take longer; a task
    not timed yet counts the median)."""
    if not trial_s:
        return max(gains, key=gains.get)
    usual = statistics.median(trial_s.values())
    return max(gains, key=lambda n: gains[n] / max(trial_s.get(n, usual), 1e-6))


def trial_seconds(progress: dict, names) -> dict[str, float]:
    """Each task's seconds per search trial this database has measured ({} until one has)."""
    return {n: progress[n]["search_s"] / progress[n]["searched"] for n in names
            if progress.get(n, {}).get("searched")}
