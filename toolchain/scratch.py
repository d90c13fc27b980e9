"""Temporary files and directories named by the process that made them (``PREFIX<pid>…``), so that a later
process can prove what a killed one left behind is agoc's and no longer in use, and remove it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


def owned_prefix(prefix: str) -> str:
    """The name prefix of this process's scratch entries: ``PREFIX<pid>-``."""
    return f"{prefix}{os.getpid()}-"


#: the prefixes this process has swept
_SWEPT: set[str] = set()


def mkdtemp(prefix: str) -> str:
    """A new temporary directory named :func:`owned_prefix` ``(prefix)``; the first one per prefix and process
    sweeps what dead processes left under that prefix."""
    if prefix not in _SWEPT:
        _SWEPT.add(prefix)
        sweep(tempfile.gettempdir(), prefix)
    return tempfile.mkdtemp(prefix=owned_prefix(prefix))


def owner(name: str, prefix: str) -> int | None:
    """The process id a scratch entry's name carries (``PREFIX<pid>-…`` or ``PREFIX<pid>.ext``), or None when
    the name is not one of ours."""
    if not name.startswith(prefix):
        return None
    head = name[len(prefix):]
    digits = head[: len(head) - len(head.lstrip("0123456789"))]
    rest = head[len(digits):]
    return int(digits) if digits and rest[:1] in ("-", ".") else None


def sweep(folder: str, prefix: str) -> list[str]:
    """Remove the entries of ``folder`` named ``PREFIX<pid>…`` whose process is gone; anything else stays.
    Returns the names removed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = owner(name, prefix)
        if pid is None or alive(pid):
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(name)
    return removed


def alive(pid: int) -> bool:
    """Whether a process with this id exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
