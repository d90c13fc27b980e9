"""Shared fixtures: tiny models on disk, the CLI runner, tool requirements."""

from __future__ import annotations

import os
import shutil

import onnx
import pytest

import models


def require_tool(name: str) -> str:
    """Path of a system tool; skip without it — or fail when AGOC_STRICT_TOOLS=1 (CI installs them)."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not found (run `make setup`)"
    if os.environ.get("AGOC_STRICT_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def _private_state_dirs(tmp_path_factory):
    return tmp_path_factory.mktemp("agoc-state")


@pytest.fixture(autouse=True)
def _private_state(_private_state_dirs, monkeypatch):
    """The tracker state (AGOC_HOME) and the qemu device's sandbox in this test process's own temporary
    folder, not the user's ~/.cache/agoc and build/devices/qemu: parallel test workers (pytest -n) and a
    second checkout's tests never share them. A test's own fixtures may still point them elsewhere."""
    monkeypatch.setenv("AGOC_HOME", str(_private_state_dirs / "home"))
    monkeypatch.setenv("AGOC_QEMU_SANDBOX", str(_private_state_dirs / "qemu"))
    # a host build's locality default follows this machine's caches: none here, so a partition is the same on every
    # machine (tests of the host geometry point it at a cache tree of their own)
    monkeypatch.setenv("AGOC_HOST_CACHES", "none")


@pytest.fixture
def model_file(tmp_path):
    """Write a zoo model to an ONNX file: model_file("tiny-cnn") -> path."""

    def write(name: str, shape=None, path=None):
        path = path or tmp_path / f"{name}.onnx"
        onnx.save(models.build(name, shape), str(path))
        return path

    return write


@pytest.fixture
def cli():
    """Invoke `agoc ARGS...` through typer's test runner; returns the Result."""
    from typer.testing import CliRunner

    from host import cli as cli_module

    app = cli_module.app
    # a wide terminal, so table cells and messages are not wrapped mid-phrase
    cli_module.console.width = cli_module.err_console.width = 200
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke
