"""One engine in its own process, timed on command: the benchmark's measuring hand.

Started by :mod:`host.bench` as ``python -m host.bench_worker CONFIG_JSON``. It
loads its engine, warms up, prints ``{"ready": ...}`` and then answers one
JSON line per command read from stdin:

* ``{"cmd": "run", "n": K}`` → ``{"samples_ms": [K per-call latencies]}``
* ``{"cmd": "quit"}`` → ``{"peak_rss_mb": ...}`` and exit.

Why a process per engine (design §5): after each call TVM's pool threads spin
for ≈130 ms, and an engine timed in that window in the same process runs at
one-core speed. Separate processes, driven one at a time with a gap between
them, keep each engine's measurement clean.

Config keys: ``engine`` (``tvm`` | ``onnxruntime``), ``artifact`` (directory:
the library and the sample inputs), ``threads``, ``warmup``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


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


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    threads = int(config["threads"])
    # must precede the first TVM import: its thread pool reads it once
    os.environ["TVM_NUM_THREADS"] = str(threads)
    from toolchain.artifact import load_artifact

    started = time.perf_counter()
    try:
        call = ENGINES[config["engine"]](load_artifact(config["artifact"]), threads)
        for _ in range(int(config.get("warmup", 3))):
            call()
    except Exception as exc:  # reported to the orchestrator, which records the variant as failed
        _reply({"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"})
        return 1
    _reply({"ready": True, "load_ms": (time.perf_counter() - started) * 1e3})
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "run":
            samples = []
            for _ in range(int(command["n"])):
                t0 = time.perf_counter_ns()
                call()
                samples.append((time.perf_counter_ns() - t0) / 1e6)
            _reply({"samples_ms": samples})
        elif command["cmd"] == "quit":
            _reply({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
