"""Where a tuning session's time goes (toolchain/tune/phases.py) and what was cut: seconds per phase counted
once each, saved with the database and shown by its status; builder workers kept across batches; a candidate
checked numerically once per process."""

import os
import types

import pytest

from toolchain import scratch
from toolchain.targets import resolve_target
from toolchain.tune import adapter, candidates, phases, workers
from toolchain.tune.db import TuneDB

SPEC = resolve_target("host", num_cores=2)


@pytest.fixture
def clock(monkeypatch):
    """The phases' clock, moved on by hand: ``clock.tick(seconds)``."""
    now = types.SimpleNamespace(t=100.0)
    now.tick = lambda s: setattr(now, "t", now.t + s)
    monkeypatch.setattr(phases, "time", types.SimpleNamespace(perf_counter=lambda: now.t))
    phases.start()
    return now


def test_a_phase_inside_another_counts_as_its_own_and_the_rest_is_other(clock):
    with phases.timed("search"):
        clock.tick(5)
        with phases.timed("build"):
            clock.tick(10)
    clock.tick(2)
    counted = phases.snapshot()
    assert counted.seconds == {"search": 5, "build": 10, "other": 2}  # the search's own time: its build left out
    assert counted.wall_s == 17 and counted.calls == {"search": 1, "build": 1}


def test_what_runs_inside_a_seed_or_a_verification_counts_as_theirs(clock):
    with phases.timed("seed"):
        with phases.timed("build"):
            clock.tick(5)
    phases.timing("verify")(lambda: clock.tick(1))()
    counted = phases.snapshot()
    assert counted.seconds == {"seed": 5, "verify": 1, "other": 0} and "build" not in counted.calls


def test_a_sessions_phases_are_kept_run_by_run_and_shown_with_its_status(tmp_path):
    from host.render import phases_line

    db = TuneDB(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    first = phases.Phases({"search": 6.0, "build": 3.0, "other": 1.0}, trials=4, wall_s=10.0)
    db.save_phases(first.to_json())
    db.save_phases(phases.Phases({"run": 2.0}, trials=1, wall_s=2.0).to_json())
    assert [r["trials"] for r in db.phases] == [4, 1]
    assert phases.Phases.from_json(db.phases[0]).shares()["search"] == pytest.approx(0.6)
    line = phases_line(db.phases[0])
    assert "4 trials" in line and "2.50 s/trial" in line and "search 6 s (60%)" in line


def test_a_candidate_is_checked_in_a_fresh_process_once(monkeypatch):
    runs = []

    def fresh_process(request, spec, timeout):
        runs.append(request["trace"])
        return {"ok": len(runs) == 1, "max_abs": 0.0}

    monkeypatch.setattr(candidates, "_check_isolated", fresh_process)
    monkeypatch.setattr(candidates, "_CHECKED", {})
    monkeypatch.setattr(candidates, "plain", lambda trace: trace)
    from tvm import te

    a = te.placeholder((4,), name="a")
    func = te.create_prim_func([a, te.compute((4,), lambda i: a[i] + 1.0, name="b")])
    record = types.SimpleNamespace(trace=types.SimpleNamespace(as_json=lambda: ["one"]))
    other = types.SimpleNamespace(trace=types.SimpleNamespace(as_json=lambda: ["two"]))
    assert candidates.check_candidate(func, record, SPEC)["ok"]
    assert candidates.check_candidate(func, record, SPEC)["ok"]  # the same answer, not checked again
    assert not candidates.check_candidate(func, other, SPEC)["ok"]
    assert runs == [["one"], ["two"]]


def test_builder_workers_are_kept_from_one_batch_to_the_next():
    """MetaSchedule's LocalBuilder starts new worker processes, each importing TVM, for every batch."""
    from tvm import te
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    a = te.placeholder((64,), name="a")
    mod = adapter.workload_module(te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2.0, name="b")]))
    phases.start()
    pids = []
    for _ in range(2):
        (built,) = adapter.make_builder(SPEC, None, 1).build([BuilderInput(mod, SPEC.tvm())])
        assert not built.error_msg
        pool = workers.build_pool(1, adapter.BUILD_TIMEOUT_S)
        pids.append({w._proc.pid for w in pool._worker_map.values()})
    assert pids[0] == pids[1] and len(pids[0]) == 1
    assert phases.snapshot().calls["build"] == 2


def test_a_session_hands_what_it_counted_to_the_database_even_when_interrupted(clock, tmp_path):
    db = TuneDB(tmp_path)
    with pytest.raises(KeyboardInterrupt), phases.session(db.save_phases):
        with phases.timed("run"):
            clock.tick(3)
        phases.add_trials(2)
        raise KeyboardInterrupt
    assert db.phases == [phases.Phases({"run": 3, "other": 0}, trials=2, wall_s=3, calls={"run": 1}).to_json()]


def _request(func, trace_json, timeout=None):
    import tvm

    from toolchain.tune.adapter import workload_module

    return {"workload": tvm.ir.save_json(workload_module(func)), "trace": trace_json,
            "target": SPEC.tvm_target, "seed": 0, **({"timeout": timeout} if timeout else {})}


def test_the_check_server_answers_each_check_in_a_fresh_child_and_catches_an_unwritten_halo():
    """One server for the process answers every check in a child it forks (its memory as fresh as a new
    process's): a right schedule passes, the reuse_write halo bug (padding never written at the border)
    fails, a check past its timeout is killed and the server serves on; a dead server is replaced and the
    check still answered."""
    from tests.toolchain.test_schedule_check import _drop_the_halo, fused, schedule
    from toolchain.tune.traces import plain

    pw_dw = fused("class:pointwise_conv", 3, 8)
    server = candidates.CheckServer(SPEC.num_cores)
    try:
        right = server.ask(_request(pw_dw, plain(schedule(pw_dw).trace.as_json())), 300)
        assert right["ok"], right
        wrong = server.ask(_request(pw_dw, plain(_drop_the_halo(pw_dw).trace.as_json())), 300)
        assert not wrong["ok"] and wrong["reason"] == "outputs differ from the unscheduled kernel", wrong
        late = server.ask(_request(pw_dw, plain(schedule(pw_dw).trace.as_json())), 0.001)
        assert late == {"ok": False, "reason": "check timed out after 0 s"}
        assert server.ask(_request(pw_dw, plain(schedule(pw_dw).trace.as_json())), 300)["ok"]
        pid = server.proc.pid
    finally:
        server.close()
    assert server.proc.poll() is not None  # closed: nothing left running

    dead = candidates.check_server(SPEC.num_cores)
    dead.proc.kill()
    dead.proc.wait()
    request = _request(pw_dw, plain(schedule(pw_dw).trace.as_json()))
    assert candidates._check_isolated(request, SPEC, 300)["ok"]  # answered by a process of its own
    fresh = candidates.check_server(SPEC.num_cores)
    assert fresh is not dead and fresh.proc.pid != pid


def test_candidates_timed_only_disturbed_are_counted_per_session_and_told(tmp_path):
    from host.render import phases_line
    from toolchain.timing import Measured, report_disturbed

    report_disturbed(phases.report_path(), Measured([1.0], 5, 0.6))  # an earlier session's
    saved = []
    with phases.session(saved.append):
        for waited in (0.4, 0.9, 0.5):
            report_disturbed(phases.report_path(), Measured([2.0], 5, waited))
    assert saved[0]["disturbed"] == 3 and saved[0]["waited"] == 0.5
    assert phases.Phases.from_json(saved[0]).disturbed == 3
    assert "3 candidate(s) could be timed only while other programs" in phases_line(saved[0])
    with phases.session(saved.append):
        pass
    assert "disturbed" not in saved[1] and "other programs" not in phases_line(saved[1])


def test_a_built_candidate_leaves_no_directory_behind_and_nothing_not_its_own_is_removed(tmp_path):
    # the builder's temporary directory: its .tar, and the .so the runner's load_module made beside it
    built = tmp_path / "tmpbuilder"
    built.mkdir()
    (built / "tvm_tmp_mod.tar").write_bytes(b"tar")
    (built / "tvm_tmp_mod.tar.so").write_bytes(b"so")
    adapter._remove_built(str(built / "tvm_tmp_mod.tar"))
    assert not built.exists()
    # a directory holding anything else keeps it, and itself
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "tvm_tmp_mod.tar").write_bytes(b"tar")
    (shared / "notes.txt").write_text("a user's")
    adapter._remove_built(str(shared / "tvm_tmp_mod.tar"))
    assert [p.name for p in shared.iterdir()] == ["notes.txt"]


def test_the_reports_of_processes_that_are_gone_are_swept_and_no_other_file(tmp_path):
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"agoc-disturbed-{int(gone.stdout)}.jsonl"
    live = tmp_path / f"agoc-disturbed-{os.getpid()}.jsonl"
    others = [tmp_path / "agoc-disturbed-notes.jsonl", tmp_path / f"mine-{int(gone.stdout)}.jsonl"]
    for f in (dead, live, *others):
        f.write_text("")
    scratch.sweep(str(tmp_path), phases.REPORT_PREFIX)
    assert not dead.exists() and live.exists() and all(f.exists() for f in others)


def test_scratch_left_by_a_killed_process_is_swept_and_nothing_else(tmp_path, monkeypatch):
    """A candidate directory of a process that is gone is removed by the next process's first one; a live
    process's, an old unnamed one and a user's stay."""
    import subprocess
    import sys

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    dead = tmp_path / f"agoc-cand-{gone}-abc123"
    dead.mkdir()
    (dead / "candidate.so").write_bytes(b"so")
    keep = [tmp_path / f"agoc-cand-{os.getpid()}-xyz", tmp_path / "agoc-cand-q1w2e3", tmp_path / f"cand-{gone}-x",
            tmp_path / "agoc-cand-123abc"]
    for d in keep:
        d.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_SWEPT", set())
    made = scratch.mkdtemp("agoc-cand-")
    assert not dead.exists() and all(d.exists() for d in keep)
    assert os.path.basename(made).startswith(f"agoc-cand-{os.getpid()}-") and os.path.dirname(made) == str(tmp_path)
    assert scratch.owner(f"agoc-disturbed-{gone}.jsonl", "agoc-disturbed-") == gone
