"""Ctrl-C and SIGTERM stop a compile within seconds, remove its staging directory and touch nothing else."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_build_stops_within_two_seconds_and_cleans_up(tmp_path, sig, code):
    (tmp_path / "keep.txt").write_text("the user's")
    proc = start_compile(tmp_path, tmp_path / "out")
    try:
        wait_for_staging(tmp_path, proc)
        time.sleep(1.0)  # into the build proper
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert took < 2.0, f"took {took:.1f} s to stop"
    assert "interrupted" in err or "terminated" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
