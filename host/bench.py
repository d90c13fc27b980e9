"""Benchmark suites: compile every variant, verify it, time it against onnxruntime in one run.

Variants and suites are tables: a new pipeline (AGO partitioning, tuning, an
ablation) is a new :class:`Variant` row, not a new script.

Measurement protocol (design §5): each engine kind runs in its own worker
process (:mod:`host.bench_worker`): onnxruntime in one, every TVM variant in
another, where they share TVM's thread pool and are timed within the same
round, a block of calls each (on a host whose cores come and go, only calls
this close together see the same machine; what each call finds in cache is the
settings' cache regime, :mod:`host.cache_regime`). Workers are driven one at a
time, in a random order per round (seeded), with a gap between them so no engine is timed while
another one's threads still spin. Per variant we keep every per-call sample
(median, p10, p90 over all of them) and the per-round medians, from which the
speed-up over each baseline is taken round by round (median and p10 of the
per-round ratios).

Results are one JSON document (schema ``agoc.bench/1``) with the full
context: machine, cores, threads, versions, variant settings, trial budgets.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from host import cache_regime

log = logging.getLogger(__name__)

SCHEMA = "agoc.bench/1"


@dataclass(frozen=True)
class Variant:
    name: str
    engine: str  # "tvm" | "onnxruntime"
    description: str
    partition: str = "stock"  # for tvm: how ops are grouped into kernels
    tuned: bool = False  # tuned with the suite's trial budget (same budget for every tuned variant)
    intensive: bool = True  # tuned: offer the intensive-fusion space (False: AGO-NI)
    reformer: bool = True  # tuned: split/join divide-and-conquer (False: AGO-NR)
    cold_weights: bool = True  # tuned: candidates timed with their weights flushed (False: warm, the old way)
    base: str | None = None  # tuned: starts from this variant's tuning database, tuned first in the same run
    # (agoc tune --from: its records of the same kernels are copied in and count as trials)
    keep_inside: int = 0  # ago: a conv pair joined by a tensor of at least this many bytes stays in one subgraph
    db_of: str | None = None  # tuned: built from this variant's tuning database (made first in the same run), not tuned
    joins: str = "latency"  # ago tuned: how a split subgraph is built (compile --joins: latency, or a cache geometry)


#: Every pipeline variant the suites know.
VARIANTS: tuple[Variant, ...] = (
    Variant("onnxruntime", "onnxruntime", "onnxruntime CPU execution provider, same thread count (the reference)"),
    Variant("tvm-stock", "tvm", "TVM 0.27 default CPU pipeline: FuseOps partition, no tuning", partition="stock"),
    Variant("tvm-ago", "tvm", "AGO weighted acyclic partition (several complex ops per kernel), no tuning", partition="ago"),
    Variant("tvm-stock-tuned", "tvm", "FuseOps partition + MetaSchedule default space (the Ansor-like baseline)",
            partition="stock", tuned=True),
    Variant("tvm-ago-tuned", "tvm", "AGO: partition + intensive fusion + divide-and-conquer tuning",
            partition="ago", tuned=True),
    Variant("tvm-ago-locality", "tvm", "AGO for a phone's cache (--keep-inside 256, half a Cortex-A76's L2): "
            "every conv → depthwise / pointwise pair joined by a tensor of 256 KiB or more stays in one subgraph, "
            "and every intensive tile's slice of its intermediate is at most 256 KiB", partition="ago", tuned=True,
            keep_inside=256 * 1024),
    Variant("tvm-ago-a76", "tvm", "AGO with its joins judged for a phone's cache (compile --joins a76): the "
            "tvm-ago-tuned database, each split subgraph built joined or as its minis, whichever moves fewer "
            "simulated DRAM bytes in a Cortex-A76's caches; no tuning of its own", partition="ago", tuned=True,
            db_of="tvm-ago-tuned", joins="a76"),
    Variant("tvm-ago-locality-a76", "tvm", "tvm-ago-locality's database built with compile --joins a76 (as "
            "tvm-ago-a76 is tvm-ago-tuned's): the pairs kept inside, every other join judged by simulated traffic",
            partition="ago", tuned=True, db_of="tvm-ago-locality", keep_inside=256 * 1024, joins="a76"),
    Variant("tvm-ago-ni", "tvm", "AGO-NI: AGO without the intensive-fusion space", partition="ago", tuned=True,
            intensive=False),
    Variant("tvm-ago-nr", "tvm", "AGO-NR: AGO without the reformer (subgraphs tuned directly)", partition="ago",
            tuned=True, reformer=False),
    Variant("tvm-ago-from-stock", "tvm", "AGO tuned from the stock-tuned variant's database: the kernels both "
            "tune start with stock's records (counted as trials), so its joins compose from minis tuned as well as "
            "stock's kernels; not an equal-budget variant", partition="ago", tuned=True, base="tvm-stock-tuned"),
    Variant("tvm-stock-tuned-warm", "tvm", "the stock baseline tuned with candidates timed warm (weights in cache)",
            partition="stock", tuned=True, cold_weights=False),
    Variant("tvm-ago-tuned-warm", "tvm", "AGO tuned with candidates timed warm (weights in cache)", partition="ago",
            tuned=True, cold_weights=False),
)
VARIANTS_BY_NAME = {v.name: v for v in VARIANTS}


@dataclass(frozen=True)
class Settings:
    threads: int
    rounds: int
    calls_per_round: int
    warmup: int
    gap_s: float
    seed: int
    quick: bool
    target: str = "host"
    trials: int = 0  # tuning budget per tuned variant and model
    proxy: str | None = None  # phone-cache proxy geometry (host/proxy.py) simulated for every TVM variant
    scheduler: str = "weight"  # how every tuned variant spreads its budget (toolchain.tune.budget.SCHEDULERS)
    prepack: bool = True  # every tuned variant may rewrite its weights' layout (toolchain.tune.settings.TuneSettings)
    transfer: int = 2  # every tuned variant's searches start from similar kernels' schedules (TuneSettings)
    population: int = 128  # every tuned variant's search population per batch (TuneSettings)
    layout: str = "NHWC"  # activation layout of every TVM variant (toolchain.targets.LAYOUTS)
    pad_channels: bool = True  # every TVM variant pads output channels (toolchain.padding)
    fast_math: bool = True  # every TVM variant computes exp / erf / tanh / sigmoid / softmax fast (toolchain.fastmath)
    cache: str = "cold"  # what every timed call finds in cache (host.cache_regime.REGIMES); results without: shared
    order_seed: int | None = None  # the per-round engine order's seed alone (None: ``seed``, which also seeds tuning)

    @property
    def order(self) -> int:
        """Seed of the per-round engine order: ``order_seed``, else ``seed``. Only ``seed`` reaches the tuning,
        so a work dir can be timed again in another order without its databases being refused."""
        return self.seed if self.order_seed is None else self.order_seed


FULL = dict(rounds=10, calls_per_round=10, warmup=5, gap_s=0.3)
QUICK = dict(rounds=3, calls_per_round=3, warmup=2, gap_s=0.3)


def default_settings(quick: bool, threads: int | None = None, seed: int = 0, suite: "Suite | None" = None) -> Settings:
    trials = 0 if suite is None else (suite.quick_trials if quick else suite.trials)
    return Settings(threads=threads or os.cpu_count() or 1, seed=seed, quick=quick, trials=trials,
                    **(QUICK if quick else FULL))


@dataclass(frozen=True)
class Case:
    model: str  # zoo name
    shape: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.model}@{'x'.join(map(str, self.shape))}"


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    families: tuple[str, ...]  # which zoo families it covers
    variants: tuple[str, ...]
    baselines: tuple[str, ...]  # speed-ups are reported against these
    sizes: tuple[int, ...] = ()  # keep only these spatial sizes (empty: all listed shapes)
    threshold: float | None = None  # AGO Td for this suite (None: the default)
    trials: int = 0  # tuning budget per tuned variant and model
    quick_trials: int = 0


SUITES: dict[str, Suite] = {
    "host": Suite(
        "host",
        "every zoo network at every listed shape on this machine, untuned: stock TVM, AGO partition, onnxruntime",
        families=("cnn", "transformer"),
        variants=("tvm-stock", "tvm-ago", "onnxruntime"),
        baselines=("tvm-stock", "onnxruntime"),
    ),
    "e2e": Suite(
        "e2e",
        "zoo networks at 112×112 (BERT-tiny: 128 tokens), tuned at equal budget: AGO vs the stock partition, "
        "and onnxruntime",
        families=("cnn", "transformer"),
        variants=("tvm-stock-tuned", "tvm-ago-tuned", "onnxruntime"),
        baselines=("tvm-stock-tuned", "onnxruntime"),
        sizes=(112, 128),
        trials=256,
        quick_trials=32,
    ),
    "pairs": Suite(
        "pairs",
        "AGO's four micro-benchmark pairs (dw→dw, dw→pw, pw→dw, pw→pw) fused into one kernel: AGO vs AGO-NI vs "
        "AGO-NR at equal budget",
        families=("pair",),
        variants=("tvm-ago-tuned", "tvm-ago-ni", "tvm-ago-nr", "onnxruntime"),
        baselines=("tvm-ago-ni", "onnxruntime"),
        sizes=(56,),
        threshold=1e9,  # the whole pair is one subgraph
        trials=64,
        quick_trials=16,
    ),
    "tiny": Suite(
        "tiny",
        "the built-in tiny models (smoke test of the harness itself)",
        families=("tiny",),
        variants=("tvm-stock", "onnxruntime"),
        baselines=("tvm-stock", "onnxruntime"),
    ),
}


def suite_cases(suite: Suite, quick: bool, models: list[str] | None = None, shapes: list[int] | None = None) -> list[Case]:
    """The (model, shape) pairs of a suite; quick keeps each model's smallest shape."""
    import models as zoo
    from toolchain.errors import AgocError

    specs = [s for s in zoo.registry.MODELS if s.family in suite.families]
    if models:
        unknown = [m for m in models if m not in zoo.names()]
        if unknown:
            raise AgocError(f"unknown zoo model(s): {', '.join(unknown)}; available: {', '.join(zoo.names())}")
        specs = [zoo.get(m) for m in models]
    cases = []
    for spec in specs:
        spec_shapes = sorted(spec.shapes, key=lambda s: int(np.prod(s)))
        if suite.sizes and not shapes:
            spec_shapes = [s for s in spec_shapes if s[-1] in suite.sizes] or spec_shapes[-1:]
        if shapes:
            spec_shapes = [s for s in spec_shapes if s[-1] in shapes] or spec_shapes[:0]
        if quick:
            spec_shapes = spec_shapes[:1]
        cases.extend(Case(spec.name, tuple(s)) for s in spec_shapes)
    return cases


def machine_context() -> dict:
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
    }


def stats(samples: list[float]) -> dict:
    a = np.asarray(samples, dtype=np.float64)
    return {
        "median": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "p90": float(np.percentile(a, 90)),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "std": float(a.std()),
        "n": int(a.size),
    }


def ratio_stats(numerators: list[float], denominators: list[float]) -> dict:
    """Per-round ratios numerator/denominator: median and p10 (a speed-up when numerator is the baseline)."""
    r = np.asarray(numerators, dtype=np.float64) / np.asarray(denominators, dtype=np.float64)
    return {"median": float(np.median(r)), "p10": float(np.percentile(r, 10)), "rounds": int(r.size)}


class Worker:
    """A :mod:`host.bench_worker` process timing the variants of one engine kind, close together."""

    def __init__(self, members: dict[str, tuple[Variant, Path]], settings: Settings):
        engines = [{"name": name, "engine": v.engine, "artifact": str(path)} for name, (v, path) in members.items()]
        config = {"engines": engines, "threads": settings.threads, "warmup": settings.warmup,
                  "cache": settings.cache}
        env = dict(os.environ, TVM_NUM_THREADS=str(settings.threads), OMP_NUM_THREADS=str(settings.threads))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "host.bench_worker", json.dumps(config)],
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
        # how the timed calls were prepared (host.cache_regime): flushes and untimed calls, all runs
        self.cache = {"regime": self.hello.get("cache"), "flushes": 0, "rehearsals": 0}

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
        return reply["samples_ms"]

    def close(self) -> dict:
        if self.proc.poll() is not None:
            return {}
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.flush()
            reply = self._read()
        finally:
            self.proc.wait(timeout=30)
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


def _threshold(suite: Suite) -> float:
    from toolchain.partition import DEFAULT_THRESHOLD

    return suite.threshold if suite.threshold is not None else DEFAULT_THRESHOLD


def _tune_settings(variant: Variant, suite: Suite, settings: Settings, trials: int | None = None):
    from toolchain.tune.settings import TuneSettings

    return TuneSettings(
    trials=settings.trials if trials is None else trials, partition=variant.partition,
    threshold=_threshold(suite), keep_inside=variant.keep_inside,
    intensive=variant.intensive, reformer=variant.reformer, seed=settings.seed, cold_weights=variant.cold_weights,
    scheduler=settings.scheduler, prepack=settings.prepack, transfer=settings.transfer,
    population=settings.population,
    )


def _case_model(case: Case, settings: Settings):
    """(ONNX model, target spec) of a case."""
    import models as zoo
    from toolchain.targets import resolve_target

    return zoo.build(case.model, case.shape), resolve_target(settings.target, num_cores=settings.threads, layout=settings.layout,
                                                         pad_channels=settings.pad_channels,
                                                         fast_math=settings.fast_math)


def _legalized(model, spec):
    """The legalized Relax module of ``model`` (what is partitioned and tuned)."""
    from toolchain import build, onnx_import

    return build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)


#: Partitioning time is the median of this many runs of each partitioner on the case's op graph.
PARTITION_REPEATS = 5


def partition_figures(case: Case, suite: Suite, settings: Settings) -> dict:
    """The case's AGO and stock partitions as ``agoc partition --json`` reports them (subgraphs, trivial, Jain,
    complex chains, ...), with the partitioning time the median of :data:`PARTITION_REPEATS` runs; ``ops`` and
    ``graph_seconds``: the op graph both partition (extracted once, its time apart)."""
    from toolchain import partition
    from toolchain.opgraph import op_graph

    model, spec = _case_model(case, settings)
    mod = _legalized(model, spec)
    started = time.perf_counter()
    graph = op_graph(mod)
    figures: dict = {"ops": len(graph.nodes), "graph_seconds": round(time.perf_counter() - started, 3)}
    for method in ("ago", "stock"):
        plans = [partition.plan(method, mod, spec, _threshold(suite), graph) for _ in range(PARTITION_REPEATS)]
        partition.check(graph, plans[0])
        seconds = sorted(p.seconds for p in plans)[len(plans) // 2]
        figures[method] = {**partition.stats(graph, plans[0]), "seconds": round(seconds, 4)}
    return figures


#: With the latency scheduler, the equal budget is at least this many times the largest first pass
#: (a first batch per task) of the tuned variants: half of AGO's budget or more goes where it pays.
LATENCY_HEADROOM = 2
#: With the weight plan, the equal budget is at least this many times the largest plan's floors (a batch
#: per task, a split subgraph one per mini it brings and one for its join): a quarter of it or more is
#: spread by weight. At exactly the floors every AGO task gets one batch (MobileNet-V2 @112: 45 tasks,
#: 720 trials), and one batch of MetaSchedule is a draw (bench/RESULTS.md, fifteenth session).
WEIGHT_HEADROOM = 4 / 3


def equal_budget(case: Case, tuned: list[Variant], suite: Suite, settings: Settings) -> int:
    """The case's trial budget, the same for every tuned variant: the suite's, raised (in whole search
    batches) to :data:`WEIGHT_HEADROOM` × the largest plan's floors, since every task gets at least one
    batch and the stock partition of a large model has more kernels than the suite's budget has batches.
    With the latency scheduler: at least :data:`LATENCY_HEADROOM` × the largest first pass."""
    from toolchain.tune.plan import first_pass_trials, planned_trials
    from toolchain.tune.settings import TuneSettings

    model, spec = _case_model(case, settings)
    mod = _legalized(model, spec)
    batch = TuneSettings().per_iter
    if settings.scheduler == "latency":  # the first pass: a first batch per task
        headroom, floors = LATENCY_HEADROOM, [first_pass_trials(mod, spec, _tune_settings(v, suite, settings))
                                              for v in tuned]
    else:  # a weight plan for no trials at all is its floors
        headroom, floors = WEIGHT_HEADROOM, [planned_trials(mod, spec, _tune_settings(v, suite, settings, 0))
                                             for v in tuned]
    return max(settings.trials, -(-round(headroom * max(floors)) // batch) * batch)


def _variant_db(case: Case, variant: Variant, work_dir: Path) -> Path:
    """The tuning database a tuned variant is built from: its own, or the one it shares (``db_of``)."""
    return work_dir / case.label / f"{variant.db_of or variant.name}.db"


def _join_rule(variant: Variant) -> str:
    """The variant's ``joins`` as a rule of toolchain.tune.pairing.JOIN_RULES (a geometry: ``traffic:NAME``)."""
    from toolchain.tune.pairing import rule_for

    return rule_for(variant.joins)


def _compile_variant(case: Case, variant: Variant, suite: Suite, settings: Settings, work_dir: Path,
                     on_event) -> tuple[dict, Path | None]:
    """Compile (tuning first if the variant is tuned) + verify one TVM variant; (record, artifact dir or None)."""
    from host.devices import LocalDevice
    from toolchain import onnx_import
    from toolchain.tune.db import TuneDB
    from toolchain.tune.session import tune_model
    from toolchain.errors import AgocError, first_line
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler
    from toolchain.verify import verify_artifact

    out = work_dir / case.label / variant.name
    record: dict = {"status": "ok"}
    threshold = _threshold(suite)
    try:
        model, spec = _case_model(case, settings)
        db = None
        if variant.db_of:
            db = _variant_db(case, variant, work_dir)
            if not (db / "session.json").exists():
                return {"status": "failed", "reason": f"built from {variant.db_of}'s tuning database, which this run "
                        f"has not made: add --variants {variant.db_of}"}, None
            record["tuning"] = {"db_of": variant.db_of}
            if variant.joins != "latency":
                from host import judge

                started = time.perf_counter()
                judged = judge.judge_joins(model, case.label, {}, db, variant.joins, on_stage=lambda stage: on_event(
                    "stage", case=case.label, stage=f"{variant.name}: {stage}"))
                joins = judged.get("joins", {})
                record["joins"] = {"rule": variant.joins, "cache": judged.get("cache"), "judged": len(joins),
                                   "baseline_bytes": judged.get("baseline_bytes"),
                                   "final_bytes": judged.get("final_bytes"),
                                   "seconds": round(time.perf_counter() - started, 1)}
        elif variant.tuned:
            db = work_dir / case.label / f"{variant.name}.db"
            base = work_dir / case.label / f"{variant.base}.db" if variant.base else None
            if base is not None and not (base / "session.json").exists():
                return {"status": "failed", "reason": f"starts from {variant.base}'s tuning database, which this run "
                        f"has not made: add --variants {variant.base}"}, None
            mod = _legalized(model, spec)
            started = time.perf_counter()

            def tuning_event(kind, **info):
                on_event("tuning", case=case.label, variant=variant.name, event=kind, **info)

            summary = tune_model(
         mod, onnx_import.model_hash(model), spec, _tune_settings(variant, suite, settings), db,
         on_event=tuning_event, base=base,
     )
            record["tuning"] = {
                "trials": sum(r["trials"] for r in summary["tasks"]),
                "budget": settings.trials,
                "kernels": len([r for r in summary["tasks"] if r["phase"] != "mini"]),
                "verified": len([r for r in summary["tasks"] if r["status"] == "verified"]),
                "rejected_candidates": sum(r["rejected"] for r in summary["tasks"]),
                "estimate_ms": summary["estimate_ms"],  # the database's model estimate (verified latencies)
                **({"base": variant.base, "imported_records": sum(TuneDB(db).imported.values())}
                   if base else {}),
                "seconds": round(time.perf_counter() - started, 1),
            }
        request = CompileRequest(model, case.label, spec, partition=variant.partition, threshold=threshold, db=db,
                                 keep_inside=variant.keep_inside, joins=_join_rule(variant))
        artifact = compile_model(request, find_compiler(spec), out)
        if "joins" in record:  # the judged joins built as their minis
            record["joins"]["minis"] = len((artifact.manifest.partition_info or {}).get("unfused") or [])
        record["compile_s"] = artifact.manifest.compile_seconds
        record["kernels"] = len(artifact.manifest.kernels)
        report = verify_artifact(artifact, LocalDevice())
        record["verify"] = {
            "passed": report.passed,
            "max_abs": max(o.max_abs for o in report.outputs),
            "max_rel": max(o.max_rel for o in report.outputs),
        }
        if not report.passed:
            return {**record, "status": "wrong", "reason": "outputs differ from onnxruntime"}, None
    except AgocError as exc:
        return {"status": "failed", "reason": str(exc)}, None
    except Exception as exc:  # noqa: BLE001 - an internal error in one variant: record it, run the others
        log.exception("%s %s", case.label, variant.name)
        return {"status": "failed", "reason": f"internal error: {type(exc).__name__}: {first_line(exc)}"}, None
    return record, out


def _proxy_variant(case: Case, variant: Variant, suite: Suite, settings: Settings, work_dir: Path,
                   artifact_dir: Path) -> dict:
    """Phone-cache proxy figures of one compiled TVM variant (design §5).

    valgrind cannot run AVX-512 kernels: unless the artifact is already at AVX2 or below, the same
    kernels (same partition, same verified schedules) are rebuilt for ``host-avx2`` and verified.
    """
    import models as zoo
    from host import proxy
    from host.devices import LocalDevice
    from toolchain.artifact import load_artifact
    from toolchain.errors import AgocError
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target
    from toolchain.verify import verify_artifact

    try:
        geo = proxy.geometry(settings.proxy)
        artifact = load_artifact(artifact_dir)
        if proxy.has_avx512(artifact.manifest.target["tvm_target"]):
            spec = resolve_target("host-avx2", num_cores=settings.threads, layout=settings.layout,
                                  pad_channels=settings.pad_channels, fast_math=settings.fast_math)
            threshold = _threshold(suite)
            db = _variant_db(case, variant, work_dir) if variant.tuned else None
            request = CompileRequest(zoo.build(case.model, case.shape), case.label, spec, partition=variant.partition,
                                     threshold=threshold, db=db, keep_inside=variant.keep_inside,
                                     joins=_join_rule(variant))
            artifact = compile_model(request, find_compiler(spec), work_dir / case.label / f"{variant.name}@{spec.preset}")
            if not verify_artifact(artifact, LocalDevice()).passed:
                return {"status": "wrong", "reason": f"the {spec.preset} build differs from onnxruntime"}
        return {"status": "ok", **proxy.measure(artifact, geo)}
    except AgocError as exc:
        return {"status": "failed", "reason": str(exc)}


def proxy_baselines(suite: Suite) -> tuple[str, ...]:
    """What simulated traffic is compared with: the stock partition (untuned and tuned), then the suite's baselines."""
    return tuple(dict.fromkeys(("tvm-stock", "tvm-stock-tuned", *suite.baselines)))


def _measure(workers: list[Worker], settings: Settings, rng: random.Random, on_event):
    """Interleaved rounds: every live worker once per round, in a random order, with a gap between
    workers; inside a worker its variants are timed in a random order per round (the cache regime says
    whether as blocks of calls or one call each per pass).

    Returns (samples per variant, per-round medians per variant, failure reason per variant).
    """
    names = [name for w in workers for name in w.names]
    samples: dict[str, list[float]] = {name: [] for name in names}
    round_medians: dict[str, list[float]] = {name: [] for name in names}
    failures: dict[str, str] = {}
    for r in range(settings.rounds):
        order = list(workers)
        rng.shuffle(order)
        for worker in order:
            live = [name for name in worker.names if name not in failures]
            if not live:
                continue
            rng.shuffle(live)
            try:
                got = worker.run(settings.calls_per_round, live)
            except Exception as exc:  # a crashed engine: record it, keep measuring the others
                failures.update({name: f"worker failed in round {r + 1}: {exc}" for name in live})
                continue
            for name in live:
                samples[name].extend(got[name])
                round_medians[name].append(float(np.median(got[name])))
            time.sleep(settings.gap_s)
        on_event("round", round=r + 1, rounds=settings.rounds)
    return samples, round_medians, failures


#: What the other tuned variants' kernels are compared with (toolchain.tune.db.compare): the Ansor-like baseline.
SAME_KERNELS_BASELINE = "tvm-stock-tuned"


def _same_kernels(results: dict, tuned: list, case_dir: Path) -> None:
    """Beside each tuned variant's tuning record, how its search did on the kernels the baseline tuned
    for the same ops (their geometric mean latency ratio, compare): a run then tells the
    partition's share of a ratio from the search's."""
    from toolchain.tune.db import compare
    from toolchain.errors import AgocError

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
    results: dict[str, dict] = {}
    artifacts: dict[str, Path] = {}
    tuned = [v for v in variants if v.engine == "tvm" and v.tuned and not v.db_of]  # what spends trials
    if tuned and settings.trials:
        on_event("stage", case=case.label, stage="planning the tuning budget")
        try:
            settings = replace(settings, trials=equal_budget(case, tuned, suite, settings))
            on_event("stage", case=case.label, stage=f"{settings.trials} tuning trials for each tuned variant")
        except Exception as exc:  # noqa: BLE001 - the variants report their own failure below
            on_event("stage", case=case.label, stage=f"budget planning failed ({exc}); suite budget kept")
    for variant in sorted(variants, key=lambda v: bool(v.base or v.db_of)):  # the databases they use made first
        if variant.engine == "tvm":
            stage = "tuning + compiling" if variant.tuned else "compiling"
            on_event("stage", case=case.label, stage=f"{stage} + verifying {variant.name}")
            results[variant.name], path = _compile_variant(case, variant, suite, settings, work_dir, on_event)
            if path is not None:
                artifacts[variant.name] = path
    _same_kernels(results, tuned, work_dir / case.label)
    if settings.proxy:  # before any timing, so no simulation runs beside a timed engine
        for name, path in artifacts.items():
            on_event("stage", case=case.label, stage=f"phone-cache proxy ({settings.proxy}) {name}")
            results[name]["proxy"] = _proxy_variant(case, VARIANTS_BY_NAME[name], suite, settings, work_dir, path)
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

    on_event("stage", case=case.label, stage="loading engines")
    groups: dict[str, dict[str, tuple[Variant, Path]]] = {}  # one worker per engine kind (its thread pool)
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
        samples, round_medians, failures = _measure(workers, settings, rng, on_event)
    finally:
        for worker in workers:
            peak = worker.close().get("peak_rss_mb")
            for name in worker.names:
                results[name]["worker"].update(peak_rss_mb=peak, cache=dict(worker.cache))

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
    return results


def _proxy_ratios(results: dict[str, dict], suite: Suite) -> None:
    """``proxy_vs``: each variant's simulated figures ÷ each proxy baseline's (below 1: less traffic)."""
    from host import proxy

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
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
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
                "figures per inference (host/proxy.py)",
            },
            "protocol": "one worker process per engine kind (onnxruntime; all TVM variants, which share one "
            "thread pool), one worker active at a time, random order per round, gap_s between workers; speed-ups "
            "are per-round median ratios; within a round: " + cache_regime.regime(settings.cache).meaning
            + f" (cache regime '{settings.cache}')",
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


def cache_of(document: dict) -> str:
    """The cache regime a results document was timed in (host.cache_regime); documents before the
    setting were timed in ``shared``."""
    return document["context"].get("settings", {}).get("cache", "shared")


def geomean_speedups(documents: list[dict]) -> list[dict]:
    """Speed-ups summarised over models, as targets are stated ("≥ 1.2× geomean over stock tuned"):
    per (variant, baseline, cache regime), each case's speed-up (the median of per-round ratios; a case
    measured by several runs — several documents — gets the median over them, and its range is kept)
    and the geometric mean over the cases. Runs in different cache regimes are never pooled: the
    regime moves the ratios (MobileNet-V2 stock tuned ÷ onnxruntime 0.82× shared, 1.12× cold)."""
    by_pair: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for document in documents:
        cache = cache_of(document)
        for entry in document["results"]:
            for name, res in entry["variants"].items():
                for base, ratio in res.get("speedup_vs", {}).items():
                    by_pair.setdefault((name, base, cache), {}).setdefault(entry["label"], []).append(ratio["median"])
    rows = []
    for (name, base, cache), cases in by_pair.items():
        per_case = {label: {"median": float(np.median(runs)), "runs": runs} for label, runs in cases.items()}
        values = np.asarray([c["median"] for c in per_case.values()], dtype=np.float64)
        rows.append({"variant": name, "baseline": base, "cache": cache,
                     "geomean": float(np.exp(np.log(values).mean())), "cases": per_case})
    return rows


def results_path(out_dir: Path, suite: str, today: datetime.date | None = None) -> Path:
    """``<out_dir>/<suite>-<date>.json``; ``-2``, ``-3``… when that day already has one."""
    stem = f"{suite}-{(today or datetime.date.today()).isoformat()}"
    path = out_dir / f"{stem}.json"
    n = 2
    while path.exists():
        path = out_dir / f"{stem}-{n}.json"
        n += 1
    return path


def write_results(document: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write the JSON and its PNG chart side by side; returns both paths."""
    from host.chart import speedup_chart

    out_dir.mkdir(parents=True, exist_ok=True)
    path = results_path(out_dir, document["suite"])
    path.write_text(json.dumps(document, indent=1) + "\n")
    png = path.with_suffix(".png")
    speedup_chart(document, png)
    return path, png


def summary_rows(document: dict) -> list[dict]:
    """One flat row per (case, variant) for tables."""
    from host import proxy

    rows = []
    for entry in document["results"]:
        for name, res in entry["variants"].items():
            lat = res.get("latency_ms", {})
            rows.append(
                {
                    "case": entry["label"],
                    "variant": name,
                    "status": res["status"],
                    "median_ms": lat.get("median"),
                    "p10_ms": lat.get("p10"),
                    "p90_ms": lat.get("p90"),
                    "max_abs": res.get("verify", {}).get("max_abs"),
                    "kernels": res.get("kernels"),
                    "trials": res.get("tuning", {}).get("trials"),
                    "speedup_vs": {b: s["median"] for b, s in res.get("speedup_vs", {}).items()},
                    "reason": res.get("reason", ""),
                    "proxy_status": res.get("proxy", {}).get("status"),
                    "proxy": res.get("proxy", {}).get("model_figures"),
                    "dram_vs": {b: r["dram_bytes"] for b, r in res.get("proxy_vs", {}).items()},
                    "dram_beyond_weights_vs": {b: r.get("dram_beyond_weights", {})
                                               for b, r in res.get("proxy_vs", {}).items()},
                    "dram_floor_vs": {b: proxy.floor_ratio(entry["variants"][b]["proxy"]["model_figures"])
                                      for b in res.get("proxy_vs", {})},
                }
            )
    return rows


