"""Time-to-quality judged in one sitting: the checkpoint builds a tuning-curves run compares — (b)'s last, every
(c) point, (a)'s last, (b)'s last again as the control — each in its own process, timed in the same interleaved
rounds, so that a verdict does not rest on timings an hour apart on a VM whose speed drifts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: a build whose median per-round ratio to (b)'s last is within this (or within what (b)'s last timed against itself
#: differs, when more) is at (b)'s latency
SAME_WITHIN = 0.02
REFERENCE, CONTROL = "b-last", "b-last-again"
#: rounds of the side-by-side timing at least (each build's per-round ratio to the reference: their median)
JUDGE_ROUNDS = 10


def build_dirs(document: dict) -> dict[str, list[Path | None]]:
    """Per variant, each point's build directory: ``Point.build`` where recorded, else where a run of this bench
    writes it (``WORK/VARIANT/at-Mm``, M the point's checkpoint: 0 first for (b) and (c)), from the runs the document
    was merged from (or itself)."""
    runs = [json.loads(Path(p).read_text()) for p in document.get("merged_from", [])] or [document]
    out = {}
    for variant, points in document["curves"].items():
        run = next((r for r in reversed(runs) if variant in r.get("curves", {})), document)
        minutes = (run["checkpoints_min"] if variant == "a" else [0.0, *run["checkpoints_min"]])
        guessed = [Path(run["work"]) / variant / f"at-{m:g}m" for m in minutes]
        out[variant] = [Path(p["build"]) if p.get("build") else (guessed[i] if i < len(guessed) else None)
                        for i, p in enumerate(points)]
    return out


def contenders(document: dict) -> dict[str, Path]:
    """name -> build directory: (b)'s last verified point (the reference) and again (the control), each verified
    (c) point (``c@MINUTES``), (a)'s last verified point."""
    dirs = build_dirs(document)
    verified = {v: [(p, d) for p, d in zip(pts, dirs[v]) if p.get("verified") and d is not None and d.is_dir()]
                for v, pts in document["curves"].items()}
    if not verified.get("b"):
        raise SystemExit("no verified build of (b) whose directory is still there: nothing to judge against")
    last_b = verified["b"][-1][1]
    found = {REFERENCE: last_b, CONTROL: last_b}
    if len(verified["b"]) > 1:  # what (b)'s tuning bought over its own first build
        found["b-first"] = verified["b"][0][1]
    found.update({f"c@{p['tune_s'] / 60:.1f}": d for p, d in verified.get("c", [])})
    if verified.get("a"):
        found["a-last"] = verified["a"][-1][1]
    return found


def judge(builds: dict[str, Path], threads: int, rounds: int, calls: int, seed: int = 0) -> dict:
    """Every build and onnxruntime (on the reference's model) in a process of its own, ``rounds`` interleaved rounds
    of ``calls`` calls per regime; per regime and build its median ms and its median per-round ratio to the
    reference's."""
    from host.bench.against import REGIMES, side_by_side
    from host.bench.suites import Variant

    members = {name: (Variant(name, "tvm", name), path) for name, path in builds.items()}
    members["onnxruntime"] = (Variant("onnxruntime", "onnxruntime", "onnxruntime"), builds[REFERENCE])
    out = {}
    for regime in REGIMES:
        timed = side_by_side(members, regime, threads, rounds, calls, seed=seed)
        ref = timed.per_round.get(REFERENCE) or []
        out[regime] = {"failed": timed.failures, "disturbed_rounds": timed.disturbed, "builds": {
            name: {"ms": round(float(np.median(r)), 4),
                   "over_reference": round(float(np.median([x / y for x, y in zip(r, ref)])), 4) if ref else None}
            for name, r in timed.per_round.items() if r}}
    return out


def verdict(judged: dict) -> dict:
    """Per regime: the tolerance (:data:`SAME_WITHIN`, or the control's distance from 1 when larger), the first (c)
    point at (b)'s last latency within it (its minutes; None: none) and, where (a)'s last was timed, the first (c)
    point at (a)'s last latency within it."""
    out = {}
    for regime, found in judged.items():
        builds = found["builds"]
        control = (builds.get(CONTROL) or {}).get("over_reference")
        within = max(SAME_WITHIN, abs(control - 1) if control else 0.0)
        out[regime] = {"within": round(within, 4), "c_reaches_b_last_at_min": _first_c_at(builds, 1.0, within)}
        stock = (builds.get("a-last") or {}).get("over_reference")
        if stock is not None:
            out[regime]["c_reaches_a_last_at_min"] = _first_c_at(builds, stock, within)
    return out


def _first_c_at(builds: dict, latency: float, within: float) -> float | None:
    """Minutes of the first (c) point at ``latency`` (a ratio to the reference) or below, within ``within``."""
    return min((float(n[2:]) for n, b in builds.items() if n.startswith("c@") and b["over_reference"] is not None
                and b["over_reference"] <= latency * (1 + within)), default=None)


def table(judged: dict, verdicts: dict) -> str:
    """The sitting as text: per regime each build's median and ratio, and the verdict."""
    lines = []
    for regime, found in judged.items():
        lines.append(f"{regime} (÷ {REFERENCE}, median of per-round ratios; level within "
                     f"{verdicts[regime]['within']:.1%}):")
        for name, b in found["builds"].items():
            ratio = f"{b['over_reference']:.3f}" if b["over_reference"] is not None else "—"
            lines.append(f"  {name:14s} {b['ms']:8.3f} ms  {ratio}")
        for who in ("b", "a"):
            if f"c_reaches_{who}_last_at_min" in verdicts[regime]:
                reached = verdicts[regime][f"c_reaches_{who}_last_at_min"]
                lines.append(f"  (c) at ({who})'s last: {'not reached' if reached is None else f'{reached:g} min'}")
    return "\n".join(lines)
