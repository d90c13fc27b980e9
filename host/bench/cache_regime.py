"""What a timed call finds in the caches: the benchmark's cache regimes (``cold``, ``warm``, ``shared``) as a
table. Why each exists and what was measured: docs/tuning.md, "Cache regimes"."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Regime:
    name: str
    flush: bool  # every core's caches overwritten before each timed call
    blocks: bool  # each engine's calls of a round back to back after one untimed call (False: one call per pass)
    meaning: str


REGIMES = {r.name: r for r in (
    Regime("cold", flush=True, blocks=True,
           meaning="each engine's calls back to back, every core's caches overwritten before each timed call: "
           "weights and activations from memory, as on a phone whose caches are smaller than the model"),
    Regime("warm", flush=False, blocks=True,
           meaning="each engine's calls back to back, nothing between them: its own data wherever this host's "
           "caches keep it"),
    Regime("shared", flush=False, blocks=False,
           meaning="a worker's engines called in turn, one call each per pass, nothing between calls: a call "
           "finds what the engines before it left (biased towards an engine alone in its worker; the protocol "
           "of results without a cache regime)"),
)}

DEFAULT = "cold"

#: used where sysfs does not say (a generous desktop / server core)
FALLBACK_PRIVATE = 2 << 20
FALLBACK_SHARED = 32 << 20


def regime(name: str) -> Regime:
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown cache regime '{name}'; choose one of: {', '.join(REGIMES)}") from None


def _size_bytes(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def host_caches(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> tuple[int, int]:
    """(bytes of cpu0's largest cache below the last level, bytes of its last-level cache), from sysfs;
    the fallbacks where sysfs does not say. Instruction caches are left out."""
    levels: dict[int, int] = {}
    for index in sorted(sysfs.glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            levels[level] = max(levels.get(level, 0), _size_bytes((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    if len(levels) < 2:
        return FALLBACK_PRIVATE, FALLBACK_SHARED
    last = max(levels)
    return max(size for level, size in levels.items() if level < last), levels[last]


def flush_bytes_per_cpu(n_cpus: int, private: int, shared: int) -> int:
    """What each of ``n_cpus`` writes so that its private cache and the shared one hold none of the
    engine's data: twice its private cache plus its share of twice the shared cache."""
    return 2 * private + -(-2 * shared // max(1, n_cpus))


class Flusher:
    """One thread per CPU this process may run on, pinned to it, each overwriting its own buffer when
    :meth:`flush` is called (numpy releases the GIL while it writes, so they write at once)."""

    def __init__(self, cpus: list[int] | None = None, bytes_per_cpu: int | None = None):
        import numpy as np

        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        if bytes_per_cpu is None:
            bytes_per_cpu = flush_bytes_per_cpu(len(self.cpus), *host_caches())
        self.bytes_per_cpu = bytes_per_cpu
        self._buffers = [np.zeros(bytes_per_cpu, dtype=np.uint8) for _ in self.cpus]
        self._start = threading.Barrier(len(self.cpus) + 1)
        self._done = threading.Barrier(len(self.cpus) + 1)
        self._stop = False
        self.flushes = 0
        self.thread_ids: set[int] = set()  # the flushing threads' (left out of the run-queue wait a round reports)
        self._threads = [threading.Thread(target=self._loop, args=(cpu, buf), daemon=True)
                         for cpu, buf in zip(self.cpus, self._buffers)]
        for t in self._threads:
            t.start()

    def _loop(self, cpu: int, buf) -> None:
        self.thread_ids.add(threading.get_native_id())
        try:
            os.sched_setaffinity(0, {cpu})  # Linux: the calling thread only
        except (AttributeError, OSError):
            pass
        while True:
            self._start.wait()
            if self._stop:
                return
            buf += 1  # a read and a write of every line
            self._done.wait()

    def flush(self) -> None:
        self._start.wait()
        self._done.wait()
        self.flushes += 1

    def close(self) -> None:
        self._stop = True
        self._start.wait()
        for t in self._threads:
            t.join()
