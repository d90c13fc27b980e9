"""Ctrl-C and SIGTERM stop a compile within seconds, remove its staging directory and touch nothing else; they stop
a tune within seconds too, from inside MetaSchedule's search, its database kept."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_compile(tmp_path, out):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # a model big enough that the build is still running when the signal comes
    # Ctrl-C as a terminal sends it: a test runner's worker (pytest-xdist) ignores SIGINT, and a child inherits
    # that, so Python would install no KeyboardInterrupt handler; a shell's foreground job has the default
    # (--untuned plain: to the build sooner; the untuned kernels' scheduling stops with its caller: test_forked)
    words = ["compile", "zoo:mobilenet-v2@1x3x32x32", "-o", str(out), "--untuned", "plain"]
    return subprocess.Popen([sys.executable, "-m", "host.cli", *words], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_staging(tmp_path, proc, timeout=120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(p.name.startswith(".out.staging.") for p in tmp_path.iterdir()):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail("the compile never started building")


def signal_and_wait(proc, sig, timeout: float, kill: bool = True) -> tuple[str, float]:
    """Send ``sig`` a second into the work; (stderr, seconds until the process ended). Killed after, unless not
    ``kill`` and it did not end in ``timeout`` (subprocess.TimeoutExpired)."""
    ended = False
    try:
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=timeout)
        ended = True
        return err, time.monotonic() - sent
    finally:
        if kill or ended:
            proc.kill()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_build_stops_within_two_seconds_and_cleans_up(tmp_path, sig, code):
    (tmp_path / "keep.txt").write_text("the user's")
    proc = start_compile(tmp_path, tmp_path / "out")
    try:
        wait_for_staging(tmp_path, proc)
    except BaseException:
        proc.kill()
        raise
    err, took = signal_and_wait(proc, sig, 30)  # into the build proper
    assert proc.returncode == code, err
    assert took < 2.0, f"took {took:.1f} s to stop"
    assert "interrupted" in err or "terminated" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_search_stops_a_tune_within_seconds_and_keeps_its_database(tmp_path, sig, code):
    """The search calls back into Python (the cost model, the runner) from TVM, which turned a KeyboardInterrupt raised
    there into a RuntimeError the session survived: a tune went on after Ctrl-C. Its process group is gone after."""
    db = tmp_path / "db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    words = ["tune", "zoo:tiny-cnn", "--db", str(db), "--trials", "400", "--no-library"]

    def child_setup():
        os.setsid()  # its own process group: what it starts is found by it
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "host.cli", *words], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=child_setup)
    deadline = time.time() + 180
    while not (db / "logs").is_dir() or not any((db / "logs").iterdir()):  # MetaSchedule's search has begun
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the tune ended or never searched: {proc.communicate()}")
        time.sleep(0.05)
    # TVM's native search puts a SIGINT handler of its own in for moments (libtvm_compiler; SIGTERM untouched): a
    # Ctrl-C that lands there is lost, as a user would see, and a second one stops the tune (docs/reliability.md)
    presses = 3 if sig == signal.SIGINT else 1
    for press in range(presses):
        last = press == presses - 1
        try:
            err, took = signal_and_wait(proc, sig, 60 if last else 5.0, kill=last)
            break
        except subprocess.TimeoutExpired:
            if last:
                raise
    assert proc.returncode == code, err[-2000:]
    assert took < 5.0, f"took {took:.1f} s to stop"
    assert (db / "session.json").is_file()  # the database is the user's result so far: kept
    for _ in range(100):  # its workers (runner, builders, checker) follow it out
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the tune's worker processes outlived it")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_inside_a_tvm_callback_stops_with_its_own_code_not_as_a_failed_stage(monkeypatch, sig, code):
    """TVM hands an exception raised in one of its Python callbacks (a pass) back as a RuntimeError, which the stage
    wraps ("legalizing the model failed"): a signal received there is still an interrupt, not the user's error."""
    import tvm

    from host import cli
    from toolchain.errors import BuildError

    class Stopped(Exception):
        pass

    stopped = []

    def stop(exit_code):
        stopped.append(exit_code)
        raise Stopped

    monkeypatch.setattr(cli, "_stop", stop)
    monkeypatch.setattr(cli, "_arm_deadline", lambda code: None)  # (this process is the test runner's)
    monkeypatch.setitem(cli._state, "signalled", 0)

    @tvm.transform.module_pass(opt_level=0)
    def handler_runs_here(mod, ctx):
        cli._on_signal(sig, None)  # as Python runs the handler, in the callback's bytecode

    def stage():
        try:
            handler_runs_here(tvm.IRModule())
        except Exception as exc:
            assert not isinstance(exc, KeyboardInterrupt)  # what TVM did to it: why the flag is needed
            raise BuildError(f"legalizing the model failed: {exc!r}") from exc

    with pytest.raises(Stopped):
        cli._guard(stage)()
    assert stopped == [code]


def test_an_interrupt_kills_every_process_it_started():
    """A builder worker mid-build would outlive the hard exit and hold the caller's pipes open; an RPC server or a
    suite's tune runs in a session of its own, where the terminal's Ctrl-C does not reach it: all are killed, and
    what they started."""
    script = (
        "import subprocess, sys, time\n"
        "from host import cli\n"
        "worker = subprocess.Popen(['sleep', '60'])\n"
        "server = subprocess.Popen(['sh', '-c', 'sleep 60 & echo $!; wait'], start_new_session=True,\n"
        "                          stdout=subprocess.PIPE, text=True)\n"
        "grandchild = server.stdout.readline().strip()\n"
        "cli._end_workers()\n"
        "print(worker.wait(timeout=10), server.wait(timeout=10), grandchild)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    worker, server, grandchild = out.stdout.split()
    assert int(worker) == int(server) == -signal.SIGKILL
    assert _gone(int(grandchild)), "a process its child started outlived it"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_process_even_when_its_unwinding_stalls(sig, code):
    """After Ctrl-C or SIGTERM a command unwinds (its progress display, its session); should that wait on a lock a
    worker thread holds, the process still ends STOP_GRACE_S on, with the signal's code and nothing left behind."""
    script = (
        "import os, signal, subprocess, threading, time\n"
        "from host import cli\n"
        f"signal.signal({int(sig)}, cli._on_signal)\n"
        "worker = subprocess.Popen(['sleep', '60'])\n"
        "print(worker.pid, flush=True)\n"
        "held = threading.Lock()\n"
        "held.acquire()\n"
        "try:\n"
        f"    os.kill(os.getpid(), {int(sig)})\n"
        "    time.sleep(30)\n"
        "except KeyboardInterrupt:\n"
        "    held.acquire()  # the unwinding waits for good\n"
    )
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert out.returncode == code, out.stderr
    assert ("interrupted" if code == 130 else "terminated") in out.stderr
    assert took < 30  # the deadline, not the sleep or the lock, ended it
    assert _gone(int(out.stdout)), "its worker outlived it"


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended within five seconds (a zombie not yet reaped counts as ended)."""
    for _ in range(100):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return False
