"""A join or its minis, decided on their kept schedules timed together (toolchain/tune/pairing.py)."""

import pytest

from tests.toolchain.test_tuning import SPEC, _fake_db
from toolchain.settings import PartitionSettings
from toolchain.tune import pairing
from toolchain.tune.adapter import workload_module
from toolchain.tune.apply import unfuse_slower
from toolchain.tune.db import status
from toolchain.tune.events import Paired, Pairing
from toolchain.tune.pairing import first_batch_vs_minis
from toolchain.tune.plan import plan_tasks
from toolchain.tune.settings import TuneSettings, TuningError
from toolchain.tune.traces import plain


def _verified(joined_ms, minis_ms):
    out = {"J": {"status": "verified", "latency_ms": joined_ms}}
    out.update({f"m{i}": {"status": "verified", "latency_ms": ms} for i, ms in enumerate(minis_ms)})
    return out


def _pair(verified, ratio, joined_ms=1.0):
    minis = [k for k in verified if k != "J"]
    verified["J"]["paired"] = {"joined_ms": joined_ms, "minis_ms": joined_ms * ratio, "ratio": ratio, "rounds": 3,
                               "of": pairing.pairing_key("J", minis, verified)}
    return minis


def test_without_a_pairing_the_recorded_latencies_decide():
    verified = _verified(0.5, [0.1, 0.1])
    choice = pairing.choose("J", ["m0", "m1"], verified)
    assert (choice.build, choice.paired, choice.reason) == ("minis", False, "slower than its minis")
    assert choice.minis_ms == pytest.approx(0.2)
    assert pairing.choose("J", ["m0", "m1"], _verified(0.15, [0.1, 0.1])).build == "joined"
    unverified = _verified(0.15, [0.1, 0.1])
    unverified["J"]["status"] = "unverified"
    assert pairing.choose("J", ["m0", "m1"], unverified).reason == "no verified schedule (unverified)"
    unverified["m1"]["status"] = "unverified"  # neither verified: untuned, the minis get the library's schedules
    neither = pairing.choose("J", ["m0", "m1"], unverified)
    assert neither.build == "minis" and "neither it nor all its minis" in neither.reason
    unverified["J"]["status"] = "verified"  # a verified join against minis not all verified: the join
    assert pairing.choose("J", ["m0", "m1"], unverified).build == "joined"


def test_a_current_pairing_overrules_the_recorded_latencies_and_a_stale_one_does_not():
    verified = _verified(0.5, [0.1, 0.1])  # recorded: the join looks 2.5x slower
    minis = _pair(verified, ratio=1.2)  # timed together it is 1.2x faster
    choice = pairing.choose("J", minis, verified)
    assert (choice.build, choice.paired, choice.joined_ms, choice.minis_ms) == ("joined", True, 1.0, 1.2)
    verified = _verified(0.15, [0.1, 0.1])  # recorded: the join looks faster
    minis = _pair(verified, ratio=0.8)
    assert pairing.choose("J", minis, verified).build == "minis"
    assert pairing.choose("J", minis, verified).reason == "slower than its minis, timed together"
    verified["m0"]["latency_ms"] = 0.05  # a mini got a new schedule since: the pairing is stale
    assert pairing.current_pairing("J", minis, verified) is None
    assert pairing.choose("J", minis, verified).build == "joined"


def test_the_build_and_the_estimate_follow_a_pairing(dwsep_split, tmp_path):
    mod, graph, plan, split, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    db = _fake_db(tmp_path, mod, graph, settings, joined_ms=0.5, mini_ms=[0.1, 0.1, 0.1])
    assert unfuse_slower(plan, tmp_path)[0].groups == split.plan.groups  # recorded: slower
    verified = db.verified
    joined = next(t.name for t in db.tasks if t.phase == "joined")
    minis = db.layout["minis"][joined]
    verified[joined]["paired"] = {"joined_ms": 0.25, "minis_ms": 0.3, "ratio": 1.2, "rounds": 3,
                                  "of": pairing.pairing_key(joined, minis, verified)}
    db.save_verified(verified)
    assert unfuse_slower(plan, tmp_path) == (plan, [])  # timed together the join is faster
    summary = status(tmp_path)
    assert summary["estimate_ms"] == pytest.approx(0.5)  # the join is built; its recorded latency counts
    (row,) = [r for r in summary["tasks"] if r["task"] == joined]
    assert row["build"] == "joined" and row["paired"]["ratio"] == 1.2


def test_joins_are_timed_next_to_their_minis_once_per_set_of_schedules(dwsep_split, tmp_path):
    """Real builds and a real runner: the join and its minis (unscheduled traces) in turn, per round."""
    from tvm import s_tir

    mod, graph, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    (joined,) = plan.compositions
    minis = [name for name, _ in plan.compositions[joined]]
    verified = {
        name: {"status": "verified", "latency_ms": 1.0,
               "trace": plain(s_tir.Schedule(workload_module(plan.funcs[name])).trace.as_json())}
        for name in [joined, *minis]
    }
    events = []
    assert pairing.pair_joins(plan, verified, SPEC, settings, rounds=2,
                              on_event=events.append) == 1
    paired = verified[joined]["paired"]
    assert paired["rounds"] == 2 and paired["joined_ms"] > 0 and paired["minis_ms"] > 0 and paired["ratio"] > 0
    assert paired["of"] == pairing.pairing_key(joined, minis, verified)
    assert [type(e) for e in events] == [Pairing, Paired]
    assert pairing.pair_joins(plan, verified, SPEC, settings, rounds=2) == 0  # still current: not again
    verified[minis[0]]["latency_ms"] = 0.5  # a new schedule for a mini: timed again
    bad_trace = [[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []]
    broken = {**verified, minis[1]: {**verified[minis[1]], "trace": bad_trace}}
    assert pairing.pair_joins(plan, broken, SPEC, settings, rounds=2) == 0  # a pairing that fails: recorded
    assert "paired_error" in broken[joined] and "paired" in broken[joined]  # (the stale one is ignored)
    assert pairing.current_pairing(joined, minis, broken) is None


def test_a_joins_first_batch_is_timed_next_to_its_minis(dwsep_split):
    """The hand-back check after a join's first batch: its best record so far and its minis' kept
    schedules, timed in turn; nothing to time while a mini has no verified schedule."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    mod, graph, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, graph, SPEC, settings)
    (joined,) = plan.compositions
    minis = [name for name, _ in plan.compositions[joined]]
    func = plan.funcs[joined]
    database = ms.database.MemoryDatabase()
    assert first_batch_vs_minis(joined, plan, database, {}, SPEC, settings) is None  # no records
    workload = database.commit_workload(workload_module(func))
    trace = s_tir.Schedule(workload_module(func)).trace
    database.commit_tuning_record(ms.database.TuningRecord(
        trace, workload, [0.001], SPEC.tvm(), ms.arg_info.ArgInfo.from_prim_func(func)))
    verified = {m: {"status": "verified", "latency_ms": 1.0,
                    "trace": plain(s_tir.Schedule(workload_module(plan.funcs[m])).trace.as_json())}
                for m in minis}
    together = first_batch_vs_minis(joined, plan, database, verified, SPEC, settings)
    assert together["rounds"] == pairing.PAIR_ROUNDS and together["joined_ms"] > 0 and together["ratio"] > 0
    verified[minis[0]]["status"] = "unverified"
    assert first_batch_vs_minis(joined, plan, database, verified, SPEC, settings) is None


def _traffic(verified, minis, joined_bytes, minis_bytes):
    return {"J": {"joined_bytes": joined_bytes, "minis_bytes": minis_bytes, "cache": "2MiB",
                  "of": pairing.pairing_key("J", minis, verified)}}


def test_the_traffic_rule_builds_the_side_that_moves_fewer_bytes_while_its_judgement_is_current():
    verified = _verified(0.15, [0.1, 0.1])  # by latency: the join
    minis = ["m0", "m1"]
    fewer = pairing.choose_by("traffic:a76", "J", minis, verified, _traffic(verified, minis, 100_000, 300_000))
    assert (fewer.build, fewer.joined_bytes, fewer.minis_bytes, fewer.reason) == ("joined", 100_000, 300_000, "")
    more = pairing.choose_by("traffic:a76", "J", minis, verified, _traffic(verified, minis, 400_000, 300_000))
    assert more.build == "minis" and more.joined_ms == 0.15 and more.minis_ms == pytest.approx(0.2)
    assert more.reason == ("the model moves no fewer simulated DRAM bytes with it joined (400 vs 300 KB per inference, "
                           "a76 at 2MiB)")
    tie = _traffic(verified, minis, 300_000, 300_000)  # a tie: the latency rule's way
    assert pairing.choose_by("traffic:a76", "J", minis, verified, tie).build == "joined"
    slow = _verified(0.5, [0.1, 0.1])  # by latency: the minis
    assert pairing.choose_by("traffic:a76", "J", minis, slow, _traffic(slow, minis, 300_000, 300_000)).build == "minis"
    stale = _traffic(verified, minis, 400_000, 300_000)
    verified["m0"]["latency_ms"] = 0.05  # a mini got a new schedule since it was judged
    with pytest.raises(ValueError, match="J has no current traffic judgement for a76"):
        pairing.choose_by("traffic:a76", "J", minis, verified, stale)
    with pytest.raises(ValueError, match="no current traffic judgement"):
        pairing.choose_by("traffic:a76", "J", minis, verified, {})
    # the other rules; and whatever the rule, a side without verified schedules is not built
    assert pairing.choose_by("minis", "J", minis, verified).build == "minis"
    assert pairing.choose_by("joined", "J", minis, _verified(0.5, [0.1, 0.1])).build == "joined"
    assert pairing.choose_by("latency", "J", minis, _verified(0.5, [0.1, 0.1])).build == "minis"
    unverified = _verified(0.15, [0.1, 0.1])
    unverified["m1"]["status"] = "failed"
    assert pairing.choose_by("minis", "J", minis, unverified).build == "joined"
    assert pairing.choose_by("traffic:a76", "J", minis, unverified, {}).build == "joined"  # nothing to judge
    assert pairing.check_rule("traffic:small-slc") == "traffic:small-slc"
    for bad in ("traffic:", "fastest"):
        with pytest.raises(ValueError, match="unknown join rule"):
            pairing.check_rule(bad)


def test_compile_builds_each_join_as_its_traffic_judgement_says(dwsep_split, tmp_path):
    mod, graph, plan, split, *_ = dwsep_split
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    db = _fake_db(tmp_path, mod, graph, settings, joined_ms=0.2, mini_ms=[0.1, 0.1, 0.1])  # by latency: joined
    with pytest.raises(TuningError, match=r"no current traffic judgement for a76 .*--joins a76` judges"):
        unfuse_slower(plan, tmp_path, "traffic:a76")
    verified = db.verified
    joined = next(t.name for t in db.tasks if t.phase == "joined")
    minis = db.layout["minis"][joined]
    judged = {joined: {"joined_bytes": 500_000, "minis_bytes": 200_000, "cache": "2MiB",
                       "of": pairing.pairing_key(joined, minis, verified)}}
    db.save_traffic("a76", {"geometry": "a76", "cache": "2MiB", "joins": judged})
    assert unfuse_slower(plan, tmp_path) == (plan, [])  # the latency rule does not read them
    built, unfused = unfuse_slower(plan, tmp_path, "traffic:a76")
    assert built.groups == split.plan.groups
    assert unfused[0]["joined_bytes"] == 500_000 and unfused[0]["minis_bytes"] == 200_000
    assert "the model moves no fewer simulated DRAM bytes with it joined" in unfused[0]["reason"]
    with pytest.raises(TuningError, match="no current traffic judgement for a55"):
        unfuse_slower(plan, tmp_path, "traffic:a55")  # judged per geometry
    assert unfuse_slower(plan, tmp_path, "minis")[0].groups == split.plan.groups
    assert unfuse_slower(plan, tmp_path, "joined") == (plan, [])
