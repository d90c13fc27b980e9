"""Fixtures of the device tests: the runners built, and the fake adb phone."""

import fcntl
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.fakeadb import FakeAdbServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runners():
    """Build (or find) the host and linux-arm64 runners."""
    require_tool("cmake")
    require_tool("aarch64-linux-gnu-g++")
    require_tool("qemu-aarch64")
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".runners.lock", "w") as lock:  # parallel workers (pytest -n): one make at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        for target in ("host", "linux-arm64"):
            subprocess.run(["make", "--no-print-directory", "runner", f"TARGET={target}"], cwd=ROOT, check=True,
                           capture_output=True)


@pytest.fixture
def phone(tmp_path, monkeypatch):
    """One emulated phone behind the fake adb server (its programs run under qemu)."""
    with FakeAdbServer(tmp_path / "phone") as server:
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
        monkeypatch.delenv("ANDROID_SERIAL", raising=False)
        yield server
