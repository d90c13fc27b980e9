"""On-device RPC tuning: the runner's RPC server on devices, agents on TVM's tracker, MetaSchedule
measuring through them, and what happens when a device fails.

The qemu device and the fake adb phone (tests/fakeadb) stand in for phones: their outputs are real,
their times are not (nothing here asserts on time).
"""

import collections
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

#: tiny-cnn in ONNX's layout is one subgraph split into two minis: 12 trials in batches of 4 give each
#: mini and their join a first batch (the plan) and the join is then timed next to its minis (a pairing).
#: The search's own cost (population 128 by default) is not what is tested here.
#: the roof stops kernels on what they measured, and these tests count trials and pairings: without it here
#: (test_killing_the_runner_mid_run_loses_nothing measures the roof over RPC)
TUNE_ARGS = ("--trials", "12", "--per-iter", "4", "--population", "8", "--layout", "NCHW", "--roof", "0")


@pytest.fixture
def sandboxes(tmp_path, monkeypatch):
    monkeypatch.setenv("AGOC_QEMU_SANDBOX", str(tmp_path / "qemu"))
    monkeypatch.setenv("AGOC_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture(scope="module")
def qemu_tuned(runners, tmp_path_factory):
    """tiny-cnn tuned on qemu through RPC by ``agoc tune`` (in this process), once per test session: the
    parallel workers (pytest -n) share it, the first one there tunes. Returns (database, {exit_code,
    stdout, stderr} of the tune). Read it only (``compile --db`` does); copy it to change it."""
    from typer.testing import CliRunner

    from host import cli as cli_module

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    db, done = root / "rpc-qemu-tuned" / "db", root / "rpc-qemu-tuned.json"
    with open(root / "rpc-qemu-tuned.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(db.parent, ignore_errors=True)
            with pytest.MonkeyPatch.context() as mp:  # its own tracker state and qemu sandbox
                mp.setenv("AGOC_QEMU_SANDBOX", str(db.parent / "qemu"))
                mp.setenv("AGOC_HOME", str(db.parent / "home"))
                cli_module.console.width = cli_module.err_console.width = 200
                result = CliRunner().invoke(cli_module.app, ["tune", "zoo:tiny-cnn", "--db", str(db), "--device",
                                                             "qemu", *TUNE_ARGS])
            done.write_text(json.dumps({"exit_code": result.exit_code, "stdout": result.stdout,
                                        "stderr": result.stderr}))
    return db, json.loads(done.read_text())


def _axpy(path, target):
    import tvm
    from tvm import te
    from tvm.support import cc

    a, b = te.placeholder((256,), name="A"), te.placeholder((256,), name="B")
    c = te.compute((256,), lambda i: a[i] * 2.0 + b[i], name="C")
    lib = tvm.compile(tvm.IRModule({"axpy": te.create_prim_func([a, b, c]).with_attr("global_symbol", "axpy")}),
                      target=target)
    cross = target.get("mtriple", "").startswith("aarch64")
    lib.export_library(str(path), **({"fcompile": cc.cross_compiler("aarch64-linux-gnu-g++")} if cross else {}))
    return path


def test_agent_offers_a_device_on_the_tracker_and_relays_sessions(runners, sandboxes):
    import tvm
    from tvm import rpc

    from host import rpc as rpc_mod
    from host.devices import get_device
    from toolchain.targets import resolve_target

    spec = resolve_target("linux-arm64")
    with rpc_mod.RpcSession(spec, [get_device("qemu")], work_dir=sandboxes / "agents") as session:
        host, port = session.tracker
        assert host == "127.0.0.1"  # loopback by default
        summary = rpc_mod.tracker_summary(host, port)
        assert rpc_mod.servers_for(summary, "linux-arm64") == 1
        assert all(s["addr"][0] == "127.0.0.1" for s in summary["server_info"])
        status = session.agent_status("qemu")
        assert status["state"] == "offered" and status["runner_pid"]
        # the runner accepts neither the tracker key nor a guess: only the agent's secret
        with pytest.raises(Exception, match="match"):
            rpc.connect("127.0.0.1", status["runner_port"], key="linux-arm64")
        # a client that asks the tracker gets a session on the device, through the agent
        remote = rpc.connect_tracker(host, port).request("linux-arm64", session_timeout=120)
        lib = _axpy(sandboxes / "axpy.so", spec.tvm_target)
        remote.upload(str(lib))
        kernel = remote.load_module("axpy.so")
        dev = remote.cpu()
        x = np.arange(256, dtype=np.float32)
        ta, tb = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(x, dev)
        tc = tvm.runtime.tensor(np.zeros(256, np.float32), dev)
        kernel["axpy"](ta, tb, tc)
        np.testing.assert_allclose(tc.numpy(), 3 * x)
        info = json.loads(remote.get_function("agoc.sysinfo")())
        assert info["device"] == "qemu" and "cpu_freq_khz" in info and "thermal_c" in info
        del kernel, ta, tb, tc, dev, remote
        __import__("gc").collect()
        deadline = time.time() + 60
        while session.agent_status("qemu").get("sessions", 0) < 1 and time.time() < deadline:
            time.sleep(0.2)
        assert session.agent_status("qemu")["sessions"] == 1
        # offered again after the session, under a fresh one-time match key
        assert rpc_mod.servers_for(rpc_mod.tracker_summary(host, port), "linux-arm64") == 1
        runner_pid = status["runner_pid"]
    assert session.agent_status("qemu")["state"] == "stopped"
    assert not __import__("psutil").pid_exists(runner_pid), "the runner outlived its agent"


@pytest.mark.e2e
def test_tune_on_qemu_through_rpc_then_compile_and_verify(cli, runners, sandboxes, qemu_tuned):
    db, tuned = qemu_tuned
    assert tuned["exit_code"] == 0, tuned["stderr"]
    assert "measured on qemu over RPC" in tuned["stderr"]
    assert "plan: 1 kernel (1 split into 2 minis), 12 trials" in tuned["stderr"]  # a batch per mini and the join
    session = json.loads((db / "session.json").read_text())
    assert session["target"]["mtriple"] == "aarch64-linux-gnu"
    log = [json.loads(ln) for ln in (db / "measurements.jsonl").read_text().splitlines()]
    ok = [ln for ln in log if ln["status"] == "ok"]
    assert ok and all(ln["device"] == "qemu" and ln["median_ms"] > 0 for ln in ok)
    assert all("cpu_freq_khz" in ln and "thermal_c" in ln for ln in ok)
    report = json.loads((db / "devices.json").read_text())
    assert report["devices"]["qemu"]["measured"] == sum(ln["purpose"] == "candidate" for ln in ok)
    # kernels timed in turn on the device, 3 rounds (PAIR_ROUNDS) a call: the join and its two minis, and a task's
    # best records timed again before the best is verified
    calls = collections.Counter(ln["pairing"] for ln in ok if ln["purpose"] == "pairing")
    assert report["devices"]["qemu"]["paired"] == sum(calls.values())
    assert 3 * 3 in calls.values() and all(n % 3 == 0 for n in calls.values())
    # every kernel verified; MetaSchedule's records hold the device's latencies
    status = cli("tune", "--status", db)
    assert status.exit_code == 0 and "verified" in status.stdout

    # the command tune printed builds what was tuned: for the database's target, checked under qemu
    printed = tuned["stdout"].split("build with: ")[1].split()
    assert printed[:5] == ["agoc", "compile", "zoo:tiny-cnn", "--db", str(db)] and "--target" not in printed
    refused = cli("compile", "zoo:tiny-cnn", "--db", db, "--target", "host", "-o", sandboxes / "host-art")
    assert refused.exit_code == 1 and "--other-target" in refused.stderr
    assert not (sandboxes / "host-art").exists()
    out = sandboxes / "art"
    result = cli(*printed[1:-1], out)
    assert result.exit_code == 0, result.stderr
    assert "tuned" in result.stdout and "target linux-arm64" in result.stdout and "checked on qemu" in result.stdout
    result = cli("verify", out, "--device", "qemu", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["passed"]


@pytest.mark.e2e
def test_a_float16_session_on_qemu_tunes_the_float16_kernels_and_compile_builds_them(cli, runners, sandboxes):
    """`tune --precision fp16` through RPC: the session records its precision, the kernels it tunes and verifies are
    the float16 ones (ARMv8.2-A arithmetic, run by qemu), and `compile --db` builds them in float16 without being
    told, checked and verified under qemu within float16's tolerance."""
    from toolchain.tune.db import TuneDB

    db = sandboxes / "db16"
    result = cli("tune", "zoo:tiny-cnn", "--db", db, "--device", "qemu", "--precision", "fp16", *TUNE_ARGS)
    assert result.exit_code == 0, result.stderr
    assert "float16" in result.stderr
    tuned = TuneDB(db)
    assert tuned.precision == "fp16" and "+fullfp16" in tuned.session["target"]["mattr"]
    records = tuned.ms_database().get_all_tuning_records()
    assert records and all("float16" in r.workload.mod.script() for r in records)
    assert tuned.verified and all(v["status"] == "verified" for v in tuned.verified.values()), tuned.verified
    again = cli("tune", "zoo:tiny-cnn", "--db", db, "--device", "qemu", *TUNE_ARGS)  # fp32 into an fp16 database
    assert again.exit_code == 1 and "--precision fp16" in again.stderr
    out = sandboxes / "art16"
    built = cli("compile", "zoo:tiny-cnn", "--db", db, "-o", out)
    assert built.exit_code == 0, built.stderr
    assert "float16" in built.stderr and "tuned" in built.stdout and "checked on qemu" in built.stdout
    assert json.loads((out / "manifest.json").read_text())["target"]["precision"] == "fp16"
    result = cli("verify", out, "--device", "qemu", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["passed"], result.stdout + result.stderr


@pytest.mark.e2e
def test_two_devices_share_one_tuning_run(cli, runners, sandboxes, phone):
    """The qemu device and an adb phone (both linux-arm64) on one private tracker, one run; a join
    and its minis are timed against each other on one of them, never across the two."""
    from toolchain.tune.pairing import PAIR_ROUNDS

    db = sandboxes / "db2"
    result = cli("tune", "zoo:tiny-cnn", "--db", db, "--device", "qemu", "--device", "emulator-5554", *TUNE_ARGS)
    assert result.exit_code == 0, result.stderr
    report = json.loads((db / "devices.json").read_text())
    measured = {name: d.get("measured", 0) for name, d in report["devices"].items()}
    assert set(measured) == {"qemu", "emulator-5554"}
    assert all(n > 0 for n in measured.values()), measured
    log = [json.loads(ln) for ln in (db / "measurements.jsonl").read_text().splitlines()]
    ok = [ln for ln in log if ln["status"] == "ok"]
    pairings: dict[str, list] = {}
    for ln in ok:
        if ln["purpose"] == "pairing":
            pairings.setdefault(ln["pairing"], []).append(ln)
    assert pairings, "the join was never timed next to its minis"
    for lines in pairings.values():  # one pairing: rounds of the join and each of its minis, on one device
        assert len(lines) % PAIR_ROUNDS == 0 and len({ln["device"] for ln in lines}) == 1, lines


@pytest.fixture
def phone_like_qemu(tmp_path, monkeypatch):
    """A fake adb phone with as many cores as the qemu device reports (this machine's): the two then run
    one target (linux-arm64 with the same num-cores), so a database tuned on qemu resumes on the phone."""
    from tests.fakeadb.server import DEFAULT_CPUS, FakeAdbServer

    cpus = tuple(DEFAULT_CPUS[i % len(DEFAULT_CPUS)] for i in range(os.cpu_count() or 1))
    with FakeAdbServer(tmp_path / "phone", cpus=cpus) as server:
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
        monkeypatch.delenv("ANDROID_SERIAL", raising=False)
        yield server


@pytest.mark.e2e
def test_pairing_on_a_phone_whose_port_this_process_relays(cli, runners, sandboxes, phone_like_qemu, qemu_tuned):
    """The fake adb server relays the phone's forwarded port in this process: timing a join next to
    its minis must not block it (a blocking TVM call holds the interpreter lock; it hung here once).
    The session tuned on qemu (the same target), its pairing dropped, resumed on the phone: nothing is
    left to search, so the run is the pairing, timed on the phone (the full tuning run on a phone,
    pairing included, is test_two_devices_share_one_tuning_run's)."""
    from toolchain.tune.pairing import PAIR_ROUNDS

    db = sandboxes / "db3"
    shutil.copytree(qemu_tuned[0], db)
    verified = json.loads((db / "verified.json").read_text())
    joins = [name for name, entry in verified.items() if entry.pop("paired", None)]
    assert len(joins) == 1, "the session on qemu paired its one join"
    (db / "verified.json").write_text(json.dumps(verified))
    before = len((db / "measurements.jsonl").read_text().splitlines())
    result = cli("tune", "zoo:tiny-cnn", "--db", db, "--device", "emulator-5554", *TUNE_ARGS)
    assert result.exit_code == 0, result.stderr
    log = [json.loads(ln) for ln in (db / "measurements.jsonl").read_text().splitlines()[before:]]
    assert log and {ln["purpose"] for ln in log} == {"pairing"}  # resumed: nothing but the pairing ran
    assert {ln["device"] for ln in log} == {"emulator-5554"} and len(log) == 3 * PAIR_ROUNDS  # the join, 2 minis
    assert json.loads((db / "verified.json").read_text())[joins[0]]["paired"]["rounds"] == PAIR_ROUNDS


@pytest.mark.e2e
def test_killing_the_runner_mid_run_loses_nothing(runners, sandboxes):
    """SIGKILL the device's RPC server while it measures: the run finishes on the restarted
    runner, the loss is reported, and every finished record is in the database."""
    from host import rpc as rpc_mod
    from host.devices import get_device
    from host.measure import read_log
    from models.registry import build as build_model
    from toolchain import build, onnx_import
    from toolchain.targets import resolve_target
    from toolchain.tune.session import tune_model
    from toolchain.tune.settings import TuneSettings

    spec = resolve_target("linux-arm64", num_cores=2, layout="NCHW")  # convs only: every task tunes to its budget
    proto = build_model("tiny-cnn", None)
    mod = build.legalize(onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {})), spec)
    db = sandboxes / "db3"
    db.mkdir()
    log = db / "measurements.jsonl"
    settings = TuneSettings(trials=12, per_iter=4, population=8)  # a first batch for each task (TUNE_ARGS)
    killed = {}

    with rpc_mod.RpcSession(spec, [get_device("qemu")], log=log, work_dir=db / "agents") as session:

        def killer():
            while len([x for x in read_log(log) if x["status"] == "ok"]) < 3:
                time.sleep(0.2)
            killed["pid"] = session.agent_status("qemu")["runner_pid"]
            os.kill(killed["pid"], 9)  # the runner under qemu is a process of this machine

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        events = []
        summary = tune_model(mod, onnx_import.model_hash(proto), spec, settings, db, events.append,
                             measure=session.measure())
        thread.join(timeout=5)
        report = session.report()
    assert killed, "the runner was never killed"
    assert report["devices"]["qemu"]["restarts"] >= 1, report
    assert session.agent_status("qemu")["runner_pid"] != killed["pid"]
    lines = read_log(log)
    # measurements went on after the kill (on the restarted runner)
    assert sum(1 for x in lines if x["status"] == "ok") > 3
    # the database: every task tuned to its budget and verified, nothing lost
    assert all(t["status"] == "verified" for t in summary["tasks"]), summary["tasks"]
    assert all(t["trials"] >= t["budget"] or t["at_roof"] for t in summary["tasks"])
    from toolchain.tune.events import Roof

    roofs = [e for e in events if isinstance(e, Roof)]  # the roof probe, timed on the device over RPC
    assert roofs and roofs[0].gflops > 0, roofs


def test_a_killed_agent_leaves_no_runner_behind(runners, sandboxes):
    import psutil

    from host import rpc as rpc_mod
    from host.devices import get_device
    from toolchain.targets import resolve_target

    spec = resolve_target("linux-arm64", num_cores=2)
    with rpc_mod.RpcSession(spec, [get_device("qemu")], work_dir=sandboxes / "agents-killed") as session:
        runner = session.agent_status("qemu")["runner_pid"]
        assert psutil.pid_exists(runner)
        session.agents["qemu"].kill()  # SIGKILL: the agent cannot stop its runner itself
        session.agents["qemu"].wait(timeout=30)
        assert psutil.pid_exists(runner)  # orphaned, still serving ...
    deadline = time.time() + 10  # ... until the session ends
    while psutil.pid_exists(runner) and psutil.Process(runner).status() != psutil.STATUS_ZOMBIE:
        assert time.time() < deadline, "the orphaned runner was not stopped"
        time.sleep(0.1)


def test_tracker_cli_start_serve_status_stop(cli, runners, sandboxes):
    result = cli("tracker", "start", "--port", "19190")
    assert result.exit_code == 0, result.stderr
    state = json.loads((sandboxes / "home" / "tracker.json").read_text())
    assert state["host"] == "127.0.0.1"
    env = {**os.environ, "AGOC_HOME": str(sandboxes / "home")}
    serve = subprocess.Popen([sys.executable, "-m", "host.cli", "tracker", "serve", "--device", "local",
                              "--key", "x86"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            result = cli("tracker", "status", "--json")
            assert result.exit_code == 0, result.stderr
            if any(s["key"] == "server:x86" for s in json.loads(result.stdout)["server_info"]):
                break
            time.sleep(0.5)
        else:
            pytest.fail("the served device never registered")
        table = cli("tracker", "status")
        assert "x86" in table.stdout
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        result = cli("tracker", "stop")
        assert result.exit_code == 0


def test_tune_without_a_tracker_or_key_is_a_clear_error(cli, sandboxes):
    result = cli("tune", "zoo:tiny-cnn", "--db", sandboxes / "db", "--tracker", "127.0.0.1:1")
    assert result.exit_code == 1 and "--key" in result.stderr


def test_retry_only_on_device_failures():
    from host.measure import _retryable

    assert _retryable("Traceback ...\nsession.device(...)\nConnectionResetError: [Errno 104] Connection reset by peer")
    assert _retryable("RuntimeError: Cannot find server that matches key linux-arm64")
    assert not _retryable("Traceback: in session ...\nValueError: Unknown device: llvm")
    assert not _retryable("TimeoutError: session timed out")


@pytest.mark.e2e
def test_a_hanging_kernel_is_timed_out_and_the_device_serves_again(runners, sandboxes):
    """A kernel that never returns: the runner kills its session at the client's timeout; the agent
    offers the device again and the next session works."""
    import tvm
    from tvm import rpc
    from tvm.script import tirx as T

    from host import rpc as rpc_mod
    from host.devices import get_device
    from toolchain.targets import resolve_target

    @T.prim_func
    def spin(a: T.Buffer((1,), "float32"), b: T.Buffer((1,), "float32")):
        T.func_attr({"global_symbol": "spin"})
        while a[0] > T.float32(0):
            b[0] = b[0] + T.float32(1)

    spec = resolve_target("host")
    lib = sandboxes / "spin.so"
    tvm.compile(tvm.IRModule({"spin": spin}), target=spec.tvm_target).export_library(str(lib))
    with rpc_mod.RpcSession(spec, [get_device("local")], key="hang", work_dir=sandboxes / "agents") as session:
        host, port = session.tracker
        remote = rpc.connect_tracker(host, port).request("hang", session_timeout=3)
        remote.upload(str(lib))
        kernel = remote.load_module("spin.so")
        dev = remote.cpu()
        a = tvm.runtime.tensor(np.ones(1, np.float32), dev)
        b = tvm.runtime.tensor(np.zeros(1, np.float32), dev)
        with pytest.raises(RuntimeError):  # tvm.error.InternalError "code=kShutdown" (TVM's errors are RuntimeErrors)
            kernel["spin"](a, b)  # the session is killed on the device after 3 s
        del kernel, a, b, dev, remote
        __import__("gc").collect()
        again = rpc.connect_tracker(host, port).request("hang", session_timeout=30)
        assert json.loads(again.get_function("agoc.sysinfo")())["device"] == "local"
        assert session.agent_status("local")["runner_pid"]


@pytest.mark.e2e
def test_a_phone_that_goes_away_is_withdrawn_and_reattached(runners, sandboxes, phone):
    """The phone leaves the adb server (a reboot: its runner dies with it): the agent withdraws it
    from the tracker, and offers it again, with a fresh runner, once it is back."""
    from host import rpc as rpc_mod
    from host.devices import get_device
    from toolchain.targets import resolve_target

    def wait(predicate, what, timeout=120):
        deadline = time.time() + timeout
        while not predicate():
            assert time.time() < deadline, f"timed out waiting until {what}"
            time.sleep(0.3)

    spec = resolve_target("linux-arm64")
    with rpc_mod.RpcSession(spec, [get_device("emulator-5554")], work_dir=sandboxes / "agents") as session:
        host, port = session.tracker
        servers = lambda: rpc_mod.servers_for(rpc_mod.tracker_summary(host, port), "linux-arm64")  # noqa: E731
        first_pid = session.agent_status("emulator-5554")["runner_pid"]
        phone.unplug()
        wait(lambda: servers() == 0, "the phone is withdrawn")
        # the agent withdraws the device first and records why a moment later
        wait(lambda: session.agent_status("emulator-5554").get("state", "").startswith("waiting"), "the agent waits")
        phone.plug()
        wait(lambda: servers() == 1, "the phone is offered again")
        status = session.agent_status("emulator-5554")
        assert status["restarts"] >= 1 and status["runner_pid"] != first_pid
        # a session on the phone again, from another process: this one serves the fake adb server's
        # relays, which a blocking TVM call here would stall (it holds the interpreter lock)
        probe = ("import json, sys; from tvm import rpc; "
                 "r = rpc.connect_tracker(sys.argv[1], int(sys.argv[2])).request('linux-arm64', session_timeout=60); "
                 "print(json.loads(r.get_function('agoc.sysinfo')())['device'])")
        done = subprocess.run([sys.executable, "-c", probe, host, str(port)], capture_output=True, text=True,
                              timeout=120)
        assert done.stdout.strip() == "emulator-5554", done.stderr[-500:]
