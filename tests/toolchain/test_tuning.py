"""The tuning driver's parts: budgets, stabilisation, the database directory, composing minis'
schedules on join, applying verified records. The end-to-end session (real MetaSchedule trials)
is marked slow."""

import dataclasses
import json
import math
import re

import pytest

import models
from toolchain import build, onnx_import, partition, roofline
from toolchain.opgraph import op_graph
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune import adapter, candidates, compose, pairing
from toolchain.tune.adapter import (
    latency,
    postprocess,
    records_of,
    session_cost_model,
    space_for,
    trial_latencies,
    tune_trials,
    workload_module,
)
from toolchain.tune.apply import unfuse_slower
from toolchain.tune.budget import budgets, expected_gain, roofline_gain, stabilised
from toolchain.tune.compose import compose_joined, restore_unroll
from toolchain.tune.db import TuneDB, compare, import_records, status
from toolchain.tune.events import AtRoof, Exhausted, JoinYields, Roof, Round, SearchFailed, Seeded, TaskStarted
from toolchain.tune.plan import block_names, first_pass_trials, floor_trials, map_blocks, plan_tasks
from toolchain.tune.roof import RoofMeter
from toolchain.tune.session import model_times, tune_model
from toolchain.tune.settings import SCHEMA, TuneSettings, TuningError
from toolchain.tune.traces import plain, rename_blocks, replay_tolerant, unroll_of

SPEC = resolve_target("host")
NCHW = resolve_target("host", layout="NCHW")  # plans counted in kernels: no edge transposes


def test_budgets_follow_weights_in_whole_batches_and_add_up():
    assert budgets([1.0, 3.0], total=64, minimum=16) == [16, 48]
    assert budgets([1.0, 100.0], total=64, minimum=16) == [16, 48]  # every kernel gets a batch
    assert sum(budgets([1.0, 1.0, 1.0], total=64, minimum=16)) == 64  # remainders are not lost
    assert budgets([1.0] * 5, total=64, minimum=16) == [16] * 4 + [0]  # more kernels than batches: four reached
    assert budgets([], total=64, minimum=16) == []
    # the one-batch floor never pushes the sum over the budget: the heavy kernels give way
    assert budgets([2.5, 0.3, 0.2], total=48, minimum=16) == [16, 16, 16]
    assert sum(budgets([50.0, 1.0, 1.0, 1.0, 30.0], total=160, minimum=16)) == 160


def test_stabilised_means_no_gain_over_the_last_window():
    assert not stabilised([5, 4, 3, 2], window=2, tolerance=0.02)  # still improving
    assert stabilised([5, 4, 3, 3, 3, 2.99], window=2, tolerance=0.02)
    assert not stabilised([5, 4, 3], window=2, tolerance=0.02)  # too few trials to tell
    assert not stabilised([math.inf] * 6, window=2, tolerance=0.02)


def test_rename_blocks_rewrites_block_lookups_and_drops_postprocessing():
    trace = [
        [
            ["GetSBlock", [], ["conv2d_nchw", "main"], ["b0"]],
            ["SamplePerfectTile", ["l1"], [2, 64], ["v0", "v1"]],
            ["EnterPostproc", [], [], []],
            ["GetChildBlocks", ["b9"], [], ["b10", "b11"]],
        ],
        [[1, [4, 8]], [3, [0]]],
    ]
    renamed = rename_blocks(trace, {"conv2d_nchw": "conv2d_nchw_1"})
    assert renamed[0][0][2] == ["conv2d_nchw_1", "main"] and renamed[0][1] == trace[0][1]
    assert len(renamed[0]) == 2 and renamed[1] == [[1, [4, 8]]]  # postproc steps depend on the whole func


def test_block_map_sends_each_mini_block_to_the_same_op_block_in_the_joined_kernel(dwsep_split):
    _, graph, plan, split, (_, joined), minis = dwsep_split
    mapping = map_blocks(graph, split.plan.groups[1], plan.groups[0], minis[1][1], joined)
    joined_blocks = block_names(joined)
    mini_blocks = block_names(minis[1][1])
    assert len(mapping) == len(mini_blocks) and set(mapping.values()) <= set(joined_blocks)
    # the depthwise conv block of the mini is the depthwise conv block of the joined kernel
    assert mapping["group_conv2d_nchw"].startswith("group_conv2d_nchw")


def test_composing_a_mini_schedule_onto_the_joined_kernel(dwsep_split):
    from tvm import s_tir

    _, graph, plan, split, (_, joined), minis = dwsep_split
    mini_func = minis[1][1]  # the depthwise mini
    sch = s_tir.Schedule(workload_module(mini_func))
    block = sch.get_sblock("group_conv2d_nchw")
    outer, _ = sch.split(sch.get_loops(block)[1], [None, 8])
    sch.parallel(outer)
    trace = plain(sch.trace.as_json())
    mapping = map_blocks(graph, split.plan.groups[1], plan.groups[0], mini_func, joined)
    composed = compose_joined(joined, [(trace, mapping)])
    assert composed is not None
    assert "T.parallel" in composed.mod["main"].script()
    # a trace that names blocks the joined kernel lacks is skipped, not fatal
    assert compose_joined(joined, [(trace, {"group_conv2d_nchw": "nope"})]) is None


def test_scheduling_a_workload_leaves_the_kernel_it_was_made_from_as_it_was(dwsep_split):
    from tvm import s_tir

    func = dwsep_split[-1][1][1]
    before = func.script()
    sch = s_tir.Schedule(workload_module(func))  # a module nothing else holds: edited in place
    sch.split(sch.get_loops(sch.get_sblock("group_conv2d_nchw"))[1], [None, 2])
    assert func.script() == before


def test_a_kernels_latencies_come_in_commit_order_the_database_lists_them_best_first(dwsep_split, tmp_path):
    """stabilised() reads the trials in the order they were measured; MetaSchedule's database hands a
    workload's records back sorted (with it every mini looked stable after two windows)."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    (_, first), (_, second) = dwsep_split[-1][:2]
    db = TuneDB(tmp_path)
    database = db.ms_database()
    order = {first: [3e-3, 1e-3, 2e-3], second: [5e-3, 4e-3]}
    for i in range(3):
        for func, secs in order.items():
            if i < len(secs):
                mod = workload_module(func)
                database.commit_tuning_record(ms.database.TuningRecord(
                    s_tir.Schedule(mod).trace, database.commit_workload(mod), [secs[i]], SPEC.tvm(),
                    ms.arg_info.ArgInfo.from_prim_func(func)))
    assert trial_latencies(db.ms_dir, first) == pytest.approx([3e-3, 1e-3, 2e-3])
    assert trial_latencies(db.ms_dir, second) == pytest.approx([5e-3, 4e-3])
    assert [latency(r) for r in records_of(database, first)] == pytest.approx([1e-3, 2e-3, 3e-3])


def _mini_trace(func, block: str, unroll: int):
    """A MetaSchedule-like trace of one mini: split + parallel of ``block``, and the sampled auto-unroll
    depth as the root annotation (how ParallelizeVectorizeUnroll records it)."""
    from tvm import s_tir

    sch = s_tir.Schedule(workload_module(func))
    b = sch.get_sblock(block)
    outer, _ = sch.split(sch.get_loops(b)[1], [None, 2])
    sch.parallel(outer)
    depth = sch.sample_categorical([0, 16, 64, 512], [0.25] * 4, decision=[0, 16, 64, 512].index(unroll))
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", depth)
    return plain(sch.trace.as_json())


def test_each_composed_nest_keeps_its_own_minis_unroll_depth(dwsep_split):
    """MetaSchedule keeps one auto-unroll depth per kernel (a root annotation): composed, the last
    mini's would rule every nest."""
    _, graph, plan, split, (_, joined), minis = dwsep_split
    parts = []
    for i, depth in ((0, 512), (1, 16)):  # the pointwise mini (depth 512), the depthwise one (16)
        func = minis[i][1]
        block = next(n for n in block_names(func) if "conv" in n)
        trace = _mini_trace(func, block, depth)
        assert unroll_of(trace) == depth
        parts.append((trace, map_blocks(graph, split.plan.groups[i], plan.groups[0], func, joined)))
    sch = postprocess(compose_joined(joined, parts), SPEC)
    assert restore_unroll(sch, parts) >= 2
    depths = re.findall(r'"pragma_auto_unroll_max_step": (\d+)', sch.mod["main"].script())
    assert "512" in depths and "16" in depths


def test_a_step_that_does_not_replay_on_the_joined_kernel_is_left_out(dwsep_split):
    """A step without results that fails on the joined kernel is dropped, the rest of the mini's
    schedule still applies; a failing lookup (a step with results) ends the trace there."""
    _, graph, plan, split, (_, joined), minis = dwsep_split
    func = minis[1][1]  # the depthwise mini
    block = "group_conv2d_nchw"
    insts, decisions = _mini_trace(func, block, 64)
    lookup = next(i for i, inst in enumerate(insts) if inst[0] == "GetSBlock" and inst[2][0] == block)
    # a step that fails anywhere (inlining the conv, a reduction) and has no results, right after the lookup
    bad = ["ComputeInline", [insts[lookup][3][0]], [], []]
    trace = [insts[: lookup + 1] + [bad] + insts[lookup + 1:], [[d[0] + (d[0] > lookup), d[1]] for d in decisions]]
    mapping = map_blocks(graph, split.plan.groups[1], plan.groups[0], func, joined)
    replayed, kept, dropped = replay_tolerant(
    __import__("tvm").s_tir.Schedule(workload_module(joined)), rename_blocks(trace, mapping))
    assert dropped == ["ComputeInline"] and "T.parallel" in replayed.mod["main"].script()
    assert unroll_of(kept) == 64  # decisions re-indexed past the dropped step
    assert compose_joined(joined, [(trace, mapping)]) is not None
    assert compose_joined(joined, [(trace, {block: "nope"})]) is None  # only the failed lookup: nothing


def test_a_composed_seed_is_postprocessed_like_every_candidate(dwsep_split):
    """MetaSchedule traces carry parallel/vectorise as root annotations that only its postprocessors
    turn into loops: a composed seed built without them ran on one core, scalar."""
    from tvm import s_tir

    _, graph, plan, split, (_, joined), minis = dwsep_split
    mini_func = minis[1][1]
    sch = s_tir.Schedule(workload_module(mini_func))
    sch.annotate(sch.get_sblock("root"), "meta_schedule.parallel", 32)
    sch.annotate(sch.get_sblock("root"), "meta_schedule.vectorize", 64)
    trace = plain(sch.trace.as_json())
    mapping = map_blocks(graph, split.plan.groups[1], plan.groups[0], mini_func, joined)
    composed = compose_joined(joined, [(trace, mapping)])
    assert "T.parallel" not in composed.mod["main"].script()  # an annotation only, so far
    done = postprocess(composed, SPEC)
    script = done.mod["main"].script()
    assert "T.parallel" in script and "T.vectorized" in script
    assert any(inst.kind.name == "EnterPostproc" for inst in done.trace.insts)  # replayable as a record


def test_the_reformer_budget_gives_every_mini_a_batch_and_the_join_the_rest(dwsep_split):
    mod, graph, *_ = dwsep_split  # one subgraph of three complex ops (pw, dw, pw)
    roomy = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, roomy)
    assert [t.phase for t in plan.tasks] == ["mini", "mini", "mini", "joined"]  # minis first, then the join
    assert sum(t.budget for t in plan.tasks[:3]) == 32 and plan.tasks[3].budget == 32  # split_fraction 0.5
    assert floor_trials(mod, SPEC, roomy) == 32  # the subgraph's floor: a batch per mini and one for the join
    tight = TuneSettings(trials=32, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, tight)
    assert [(t.phase, t.budget) for t in plan.tasks] == [("mini", 8)] * 3 + [("joined", 8)]
    # a budget under the floor: nothing is planned beyond the user's budget; the heaviest mini gets it
    # (the others start from a seed, or TVM's default schedule, and the subgraph is built as its minis)
    short = TuneSettings(trials=8, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, short)
    budgets = [(t.phase, t.budget) for t in plan.tasks]
    assert sorted(budgets) == [("joined", 0), ("mini", 0), ("mini", 0), ("mini", 8)]
    # without the reformer the subgraph is one kernel with one batch
    _, plan = plan_tasks(mod, graph, SPEC, TuneSettings(trials=8, per_iter=8, reformer=False,
                                                        partition=PartitionSettings(threshold=1e9)))
    assert [(t.phase, t.budget) for t in plan.tasks] == [("kernel", 8)]


def _legalized(model):
    """An ONNX model as the tuner sees it: (legalized module, op graph)."""
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), NCHW)
    return mod, op_graph(mod)


def _twin_blocks():
    """Two identical depthwise → pointwise blocks in a row (legalized module, op graph)."""
    from models.builder import GraphBuilder

    b = GraphBuilder("twin-blocks")
    x = b.input("x", (1, 16, 16, 16))
    for i in range(2):
        x = b.conv(b.conv(x, 16, 16, 3, groups=16, name=f"dw{i}", act="relu"), 16, 16, 1, name=f"pw{i}", act="relu")
    return _legalized(b.finish(x, (1, 16, 16, 16)))


def test_a_kernel_the_model_calls_three_times_gets_three_times_the_trials():
    """Budgets follow each kernel's share of the model's time: its weight (one call) times its calls.
    By weight alone, a kernel run three times got as many trials as one run once."""
    from models.builder import GraphBuilder

    b = GraphBuilder("thrice")
    x = b.input("x", (1, 16, 16, 16))
    for i in range(3):
        x = b.conv(x, 16, 16, 1, name=f"pw{i}", act="relu")
    x = b.conv(x, 16, 16, 1, name="last")  # no activation: a kernel of its own, called once
    mod, graph = _legalized(b.finish(x, (1, 16, 16, 16)))
    settings = TuneSettings(trials=64, per_iter=16, partition=PartitionSettings("stock"))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    assert sorted((t.calls, t.budget) for t in plan.tasks) == [(1, 16), (3, 48)]


@pytest.mark.parametrize("threshold, groups", [(1e9, 1), (30.0, 2)])
def test_a_mini_tuned_elsewhere_is_not_charged_to_the_join_again(threshold, groups):
    """A split subgraph's floor is a batch per mini it brings and one for its join. Its minis that are
    tuned once elsewhere (an identical mini of the same join or of an earlier one, or a kernel) cost
    nothing here: charged again, they took batches from the kernels (MobileNet-V2 at 960 trials: every
    kernel one batch while late joins got three)."""
    mod, graph = _twin_blocks()
    tight = TuneSettings(trials=24, per_iter=8, partition=PartitionSettings(threshold=threshold))
    _, plan = plan_tasks(mod, graph, SPEC, tight)
    assert len(plan.groups) == groups
    # one subgraph dw pw dw pw (two distinct minis); or dw pw dw + the kernel pw (one mini of its own)
    assert sorted(t.phase for t in plan.tasks) == sorted(["mini", "mini", "joined"] if groups == 1
                                                         else ["mini", "kernel", "joined"])
    assert [t.budget for t in plan.tasks] == [8, 8, 8]  # a batch each: 24 trials, not 40
    assert floor_trials(mod, SPEC, tight) == 24


def test_a_kernel_that_is_also_a_joins_mini_is_tuned_before_every_join():
    """MnasNet repeats blocks: one op group is a kernel of its own in one place and a mini of a split
    subgraph in another (one task). A join is composed from its minis' verified schedules, so that
    kernel must be tuned before the joins (it was not: a join started with one conv unscheduled)."""
    mod, graph = _legalized(models.build("mnasnet", (1, 3, 56, 56)))
    _, plan = plan_tasks(mod, graph, SPEC, TuneSettings(trials=256))
    phase = {t.name: t.phase for t in plan.tasks}
    shared = {n for parts in plan.compositions.values() for n, _ in parts if phase[n] == "kernel"}
    assert shared  # the case exists
    first_join = min(i for i, t in enumerate(plan.tasks) if t.phase == "joined")
    assert all(i < first_join for i, t in enumerate(plan.tasks) if t.name in shared)


@pytest.fixture
def fake_search(monkeypatch):
    """MetaSchedule replaced by a fake search: every trial of a kernel measures 1 ms, or what
    ``trials.speed_ms[script]`` says (so every mini stabilises after its first two windows), and every
    tuned kernel verifies at that latency. Returns the trials (kernel script -> latencies in s)."""

    class Trials(dict):
        speed_ms: dict = {}

    trials = Trials()
    ms = lambda func: trials.speed_ms.get(func.script(), 1.0)  # noqa: E731
    monkeypatch.setattr(adapter, "records_of", lambda database, func: trials.get(func.script(), []))
    monkeypatch.setattr(adapter, "latency", lambda record: record)
    monkeypatch.setattr(adapter, "trial_latencies", lambda work_dir, func: list(trials.get(func.script(), [])))
    monkeypatch.setattr(adapter, "trial_latencies_of", lambda work_dir, funcs, hashes=None: {
        name: list(trials.get(func.script(), [])) for name, func in funcs.items()})
    monkeypatch.setattr(adapter, "tune_trials", lambda func, spec, database, n, *a, **k:
                        trials.setdefault(func.script(), []).extend([ms(func) / 1e3] * n))
    monkeypatch.setattr(compose, "seed_joined", lambda *a, **k: False)
    monkeypatch.setattr(compose, "seed_from_siblings", lambda *a, **k: [])  # (tests/toolchain/test_transfer.py)
    monkeypatch.setattr(adapter, "session_cost_model", lambda *a, **k: None)  # (no records to learn from)
    # (no schedules to time; tests/toolchain/test_pairing.py times real ones)
    monkeypatch.setattr(pairing, "pair_joins", lambda *a, **k: 0)
    monkeypatch.setattr(pairing, "first_batch_vs_minis", lambda *a, **k: None)
    monkeypatch.setattr(RoofMeter, "start", lambda self, on_event: None)  # no roof: tests below set one
    monkeypatch.setattr(candidates, "verify_task", lambda task, func, *a, **k: {
        "status": "verified" if trials.get(func.script()) else "untuned", "latency_ms": ms(func),
        "trials": len(trials.get(func.script(), []))})
    return trials


def test_minis_that_stabilise_early_hand_their_trials_to_the_join(dwsep_split, tmp_path, fake_search):
    """The session spends its whole budget: what the minis leave goes to their joined kernel; a
    resumed session neither re-tunes a stabilised mini nor adds trials."""
    mod, graph, *_ = dwsep_split
    trials = fake_search
    settings = TuneSettings(trials=256, per_iter=8, stable_window=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    minis = [t for t in plan.tasks if t.phase == "mini"]
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    assert all(t.budget > 16 for t in minis)  # room to stop early
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    used = {t.name: len(trials[plan.funcs[t.name].script()]) for t in plan.tasks}
    assert all(used[t.name] == 16 for t in minis)  # stable after two windows
    assert used[joined.name] == joined.budget + sum(t.budget - 16 for t in minis)
    assert sum(used.values()) == settings.trials == 256  # the budget, exactly
    assert [e.budget for e in events if isinstance(e, TaskStarted) and e.task == joined.name] == [used[joined.name]]
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)  # resume: nothing left to do
    assert {t.name: len(trials[plan.funcs[t.name].script()]) for t in plan.tasks} == used


def test_a_join_still_slower_than_its_minis_after_a_batch_hands_its_trials_back(dwsep_split, tmp_path, fake_search):
    """Where joining does not pay (here: the joined kernel measures 5 ms, its three minis 1 ms each),
    the join stops after one batch and its minis tune on with the rest of its budget: the subgraph is
    built as its minis anyway, so those trials are better spent on them. Nothing more on resume."""
    mod, graph, *_ = dwsep_split
    trials = fake_search
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    minis = [t for t in plan.tasks if t.phase == "mini"]
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    trials.speed_ms[plan.funcs[joined.name].script()] = 5.0
    events = []
    summary = tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    used = {t.name: len(trials[plan.funcs[t.name].script()]) for t in plan.tasks}
    assert used[joined.name] == settings.per_iter  # one batch, then it yields
    (info,) = [e for e in events if isinstance(e, JoinYields)]
    assert info.best_ms == 5.0 and info.minis_ms == 3.0 and info.left == joined.budget - settings.per_iter
    assert sum(used[t.name] for t in minis) == sum(t.budget for t in minis) + info.left  # nothing lost
    assert sum(used.values()) == settings.trials == 64
    rows = {r["task"]: r for r in summary["tasks"]}
    assert rows[joined.name]["handed_back"] == info.left
    assert all(rows[t.name]["trials"] == used[t.name] for t in minis)  # re-verified with their new trials
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)  # resume: nothing left to do
    assert {t.name: len(trials[plan.funcs[t.name].script()]) for t in plan.tasks} == used
    # a database whose join handed trials to a mini an older split had (not in this plan): resuming skips it
    db = TuneDB(tmp_path)
    progress = db.progress
    progress[joined.name]["handed_back"]["fused_gone-000000000000"] = 99
    db.save_progress(progress)
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)
    assert {t.name: len(trials[plan.funcs[t.name].script()]) for t in plan.tasks} == used
    # a join that keeps up with its minis (1 ms vs 3 ms) and has no seed to beat spends its whole budget
    trials.clear()
    trials.speed_ms.clear()
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path / "fast")
    assert len(trials[plan.funcs[joined.name].script()]) == joined.budget


@pytest.mark.parametrize("stable", [False, True])
def test_a_resumed_session_with_a_larger_budget_spends_it_where_a_join_handed_back(
        dwsep_split, tmp_path, fake_search, stable):
    """Topping a database up (resuming with a larger --trials) spends the whole new budget. A join
    that handed its rest to its minis, and minis that stabilised (their unspent goes to that join),
    kept their old counts on resume: the growth was neither searched nor carried (MobileNet-V2
    topped up from 2x to 4x spent 3189 of 3968 trials). It goes to the join's minis now, once."""
    mod, graph, *_ = dwsep_split
    trials = fake_search
    small = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9),
                         stable_window=8 if stable else 10_000)
    _, plan = plan_tasks(mod, graph, SPEC, small)
    minis = [t for t in plan.tasks if t.phase == "mini"]
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    trials.speed_ms[plan.funcs[joined.name].script()] = 5.0  # slower than its minis: it hands back
    tune_model(mod, "a" * 64, SPEC, small, tmp_path)
    used = lambda: {t.name: len(trials.get(plan.funcs[t.name].script(), [])) for t in plan.tasks}  # noqa: E731
    assert sum(used().values()) == 64
    before = {r["task"]: r for r in status(tmp_path)["tasks"]}[joined.name]["handed_back"]
    large = dataclasses.replace(small, trials=256)
    tune_model(mod, "a" * 64, SPEC, large, tmp_path)
    after = used()
    assert after[joined.name] == small.per_iter  # still the one batch: the growth went to the minis
    assert sum(after.values()) == large.trials == 256
    assert all(after[t.name] > 16 for t in minis)
    handed = {r["task"]: r for r in status(tmp_path)["tasks"]}[joined.name]["handed_back"]
    _, big = plan_tasks(mod, graph, SPEC, large)
    own = sum(16 if stable else t.budget for t in big.tasks if t.phase == "mini")  # what minis tune by themselves
    assert handed > before and handed == 256 - small.per_iter - own  # the rest, recorded as handed back
    tune_model(mod, "a" * 64, SPEC, large, tmp_path)  # resumed again at that budget: nothing more
    assert used() == after


def test_a_join_whose_first_batch_finds_nothing_better_than_its_seed_goes_back_to_its_minis(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """At these budgets a joined kernel's search rarely beats the composition of its tuned minis:
    when its first batch found nothing faster than that seed, the minis get the rest of its budget
    and the join is composed again from their (better) schedules."""
    mod, graph, *_ = dwsep_split
    trials = fake_search
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    script = plan.funcs[joined.name].script()
    seeds = []

    def seed(task, *args, **kwargs):
        seeds.append(task.name)
        trials.setdefault(script, []).append(1e-3)  # the composed seed: 1 ms, as fast as the search gets
        return True

    monkeypatch.setattr(compose, "seed_joined", seed)
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    (info,) = [e for e in events if isinstance(e, JoinYields)]
    assert info.reason == "no gain on its seed" and info.seed_ms == 1.0
    assert seeds == [joined.name, joined.name]  # seeded, then seeded again after the minis went on
    assert len(trials[script]) == 1 + settings.per_iter + 1
    assert [e.again for e in events if isinstance(e, Seeded)] == [False, True]
    used = sum(len(v) for k, v in trials.items() if k != script)
    assert used == sum(t.budget for t in plan.tasks if t.phase == "mini") + info.left
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)  # resume: no third seed, no more trials
    assert seeds == [joined.name, joined.name] and len(trials[script]) == 1 + settings.per_iter + 1


def test_a_join_starts_from_its_composed_minis_and_from_joins_like_it(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """A join's first records are its composed seed and its siblings' seeds (joins of the same blocks
    tuned before it); they count against its budget, and the best of them is the seed its first
    batch must beat."""
    mod, graph, *_ = dwsep_split
    trials = fake_search
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9), transfer=2)
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    script = plan.funcs[joined.name].script()

    def composed(task, *args, **kwargs):
        trials.setdefault(script, []).append(1e-3)
        return True

    def siblings(task, *args, **kwargs):
        if task.phase != "joined":
            return []
        trials.setdefault(script, []).extend([0.5e-3, 2e-3])  # one sibling's seed faster than the composed one
        return ["another join", "a third join"]

    monkeypatch.setattr(compose, "seed_joined", composed)
    monkeypatch.setattr(compose, "seed_from_siblings", siblings)
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    (seeded,) = [e for e in events if isinstance(e, Seeded) and e.task == joined.name and not e.again]
    assert seeded.composed and seeded.siblings == ["another join", "a third join"] and seeded.best_ms == 0.5
    (info,) = [e for e in events if isinstance(e, JoinYields)]
    assert info.reason == "no gain on its seed" and info.seed_ms == 0.5  # the search's 1 ms does not beat it
    assert trials[script][:3] == [1e-3, 0.5e-3, 2e-3]
    assert len(trials[script]) == 3 + settings.unit + 1  # three seeds, a batch, the composition again
    rows = {r["task"]: r for r in status(tmp_path)["tasks"]}
    assert rows[joined.name]["seeded_from"] == 2
    none = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9), transfer=0)
    calls = []
    monkeypatch.setattr(compose, "seed_from_siblings", lambda *a, **k: calls.append(a[0].name) or [])
    tune_model(mod, "a" * 64, SPEC, none, tmp_path / "none", lambda event: None)
    assert joined.name not in calls  # --transfer 0: the composed seed only


def test_a_search_that_fails_ends_its_task_not_the_session(dwsep_split, tmp_path, fake_search, monkeypatch):
    """A TVM space that raises on a kernel's structure (seen: the stock space on SqueezeNet's fire
    module, two convs into one concat) is recorded; the session goes on; compile --db builds the
    subgraph as its verified minis."""
    mod, graph, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    fake = adapter.tune_trials

    def tune_trials(func, *args, **kwargs):
        if func.script() == plan.funcs[joined.name].script():
            raise RuntimeError("ScheduleError: An error occurred in the schedule primitive 'reverse-compute-at'.")
        return fake(func, *args, **kwargs)

    monkeypatch.setattr(adapter, "tune_trials", tune_trials)
    events = []
    summary = tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    rows = {r["task"]: r for r in summary["tasks"]}
    assert any(isinstance(e, SearchFailed) for e in events)
    assert "reverse-compute-at" in rows[joined.name]["search_error"]
    assert rows[joined.name]["status"] == "untuned"
    assert all(rows[t.name]["status"] == "verified" for t in plan.tasks if t.phase == "mini")
    assert summary["estimate_ms"] == pytest.approx(3.0)  # the three minis, built in its place
    built, unfused = unfuse_slower(partition.plan(PartitionSettings(threshold=1e9), mod, SPEC, graph=graph), tmp_path)
    assert len(unfused) == 1 and unfused[0]["joined_ms"] is None and "no verified schedule" in unfused[0]["reason"]
    assert len(built.groups) == 3
    # without the reformer: a kernel whose search fails leaves its trials to the next kernel
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    first, second = plan.tasks[:2]
    fake_search.clear()
    failing = plan.funcs[first.name].script()

    def tune_first_fails(func, *args, **kwargs):
        if func.script() == failing:
            raise RuntimeError("ScheduleError")
        return fake(func, *args, **kwargs)

    monkeypatch.setattr(adapter, "tune_trials", tune_first_fails)
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path / "flat")
    assert len(fake_search.get(plan.funcs[second.name].script(), [])) == second.budget + first.budget


def test_an_exhausted_kernel_leaves_its_trials_to_the_next_and_is_not_searched_again(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    first, second = plan.tasks[:2]
    fake, small = adapter.tune_trials, plan.funcs[first.name].script()

    def tune_trials(func, spec, database, n, *args, **kwargs):  # the first kernel has 5 schedules in all
        if func.script() != small:
            return fake(func, spec, database, n, *args, **kwargs)
        left = 5 - len(fake_search.get(small, []))  # past those, one repeat per call (a tuner that
        fake(func, spec, database, max(1, min(n, left)), *args, **kwargs)  # ignored the flag would go on)
        return True

    monkeypatch.setattr(adapter, "tune_trials", tune_trials)
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    assert Exhausted(task=first.name, done=5, left=first.budget - 5) in events
    assert len(fake_search[small]) == 5
    assert len(fake_search[plan.funcs[second.name].script()]) == second.budget + first.budget - 5
    rows = {r["task"]: r for r in status(tmp_path)["tasks"]}
    assert rows[first.name]["exhausted"] and not rows[second.name]["exhausted"]
    events.clear()
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    assert not any(isinstance(e, Exhausted) for e in events) and len(fake_search[small]) == 5  # resumed: done


def test_a_kernel_whose_search_measures_nothing_ends_instead_of_searching_until_the_deadline(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """A space whose every sample fails the static checks gives a search call nothing to measure: the task ends as
    an exhausted one (its trials to the next kernel) after one call, not one call after another until the deadline."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    first, second = plan.tasks[:2]
    fake, dry = adapter.tune_trials, plan.funcs[first.name].script()
    calls = []

    def tune_trials(func, spec, database, n, *args, **kwargs):
        if func.script() != dry:
            return fake(func, spec, database, n, *args, **kwargs)
        calls.append(n)
        return False  # nothing measured, and MetaSchedule's exhaustion callback never ran

    monkeypatch.setattr(adapter, "tune_trials", tune_trials)
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    assert len(calls) == 1 and Exhausted(task=first.name, done=0, left=first.budget) in events
    assert len(fake_search[plan.funcs[second.name].script()]) == second.budget + first.budget
    assert json.loads((tmp_path / "progress.json").read_text())[first.name]["exhausted"]


def test_what_the_last_kernel_leaves_goes_round_by_round_so_the_whole_budget_is_spent(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """The weight plan's carry has no task after the last kernel: it goes in rounds to the kernels
    that save the model most, as with the latency scheduler; a resumed session adds nothing."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    last, others = plan.tasks[-1], plan.tasks[:-1]
    fake, small = adapter.tune_trials, plan.funcs[last.name].script()
    slow = plan.funcs[others[0].name].script()
    fake_search.speed_ms[slow] = 5.0  # the model's slowest kernel: where the rounds go

    def tune_trials(func, spec, database, n, *args, **kwargs):  # the last kernel has 5 schedules in all
        if func.script() != small:
            return fake(func, spec, database, n, *args, **kwargs)
        fake(func, spec, database, max(1, min(n, 5 - len(fake_search.get(small, [])))), *args, **kwargs)
        return True

    monkeypatch.setattr(adapter, "tune_trials", tune_trials)
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    used = {t.name: len(fake_search[plan.funcs[t.name].script()]) for t in plan.tasks}
    assert used[last.name] == 5 and last.budget > 5
    assert sum(used.values()) == flat.trials  # before: 5 - last.budget short
    rounds = [e for e in events if isinstance(e, Round)]
    assert rounds and {r.task for r in rounds} == {others[0].name} and rounds[0].left == last.budget - 5
    assert used[others[0].name] == others[0].budget + last.budget - 5
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path)  # resumed: nothing left to spend
    assert {t.name: len(fake_search[plan.funcs[t.name].script()]) for t in plan.tasks} == used


def _roof(monkeypatch, rates: list[float]):
    """The session's roof probe timed at ``rates`` (multiply-adds per ms), one per timing; returns the timings."""
    timed = []

    def start(meter, on_event):
        meter.probe = ("probe", "a fake probe")
        meter.rate = meter.time(None)
        on_event(Roof(gflops=roofline.gflops(meter.rate), share=meter.settings.roof_share, probe="a fake probe"))

    def time(meter, sch):
        timed.append(rates[min(len(timed), len(rates) - 1)])
        return timed[-1]

    monkeypatch.setattr(RoofMeter, "start", start)
    monkeypatch.setattr(RoofMeter, "time", time)
    return timed


def test_a_kernel_at_the_roof_is_searched_no_further_and_its_trials_go_to_the_others(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """A kernel whose best reaches the roof's share stops after its first batch; the trials it leaves go to
    the kernel still below it, so the budget is spent; with --roof 0 every kernel takes its own budget."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    fast, slow = plan.tasks[0], plan.tasks[1]
    work = {t.name: roofline.cost(plan.funcs[t.name]).reduce for t in plan.tasks}
    assert work[fast.name] and fast.budget > 2 * flat.per_iter
    roof = work[fast.name] / 1.0  # its 1 ms: the roof's rate
    for t in plan.tasks:  # every other kernel at a tenth of it
        if t.name != fast.name:
            fake_search.speed_ms[plan.funcs[t.name].script()] = 10 * work[t.name] / roof
    _roof(monkeypatch, [roof])
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    used = {t.name: len(fake_search.get(plan.funcs[t.name].script(), [])) for t in plan.tasks}
    stops = [e for e in events if isinstance(e, AtRoof)]
    assert [(e.task, e.done) for e in stops] == [(fast.name, 2 * flat.per_iter)]  # after its first search call
    assert stops[0].share == pytest.approx(1.0) and stops[0].left == fast.budget - 2 * flat.per_iter
    assert used[fast.name] == 2 * flat.per_iter and used[slow.name] > slow.budget
    assert sum(used.values()) == flat.trials  # the rest went on: the budget spent, not more
    assert json.loads((tmp_path / "progress.json").read_text())[fast.name]["at_roof"] == pytest.approx(1.0)
    rows = {r["task"]: r for r in status(tmp_path)["tasks"]}
    assert rows[fast.name]["at_roof"] == pytest.approx(1.0) and rows[slow.name]["at_roof"] is None

    fake_search.clear()
    tune_model(mod, "a" * 64, SPEC, dataclasses.replace(flat, roof_share=0.0), tmp_path / "off")
    assert {t.name: len(fake_search.get(plan.funcs[t.name].script(), [])) for t in plan.tasks}[fast.name] \
        == fast.budget


def test_when_every_kernel_is_at_the_roof_the_session_ends_before_its_budget(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    roof = max(roofline.cost(f).reduce for f in plan.funcs.values())  # the heaviest at 1 ms
    for t in plan.tasks:  # every kernel at 90 % of it
        work = roofline.cost(plan.funcs[t.name]).reduce
        fake_search.speed_ms[plan.funcs[t.name].script()] = work / roof / 0.9 if work else 1.0
    _roof(monkeypatch, [roof])
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    reduce = [t for t in plan.tasks if roofline.cost(plan.funcs[t.name]).reduce]
    assert {e.task for e in events if isinstance(e, AtRoof)} == {t.name for t in reduce if t.budget}
    spent = sum(len(v) for v in fake_search.values())
    assert spent < flat.trials and not any(isinstance(e, Round) and e.task in {t.name for t in reduce}
                                           for e in events)


def test_a_kernel_well_above_the_roof_has_the_probe_timed_again_and_raises_the_roof(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """A probe timed while the machine was slow for a moment sets the roof too low: the first kernel measured
    at twice its rate has it timed again (the roof then the faster of the two), at most twice a session."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    work = {t.name: roofline.cost(plan.funcs[t.name]).reduce for t in plan.tasks}
    first = plan.tasks[0]
    true_roof = work[first.name] / 1.0
    for t in plan.tasks:  # every kernel at half the true roof
        fake_search.speed_ms[plan.funcs[t.name].script()] = 2 * work[t.name] / true_roof if work[t.name] else 1.0
    timed = _roof(monkeypatch, [true_roof / 4, true_roof])  # the first probe slow: every kernel 2× "the roof"
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    roofs = [e for e in events if isinstance(e, Roof)]
    assert len(timed) == 2 and roofs[1].reason.startswith("timed again")
    assert roofs[1].gflops == pytest.approx(roofline.gflops(true_roof))
    assert not any(isinstance(e, AtRoof) for e in events)  # at half the true roof: searched on


def test_a_kernel_that_raised_the_roof_is_not_at_the_roof_by_its_own_time(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """The probe is no peak (stock's tuned convs ran above it on this host): a kernel that runs above it raises the
    roof for the others, not for itself — judged against its own rate, it would stop however far from the peak it
    is. A later kernel at 90 % of that rate stops; the one that raised it, above every other, is searched on."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    work = {t.name: roofline.cost(plan.funcs[t.name]).reduce for t in plan.tasks}
    fast, *rest = [t for t in plan.tasks if work[t.name]]
    probe = work[fast.name] / 2.0  # the probe at half the first kernel's rate, timed the same every time
    fake_search.speed_ms[plan.funcs[fast.name].script()] = 1.0
    for t in rest:
        fake_search.speed_ms[plan.funcs[t.name].script()] = work[t.name] / (0.9 * 2 * probe)
    timed = _roof(monkeypatch, [probe])
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    roofs = [e for e in events if isinstance(e, Roof)]
    assert roofs[1].reason.startswith("timed again") and roofs[1].gflops == pytest.approx(roofline.gflops(2 * probe))
    stops = {e.task: e for e in events if isinstance(e, AtRoof)}
    assert fast.name not in stops and len(fake_search[plan.funcs[fast.name].script()]) >= fast.budget
    assert rest and {t.name for t in rest if t.budget} <= set(stops)
    assert all(stops[t.name].share == pytest.approx(0.9) for t in rest if t.budget) and len(timed) <= 3


def test_a_kernel_starts_from_its_siblings_seeds_which_count_against_its_budget(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """Every kernel but the first is offered the verified kernels before it (two seeds each, here);
    the seeds are records of its own, so the search adds only what is left of its budget, and a
    resumed session does not seed again."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False, transfer=2)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    offered = []

    def seed(task, plan_, database, spec, verified, settings, measure=None):
        ready = [n for n, v in verified.items() if v.get("status") == "verified"]
        offered.append((task.name, ready))
        if not ready:
            return []
        fake_search.setdefault(plan_.funcs[task.name].script(), []).extend([0.5e-3] * settings.transfer)
        return ready[: settings.transfer]

    monkeypatch.setattr(compose, "seed_from_siblings", seed)
    events = []
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, events.append)
    assert [name for name, _ in offered] == [t.name for t in plan.tasks]
    assert offered[0][1] == [] and offered[1][1] == [plan.tasks[0].name]  # what is verified by then
    for t in plan.tasks:  # seeds included, every kernel ends at its budget
        assert len(fake_search[plan.funcs[t.name].script()]) == t.budget
    seeded = [e for e in events if isinstance(e, Seeded)]
    assert [e.task for e in seeded] == [t.name for t in plan.tasks[1:]]
    assert all(e.siblings and e.best_ms == 0.5 for e in seeded)
    rows = {r["task"]: r for r in status(tmp_path)["tasks"]}
    assert rows[plan.tasks[0].name]["seeded_from"] == 0 and rows[plan.tasks[1].name]["seeded_from"] == 1
    offered.clear()
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, lambda event: None)
    assert offered == []  # resumed: every kernel has its records


def test_a_resumed_kernel_whose_block_was_never_tried_gets_it_once_within_the_budget(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """A database whose records predate the register blocks (no "block" in its progress) is not built from those
    records alone: resumed, each kernel's block is measured once as one more record (a trial of the budget), and
    never again after; a resumed session with no budget left adds nothing."""
    mod, graph, *_ = dwsep_split
    flat = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0), reformer=False, transfer=2)
    _, plan = plan_tasks(mod, graph, SPEC, flat)
    tried = []

    def block(task, plan_, database, spec, verified, settings, measure=None):
        tried.append(task.name)
        assert settings.transfer == 1  # one seed: the block
        fake_search.setdefault(plan_.funcs[task.name].script(), []).append(0.25e-3)
        return "8x4"

    monkeypatch.setattr(compose, "seed_from_block", lambda *a, **k: "")
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, lambda event: None)
    db = TuneDB(tmp_path)
    assert all(db.progress[t.name]["block"] == "" for t in plan.tasks)  # tried at the first seed: none
    db.save_progress({n: {k: v for k, v in e.items() if k != "block"} for n, e in db.progress.items()})
    monkeypatch.setattr(compose, "seed_from_block", block)
    tune_model(mod, "a" * 64, SPEC, flat, tmp_path, lambda event: None)
    assert tried == []  # the budget is spent: nothing measured
    more, events = dataclasses.replace(flat, trials=96), []
    tune_model(mod, "a" * 64, SPEC, more, tmp_path, events.append)
    assert tried == [t.name for t in plan.tasks]
    assert [e.task for e in events if isinstance(e, Seeded) and e.block == "8x4"] == tried
    assert all(0.25e-3 in fake_search[plan.funcs[t.name].script()] for t in plan.tasks)
    assert sum(len(v) for v in fake_search.values()) == 96  # the block counted against the budget
    assert all(TuneDB(tmp_path).progress[t.name]["block"] == "8x4" for t in plan.tasks)
    tried.clear()
    tune_model(mod, "a" * 64, SPEC, dataclasses.replace(flat, trials=128), tmp_path, lambda event: None)
    assert tried == []  # tried once


def _fake_db(path, mod, graph, settings, joined_ms, mini_ms):
    """A tuning database whose verified latencies are given (no trials run)."""
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    db = TuneDB(path)
    db.open_session({"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"},
                     "settings": settings.to_json()})
    db.save_tasks(plan.tasks)
    db.save_layout(plan)
    minis = iter(mini_ms)
    db.save_verified({
        t.name: {"status": "verified", "phase": t.phase,
                 "latency_ms": joined_ms if t.phase == "joined" else next(minis)}
        for t in plan.tasks
    })
    return db


def test_two_databases_compare_on_the_kernels_both_tuned_whatever_they_are_called(dwsep_split, tmp_path, cli):
    """compare matches kernels by structural hash: another partition's session names the same
    PrimFunc otherwise. Unverified kernels are left out; databases for other targets are refused."""
    mod, graph, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    ago = _fake_db(tmp_path / "ago", mod, graph, settings, joined_ms=0.5, mini_ms=[0.1, 0.2, 0.4])
    tasks = ago.tasks
    other = TuneDB(tmp_path / "stock")  # the same kernels under other names, one of them unverified
    other.open_session({**ago.session, "settings": {**settings.to_json(), "partition": "stock"}})
    renamed = [dataclasses.replace(t, name="stock_" + t.name, phase="kernel", parent=None) for t in tasks]
    other.save_tasks(renamed)
    ms = dict(zip([t.name for t in renamed], [0.1, 0.1, 0.1, 0.25]))  # minis first, then the join
    other.save_verified({n: {"status": "verified", "latency_ms": v} for n, v in ms.items()})
    c = compare(tmp_path / "ago", tmp_path / "stock")
    assert [t.phase for t in tasks] == ["mini"] * 3 + ["joined"]
    assert sorted(r["ratio"] for r in c["kernels"]) == pytest.approx([1.0, 2.0, 2.0, 4.0])
    assert c["geomean"] == pytest.approx(2.0) and c["kernels"][0]["ratio"] == pytest.approx(4.0)  # worst first
    assert {r["other"] for r in c["kernels"]} == set(ms)
    assert {r["task"] for r in c["kernels"]} == {t.name for t in tasks}
    assert c["estimate_ms"] == pytest.approx(0.5) and c["other_estimate_ms"] == pytest.approx(0.55)
    verified = other.verified
    verified[renamed[2].name]["status"] = "failed"  # the 4x mini: not verified there, not compared
    other.save_verified(verified)
    c = compare(tmp_path / "ago", tmp_path / "stock")
    assert len(c["kernels"]) == 3 and c["geomean"] == pytest.approx(4 ** (1 / 3))
    shown = cli("tune", "--status", tmp_path / "ago", "--against", tmp_path / "stock")
    assert shown.exit_code == 0 and "3 kernels tuned in both, geometric mean 1.59×" in shown.stdout
    assert "2.00×" in shown.stdout and "4.00×" not in shown.stdout
    refused = cli("tune", "--against", tmp_path / "stock")
    assert refused.exit_code == 1 and "--against compares two databases" in refused.stderr
    arm = TuneDB(tmp_path / "arm")
    arm.open_session({**ago.session, "target": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}})
    arm.save_tasks(tasks)
    with pytest.raises(TuningError, match="different targets"):
        compare(tmp_path / "ago", tmp_path / "arm")


def test_a_joined_kernel_slower_than_its_minis_is_built_as_the_minis(dwsep_split, tmp_path):
    mod, graph, plan, split, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _fake_db(tmp_path / "slow", mod, graph, settings, joined_ms=0.5, mini_ms=[0.1, 0.1, 0.1])
    built, unfused = unfuse_slower(plan, tmp_path / "slow")
    assert built.groups == split.plan.groups and len(unfused) == 1
    assert unfused[0]["joined_ms"] == 0.5 and unfused[0]["minis_ms"] == pytest.approx(0.3)
    assert unfused[0]["ops"] == list(plan.groups[0]) and unfused[0]["minis"] == 3
    partition.check(graph, built)
    assert status(tmp_path / "slow")["estimate_ms"] == pytest.approx(0.3)  # what compile --db builds
    # a joined kernel that pays for itself stays fused
    _fake_db(tmp_path / "fast", mod, graph, settings, joined_ms=0.2, mini_ms=[0.1, 0.1, 0.1])
    assert unfuse_slower(plan, tmp_path / "fast") == (plan, [])
    assert status(tmp_path / "fast")["estimate_ms"] == pytest.approx(0.2)
    # a mini without a verified schedule: nothing to compare, stays fused
    db = _fake_db(tmp_path / "partial", mod, graph, settings, joined_ms=0.5, mini_ms=[0.1, 0.1, 0.1])
    verified = db.verified
    verified[next(iter(verified))]["status"] = "failed"
    db.save_verified(verified)
    assert unfuse_slower(plan, tmp_path / "partial") == (plan, [])
    # a database made for another partition of the same ops (another threshold, an older agoc's rules) is built
    # as it was tuned: its groups, not joins it never measured
    other = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1.0))
    made = _fake_db(tmp_path / "other", mod, graph, other, joined_ms=0.5, mini_ms=[0.1] * 20)
    built, unfused = unfuse_slower(plan, tmp_path / "other")
    assert built.groups == tuple(tuple(g) for g in made.layout["groups"]) != plan.groups and not unfused
    partition.check(graph, built)
    layout = made.layout  # ... but a database whose groups hold other ops (another graph) changes nothing
    made._write("layout.json", {**layout, "groups": [[*layout["groups"][0], "elsewhere"], *layout["groups"][1:]]})
    assert unfuse_slower(plan, tmp_path / "other") == (plan, [])


def test_a_database_for_another_model_is_refused(tmp_path):
    db = TuneDB(tmp_path)
    session = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"}, "settings": {"trials": 8}}
    db.open_session(session)
    db.open_session(session)  # same session: resumes
    db.open_session({**session, "settings": {"trials": 32}})  # a larger budget continues the same session
    assert db.session["settings"]["trials"] == 32
    with pytest.raises(TuningError, match="different model sha256"):
        db.open_session({**session, "model_sha256": "b" * 64})
    with pytest.raises(TuningError, match="not a tuning database"):
        status(tmp_path / "elsewhere")


def test_a_database_timed_warm_is_not_continued_cold(tmp_path):
    """Records timed with weights in cache and flushed are not comparable: a database made before
    cold timing existed (no such setting recorded) resumes only with --warm-weights (and, made before
    weights were pre-packed, --no-prepack)."""
    old = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"}, "settings": {"trials": 8}}
    TuneDB(tmp_path).open_session(old)
    cold = {**old, "settings": TuneSettings(trials=8).to_json()}
    with pytest.raises(TuningError, match="different settings"):
        TuneDB(tmp_path).open_session(cold)
    with pytest.raises(TuningError, match="different settings"):
        TuneDB(tmp_path).open_session({**old, "settings": TuneSettings(trials=8, cold_weights=False).to_json()})
    TuneDB(tmp_path).open_session(
    {**old, "settings": TuneSettings(trials=8, cold_weights=False, prepack=False).to_json()})
    for transfer in (0, 3):  # sibling seeds only start tasks not yet started: any number resumes
        TuneDB(tmp_path).open_session(
     {**old, "settings": TuneSettings(trials=8, cold_weights=False, prepack=False,
                                      transfer=transfer).to_json()})


@pytest.mark.slow
def test_tune_resume_and_compile_with_the_database(tmp_path, cli):
    db = tmp_path / "db"
    args = ["tune", "zoo:tiny-dwsep", "--db", db, "--trials", "32", "--per-iter", "8"]  # minis, then the join
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    summary = status(db)
    assert all(r["status"] == "verified" for r in summary["tasks"]) and summary["estimate_ms"] > 0
    records = (db / "ms" / "database_tuning_record.json").read_text().count("\n")
    assert cli(*args).exit_code == 0  # resume: budget already spent, nothing new, nothing lost
    assert (db / "ms" / "database_tuning_record.json").read_text().count("\n") == records
    result = cli("compile", "zoo:tiny-dwsep", "--db", db, "-o", tmp_path / "art")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    # every kernel built (a join, or its minis where it measured slower than they did together) has its schedule
    assert manifest["tuning"]["applied"] == manifest["tuning"]["kernels"] >= 1
    assert cli("verify", tmp_path / "art").exit_code == 0


def _flat_form(settings: TuneSettings, keep_inside: bool = True) -> dict:
    """``settings`` as a session.json made before the partition knobs were one record held them: flat, one
    ``keep_inside`` for both the locality unit and the tile cache (without it: made before that setting)."""
    part = settings.partition
    flat = {k: v for k, v in settings.to_json().items() if k not in ("partition", "tile_cache")}
    flat |= {"partition": part.method, "threshold": part.threshold}
    return flat | ({"keep_inside": part.locality_unit} if keep_inside else {})


def test_keep_inside_is_a_session_setting_that_compile_cuts_kernels_by(tmp_path, cli):
    """--keep-inside changes the kernels, so a database holds one value: compile --db cuts the model as
    the session did (here the pw → dw → pw chain in one kernel although Td 1 merges nothing else), and a
    session with another value is refused; databases made before the setting hold 0."""
    model = models.build("tiny-dwsep")
    kept = TuneSettings(partition=PartitionSettings(threshold=1.0, locality_unit=32 * 1024), tile_cache=32 * 1024)
    session = {"schema": SCHEMA, "model_sha256": onnx_import.model_hash(model), "target": SPEC.tvm_target,
               "layout": "NHWC", "settings": kept.to_json()}
    db = TuneDB(tmp_path / "db")
    db.open_session(session)
    result = cli("compile", "zoo:tiny-dwsep", "--db", tmp_path / "db", "-o", tmp_path / "art")
    assert result.exit_code == 0, result.stderr
    info = json.loads((tmp_path / "art" / "manifest.json").read_text())["partition_info"]
    assert info["keep_inside"] == 32 * 1024 and info["max_complex_ops"] == 3
    assert info["settings"] == session["settings"]["partition"]  # the same JSON in manifest and session
    plain = TuneSettings(partition=PartitionSettings(threshold=1.0))
    with pytest.raises(TuningError, match=r"different settings \(partition.locality_unit: 32768 → 0, tile_cache.*"
                       r"the same settings \(--keep-inside 32\)"):
        db.open_session({**session, "settings": plain.to_json()})
    TuneDB(tmp_path / "old").open_session({**session, "settings": _flat_form(plain, keep_inside=False)})
    TuneDB(tmp_path / "old").open_session({**session, "settings": plain.to_json()})


def test_a_database_made_before_the_settings_record_still_opens_and_compiles(tmp_path, cli):
    """A session.json with the partition knobs flat (``partition``, ``threshold``, ``keep_inside``) reads as
    the record (keep_inside: both the locality unit and the tile cache), resumes with the same settings
    given the current way, refuses others, and ``compile --db`` cuts the model as it was tuned."""
    model = models.build("tiny-dwsep")
    kept = TuneSettings(partition=PartitionSettings(threshold=1.0, locality_unit=32 * 1024), tile_cache=32 * 1024)
    session = {"schema": SCHEMA, "model_sha256": onnx_import.model_hash(model), "target": SPEC.tvm_target,
               "layout": "NHWC", "settings": _flat_form(kept)}
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "session.json").write_text(json.dumps(session))
    db = TuneDB(tmp_path / "db")
    assert db.settings == kept == TuneSettings.from_json(session["settings"])
    assert status(tmp_path / "db")["session"]["settings"] == kept.to_json()
    result = cli("compile", "zoo:tiny-dwsep", "--db", tmp_path / "db", "-o", tmp_path / "art")
    assert result.exit_code == 0, result.stderr
    info = json.loads((tmp_path / "art" / "manifest.json").read_text())["partition_info"]
    assert info["keep_inside"] == 32 * 1024 and info["max_complex_ops"] == 3 and info["threshold"] == 1.0
    with pytest.raises(TuningError, match="different settings"):
        db.open_session({**session, "settings": dataclasses.replace(kept, tile_cache=0).to_json()})
    db.open_session({**session, "settings": dataclasses.replace(kept, trials=512).to_json()})  # resumed
    written = json.loads((tmp_path / "db" / "session.json").read_text())["settings"]  # now in the new form
    assert written["partition"] == kept.partition.to_json() and written["tile_cache"] == 32 * 1024
    assert TuneDB(tmp_path / "db").settings == dataclasses.replace(kept, trials=512)


def _loop_schedule(func, parallel: bool, factor: int):
    """``func``'s first block with its second loop split by ``factor``, the outer part parallel or not."""
    from tvm import s_tir

    sch = s_tir.Schedule(workload_module(func))
    block = sch.get_child_blocks(sch.get_sblock("root"))[-1]
    outer, _ = sch.split(sch.get_loops(block)[1], [None, factor])
    if parallel:
        sch.parallel(outer)
    return sch


def test_a_session_starts_from_another_databases_records_of_the_same_kernels(dwsep_split, tmp_path, cli):
    """agoc tune --from: the records another database holds for this session's kernels (matched by
    structural hash, whatever its partition called them) are copied in, in their commit order, and are
    those kernels' trials from then on; a kernel that already has records here gets none (a resumed
    session copies nothing twice). Another target's database, or a directory that is not one, is refused."""
    from tvm.s_tir import meta_schedule as ms

    (_, first), (_, second), (_, third) = dwsep_split[-1][:3]
    session = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": SPEC.tvm_target, "layout": SPEC.layout,
               "settings": TuneSettings(partition=PartitionSettings("stock")).to_json()}
    base = TuneDB(tmp_path / "stock")
    base.open_session(session)
    database = base.ms_database()
    for func, latencies in ((first, [4e-3, 1e-3, 2e-3]), (second, [3e-3, 5e-3])):  # interleaved, as a session commits
        workload = database.commit_workload(workload_module(func))
        for i, secs in enumerate(latencies):
            database.commit_tuning_record(ms.database.TuningRecord(
                _loop_schedule(func, i % 2 == 0, 2 ** i).trace, workload, [secs], SPEC.tvm(),
                ms.arg_info.ArgInfo.from_prim_func(func)))
    del database
    ours = TuneDB(tmp_path / "ago")
    ours.open_session({**session, "settings": TuneSettings().to_json()})
    funcs = {"mini-a": first, "mini-b": second, "mini-c": third}
    assert import_records(tmp_path / "ago", tmp_path / "stock", funcs) == {"mini-a": 3, "mini-b": 2}
    assert trial_latencies(ours.ms_dir, first) == pytest.approx([4e-3, 1e-3, 2e-3])  # commit order
    assert trial_latencies(ours.ms_dir, second) == pytest.approx([3e-3, 5e-3])
    assert trial_latencies(ours.ms_dir, third) == []
    loaded = ours.ms_database()  # MetaSchedule reads them as its own: replayable records of our workloads
    assert sorted(latency(r) for r in records_of(loaded, first)) == pytest.approx([1e-3, 2e-3, 4e-3])
    del loaded
    assert import_records(tmp_path / "ago", tmp_path / "stock", funcs) == {}  # resumed: nothing twice
    assert len(trial_latencies(ours.ms_dir)) == 5
    assert ours.imported == {"mini-a": 3, "mini-b": 2}  # kept: a resumed session still says what it started from
    arm = TuneDB(tmp_path / "arm")
    arm.open_session({**session, "target": {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}})
    with pytest.raises(TuningError, match="another target"):
        import_records(tmp_path / "ago", tmp_path / "arm", funcs)
    with pytest.raises(TuningError, match="not a tuning database"):
        import_records(tmp_path / "ago", tmp_path / "nothing", funcs)
    refused = cli("tune", "zoo:tiny-dwsep", "--db", tmp_path / "new", "--trials", "8", "--from", tmp_path / "nothing")
    assert refused.exit_code == 1 and "not a tuning database" in refused.stderr
    assert not (tmp_path / "new" / "ms" / "database_tuning_record.json").exists()  # refused before any trial


def test_the_session_cost_model_ranks_a_new_kernels_candidates_by_what_other_kernels_measured(
        dwsep_split, tmp_path):
    """A fresh MetaSchedule cost model guesses at random for its first 100 trials, more than a kernel
    gets here: the session's model is trained on every record the database holds, whichever kernel they
    are of, so a kernel it has never seen is searched with what the others measured."""
    from tvm.s_tir import meta_schedule as ms

    (_, first), (_, second) = dwsep_split[-1][:2]
    database = TuneDB(tmp_path).ms_database()
    mod = workload_module(first)
    workload = database.commit_workload(mod)
    for i in range(120):  # the first kernel: parallel schedules measured 4x faster than serial ones
        parallel, factor = i % 2 == 0, [1, 2, 4, 8][i // 2 % 4]
        database.commit_tuning_record(ms.database.TuningRecord(
            _loop_schedule(first, parallel, factor).trace, workload, [1e-3 if parallel else 4e-3], SPEC.tvm(),
            ms.arg_info.ArgInfo.from_prim_func(first)))
    model = session_cost_model({"first": first, "second": second}, database, SPEC)
    assert model.data_size == 120
    context = ms.TuneContext(mod=workload_module(second), target=SPEC.tvm(), num_threads=1)
    args = ms.arg_info.ArgInfo.from_prim_func(second)
    scores = [model.predict(context, [ms.search_strategy.MeasureCandidate(_loop_schedule(second, p, 2), args)])[0]
              for p in (True, False, True)]
    assert scores[0] == scores[2] > scores[1]  # a trained model (a random one would differ between calls)


def test_kernels_and_joins_search_with_the_sessions_two_cost_models(dwsep_split, tmp_path, fake_search, monkeypatch):
    """Every search of a kernel or mini uses one model, learning from kernels' and minis' records only;
    every join's search another, learning from every record. One model for all, fed the joins'
    records, ranked MobileNet-V2's single-conv candidates at random or inversely."""
    mod, graph, *_ = dwsep_split
    made, used = {}, []

    def model(funcs, *a, **k):
        made[frozenset(funcs)] = object()
        return made[frozenset(funcs)]

    monkeypatch.setattr(adapter, "session_cost_model", model)
    search = adapter.tune_trials
    monkeypatch.setattr(adapter, "tune_trials",
                        lambda func, *a, **k: used.append((func, a[-1])) or search(func, *a, **k))
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    phase = {plan.funcs[t.name].script(): t.phase for t in plan.tasks}
    every = frozenset(plan.funcs)
    singles = frozenset(t.name for t in plan.tasks if t.phase != "joined")
    assert set(made) == {every, singles} and len(used) >= 4
    for func, cost_model in used:
        assert cost_model is made[every if phase[func.script()] == "joined" else singles]
    assert {phase[f.script()] for f, _ in used} == {"mini", "joined"}


def _transpose_func():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def transpose(a: T.Buffer((8, 16), "float32"), b: T.Buffer((16, 8), "float32")):
        for i, j in T.grid(16, 8):
            with T.sblock("t"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vj, vi]

    return transpose


def test_a_search_space_with_nothing_left_to_try_ends_its_task(tmp_path):
    """A layout kernel has a handful of distinct schedules; once they are measured MetaSchedule would
    go on sampling rounds of 0-1 new candidates for ever: the search stops and says so."""
    func = _transpose_func().with_attr("global_symbol", "main")
    db = TuneDB(tmp_path / "db")
    settings = TuneSettings(per_iter=16)
    exhausted = tune_trials(func, SPEC, db.ms_database(), 256, settings, False, tmp_path / "logs")
    measured = len(trial_latencies(db.ms_dir))  # (the database holds this workload only)
    assert exhausted and 0 < measured < 16


@pytest.mark.parametrize("repeat", range(3))
def test_a_search_stopped_after_its_first_batch_ends_quietly_with_that_batch_recorded(tmp_path, repeat):
    """``stop`` ends the task from the measure callback; MetaSchedule may have picked that task next already
    and then trips its own "not terminated" check: that is the stop working, not a failed search."""
    func = _transpose_func().with_attr("global_symbol", "main")
    db = TuneDB(tmp_path / "db")
    asked = []
    tune_trials(func, SPEC, db.ms_database(), 64, TuneSettings(per_iter=2), False, tmp_path / "logs",
                stop=lambda: asked.append(1) or True)
    assert asked and 1 <= len(trial_latencies(db.ms_dir)) <= 2


def test_a_kernel_whose_space_does_not_generate_in_time_ends_its_search_before_any_trial(tmp_path, monkeypatch):
    """MetaSchedule's space generation never returns on some kernels (a matmul with fast-math GELU and
    softmax, tests/toolchain/test_fastmath.py): it is tried in a forked child first, bounded; a kernel
    whose space generated in time is not tried again."""
    func = _transpose_func().with_attr("global_symbol", "main")
    db = TuneDB(tmp_path / "db")
    monkeypatch.setattr(adapter, "_SPACES_OK", set())
    monkeypatch.setattr(adapter, "SPACE_TIMEOUT_S", 0.001)
    with pytest.raises(adapter.SpaceTimeout, match="did not generate within"):
        tune_trials(func, SPEC, db.ms_database(), 16, TuneSettings(per_iter=16), False, tmp_path / "logs")
    assert trial_latencies(db.ms_dir) == []
    monkeypatch.setattr(adapter, "SPACE_TIMEOUT_S", 60.0)
    adapter.check_space(func, SPEC, False)
    adapter.check_space(func, SPEC, False, timeout=0.001)  # generated in time before: not tried again
    with pytest.raises(adapter.SpaceTimeout):
        adapter.check_space(func, SPEC, True, timeout=0.001)  # another space of it is


def test_expected_gain_is_optimistic_early_and_follows_the_search_after():
    assert expected_gain([], 8) == pytest.approx(0.5)  # a fresh task: the whole prior
    assert expected_gain([1.0] * 8, 8) == pytest.approx(0.25)  # one round, no record to go by
    flat = expected_gain([1.0] * 24, 8)  # its last round brought nothing: half the prior
    assert flat == pytest.approx(0.5 * 0.5 * 8 / 32)
    improving = expected_gain([1.0] * 16 + [0.5] * 8, 8)  # its last round halved its time
    assert improving == pytest.approx((0.5 + 0.5 * 8 / 32) / 2) and improving > flat
    assert expected_gain([math.inf] * 16 + [1.0] * 8, 8) == pytest.approx(0.5 * 8 / 32)  # nothing to compare


def test_model_times_count_what_the_model_is_built_with(dwsep_split):
    mod, graph, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    minis = [t.name for t in plan.tasks if t.phase == "mini"]
    (joined,) = [t.name for t in plan.tasks if t.phase == "joined"]
    verified = {n: {"status": "verified", "latency_ms": 1.0} for n in minis}
    verified[joined] = {"status": "verified", "latency_ms": 2.0}
    assert model_times(plan, verified, {}) == {joined: 2.0}  # faster than its minis: built joined
    verified[joined]["latency_ms"] = 5.0
    assert model_times(plan, verified, {}) == {n: 1.0 for n in minis}  # built as its minis
    del verified[minis[0]]  # not verified yet: the best it measured, when it has one
    assert model_times(plan, verified, {minis[0]: {"best_ms": 0.5}}) == {joined: 5.0}  # 2.5 < 5
    assert model_times(plan, verified, {}) == {joined: 5.0}  # a mini without a time: the join


def test_the_latency_scheduler_gives_rounds_where_they_save_most_and_resumes(dwsep_split, tmp_path, fake_search):
    """A first batch of ``warmup`` per task, then rounds of ``per_iter`` by model time × expected gain:
    the join runs slower than its minis together, so it gets no rounds; the slowest mini gets most.
    The whole budget is spent, and a resumed session adds nothing."""
    mod, graph, *_ = dwsep_split
    trials = fake_search
    settings = TuneSettings(trials=96, per_iter=8, warmup=4, scheduler="latency",
                            partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    minis = [t for t in plan.tasks if t.phase == "mini"]
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    assert [t.budget for t in plan.tasks] == [4] * 4  # the first pass: a batch of 4 per mini and one for the join
    assert first_pass_trials(mod, SPEC, settings) == 16 and floor_trials(mod, SPEC, settings) == 16
    for t, speed in zip(minis, (4.0, 2.0, 1.0)):
        trials.speed_ms[plan.funcs[t.name].script()] = speed
    trials.speed_ms[plan.funcs[joined.name].script()] = 9.0
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    used = [len(trials[plan.funcs[t.name].script()]) for t in (*minis, joined)]
    assert sum(used) == 96 and used[3] == 4  # all spent; none on the join, which is built as its minis
    assert used[0] > used[1] > used[2] >= 4
    rounds = [e for e in events if isinstance(e, Round)]
    assert len(rounds) == (96 - 16) // 8 and rounds[0].task == minis[0].name and rounds[0].left == 80
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)  # resume: nothing left to do
    assert [len(trials[plan.funcs[t.name].script()]) for t in (*minis, joined)] == used
    # where the join is the faster, the rounds all go to it
    trials.clear()
    trials.speed_ms[plan.funcs[joined.name].script()] = 1.0
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path / "again")
    assert [len(trials[plan.funcs[t.name].script()]) for t in (*minis, joined)] == [4, 4, 4, 84]


def test_roofline_gain_is_the_gap_times_what_a_round_is_expected_to_close():
    assert roofline_gain([1e-3] * 8, 8, floor_s=1e-3) == 0.0  # at its floor: nothing to gain, however slow
    assert roofline_gain([], 8, floor_s=0.0) == 0.0  # nothing measured
    # half its time above the floor, one round so far: the gap × the prior
    assert roofline_gain([2e-3] * 8, 8, floor_s=1e-3) == pytest.approx(0.5 * 0.5 * 8 / 16)
    flat = roofline_gain([2e-3] * 24, 8, floor_s=1e-3)  # its last round closed nothing
    assert flat == pytest.approx(0.5 * (0.5 * 8 / 32) / 2)
    closing = roofline_gain([3e-3] * 16 + [2e-3] * 8, 8, floor_s=1e-3)  # it closed half its gap
    assert closing == pytest.approx(0.5 * (0.5 * 8 / 32 + 0.5) / 2) and closing > flat


def test_the_roofline_scheduler_sends_its_rounds_to_the_task_furthest_above_its_floor(
        dwsep_split, tmp_path, fake_search, monkeypatch):
    """Three quarters of the budget planned by weight, the rest in rounds: the slowest mini is at the
    session's best work rate (no gap) and the fastest at its best byte rate, so every round goes to the
    one in between — where the latency scheduler would have sent them to the slowest."""
    from toolchain import roofline

    mod, graph, *_ = dwsep_split
    trials = fake_search
    settings = TuneSettings(trials=128, per_iter=8, scheduler="roofline", partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    minis = [t for t in plan.tasks if t.phase == "mini"]
    (joined,) = [t for t in plan.tasks if t.phase == "joined"]
    assert first_pass_trials(mod, SPEC, settings) == 96 and floor_trials(mod, SPEC, settings) == 32
    costs = {plan.funcs[t.name].script(): roofline.Cost(work, 1)
             for t, work in zip((*minis, joined), (400, 20, 50, 470))}
    monkeypatch.setattr(roofline, "cost", lambda func: costs[func.script()])
    for t, speed in zip(minis, (4.0, 2.0, 1.0)):  # work rates 100 / 10 / 50 per ms; bytes 0.25 / 0.5 / 1
        trials.speed_ms[plan.funcs[t.name].script()] = speed
    trials.speed_ms[plan.funcs[joined.name].script()] = 9.0  # slower than its minis: built as them
    events = []
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path, events.append)
    rounds = [e.task for e in events if isinstance(e, Round)]
    assert rounds and set(rounds) == {minis[1].name}  # floor max(20/100, 1/1) = 1 ms of its 2
    assert sum(len(v) for v in trials.values()) == 128  # the whole budget spent
    tune_model(mod, "a" * 64, SPEC, settings, tmp_path)  # resumed: nothing left to do
    assert sum(len(v) for v in trials.values()) == 128


def test_a_database_keeps_its_scheduler_and_a_bad_one_is_refused(tmp_path, cli):
    old = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"},
           "settings": {k: v for k, v in TuneSettings(trials=8).to_json().items()
                        if k not in ("scheduler", "warmup")}}  # made before there was a choice: by weight
    TuneDB(tmp_path).open_session(old)
    with pytest.raises(TuningError, match="different settings"):
        TuneDB(tmp_path).open_session(
     {**old, "settings": TuneSettings(trials=8, scheduler="latency").to_json()})
    TuneDB(tmp_path).open_session({**old, "settings": TuneSettings(trials=64).to_json()})
    result = cli("tune", "zoo:tiny-cnn", "--db", tmp_path / "db", "--scheduler", "fastest")
    assert result.exit_code == 1 and "unknown scheduler 'fastest'" in result.stderr
    assert not (tmp_path / "db").exists()


def test_a_database_holds_one_activation_layout(tmp_path):
    """Kernels tuned in one layout are other workloads in the other: a session refuses to mix them; a
    database made before the layout was recorded holds NCHW kernels."""
    session = {"schema": SCHEMA, "model_sha256": "m", "target": {"kind": "llvm"},
               "settings": TuneSettings().to_json()}
    db = TuneDB(tmp_path / "db")
    db.open_session({**session, "layout": "NHWC"})
    db.open_session({**session, "layout": "NHWC"})  # the same session resumes
    with pytest.raises(TuningError, match="layout"):
        db.open_session({**session, "layout": "NCHW"})
    old = TuneDB(tmp_path / "old")
    old.open_session(session)  # as written before layouts: no key
    old.open_session({**session, "layout": "NCHW"})
    with pytest.raises(TuningError, match="layout"):
        old.open_session({**session, "layout": "NHWC"})


def test_the_search_population_reaches_metaschedule_and_may_change_on_resume(dwsep_split, tmp_path, monkeypatch):
    """--population sets how many candidates MetaSchedule's evolutionary search scores and evolves
    before each batch (a 16-trial batch cost ~31 s on 2 cores, ~20 s of it this search at 512). It
    decides how candidates are found, not how they are measured: a database resumes under another."""
    from tvm.s_tir import meta_schedule as ms

    *_, (name, func), _ = dwsep_split
    seen = []
    monkeypatch.setattr(ms, "tune_tir", lambda *a, **k: seen.append(k["strategy"]))
    settings = TuneSettings(trials=16, population=64)
    tune_trials(func, NCHW, None, 16, settings, True, tmp_path / "w")
    (strategy,) = seen
    assert isinstance(strategy, ms.search_strategy.EvolutionarySearch)
    assert strategy.population_size == 64 and strategy.init_min_unmeasured == 50
    session = {"model_sha256": "a" * 64, "target": NCHW.tvm_target, "layout": "NCHW",
               "settings": TuneSettings(population=512).to_json()}
    db = TuneDB(tmp_path / "db")
    db.open_session(session)
    db.open_session({**session, "settings": TuneSettings(population=128).to_json()})  # no error
    assert db.session["settings"]["population"] == 128
    with pytest.raises(TuningError, match=r"different settings \(per_iter: \d+ → 8\)"):  # one that matters,
        db.open_session({**session, "settings": TuneSettings(per_iter=8).to_json()})  # named
    newer = {**session, "settings": {**TuneSettings().to_json(), "search_depth": 3}}
    (tmp_path / "db" / "session.json").write_text(json.dumps(newer))  # as a newer agoc would leave it
    with pytest.raises(TuningError, match=r"tuned by a newer agoc, with settings this one does not know "
                                          r"\(search_depth\); upgrade agoc"):
        db.open_session(session)
    assert json.loads((tmp_path / "db" / "session.json").read_text()) == newer  # left as it was


def test_keep_inside_caps_the_intensive_tiles_of_every_search(dwsep_split, tmp_path, monkeypatch):
    """--keep-inside is also the cap on an intensive tile's slice of its intermediate: every search's
    space gets it (intensive.intensive_schedule's tile_cache, tested in test_intensive)."""
    from tvm.s_tir import meta_schedule as ms

    *_, (name, func), _ = dwsep_split
    seen, real = [], space_for
    monkeypatch.setattr(adapter, "space_for",
                        lambda f, s, i, tile_cache=0: seen.append(tile_cache) or real(f, s, i, tile_cache))
    monkeypatch.setattr(ms, "tune_tir", lambda *a, **k: None)
    for keep_inside in (0, 64 * 1024):
        tune_trials(func, NCHW, None, 16, TuneSettings(trials=16, tile_cache=keep_inside), True,
                    tmp_path / str(keep_inside))
    assert seen == [0, 64 * 1024]


def test_a_population_smaller_than_a_batch_is_refused_before_anything_runs(cli, tmp_path):
    result = cli("tune", "zoo:tiny-cnn", "--db", tmp_path / "db", "--population", "8")
    assert result.exit_code == 1 and "--population (8) must be at least --per-iter (16)" in result.stderr
    assert not (tmp_path / "db").exists()
    result = cli("bench-suite", "tiny", "--population", "8", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "--population must be at least 16" in result.stderr


def _gather_func():
    """rows of a (64, 8) float table gathered by 16 int64 ids (``take`` in fast mode: no bounds check)."""
    from tvm import te, topi

    table = te.placeholder((64, 8), "float32", name="table")
    ids = te.placeholder((16,), "int64", name="ids")
    out = topi.take(table, ids, axis=0, mode="fast")
    return te.create_prim_func([ids, table, out]).with_attr("global_symbol", "main")


def test_an_index_argument_is_measured_in_range_so_a_gathers_candidates_run(tmp_path):
    """MetaSchedule fills every argument at random, integers too: an id far outside the table, and
    every candidate of a gather failed (BERT-tiny's embedding kernels were built untuned). Integer
    arguments are zeros now: the candidates run and get real latencies."""
    func = _gather_func()
    db = TuneDB(tmp_path / "db")
    tune_trials(func, SPEC, db.ms_database(), 16, TuneSettings(per_iter=16), False, tmp_path / "logs")
    latencies = trial_latencies(db.ms_dir)
    assert latencies and all(math.isfinite(x) for x in latencies)


def test_measured_arguments_are_random_floats_and_zero_indices():
    import numpy as np
    import tvm

    from toolchain.timing import alloc_local

    (args,) = alloc_local(tvm.cpu(), [["TENSOR", "int64", [16]], ["TENSOR", "float32", [64, 8]]], 1)
    assert not args[0].numpy().any()
    assert np.unique(args[1].numpy()).size > 100


def test_the_best_records_are_timed_again_together_before_the_best_is_verified(monkeypatch):
    """One noisy measurement must not pick a task's schedule: the front of its records (within 1.5x of the best)
    is timed again together and re-ranked by those medians — a record measured once at 0.48 ms that runs 1.3 ms
    beside the 0.61 ms register block loses to it; a record 2x slower is not re-timed; a front that does not
    build stays as it was."""
    from types import SimpleNamespace

    def record(ms, name):
        return SimpleNamespace(run_secs=[ms / 1e3], trace=SimpleNamespace(as_json=lambda: name))

    monkeypatch.setattr(candidates, "plain", lambda trace: trace)
    timed = []

    def together(kernels, *_a, **_k):
        timed.append([trace for _, trace in kernels])
        return [[1.3, 0.61, 0.7]] * 3

    monkeypatch.setattr(adapter, "time_together", together)
    records = [record(0.48, "searched"), record(0.609, "block"), record(0.65, "other"), record(0.7, "fourth")]
    ranked, again = candidates.retimed("func", records, None, None)
    assert timed == [["searched", "block", "other"]]  # the first three, within 1.5x of the best
    assert [r.trace.as_json() for r in ranked] == ["block", "other", "searched", "fourth"]
    assert again == {0: 0.61, 1: 0.7, 2: 1.3}
    far = [record(0.3, "alone"), record(0.61, "block")]
    assert candidates.retimed("func", far, None, None) == (far, {}) and len(timed) == 1

    def broken(*_a, **_k):
        raise RuntimeError("kernel 1 does not build")

    monkeypatch.setattr(adapter, "time_together", broken)
    assert candidates.retimed("func", records, None, None) == (records, {})
