"""The sizes users ship (`make bench-shipped`): each zoo CNN at each input size tuned by the default `agoc tune`, built
from its database and without one (every build checked against onnxruntime before it is written), each timed beside
onnxruntime at every thread count, warm and cold; the tuned build's share of the FMA peak. JSON + PNG."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from host.bench.curves import agoc_path, measure, run_logged
from host.bench.suites import machine_context

MODELS = ("mobilenet-v2", "mobilenet-v3-small", "mnasnet", "squeezenet-1.1", "shufflenet-v2")
#: onnxruntime ÷ agoc the tuned build is to reach at each input size, warm and cold, on every thread count (#59);
#: a size not listed is reported without a verdict
TARGET = {112: 1.1, 224: 1.0}
#: the builds of each point: from the tuned database, and `agoc compile` without one
BUILDS = ("tuned", "untuned")


@dataclass
class Point:
    """One model at one size: the default tune's seconds and trials, each build's timings per thread count
    (``timed[build][threads]``: medians per regime of both engines, onnxruntime ÷ agoc, a note), the tuned build's
    share of the peak (``peak``), and why something is missing (``note``)."""

    model: str
    size: int
    tune_s: float | None = None
    trials: int | None = None
    timed: dict = field(default_factory=dict)
    peak: dict = field(default_factory=dict)
    note: str = ""
    code: str = ""  # :func:`code_version` of what tuned, built and timed it


#: the sources whose every change makes a point's tune and builds another's: the compiler, the CLI, the runner, the
#: zoo (the suite's own report code is left out)
SOURCES = ("toolchain/**/*.py", "host/*.py", "host/commands/*.py", "models/**/*.py", "android_runner/src/*")


def code_version(extra: list[str] = ()) -> str:
    """A digest of :data:`SOURCES` (and ``extra``: the tune's options): a point's work directory is named by it, so
    a point resumes only what the same code made (an earlier run's builds are never timed as this code's)."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(" ".join(extra).encode())
    for path in sorted({p for pattern in SOURCES for p in root.glob(pattern) if p.is_file()}):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


def run_point(model: str, size: int, args, log: Path) -> Point:
    """Tune, build twice, time; a step that fails ends the point with its first line in ``note``. A point whose
    work directory (named by :func:`code_version`) holds a finished tune resumes after it (its seconds and trials
    kept)."""
    from toolchain import tune as tuning

    code = code_version(args.tune_args)
    work = args.work / f"{model}-{size}-{code}"
    saved = work / "point.json"
    point = Point(**json.loads(saved.read_text())) if saved.exists() else Point(model, size, code=code)
    point.note = ""
    ref = f"zoo:{model}@1x3x{size}x{size}"
    try:
        if point.tune_s is None:
            started = time.monotonic()
            run_logged([agoc_path(), "tune", ref, "--db", str(work / "db"), *args.tune_args], log)
            point.tune_s = round(time.monotonic() - started, 1)
            point.trials = tuning.status(work / "db")["trials"]
            _save(point, saved)
        for build in BUILDS:
            if not (work / build / "manifest.json").exists():
                db = ["--db", str(work / "db")] if build == "tuned" else []
                run_logged([agoc_path(), "compile", ref, "-o", str(work / build), *db], log)
        for threads in args.threads:
            for build in BUILDS:
                ours, ort, note, speedup = measure(work / build, threads, args.rounds, args.calls)
                point.timed.setdefault(build, {})[str(threads)] = {
                    "ms": ours, "onnxruntime_ms": ort, "note": note, "speedup": speedup}
        point.peak = peak_share(work / "tuned", max(args.threads), log)
    except RuntimeError as exc:
        point.note = str(exc).splitlines()[0]
    _save(point, saved)
    return point


#: a per-kernel sitting whose kernels sum to more than this times the model's own median (timed in the same run, the
#: kernels inside it) was disturbed — another program held a core — and is timed again, at most :data:`SITTINGS` times
DISTURBED = 1.25
SITTINGS = 3


def peak_share(artifact: Path, threads: int, log: Path) -> dict:
    """The build's kernels timed one by one (`agoc bench --per-kernel`): the model's FLOPs, the sum of its kernels'
    medians, the GFLOP/s that makes and its fraction of the FMA peak the runner measured in the same run. A sitting
    :func:`disturbed` is timed again (the last one kept, with a note, if every one was)."""
    out = log.with_name(f"{artifact.parent.name}-per-kernel.json")
    sittings, result = 0, {}
    while sittings < SITTINGS and (sittings == 0 or disturbed(result)):
        sittings += 1
        with open(out, "w") as f:
            done = subprocess.run([agoc_path(), "bench", str(artifact), "--per-kernel", "--json", "--threads",
                                   str(threads), "--repeat", "50"], stdout=f, stderr=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            return {"note": f"agoc bench --per-kernel exited {done.returncode}"}
        result = json.loads(out.read_text())
    share, last_disturbed = share_of_peak(result, model_flops(artifact)), disturbed(result)
    if sittings > 1:  # every sitting before the last was disturbed
        share["note"] = (f"{sittings} sittings: the kernels summed to over {DISTURBED}x the model's median in "
                         f"{sittings - 1 + int(last_disturbed)}")
    return share


def disturbed(result: dict) -> bool:
    """Whether a per-kernel sitting's kernels sum to more than :data:`DISTURBED` times the model's median of the same
    run: the kernels run inside the model, so only another program's share of the cores makes them longer."""
    model = result.get("median_ms") or 0.0
    return model > 0 and share_of_peak(result)["kernels_ms"] > DISTURBED * model


def model_flops(artifact: Path) -> int:
    """The FLOPs of one inference of the artifact's model as it is (TVM's count of its stock-fused kernels, no
    channel padded: a padded conv's zero channels are not the model's work), 0 where it cannot be counted."""
    from toolchain import build, onnx_import
    from toolchain.artifact import load_artifact
    from toolchain.targets import resolve_target

    try:
        found = load_artifact(artifact)
        proto = onnx_import.load_model(found.model_path)
        shapes = {t.info.name: tuple(t.info.shape) for t in found.manifest.inputs}
        spec = resolve_target("host", pad_channels=False)
        mod = build.legalize(onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, shapes)), spec)
        return sum(k.flops * k.calls for k in build.kernels(build.fuse_stock(mod, spec)))
    except Exception:  # noqa: BLE001 - a figure of the report: the kernels' own count is used instead
        return 0


def share_of_peak(result: dict, flops: int = 0) -> dict:
    """From `agoc bench --per-kernel --json`: GFLOP per inference (``flops``, else the kernels' own count, padded
    channels included), the kernels' summed ms, GFLOP/s, the measured peak and the fraction of it (None where a
    count or the peak is missing); and the same over the model's own median of that run (``model_*``: every call timed
    whole, no per-kernel instrument — how #59 reads onnxruntime's share)."""
    kernels = result.get("kernels") or []
    flops = flops or sum((k.get("flops") or 0) * (k.get("calls_per_run") or 0) for k in kernels)
    ms = sum(k.get("median_ms") or 0.0 for k in kernels)
    model_ms = result.get("median_ms") or 0.0
    peak = (result.get("peak") or {}).get("gflops")
    rate = flops / ms / 1e6 if flops and ms > 0 else None
    model_rate = flops / model_ms / 1e6 if flops and model_ms > 0 else None
    return {"gflop": round(flops / 1e9, 4), "kernels_ms": round(ms, 4), "gflops": rate and round(rate, 1),
            "peak_gflops": peak, "fraction": round(rate / peak, 3) if rate and peak else None,
            "model_ms": round(model_ms, 4), "model_gflops": model_rate and round(model_rate, 1),
            "model_fraction": round(model_rate / peak, 3) if model_rate and peak else None}


def verdict(points: list[Point]) -> dict:
    """Per size with a :data:`TARGET`: the tuned builds at or above it on every thread count and regime, those
    below (model, threads, regime, ratio), and those not timed."""
    out: dict = {}
    for size, target in TARGET.items():
        met, below, missing = [], [], []
        for p in (p for p in points if p.size == size):
            timed = p.timed.get("tuned") or {}
            ratios = [(p.model, t, r, v) for t, one in timed.items() for r, v in one["speedup"].items()]
            if not ratios:
                missing.append(p.model)
            elif all(v >= target for *_, v in ratios):
                met.append(p.model)
            else:
                below += [{"model": m, "threads": int(t), "regime": r, "ratio": v} for m, t, r, v in ratios
                          if v < target]
        if met or below or missing:
            out[str(size)] = {"target": target, "met": met, "below": below, "not_timed": missing}
    return out


def chart(document: dict, path: Path) -> Path:
    """onnxruntime ÷ agoc of the tuned builds: a bar per model, size, thread count and regime, the targets as lines
    (Pillow, no plotting stack)."""
    from PIL import Image, ImageDraw

    bars = [(f"{p['model']}@{p['size']}", t, r, v) for p in document["points"]
            for t, one in sorted((p["timed"].get("tuned") or {}).items(), reverse=True)
            for r, v in sorted(one["speedup"].items(), reverse=True)]
    top = max([v for *_, v in bars] + [1.2]) * 1.1
    w, h, m = max(480, 64 + 14 * len(bars) + 12 * len(document["points"]) + 120), 400, 64
    image = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(image)
    ink = (30, 30, 30)

    def y(v: float) -> float:
        return h - m - (h - 2 * m) * v / top

    draw.text((m, 8), "onnxruntime / agoc, tuned by the default `agoc tune` (bars: threads, warm / cold)", fill=ink)
    for target in sorted(set(TARGET.values())):
        draw.line([(m, y(target)), (w - 8, y(target))], fill=(160, 160, 160))
        draw.text((4, y(target) - 6), f"{target:g}x", fill=ink)
    x, last, groups = m, None, 0
    colours = {("2", "warm"): (214, 96, 40), ("2", "cold"): (140, 60, 20), ("1", "warm"): (60, 120, 200),
               ("1", "cold"): (30, 70, 130)}
    for label, t, r, v in bars:
        if label != last:
            x += 12
            draw.text((x, h - m + 6 + 14 * (groups % 3)), label, fill=ink)  # three rows: labels wider than a group
            last, groups = label, groups + 1
        draw.rectangle([x, y(v), x + 10, h - m], fill=colours.get((t, r), (90, 90, 90)))
        x += 14
    draw.text((w - 250, m), "orange: 2 threads, blue: 1; dark: cold", fill=ink)
    image.save(path)
    return path


def _save(point: Point, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(point), indent=1))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m host.bench.shipped", description=__doc__)
    ap.add_argument("--models", default=",".join(MODELS), help="zoo models, comma-separated")
    ap.add_argument("--sizes", default="112,224", help="input sizes, comma-separated")
    ap.add_argument("--threads", default="2,1", help="thread counts each build is timed at, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--tune-args", default="", help="extra `agoc tune` options (default: none, the default tune)")
    ap.add_argument("--work", type=Path, default=Path("build/bench-shipped"),
                    help="tuning databases and builds; a point with a finished tune resumes after it (the same code)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from models.registry import MODELS as ZOO

    unknown = [m for m in args.models.split(",") if m and m not in {z.name for z in ZOO}]
    if unknown:  # before any tune
        print(f"error: unknown zoo model(s) {', '.join(unknown)}; give --models from: {', '.join(z.name for z in ZOO)}",
              file=sys.stderr)
        return 1
    args.threads = [int(t) for t in args.threads.split(",") if t]
    args.tune_args = args.tune_args.split()
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "commands.log"
    points = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        for model in (m for m in args.models.split(",") if m):
            print(f"{model} @{size}: tune, build, time (log {log})", flush=True)
            points.append(run_point(model, size, args, log))
            print(f"  {_line(points[-1])}", flush=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    document = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "date": stamp, "machine": machine_context(),
                "settings": {"threads": args.threads, "rounds": args.rounds, "calls": args.calls,
                             "tune": ["agoc", "tune", "MODEL", *args.tune_args]},
                "points": [asdict(p) for p in points]}
    document["verdict"] = verdict(points)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"shipped-{stamp}.json"
    path.write_text(json.dumps(document, indent=1))
    chart(document, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0 if all(not p.note for p in points) else 1


def _line(p: Point) -> str:
    if p.note:
        return f"not finished: {p.note}"
    cells = [f"{t} thr {r} {v:.2f}x" for t, one in (p.timed.get("tuned") or {}).items()
             for r, v in one["speedup"].items()]
    share, whole = p.peak.get("fraction"), p.peak.get("model_fraction")
    return (f"tuned in {p.tune_s:.0f} s ({p.trials} trials): " + ", ".join(cells)
            + (f"; {100 * share:.0f} % of peak (kernels)" if share else "")
            + (f", {100 * whole:.0f} % (model)" if whole else "")
            + (f" ({p.peak['note']})" if p.peak.get("note") else ""))


if __name__ == "__main__":
    raise SystemExit(main())
