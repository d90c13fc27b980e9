"""A function run in a child forked from this process, bounded by a timeout: a TVM call that does not return
(MetaSchedule's tiling of some kernels runs for minutes) costs the timeout, not the command."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable


def call(fn: Callable[[], object], timeout: float) -> tuple[bool, object]:
    """(True, what ``fn()`` returned, through JSON) or (False, why not: "timed out after N s", "failed: <its
    exception>" or "crashed (...)").
    The child writes nothing else and exits without this process's exit handlers."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            try:
                data = json.dumps({"value": fn()}).encode()
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, the child ends either way
                data = json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:300]}"}).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write, view):]
        finally:
            os._exit(0)
    os.close(write)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([read], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                _kill(pid)
                return False, f"timed out after {timeout:.0f} s"
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except BaseException:  # Ctrl-C or SIGTERM here: the child goes too
        _kill(pid)
        raise
    finally:
        os.close(read)
    status = os.waitpid(pid, 0)[1]
    if status != 0 or not chunks:
        return False, f"crashed (wait status {status})"
    answer = json.loads(b"".join(chunks))
    return (True, answer["value"]) if "value" in answer else (False, f"failed: {answer['error']}")


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
