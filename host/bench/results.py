"""A suite's results documents: where they are written, their chart, flat rows, geomean speed-ups."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np


def cache_of(document: dict) -> str:
    """The cache regime a results document was timed in (host.bench.cache_regime); documents before the
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
    from host.bench import proxy

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
