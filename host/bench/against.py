"""``agoc bench ARTIFACT --against onnxruntime [--against OTHER]``: the artifact, onnxruntime and other builds of
the model on the same inputs and threads, each in its own process, timed in the same interleaved rounds in the warm
and cold cache regimes; each one's ratio to the artifact."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from host.bench.run import Worker, measure_rounds
from host.bench.suites import Settings, Variant, ratio_stats

#: the engines compared: agoc's artifact (TVM's runtime) and the reference
ENGINES = (Variant("agoc", "tvm", "the artifact, on TVM's runtime"),
           Variant("onnxruntime", "onnxruntime", "onnxruntime's CPU execution provider on the artifact's model"))
#: the regimes each comparison runs in (host/bench/cache_regime.py)
REGIMES = ("warm", "cold")


@dataclass(frozen=True)
class Comparison:
    """Medians (ms) per regime and engine, and onnxruntime ÷ agoc per regime (above 1: agoc is faster); ``versus``:
    per regime every other member's ÷ agoc (other builds under their labels, onnxruntime's too)."""

    threads: int
    rounds: int
    calls: int
    median_ms: dict  # regime -> engine -> ms
    speedup: dict  # regime -> onnxruntime ÷ agoc, the median of the rounds' ratios (paired_ratio)
    failures: dict  # regime -> engine -> why it did not run
    disturbed: dict  # regime -> engine -> rounds timed while another program held its cores (toolchain/timing.py)
    per_round: dict = field(default_factory=dict)  # regime -> engine -> each round's median ms
    versus: dict = field(default_factory=dict)  # regime -> member -> its ms ÷ agoc's (paired_ratio)
    builds: dict = field(default_factory=dict)  # label -> directory of each other build timed

    def to_json(self) -> dict:
        return {"threads": self.threads, "rounds": self.rounds, "calls": self.calls, "median_ms": self.median_ms,
                "speedup": self.speedup, "versus": self.versus, "builds": self.builds, "failures": self.failures,
                "disturbed_rounds": self.disturbed, "per_round_ms": self.per_round}


def compare(artifact_dir: Path, threads: int | None = None, rounds: int = 5, calls: int = 10,
            warmup: int = 3, seed: int = 0, on_round=lambda regime, r, n: None, others: dict | None = None,
            reference: bool = True) -> Comparison:
    """Time the artifact beside onnxruntime (``reference``) and the builds ``others`` (label -> directory), each in
    a worker process of its own (host/bench/worker.py), in each regime of :data:`REGIMES`: ``rounds`` rounds of
    ``calls`` calls, members in a random order."""
    threads = threads or os.cpu_count() or 1
    others = dict(others or {})
    members = {v.name: (v, artifact_dir) for v in ENGINES if reference or v.name == "agoc"}
    members.update({label: (Variant(label, "tvm", f"the build in {path}"), Path(path))
                    for label, path in others.items()})
    medians, speedup, versus, failures, disturbed, per_round = {}, {}, {}, {}, {}, {}
    for regime in REGIMES:
        timed = side_by_side(members, regime, threads, rounds, calls, warmup, seed,
                             lambda r, regime=regime: on_round(regime, r, rounds))
        failures[regime], disturbed[regime] = timed.failures, timed.disturbed
        per_round[regime] = {name: [float(x) for x in r] for name, r in timed.per_round.items()}
        medians[regime] = {name: float(np.median(s)) for name, s in timed.samples.items() if s}
        versus[regime] = {name: paired_ratio(per_round[regime], medians[regime], name)
                          for name in members if name != "agoc" and {"agoc", name} <= set(medians[regime])}
        if "onnxruntime" in versus[regime]:
            speedup[regime] = versus[regime]["onnxruntime"]
    return Comparison(threads, rounds, calls, medians, speedup, failures, disturbed, per_round, versus,
                      {label: str(path) for label, path in others.items()})


def paired_ratio(per_round: dict, medians: dict, other: str = "onnxruntime") -> float:
    """``other`` ÷ agoc (onnxruntime's by default): the median of the rounds' ratios, both timed in each round (a
    slow spell of the host slows both: a round's ratio keeps what the ratio of the medians loses); the ratio of the
    medians where a round lacks either."""
    theirs, ours = per_round.get(other) or [], per_round.get("agoc") or []
    if theirs and len(theirs) == len(ours):
        return ratio_stats(theirs, ours)["median"]
    return medians[other] / medians["agoc"]


def labels(artifact_dir: Path, others: list[Path]) -> dict[str, Path]:
    """A label per other build for tables and JSON: its directory's name, or its path where names repeat (or clash
    with the artifact's own or an engine's)."""
    names = [Path(p).name for p in others]
    taken = {"agoc", "onnxruntime", Path(artifact_dir).name}
    return {(n if names.count(n) == 1 and n not in taken else str(p)): Path(p) for n, p in zip(names, others)}


@dataclass(frozen=True)
class Timed:
    """One regime's interleaved rounds: every call's ms and each round's median per member, why a member did not
    run, and the rounds timed while another program held a member's cores (toolchain/timing.py)."""

    samples: dict
    per_round: dict
    failures: dict
    disturbed: dict


def side_by_side(members: dict, regime: str, threads: int, rounds: int, calls: int, warmup: int = 3, seed: int = 0,
                 on_round=lambda r: None) -> Timed:
    """``members`` (name -> (Variant, artifact directory)) each in a worker process of its own, timed in ``rounds``
    interleaved rounds of ``calls`` calls in the cache ``regime``, members in a random order per round."""
    settings = Settings(threads=threads, rounds=rounds, calls_per_round=calls, warmup=warmup, gap_s=0.05,
                        seed=seed, quick=False, cache=regime)
    workers = [Worker({name: member}, settings) for name, member in members.items()]
    try:
        failed = {name: why for w in workers for name, why in w.errors.items()}
        samples, per_round, broke = measure_rounds(workers, settings, random.Random(seed),
                                                   lambda kind, **info: on_round(info["round"]))
    finally:
        for w in workers:
            w.close()
    disturbed = {name: w.disturbed for w in workers for name in w.names if w.disturbed}
    return Timed(samples, per_round, {**failed, **broke}, disturbed)
