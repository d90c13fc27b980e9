"""Joins judged by simulated phone-cache traffic (host/bench/judge.py, ``agoc compile --db DIR --joins a76``):
on a pw → dw pair under valgrind, the judgement, its reuse, and the build it decides."""

from __future__ import annotations

import hashlib
import json

import pytest

import models
from host.bench import judge
from tests.conftest import require_tool

PAIR = ("pair-pw-dw", (1, 24, 28, 28))
ZOO_REF = "zoo:pair-pw-dw@1x24x28x28"


@pytest.fixture(scope="module")
def pair_db(tmp_path_factory):
    """A tuning database of the pair as one AGO subgraph split into two minis, every kernel 'verified'
    with its default schedule (no trials run): (ONNX model, database, the join, its minis)."""
    require_tool("valgrind")
    from tests.runner.test_runner import build_runner

    build_runner("host")  # the proxy runs the host runner (with its callgrind client requests)
    return make_pair_db(tmp_path_factory.mktemp("judge") / "pair.db")


def make_pair_db(root):
    """:func:`pair_db`'s database at ``root``, without valgrind or the runner."""
    from tvm import s_tir

    from toolchain import build, onnx_import
    from toolchain.opgraph import op_graph
    from toolchain.settings import PartitionSettings
    from toolchain.targets import resolve_target
    from toolchain.tune.adapter import workload_module
    from toolchain.tune.db import TuneDB
    from toolchain.tune.plan import plan_tasks
    from toolchain.tune.settings import SCHEMA, TuneSettings
    from toolchain.tune.traces import plain

    model = models.build(*PAIR)
    spec = resolve_target("host-avx2", layout="NHWC")
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
    settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9))
    _, plan = plan_tasks(mod, op_graph(mod), spec, settings)
    db = TuneDB(root)
    db.open_session({"schema": SCHEMA, "model_sha256": onnx_import.model_hash(model),
                     "target": spec.tvm_target, "layout": "NHWC", "settings": settings.to_json()})
    db.save_tasks(plan.tasks)
    db.save_layout(plan)
    db.save_verified({
        t.name: {"status": "verified", "latency_ms": 1.0, "phase": t.phase,
                 "trace": plain(s_tir.Schedule(workload_module(plan.funcs[t.name])).trace.as_json())}
        for t in plan.tasks})
    (joined, parts), = plan.compositions.items()
    return model, db.root, joined, [name for name, _ in parts]


@pytest.mark.e2e
def test_a_join_is_judged_once_by_its_simulated_dram_bytes_and_built_as_judged(pair_db, tmp_path, cli):
    from toolchain.artifact import load_artifact
    from toolchain.tune.db import TuneDB

    model, db, joined, minis = pair_db
    assert judge.pending_joins(db, "a76") == [joined] and len(minis) == 2
    record = judge.keep_judgement(model, PAIR[0], {}, db, "a76", work_dir=tmp_path / "judged")
    assert (record["geometry"], record["cache"], record["target"]) == ("a76", "2MiB", "host-avx2")
    measured = record["joins"][joined]
    # the intermediate (144 × 28 × 28 floats) stays inside the one kernel: the model moves less with it
    assert 0 < measured["joined_bytes"] < measured["minis_bytes"]
    assert record["baseline_bytes"] == measured["joined_bytes"]  # by latency (1 ms vs 2 ms) the join is built
    assert record["final_bytes"] == record["baseline_bytes"] and record["method"] == judge.METHOD
    assert TuneDB(db).traffic["a76"] == json.loads(json.dumps(record))  # kept in the database
    # the baseline and the one flipped build, both checked; their kernels name the tasks they were scheduled with
    tasks = {build: {k.get("task") for k in load_artifact(tmp_path / "judged" / build).manifest.kernels
                     if "conv2d" in k["name"]} for build in ("baseline", "flip-1")}
    assert tasks == {"baseline": {joined}, "flip-1": set(minis)}
    assert judge.pending_joins(db, "a76") == [] and judge.pending_joins(db, "a55") == [joined]
    assert judge.judge_joins(model, PAIR[0], {}, db, "a76") == record  # current: nothing rebuilt
    TuneDB(db).save_traffic("a76", {**record, "method": "per kernel"})  # judged another way: again
    assert judge.pending_joins(db, "a76") == [joined]
    TuneDB(db).save_traffic("a76", record)

    done = cli("compile", ZOO_REF, "--db", db, "--joins", "a76", "-o", tmp_path / "a76")
    assert done.exit_code == 0, done.output
    assert "joins judged in a76's caches" in done.stdout and "joined" in done.stdout
    info = load_artifact(tmp_path / "a76").manifest.partition_info
    assert info["joins"] == "traffic:a76" and info["unfused"] == []
    # judged the other way, the same command builds the minis, and says why
    flipped = {**record, "joins": {joined: {**measured, "joined_bytes": measured["minis_bytes"] + 1}}}
    TuneDB(db).save_traffic("a76", flipped)
    done = cli("compile", ZOO_REF, "--db", db, "--joins", "a76", "-o", tmp_path / "minis")
    assert done.exit_code == 0, done.output
    assert "built as their mini-subgraphs: the model moved no fewer simulated DRAM bytes with it joined" in done.stdout
    artifact = load_artifact(tmp_path / "minis")
    (unfused,) = artifact.manifest.partition_info["unfused"]
    assert unfused["minis_bytes"] == measured["minis_bytes"] and unfused["minis"] == 2
    assert len([k for k in artifact.manifest.kernels if "conv2d" in k["name"]]) == 2
    checked = cli("verify", tmp_path / "minis")
    assert checked.exit_code == 0, checked.output


def test_compile_refuses_a_join_rule_it_cannot_follow(cli, tmp_path):
    without_db = cli("compile", "zoo:tiny-dwsep", "--joins", "a76", "-o", tmp_path / "a")
    assert without_db.exit_code == 1 and "against its tuned minis: it needs --db" in without_db.stderr
    unknown = cli("compile", "zoo:tiny-dwsep", "--db", tmp_path, "--joins", "fastest", "-o", tmp_path / "b")
    assert unknown.exit_code == 1 and "unknown --joins 'fastest'" in unknown.stderr and "a76" in unknown.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _digests(root) -> dict:
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file()}


def test_compile_judges_for_itself_and_never_writes_the_database(tmp_path, cli, monkeypatch):
    """`compile --db DB --joins a76` without a kept judgement judges the joins for that build only — here
    with a stand-in for valgrind that has the minis move fewer bytes —, builds as judged, and leaves DB
    byte-identical; a judgement kept by the explicit step is then read, not made again."""
    from host.bench import proxy
    from toolchain.artifact import load_artifact

    def simulated(artifact, geometry):
        convs = [k for k in artifact.manifest.kernels if "conv2d" in k["name"]]
        return {"model_figures": {"dram_bytes": {geometry.llc[0].label: 3000 - 1000 * len(convs)}}}

    monkeypatch.setattr(proxy, "find_valgrind", lambda: None)
    monkeypatch.setattr(proxy, "measure", simulated)
    model, db, joined, _ = make_pair_db(tmp_path / "pair.db")
    before = _digests(db)
    done = cli("compile", ZOO_REF, "--db", db, "--joins", "a76", "--no-check", "-o", tmp_path / "out")
    assert done.exit_code == 0, done.output
    assert _digests(db) == before  # not a byte written
    (unfused,) = load_artifact(tmp_path / "out").manifest.partition_info["unfused"]
    assert (unfused["joined_bytes"], unfused["minis_bytes"]) == (2000, 1000)
    assert judge.pending_joins(db, "a76") == [joined]

    kept = judge.keep_judgement(model, PAIR[0], {}, db, "a76")
    assert judge.pending_joins(db, "a76") == [] and kept["joins"][joined]["minis_bytes"] == 1000
    monkeypatch.setattr(proxy, "measure", lambda *args: pytest.fail("a kept judgement is read, not made again"))
    done = cli("compile", ZOO_REF, "--db", db, "--joins", "a76", "--no-check", "-o", tmp_path / "again")
    assert done.exit_code == 0, done.output
    # --joins unset: the target's geometry where the database keeps a current judgement in it (a host target has
    # none: --geometry names it), else the measured time
    done = cli("compile", ZOO_REF, "--db", db, "--geometry", "a76", "--no-check", "-o", tmp_path / "default")
    assert done.exit_code == 0, done.output
    assert "keeps them judged in the a76 cache geometry" in " ".join(done.stderr.split())
    assert load_artifact(tmp_path / "default").manifest.partition_info["joins"] == "traffic:a76"
    done = cli("compile", ZOO_REF, "--db", db, "--no-check", "-o", tmp_path / "timed")
    assert done.exit_code == 0, done.output
    assert load_artifact(tmp_path / "timed").manifest.partition_info["joins"] == "latency"
