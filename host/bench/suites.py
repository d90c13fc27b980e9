"""Benchmark suites as tables: the variants (one row per pipeline), the suites, their settings and
cases; the machine context and the statistics a results document carries (protocol: docs/tuning.md)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolchain import geometry

SCHEMA = "agoc.bench/1"
#: what an ARM preset keeps inside by default, in bytes: the Cortex-A76 geometry's locality size (half its L2), the
#: size the locality variants take (no hand-set number: the preset's own)
A76_KEEP_INSIDE = geometry.locality_kib(geometry.find("a76")) * geometry.KIB


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
    keep_inside: int = 0  # bytes, as --keep-inside: the locality unit and the tile cache cap (variants.partition_of)
    db_of: str | None = None  # tuned: built from this variant's tuning database (made first in the same run), not tuned
    joins: str = "latency"  # ago tuned: how a split subgraph is built (compile --joins: latency, or a cache geometry)
    untuned: str = "plain"  # what a kernel without a tuned schedule gets (compile --untuned; plain: partitions alone)


#: Every pipeline variant the suites know.
VARIANTS: tuple[Variant, ...] = (
    Variant("onnxruntime", "onnxruntime", "onnxruntime CPU execution provider, same thread count (the reference)"),
    Variant("tvm-stock", "tvm", "TVM 0.27 default CPU pipeline: FuseOps partition, no tuning", partition="stock"),
    Variant("tvm-ago", "tvm", "AGO weighted acyclic partition (several complex ops per kernel), no tuning",
            partition="ago"),
    Variant("agoc", "tvm", "what `agoc compile --geometry none` builds without tuning: AGO partition (its joins as "
            "their minis), each kernel's register block or the record library's schedule", partition="ago",
            untuned="library"),
    Variant("agoc-stock", "tvm", "the same kernel schedules (register blocks, record library) on the stock FuseOps "
            "partition, no tuning", partition="stock", untuned="library"),
    Variant("tvm-stock-tuned", "tvm", "FuseOps partition + MetaSchedule default space (the Ansor-like baseline)",
            partition="stock", tuned=True),
    Variant("tvm-ago-tuned", "tvm", "AGO: partition + intensive fusion + divide-and-conquer tuning",
            partition="ago", tuned=True),
    Variant("tvm-ago-locality", "tvm", "AGO for a phone's cache as an ARM preset builds it by default (the "
            f"Cortex-A76 geometry's locality: half its L2, {A76_KEEP_INSIDE // geometry.KIB} KiB): every conv → "
            "depthwise / pointwise pair joined by a tensor of that size or more stays in one subgraph, and every "
            "intensive tile's slice of its intermediate is at most that", partition="ago", tuned=True,
            keep_inside=A76_KEEP_INSIDE),
    Variant("tvm-ago-a76", "tvm", "AGO with its joins judged for a phone's cache (compile --joins a76): the "
            "tvm-ago-tuned database, each split subgraph built joined or as its minis, whichever moves fewer "
            "simulated DRAM bytes in a Cortex-A76's caches; no tuning of its own", partition="ago", tuned=True,
            db_of="tvm-ago-tuned", joins="a76"),
    Variant("tvm-ago-locality-a76", "tvm", "tvm-ago-locality's database built with compile --joins a76 (as "
            "tvm-ago-a76 is tvm-ago-tuned's): the pairs kept inside, every other join judged by simulated traffic",
            partition="ago", tuned=True, db_of="tvm-ago-locality", keep_inside=A76_KEEP_INSIDE,
            joins="a76"),
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
    proxy: str | None = None  # phone-cache proxy geometry (host/bench/proxy.py) simulated for every TVM variant
    scheduler: str = "weight"  # how every tuned variant spreads its budget (toolchain.tune.budget.SCHEDULERS)
    prepack: bool = True  # every tuned variant may rewrite its weights' layout (toolchain.tune.settings.TuneSettings)
    transfer: int = 2  # every tuned variant's searches start from similar kernels' schedules (TuneSettings)
    population: int = 128  # every tuned variant's search population per batch (TuneSettings)
    layout: str = "NHWC"  # activation layout of every TVM variant (toolchain.targets.LAYOUTS)
    pad_channels: bool = True  # every TVM variant pads output channels (toolchain.padding)
    fast_math: bool = True  # every TVM variant computes exp / erf / tanh / sigmoid / softmax fast (toolchain.fastmath)
    # what every timed call finds in cache (host.bench.cache_regime.REGIMES); results without: shared
    cache: str = "cold"
    order_seed: int | None = None  # the per-round engine order's seed alone (None: ``seed``, which also seeds tuning)

    @property
    def order(self) -> int:
        """Seed of the per-round engine order: ``order_seed``, else ``seed``. Only ``seed`` reaches the tuning,
        so a work dir can be timed again in another order without its databases being refused."""
        return self.seed if self.order_seed is None else self.order_seed


FULL = {"rounds": 10, "calls_per_round": 10, "warmup": 5, "gap_s": 0.3}
QUICK = {"rounds": 3, "calls_per_round": 3, "warmup": 2, "gap_s": 0.3}


def default_settings(quick: bool, threads: int | None = None, seed: int = 0, suite: Suite | None = None) -> Settings:
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
    "untuned": Suite(
        "untuned",
        "zoo CNNs at 112 and 224 as `agoc compile` builds them without tuning (register blocks, the record "
        "library) on AGO's and the stock partition, beside onnxruntime",
        families=("cnn",),
        variants=("agoc-stock", "agoc", "onnxruntime"),
        baselines=("agoc-stock", "onnxruntime"),
        sizes=(112, 224),
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


def suite_cases(suite: Suite, quick: bool, models: list[str] | None = None,
                shapes: list[int] | None = None) -> list[Case]:
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


#: /proc/cpuinfo flags of FP32 vector units, widest first: (flag, name)
VECTOR_FLAGS = (("avx512f", "avx512"), ("avx2", "avx2"), ("asimd", "neon"), ("sse2", "sse2"))


def cpu_info(text: str) -> tuple[str | None, str | None]:
    """(the first core's model name, its widest FP32 vector unit: :data:`VECTOR_FLAGS`) from /proc/cpuinfo's text."""
    lines = reversed(text.splitlines())  # the first core's values written last
    info = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in lines if ":" in line)}
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return info.get("model name"), next((name for flag, name in VECTOR_FLAGS if flag in flags), None)


def machine_context() -> dict:
    import psutil

    try:
        cpu, vector = cpu_info(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu, vector = None, None
    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "vector": vector,  # figures from hosts with different vector units do not compare
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
