"""The budget scheduler on plain numbers: budgets from weights, when minis stabilise, when a join yields,
how trials are handed back, which task gets the next round (toolchain/tune/budget.py, no TVM)."""

import math
import subprocess
import sys

import pytest

from toolchain.tune.budget import (
    budgets,
    expected_gain,
    first_pass,
    hand_back,
    join_yields,
    next_round,
    roofline_gain,
    round_gains,
    short_of_floors,
    split_budget,
    stabilised,
    task_ms,
    trial_seconds,
    unspent,
)
from toolchain.tune.settings import Task


def test_budgets_are_whole_batches_in_proportion_to_weight():
    assert budgets([1, 1], 64, 16) == [32, 32]
    assert budgets([3, 1], 64, 16) == [48, 16]
    assert budgets([], 64, 16) == []


def test_budgets_give_every_kernel_its_floor_and_the_largest_remainders_the_spare_batches():
    assert budgets([10, 1], 32, 16) == [16, 16]  # the light kernel still gets its batch
    assert budgets([1, 1, 1], 64, 16) == [32, 16, 16]  # 4 batches over 3: the spare one to the first
    assert budgets([1, 1], 64, 16, floors=[3, 1]) == [48, 16]


@pytest.mark.parametrize("weights,total,floors", [
    ([1, 1, 1], 16, None), ([5, 1, 3, 2], 40, None), ([1, 9], 100, [3, 1]), ([2, 2, 2, 2, 2], 70, [2, 1, 1, 3, 1]),
    ([4, 1], 7, None), ([1] * 30, 256, None), ([3, 1, 1], 0, None), ([1, 4], 8, [4, 4])])
def test_a_plan_never_spends_more_than_the_users_budget(weights, total, floors):
    """Whatever the floors, the sum is the budget exactly (trials short of a whole batch go to the heaviest
    kernel reached; when no floor fits, all of it to the kernel that saves most per batch)."""
    alloc = budgets(weights, total, 16, floors)
    assert sum(alloc) <= total and all(a >= 0 for a in alloc)
    assert sum(alloc) == total


def test_a_budget_short_of_the_floors_goes_by_weight_alone():
    assert budgets([1, 1, 1], 16, 16) == [16, 0, 0]  # one batch: the first of equals
    assert budgets([1, 5, 3], 32, 16) == [0, 16, 16]  # the two heaviest
    assert budgets([1, 5, 3], 40, 16) == [0, 24, 16]  # 8 trials short of a batch: to the heaviest reached
    assert budgets([1, 9], 39, 16, floors=[1, 3]) == [0, 39]  # a split subgraph's floor does not fit: its share
    assert short_of_floors([6, 3], 3) == [2, 1]
    assert budgets([1, 4], 8, 16, floors=[4, 4]) == [0, 8]  # not one whole batch: all to the heaviest
    # the latency scheduler plans no trials up front but a first batch per task, within the budget
    assert budgets([1, 1, 1], 0, 8, cap=16) == [8, 8, 0]
    assert budgets([1, 1, 1], 0, 8, cap=64) == [8, 8, 8]


def test_a_task_has_stabilised_when_its_last_window_improved_its_best_by_less_than_the_tolerance():
    assert stabilised([1.0, 0.9, 0.89, 0.895], window=2, tolerance=0.02)
    assert not stabilised([1.0, 0.9, 0.8, 0.85], window=2, tolerance=0.02)
    assert not stabilised([1.0, 0.9, 0.89], window=2, tolerance=0.02)  # under two windows: too early
    assert not stabilised([math.inf] * 4, window=2, tolerance=0.02)  # nothing ran yet


def test_the_schedulers_plan_all_none_or_three_quarters_of_the_budget_up_front():
    assert first_pass(256, "weight") == 256
    assert first_pass(256, "latency") == 0
    assert first_pass(256, "roofline") == 192


def test_a_split_subgraph_gives_its_minis_a_share_and_its_join_the_rest():
    assert split_budget(64, [1.0, 1.0], 0.5, 16) == ([16, 16], 32)
    assert split_budget(48, [1.0, 1.0, 1.0], 0.5, 16) == ([16, 16, 16], 0)  # tight: the join has its seeds
    assert split_budget(40, [1.0, 1.0, 1.0], 0.5, 16) == ([24, 16, 0], 0)  # within the subgraph's budget
    assert split_budget(0, [1.0, 1.0], 0.5, 16) == ([0, 0], 0)  # not reached: nothing for any of them
    assert split_budget(64, [], 0.5, 16) == ([], 64)


def test_a_join_hands_its_rest_to_its_minis_by_weight_on_top_of_their_records():
    assert hand_back({"a": 3.0, "b": 1.0}, 10, {"a": 5}) == {"a": 13, "b": 2}
    assert hand_back({"a": 1.0, "b": 1.0}, 1, {}) == {"a": 1}  # a mini handed nothing is left out
    assert hand_back({}, 10, {}) == {}
    assert hand_back({"a": 1.0}, 0, {}) == {}


def test_what_a_joins_minis_left_unspent_goes_to_that_join_only():
    tasks = [Task("m1", "mini", (), "j", 1.0, 32), Task("m2", "mini", (), "j", 1.0, 32),
             Task("m3", "mini", (), "other", 1.0, 32), Task("j", "joined", (), None, 1.0, 8)]
    assert unspent(tasks, "j", {"m1": 20}) == 12  # m2 not run yet: nothing of it counted
    assert unspent(tasks, "j", {"m1": 40}) == 0


@pytest.mark.parametrize("best, seed, minis, ratio, why", [
    (None, None, None, 0.8, "slower than its minis"),  # timed together: minis ÷ join × 1.1 < 1
    (None, None, None, 0.95, None),
    (1.2, None, 1.0, None, "slower than its minis"),  # recorded times: 1.2 > 1.0 × 1.1
    (1.05, 1.06, 1.0, None, "no gain on its seed"),  # 1.05 ≥ 1.06 × 0.98
    (1.0, 1.06, 1.0, None, None),
])
def test_a_join_yields_when_slower_than_its_minis_or_no_better_than_its_seed(best, seed, minis, ratio, why):
    assert join_yields(best, seed, minis, ratio, join_margin=0.10, stable_tolerance=0.02) == why


def test_a_rounds_expected_gain_starts_at_the_prior_and_follows_what_the_search_closed():
    assert expected_gain([], 16) == 0.5
    assert expected_gain([1.0] * 16, 16) == 0.25  # one round: the prior alone
    assert expected_gain([2.0] * 16 + [1.0] * 16, 16) == pytest.approx((0.5 + 1 / 6) / 2)


def test_a_task_at_its_roofline_floor_gains_nothing_however_slow():
    assert roofline_gain([1.0] * 4, 16, 1.0) == 0.0
    assert roofline_gain([], 16, 1.0) == 0.0
    assert roofline_gain([2.0], 16, 1.0) == pytest.approx(0.5 * 0.5 * 16 / 17)


def test_a_tasks_time_is_its_verified_latency_else_its_best_measured():
    verified = {"a": {"status": "verified", "latency_ms": 1.5}, "b": {"status": "unverified"}}
    progress = {"b": {"best_ms": 2.0}, "c": {"best_ms": None}, "d": {"best_ms": math.inf}}
    assert [task_ms(n, verified, progress) for n in "abcde"] == [1.5, 2.0, None, None, None]


def test_the_next_round_goes_where_it_saves_the_most_model_time():
    gains = round_gains({"a": 2.0, "b": 1.0}, {"a": [], "b": []}, 16)
    assert gains == {"a": 1.0, "b": 0.5} and next_round(gains) == "a"
    floors = round_gains({"a": 2.0, "b": 1.0}, {"a": [1.0], "b": [2.0]}, 16, {"a": 1.0, "b": 1.0})
    assert floors["a"] == 0.0 and next_round(floors) == "b"  # a is at its floor


def test_under_a_deadline_the_next_round_goes_where_it_saves_the_most_per_second():
    gains = {"big": 1.0, "small": 0.6, "new": 0.5}
    progress = {"big": {"searched": 32, "search_s": 64.0}, "small": {"searched": 32, "search_s": 16.0}, "new": {}}
    per_trial = trial_seconds(progress, gains)
    assert per_trial == {"big": 2.0, "small": 0.5}  # "new" has not searched: it counts the median
    assert next_round(gains) == "big" and next_round(gains, per_trial) == "small"
    assert next_round({"big": 1.0, "new": 0.9}, {"big": 2.0}) == "big"  # both at 2 s a trial


def test_the_scheduler_imports_no_tvm():
    code = "import sys, toolchain.tune.budget; sys.exit('tvm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
