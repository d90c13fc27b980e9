"""Engines in their own process, timed on command: ``python -m host.bench.worker CONFIG_JSON``, one JSON
line per command on stdin (the protocol: docs/tuning.md, Benchmark worker)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _tvm_call(artifact, threads: int):
    from toolchain.runtime import VMSession

    session = VMSession(
        artifact.library_path,
        [t.info for t in artifact.manifest.inputs],
        [t.info.name for t in artifact.manifest.outputs],
    )
    return session.bind(artifact.read_inputs())


def _ort_call(artifact, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(artifact.model_path), opts, providers=["CPUExecutionProvider"])
    feeds = artifact.read_inputs()
    return lambda: session.run(None, feeds)


ENGINES = {"tvm": _tvm_call, "onnxruntime": _ort_call}


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _status_mb(key: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of this process in MiB (Linux); None elsewhere. Unlike ``ru_maxrss``,
    ``VmHWM`` starts afresh at exec, so it does not inherit the orchestrator's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _load(entry: dict, threads: int, warmup: int):
    """(the engine's call, MiB its model added to the resident set once loaded and warmed up)."""
    import importlib

    from toolchain.artifact import load_artifact

    importlib.import_module(entry["engine"])  # the runtime itself (tvm, onnxruntime) is not the model's memory
    before = _status_mb("VmRSS")
    call = ENGINES[entry["engine"]](load_artifact(entry["artifact"]), threads)
    for _ in range(warmup):
        call()
    after = _status_mb("VmRSS")
    return call, (after - before if before is not None and after is not None else None)


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    threads = int(config["threads"])
    # must precede the first TVM import: its thread pool reads it once
    os.environ["TVM_NUM_THREADS"] = str(threads)
    calls, load_ms, rss_mb, errors = {}, {}, {}, {}
    for entry in config["engines"]:
        started = time.perf_counter()
        try:
            calls[entry["name"]], rss_mb[entry["name"]] = _load(entry, threads, int(config.get("warmup", 3)))
            load_ms[entry["name"]] = (time.perf_counter() - started) * 1e3
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator, which records the variant as failed
            errors[entry["name"]] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    from host.bench.cache_regime import DEFAULT, Flusher, regime
    from toolchain.timing import MAX_WAIT, MIN_WAIT_S, run_queue_wait

    cache = regime(config.get("cache", DEFAULT))
    flusher = None  # made at the first run: a worker that only loads (memory alone) needs none
    _reply({"ready": True, "load_ms": load_ms, "model_rss_mb": rss_mb, "errors": errors, "cache": cache.name})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "run":
            if cache.flush and flusher is None:
                peak_before_flusher = _status_mb("VmHWM")
                flusher = Flusher()
            order = [name for name in command.get("order", calls) if name in calls]
            n = int(command["n"])
            # blocks: A A A B B B (each after one untimed call); passes: A B A B A B
            sequence = ([(name, i == 0) for name in order for i in range(n)] if cache.blocks
                        else [(name, False) for _ in range(n) for name in order])
            samples: dict[str, list[float]] = {name: [] for name in order}
            flushes = rehearsals = 0
            disturbed = 0  # timed calls whose threads waited on a run queue (toolchain/timing.py MAX_WAIT of the call)
            flushing = frozenset(getattr(flusher, "thread_ids", ()))  # the flusher's threads: the worker's own
            for name, first in sequence:
                if first:
                    calls[name]()
                    rehearsals += 1
                if flusher is not None:
                    flusher.flush()
                    flushes += 1
                before = run_queue_wait(flushing)
                t0 = time.perf_counter_ns()
                calls[name]()
                samples[name].append((time.perf_counter_ns() - t0) / 1e6)
                after = run_queue_wait(flushing)  # another program on the engine's cores
                if None not in (before, after) and after - before > max(MIN_WAIT_S, MAX_WAIT * samples[name][-1] / 1e3):
                    disturbed += 1
            _reply({"samples_ms": samples, "flushes": flushes, "rehearsals": rehearsals, "disturbed_calls": disturbed})
        elif command["cmd"] == "quit":
            # the flusher's buffers are the benchmark's, not the engines': left out of the peak
            flush_mb = flusher.bytes_per_cpu * len(flusher.cpus) / 2**20 if flusher else 0.0
            peak = _status_mb("VmHWM")
            if peak is not None and flusher is not None:
                peak = max(peak_before_flusher or 0.0, peak - flush_mb)
            _reply({"peak_rss_mb": peak, "flush_mb": flush_mb})
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
