"""What measuring through RPC costs (``agoc bench-rpc``): tuning throughput of one kernel measured by the
local runner vs through tracker → agent → the C++ runner's RPC server, same kernel, trials and seed."""

from __future__ import annotations

import datetime
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SCHEMA = "agoc.bench.rpc/1"
DEFAULT_MODEL = "zoo:pair-pw-dw@1x24x28x28"


def _kernel(model: str, spec):
    """The model's first conv / matmul kernel (legalized, unfused): (model label, name, PrimFunc)."""
    from host.source import load_source
    from toolchain import build, onnx_import
    from toolchain.errors import UnsupportedModelError
    from toolchain.tune import group_kernels

    proto, label, _ = load_source(model, [])
    mod = build.legalize(onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, {})), spec)
    for name, func in group_kernels(mod):
        if name.startswith(("conv2d", "matmul", "dense")):
            return label, name, func
    raise UnsupportedModelError(f"{label} has no conv or matmul kernel to tune")


def run(model: str = DEFAULT_MODEL, device: str = "local", trials: int = 32, per_iter: int = 8, repeats: int = 2,
        out_dir: Path = Path("bench/results"), on_event: Callable[..., None] = lambda kind, **info: None) -> dict:
    from tvm.s_tir import meta_schedule as ms

    from host import rpc as rpc_mod
    from host.bench.suites import machine_context
    from host.devices import get_device
    from host.measure import Hygiene
    from toolchain.targets import resolve_target
    from toolchain.timing import Timing
    from toolchain.tune import (
        FAILED_SECS,
        TuneSettings,
        latency,
        records_of,
        tune_trials,
    )

    dev = get_device(device)
    spec = resolve_target(rpc_mod.device_target(dev),
                          num_cores=None if dev.kind == "local" else dev.describe().get("cores"))
    label, kernel, func = _kernel(model, spec)
    settings = TuneSettings(trials=trials, per_iter=per_iter)
    hygiene = Hygiene(Timing(cold=settings.cold_weights))  # as the local runner times
    work = Path(tempfile.mkdtemp(prefix="agoc-bench-rpc-"))
    rows = {"local": [], "rpc": [], "warm-up": []}

    def one(path: str, measure) -> dict:
        db_dir = work / f"{path}-{len(rows[path])}"
        (db_dir / "ms").mkdir(parents=True)
        database = ms.database.JSONDatabase(work_dir=str(db_dir / "ms"))
        on_event("start", path=path)
        started = time.perf_counter()
        tune_trials(func, spec, database, trials, settings, True, db_dir / "logs", measure)
        seconds = time.perf_counter() - started
        lat = [latency(r) for r in records_of(database, func)]
        ok = [x for x in lat if x < FAILED_SECS]
        row = {"seconds": seconds, "trials": len(lat), "failed": len(lat) - len(ok),
               "trials_per_min": 60 * len(lat) / seconds, "best_ms": min(ok) * 1e3 if ok else None}
        on_event("done", path=path, **row)
        if path == "warm-up":
            rows[path].append(row)
        return row

    try:
        with rpc_mod.RpcSession(spec, [dev], hygiene=hygiene, log=work / "measurements.jsonl",
                                work_dir=work / "agents") as session:
            measure = session.measure()
            if spec.runs_on_host:
                one("warm-up", None)  # imports and worker pools are paid by neither path
            for i in range(repeats):  # interleaved, alternating which goes first
                order = ["local", "rpc"] if i % 2 == 0 else ["rpc", "local"]
                for path in order:
                    if path == "local" and not spec.runs_on_host:
                        continue
                    rows[path].append(one(path, measure if path == "rpc" else None))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median(path, key):
        values = [r[key] for r in rows[path] if r[key] is not None]
        return statistics.median(values) if values else None

    local_tpm, rpc_tpm = median("local", "trials_per_min"), median("rpc", "trials_per_min")
    document = {
        "schema": SCHEMA,
        "date": datetime.date.today().isoformat(),
        "context": machine_context(),
        "model": label, "kernel": kernel, "device": dev.name, "target": spec.tvm_target,
        "settings": {"trials": trials, "per_iter": per_iter, "repeats": repeats, "hygiene": hygiene.to_json()},
        "runs": {k: v for k, v in rows.items() if k != "warm-up"},
        "local_trials_per_min": local_tpm,
        "rpc_trials_per_min": rpc_tpm,
        "rpc_overhead": (local_tpm / rpc_tpm) if local_tpm and rpc_tpm else None,
    }
    document["path"] = str(_write(document, out_dir))
    return document


def _write(document: dict, out_dir: Path) -> Path:
    """``out_dir/rpc-<date>.json`` (``-2``, ``-3``… when that day has one already)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"rpc-{document['date']}.json"
    n = 2
    while path.exists():
        path = out_dir / f"rpc-{document['date']}-{n}.json"
        n += 1
    path.write_text(json.dumps(document, indent=2))
    return path
