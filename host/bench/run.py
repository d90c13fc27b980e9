"""Running a suite: one worker process per engine kind, interleaved timed rounds, the results document."""

from __future__ import annotations

import datetime
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from host.bench import cache_regime
from host.bench.results import geomean_speedups
from host.bench.suites import (
    SCHEMA,
    VARIANTS_BY_NAME,
    Case,
    Settings,
    Suite,
    Variant,
    machine_context,
    ratio_stats,
    stats,
)
from host.bench.variants import (
    compile_variant,
    equal_budget,
    partition_figures,
    proxy_baselines,
    proxy_variant,
)

log = logging.getLogger(__name__)


class Worker:
    """A :mod:`host.bench.worker` process timing the variants of one engine kind, close together."""

    def __init__(self, members: dict[str, tuple[Variant, Path]], settings: Settings):
        engines = [{"name": name, "engine": v.engine, "artifact": str(path)} for name, (v, path) in members.items()]
        config = {"engines": engines, "threads": settings.threads, "warmup": settings.warmup,
                  "cache": settings.cache}
        env = dict(os.environ, TVM_NUM_THREADS=str(settings.threads), OMP_NUM_THREADS=str(settings.threads))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "host.bench.worker", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.hello = self._read()
        # a variant that did not load: its reason; the whole process failing fails every member
        self.errors = {name: self.hello["error"] for name in members} if "error" in self.hello else self.hello["errors"]
        self.names = [name for name in members if name not in self.errors]
        # how the timed calls were prepared (host.bench.cache_regime): flushes and untimed calls, all runs
        self.cache = {"regime": self.hello.get("cache"), "flushes": 0, "rehearsals": 0}
        # rounds timed while another program held the engine's cores (toolchain/timing.py's run-queue wait)
        self.disturbed = 0

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"worker exited with code {self.proc.wait()}"}
        return json.loads(line)

    def run(self, n: int, order: list[str]) -> dict[str, list[float]]:
        """``n`` timed calls of each variant in ``order`` (back to back per variant, or in passes: the
        cache regime's way): samples per variant."""
        self.proc.stdin.write(json.dumps({"cmd": "run", "n": n, "order": order}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(reply["error"])
        self.cache["flushes"] += reply.get("flushes", 0)
        self.cache["rehearsals"] += reply.get("rehearsals", 0)
        calls = sum(len(v) for v in reply["samples_ms"].values())
        if calls and 2 * reply.get("disturbed_calls", 0) >= calls:  # its median call waited on a run queue
            self.disturbed += 1
        return reply["samples_ms"]

    def hold(self, held: bool) -> None:
        """Stop the worker's process (``held``) or let it go on: an engine that is not being timed must not
        spin its idle threads on the cores of the one that is (onnxruntime's intra-op threads spin after a
        call; on 2 cores that made a 0.06 ms TVM model read 4 ms)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP if held else signal.SIGCONT)

    def close(self) -> dict:
        if self.proc.poll() is not None:
            return {}
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.flush()
            reply = self._read()
        finally:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a worker slowed down by other programs: its figures are in
                self.proc.kill()
                self.proc.wait()
        return reply


def memory_alone(members: dict[str, tuple[Variant, Path]], settings: Settings) -> dict[str, float]:
    """MiB each model adds to a process that loads it alone, loaded and warmed up in a worker of its own.

    Variants sharing a timing worker cannot be charged from it: what a model's loading adds there
    depends on what the allocator kept from the models loaded before it (MobileNet-V2 @112, both
    tuned: AGO's adds 31 MB alone and 54 MB after stock's; stock's 31 alone, 29 after AGO's). The phone's
    runner loads one model per process, so that is the figure reported."""
    out = {}
    for name, member in members.items():
        worker = Worker({name: member}, settings)
        try:
            if name in worker.names:
                out[name] = worker.hello["model_rss_mb"][name]
        finally:
            worker.close()
    return out


def measure_rounds(workers: list[Worker], settings: Settings, rng: random.Random, on_event):
    """Interleaved rounds: every live worker once per round, in a random order, with a gap between
    workers; inside a worker its variants are timed in a random order per round (the cache regime says
    whether as blocks of calls or one call each per pass).

    Returns (samples per variant, per-round medians per variant, failure reason per variant).
    """
    names = [name for w in workers for name in w.names]
    samples: dict[str, list[float]] = {name: [] for name in names}
    round_medians: dict[str, list[float]] = {name: [] for name in names}
    failures: dict[str, str] = {}
    alone = len(workers) > 1  # each worker timed with the others stopped
    try:
        for worker in workers if alone else []:
            worker.hold(True)
        _rounds(workers, settings, rng, on_event, alone, samples, round_medians, failures)
    finally:
        for worker in workers if alone else []:
            worker.hold(False)
    return samples, round_medians, failures


def _rounds(workers, settings, rng, on_event, alone, samples, round_medians, failures) -> None:
    for r in range(settings.rounds):
        order = list(workers)
        rng.shuffle(order)
        for worker in order:
            live = [name for name in worker.names if name not in failures]
            if not live:
                continue
            rng.shuffle(live)
            worker.hold(False)
            try:
                got = worker.run(settings.calls_per_round, live)
            except Exception as exc:  # noqa: BLE001 - a crashed engine: record it, keep measuring the others
                failures.update({name: f"worker failed in round {r + 1}: {exc}" for name in live})
                continue
            finally:
                if alone:
                    worker.hold(True)
            for name in live:
                samples[name].extend(got[name])
                round_medians[name].append(float(np.median(got[name])))
            time.sleep(settings.gap_s)
        on_event("round", round=r + 1, rounds=settings.rounds)


#: What the other tuned variants' kernels are compared with (toolchain.tune.db.compare): the Ansor-like baseline.
SAME_KERNELS_BASELINE = "tvm-stock-tuned"


def same_kernels(results: dict, tuned: list, case_dir: Path) -> None:
    """Beside each tuned variant's tuning record, how its search did on the kernels the baseline tuned
    for the same ops (their geometric mean latency ratio, compare): a run then tells the
    partition's share of a ratio from the search's."""
    from toolchain.errors import AgocError
    from toolchain.tune import compare

    names = {v.name for v in tuned}
    if SAME_KERNELS_BASELINE not in names or "tuning" not in results.get(SAME_KERNELS_BASELINE, {}):
        return
    for name in sorted(names - {SAME_KERNELS_BASELINE}):
        if "tuning" not in results.get(name, {}):
            continue
        try:
            c = compare(case_dir / f"{name}.db", case_dir / f"{SAME_KERNELS_BASELINE}.db")
        except AgocError as exc:
            results[name]["tuning"]["same_kernels"] = {"vs": SAME_KERNELS_BASELINE, "error": str(exc)}
            continue
        results[name]["tuning"]["same_kernels"] = {"vs": SAME_KERNELS_BASELINE, "kernels": len(c["kernels"]),
                                                   "geomean": c["geomean"]}


def run_case(case: Case, variants: list[Variant], suite: Suite, settings: Settings, work_dir: Path, rng,
             on_event) -> dict:
    """One case: tune and compile the TVM variants (the databases others use first), the phone-cache proxy,
    then every engine loaded in its worker and measured in interleaved rounds → results by variant name."""
    results: dict[str, dict] = {}
    tuned = [v for v in variants if v.engine == "tvm" and v.tuned and not v.db_of]  # what spends trials
    if tuned and settings.trials:
        settings = _equal_budget_settings(case, tuned, suite, settings, on_event)
    artifacts = _compile_tvm_variants(case, variants, suite, settings, work_dir, on_event, results)
    same_kernels(results, tuned, work_dir / case.label)
    if settings.proxy:  # before any timing, so no simulation runs beside a timed engine
        for name, path in artifacts.items():
            on_event("stage", case=case.label, stage=f"phone-cache proxy ({settings.proxy}) {name}")
            results[name]["proxy"] = proxy_variant(case, VARIANTS_BY_NAME[name], suite, settings, work_dir, path)
        _proxy_ratios(results, suite)
    reference_inputs = next(iter(artifacts.values()), None)
    if reference_inputs is None:  # onnxruntime needs an artifact's model copy and inputs
        for variant in variants:
            results.setdefault(variant.name, {"status": "skipped", "reason": "no TVM variant compiled"})
        return results
    for variant in variants:
        if variant.engine == "onnxruntime":
            results[variant.name] = {"status": "ok"}
            artifacts[variant.name] = reference_inputs
    samples, round_medians, failures = _load_and_measure(case, artifacts, settings, rng, on_event, results)
    _record_latencies(results, samples, round_medians, failures, suite)
    return results


def _equal_budget_settings(case: Case, tuned: list[Variant], suite: Suite, settings: Settings, on_event) -> Settings:
    """``settings`` with the case's equal tuning budget for each tuned variant (the suite's when planning fails)."""
    on_event("stage", case=case.label, stage="planning the tuning budget")
    try:
        settings = replace(settings, trials=equal_budget(case, tuned, suite, settings))
        on_event("stage", case=case.label, stage=f"{settings.trials} tuning trials for each tuned variant")
    except Exception as exc:  # noqa: BLE001 - the variants report their own failure below
        on_event("stage", case=case.label, stage=f"budget planning failed ({exc}); suite budget kept")
    return settings


def _compile_tvm_variants(case: Case, variants: list[Variant], suite: Suite, settings: Settings, work_dir: Path,
                          on_event, results: dict) -> dict[str, Path]:
    """Tune, compile and verify each TVM variant into ``results``; → the artifacts that compiled, by name."""
    artifacts: dict[str, Path] = {}
    for variant in sorted(variants, key=lambda v: bool(v.base or v.db_of)):  # the databases they use made first
        if variant.engine == "tvm":
            stage = "tuning + compiling" if variant.tuned else "compiling"
            on_event("stage", case=case.label, stage=f"{stage} + verifying {variant.name}")
            results[variant.name], path = compile_variant(case, variant, suite, settings, work_dir, on_event)
            if path is not None:
                artifacts[variant.name] = path
    return artifacts


def _load_and_measure(case: Case, artifacts: dict[str, Path], settings: Settings, rng, on_event,
                      results: dict) -> tuple[dict, dict, dict]:
    """Load every artifact in one worker per engine kind (its thread pool), recording load time, memory and
    load failures in ``results``; measure them in rounds → (samples, round medians, failures)."""
    on_event("stage", case=case.label, stage="loading engines")
    groups: dict[str, dict[str, tuple[Variant, Path]]] = {}
    for name, path in artifacts.items():
        variant = VARIANTS_BY_NAME[name]
        groups.setdefault(variant.engine, {})[name] = (variant, path)
    workers: list[Worker] = []
    try:
        for members in groups.values():
            alone = memory_alone(members, settings) if len(members) > 1 else {}
            worker = Worker(members, settings)
            workers.append(worker)
            for name, reason in worker.errors.items():
                results[name] = {**results[name], "status": "failed", "reason": reason}
            for name in worker.names:
                results[name]["load_ms"] = worker.hello["load_ms"][name]
                results[name]["model_rss_mb"] = alone.get(name, worker.hello["model_rss_mb"][name])
                results[name]["worker"] = {"engines": worker.names}
        on_event("stage", case=case.label, stage="measuring")
        return measure_rounds(workers, settings, rng, on_event)
    finally:
        for worker in workers:
            peak = worker.close().get("peak_rss_mb")
            for name in worker.names:
                results[name]["worker"].update(peak_rss_mb=peak, cache=dict(worker.cache),
                                               disturbed_rounds=worker.disturbed)


def _record_latencies(results: dict, samples: dict, round_medians: dict, failures: dict, suite: Suite) -> None:
    """Latency statistics and each variant's speedup over the suite's baselines, into ``results``."""
    for name in samples:
        if name in failures:
            results[name].update(status="failed", reason=failures[name])
            continue
        results[name]["latency_ms"] = {**stats(samples[name]), "samples": samples[name]}
        results[name]["round_medians_ms"] = round_medians[name]
    for name, res in results.items():
        if "round_medians_ms" not in res:
            continue
        res["speedup_vs"] = {
            base: ratio_stats(results[base]["round_medians_ms"], res["round_medians_ms"])
            for base in suite.baselines
            if base != name and "round_medians_ms" in results.get(base, {})
        }


def _proxy_ratios(results: dict[str, dict], suite: Suite) -> None:
    """``proxy_vs``: each variant's simulated figures ÷ each proxy baseline's (below 1: less traffic)."""
    from host.bench import proxy

    ok = {name: res["proxy"] for name, res in results.items() if res.get("proxy", {}).get("status") == "ok"}
    for name, figures in ok.items():
        results[name]["proxy_vs"] = {base: proxy.ratios(figures, ok[base]) for base in proxy_baselines(suite)
                                     if base != name and base in ok}


def run_suite(
    suite: Suite,
    cases: list[Case],
    settings: Settings,
    work_dir: Path,
    variants: list[str] | None = None,
    on_event: Callable[..., None] = lambda kind, **info: None,
) -> dict:
    """Run ``cases`` × variants; returns the results document (not yet written)."""
    from toolchain.pipeline import package_versions

    chosen = [VARIANTS_BY_NAME[v] for v in (variants or suite.variants)]
    rng = random.Random(settings.order)
    started = time.time()
    document = {
        "schema": SCHEMA,
        "suite": suite.name,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "context": {
            "machine": machine_context(),
            "threads": settings.threads,
            "versions": package_versions(),
            "settings": asdict(settings),
            "variants": [asdict(v) for v in chosen],
            # the suite's floor: each case's tuned variants get its equal budget, at least this (equal_budget);
            # what a case's variant was given and spent: results[].variants[name].tuning.budget / .trials
            "min_trial_budgets": {v.name: (settings.trials if v.tuned and not v.db_of else 0) for v in chosen},
            "threshold": suite.threshold,
            "baselines": list(suite.baselines),
            "proxy": None if not settings.proxy else {
                "geometry": settings.proxy, "baselines": list(proxy_baselines(suite)),
                "method": "callgrind cache simulation of the host-avx2 build, one thread, timed calls only; "
                "figures per inference (host/bench/proxy.py)",
            },
            "protocol": "one worker process per engine kind (onnxruntime; all TVM variants, which share one "
            "thread pool), one worker active at a time (the others stopped), random order per round, gap_s between "
            "workers; speed-ups are per-round median ratios; within a round: "
            + cache_regime.regime(settings.cache).meaning + f" (cache regime '{settings.cache}')",
        },
        "results": [],
    }
    for i, case in enumerate(cases):
        on_event("case", case=case.label, index=i, total=len(cases))
        entry = {"model": case.model, "shape": list(case.shape), "label": case.label}
        on_event("stage", case=case.label, stage="partitioning (AGO and stock)")
        try:
            entry["partition"] = partition_figures(case, suite, settings)
        except Exception as exc:  # noqa: BLE001 - the variants report their own failures; keep the case
            entry["partition"] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        entry["variants"] = run_case(case, chosen, suite, settings, work_dir, rng, on_event)
        document["results"].append(entry)
        on_event("case_done", case=case.label, index=i, total=len(cases), variants=entry["variants"])
    document["summary"] = {"geomean_speedup": {}}  # over this run's cases (see geomean_speedups)
    for row in geomean_speedups([document]):
        document["summary"]["geomean_speedup"].setdefault(row["variant"], {})[row["baseline"]] = row["geomean"]
    document["seconds"] = round(time.time() - started, 1)
    return document
