"""`make bench-tuning`: time to quality. A model's latency against tuning wall-clock for (a) MetaSchedule as TVM
ships it, (b) agoc from scratch and (c) agoc with a record library and cost model built without the model
(leave-one-out); every checkpoint built, verified and timed beside onnxruntime; JSON + PNG in bench/results/."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

VARIANTS = {
    "a": "MetaSchedule as TVM ships it: TVM's ONNX frontend and FuseOps, tune_relax's defaults",
    "b": "agoc from scratch: no record library, no pre-trained cost model",
    "c": "agoc with a record library and cost model built without this model (leave-one-out)",
}
#: seconds a stopped stock tune gets to exit before it is killed
STOP_GRACE_S = 10


@dataclass
class Point:
    """One checkpoint of one variant: tuning seconds so far, what the tuner estimated, what the build measured
    (median ms per regime, onnxruntime's in the same rounds) and whether it was verified."""

    variant: str
    tune_s: float
    trials: int | None = None
    estimate_ms: float | None = None
    ms: dict = field(default_factory=dict)  # regime -> median ms of the build
    onnxruntime_ms: dict = field(default_factory=dict)  # regime -> onnxruntime's median in the same rounds
    verified: bool = False
    build_s: float | None = None
    note: str = ""
    build: str = ""  # the checkpoint's build directory (host/bench/together.py times them again side by side)


def agoc_path() -> str:
    return str(Path(sys.executable).with_name("agoc"))


def run_logged(words: list[str], log: Path) -> None:
    """Run an agoc/python command, its output appended to ``log``; raise with its tail when it fails."""
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(words)}\n")
        f.flush()
        done = subprocess.run(words, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(words[:3])}… exited {done.returncode}:\n{log.read_text()[-1500:]}")


# ----------------------------------------------------------------------------- leave-one-out library


def loo_library(model: str, spec, out: Path, given=None):
    """The record library ``given`` (a loaded one that serves ``spec``; else the packaged one of ``spec``'s target)
    less everything tuned on ``model`` (a zoo name), with its cost model retrained on what is left, at ``out``; None
    when there is no library or nothing is left."""
    from toolchain.tune import library

    if given is None:
        packaged = library.default_for(spec)
        if packaged is None:
            return None
        given = library.Library.load(packaged)
    return library.subset(given, out, lambda source: not tuned_on(model, source))


def tuned_on(model: str, source: dict) -> bool:
    """Whether a library's source (a database it was built from) tuned ``model`` (a zoo name), at any input size:
    its command names ``zoo:MODEL@``, or its database is named after it (``mobilenet-v2``, ``mobilenet-v2-112.db``,
    ``rerun-squeezenet-1.1-112.db``; not ``mobilenet-v3-small-112.db`` for ``mobilenet-v2``)."""
    if f"zoo:{model}@" in (source.get("command") or ""):
        return True
    name = Path(source.get("database") or "").name
    return re.search(rf"(^|[-_]){re.escape(model)}([-_.@]|$)", name) is not None


# ----------------------------------------------------------------------------- timing a build


#: a build's warm median this many times its cold one: its warm rounds were disturbed (a warm call finds in cache
#: what a cold one fetches; seen: 6.82 ms warm beside 3.74 cold, the same build 3.90 warm on an idle VM)
WARM_OVER_COLD = 1.25


def suspect(ours: dict, ort: dict, disturbed: dict) -> str:
    """Why a checkpoint's timing is not to be trusted ("" when it is): rounds timed while another program held the
    cores, or either engine's warm median above :data:`WARM_OVER_COLD` times its cold one."""
    busy = sum(n for engines in disturbed.values() for n in engines.values())
    if busy:
        return f"{busy} round(s) timed while other programs held the cores"
    for engine, medians in (("agoc", ours), ("onnxruntime", ort)):
        warm, cold = medians.get("warm"), medians.get("cold")
        if warm and cold and warm > WARM_OVER_COLD * cold:
            return f"{engine} {warm:.3f} ms warm against {cold:.3f} cold"
    return ""


def measure(artifact: Path, threads: int, rounds: int, calls: int) -> tuple[dict, dict, str, dict]:
    """(build's median ms per regime, onnxruntime's, a note, onnxruntime ÷ agoc per regime: the median of the rounds'
    ratios), each engine in its own process, interleaved rounds; timed a second time where the first is
    :func:`suspect` (the note says why; the second timing is kept)."""
    from host.bench.against import compare

    note = ""
    for attempt in range(2):
        found = compare(artifact, threads=threads, rounds=rounds, calls=calls)
        ours = {r: round(m["agoc"], 4) for r, m in found.median_ms.items() if "agoc" in m}
        ort = {r: round(m["onnxruntime"], 4) for r, m in found.median_ms.items() if "onnxruntime" in m}
        speedup = {r: round(v, 3) for r, v in found.speedup.items()}
        why = suspect(ours, ort, found.disturbed)
        if not why:
            return ours, ort, note, speedup
        note = f"timed again: {why}" if attempt == 0 else f"{note}; again: {why}"
    return ours, ort, note, speedup


# ----------------------------------------------------------------------------- agoc (b), (c)


def agoc_curve(args, name: str, library: Path | None, work: Path, log: Path) -> list[Point]:
    """agoc tune resumed checkpoint by checkpoint (``--time`` the difference), each checkpoint compiled from the
    database (``compile`` checks it against onnxruntime before writing it) and timed."""
    lib = ["--library", str(library)] if library is not None else ["--no-library"]
    db, points, spent = work / name / "db", [], 0.0
    for minutes in [0.0, *checkpoints(args, name)]:
        point = Point(name, round(spent, 1))
        if minutes > 0:
            started = time.monotonic()
            run_logged([agoc_path(), "tune", args.model, "--db", str(db), "--time",
                        f"{max(1, round(minutes * 60 - spent))}s", "--seed", str(args.seed), *lib], log)
            spent += time.monotonic() - started
            from toolchain import tune as tuning

            status = tuning.status(db)
            point = Point(name, round(spent, 1), trials=status["trials"], estimate_ms=status["estimate_ms"])
        out = work / name / f"at-{minutes:g}m"
        words = [agoc_path(), "compile", args.model, "-o", str(out), *(["--db", str(db)] if minutes > 0 else []), *lib]
        points.append(_built_and_timed(point, lambda words=words: run_logged(words, log), out, args))
    return points


def checkpoints(args, variant: str) -> list[float]:
    """A variant's checkpoints in minutes: ``--checkpoints``, (c)'s ``--checkpoints-c`` where given."""
    return args.checkpoints_c if variant == "c" and args.checkpoints_c else args.checkpoints


def _built_and_timed(point: Point, build, out: Path, args) -> Point:
    """``build()`` writes the checkpoint's build to ``out``, verified; then it is timed beside onnxruntime. A build
    that fails or does not verify is recorded so (its first line)."""
    started = time.monotonic()
    point.build = str(out)
    try:
        build()
        point.verified, point.build_s = True, round(time.monotonic() - started, 1)
        point.ms, point.onnxruntime_ms, point.note, _ = measure(out, args.threads, args.rounds, args.calls)
    except RuntimeError as exc:
        point.note = str(exc).splitlines()[0]
    print(f"  ({point.variant}) {_line(point)}", flush=True)
    return point


# ----------------------------------------------------------------------------- MetaSchedule (a)


def stock_curve(args, spec, model_path: Path, template: Path, work: Path, log: Path) -> list[Point]:
    """One ``tune_relax`` run stopped at the last checkpoint; at each checkpoint its estimate from the batches
    measured by then, and the model built with the records it held then, verified and timed."""
    from host.bench import stock_ms

    stock = work / "a"
    (stock / "ms").mkdir(parents=True, exist_ok=True)
    target = json.dumps(dict(spec.tvm_target))
    words = [sys.executable, "-m", "host.bench.stock_ms", "tune", "--model", str(model_path), "--target", target,
             "--work", str(stock / "ms"), "--scheduler", args.stock_scheduler]
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(words)}\n")
        f.flush()
        proc = subprocess.Popen(words, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        started = time.monotonic()
        try:
            proc.wait(timeout=args.checkpoints[-1] * 60)
        except subprocess.TimeoutExpired:
            _stop(proc)
        except BaseException:  # Ctrl-C: its own session does not see the terminal's signal
            _stop(proc)
            raise
    ended = time.monotonic() - started
    logged = stock_ms.batches(stock / "ms")
    tasks = stock_ms.tasks(stock / "ms")
    points = []
    for minutes in args.checkpoints:
        until = min(minutes * 60, ended)
        point = Point("a", round(until, 1), trials=sum(len(b["secs"]) for b in logged if b["t"] <= until),
                      estimate_ms=stock_ms.estimate_ms(logged, until, tasks))
        out, records = stock / f"at-{minutes:g}m", stock_ms.records_at(logged, until)
        points.append(_built_and_timed(point, lambda out=out, records=records: _stock_artifact(
            model_path, target, stock, records, template, out, log), out, args))
    return points


def _stop(proc: subprocess.Popen) -> None:
    """Stop the tune and its builder/runner workers (its own process group)."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _stock_artifact(model_path: Path, target: str, stock: Path, records: int, template: Path, out: Path,
                    log: Path) -> None:
    """The stock build as an artifact: ``template``'s (agoc's build of the same model: its inputs, expected
    outputs, model) with the stock library in place of agoc's, then ``agoc verify``'d against those outputs."""
    from toolchain.artifact import MANIFEST, file_sha256

    if out.exists():
        shutil.rmtree(out)  # this bench's own checkpoint directory
    shutil.copytree(template, out, ignore=shutil.ignore_patterns("*.so"))
    manifest = json.loads((out / MANIFEST).read_text())
    library = out / manifest["library"]
    run_logged([sys.executable, "-m", "host.bench.stock_ms", "build", "--model", str(model_path), "--target", target,
                "--work", str(stock / "ms"), "--records", str(records), "--out", str(library)], log)
    manifest.update(library_sha256=file_sha256(library), partition="stock", kernels=[], untuned=None,
                    tuning={"db": str(stock / "ms"), "records": records, "by": "tvm.s_tir.meta_schedule.tune_relax"})
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    run_logged([agoc_path(), "verify", str(out)], log)


# ----------------------------------------------------------------------------- summary


def _line(p: Point) -> str:
    warm = p.ms.get("warm")
    ratio = f", {p.onnxruntime_ms['warm'] / warm:.2f}× onnxruntime" if warm and p.onnxruntime_ms.get("warm") else ""
    est = f", estimate {p.estimate_ms:.3f} ms" if p.estimate_ms is not None else ""
    got = f"{warm:.3f} ms warm{ratio}{f' ({p.note})' if p.note else ''}" if warm else (p.note or "not measured")
    return f"{p.tune_s / 60:.1f} min, {p.trials if p.trials is not None else 0} trials{est}: {got}"


def relative(p: Point, regime: str) -> float | None:
    """The checkpoint's latency over onnxruntime's in the same rounds (below 1: faster): what compares across
    checkpoints on a host whose speed drifts (onnxruntime's own median moved 3.3-5.8 ms within one run)."""
    ms, ort = p.ms.get(regime), p.onnxruntime_ms.get(regime)
    return ms / ort if p.verified and ms and ort else None


def time_to(points: list[Point], target: float | None, regime: str = "warm") -> float | None:
    """Tuning seconds to the first verified checkpoint at or below ``target`` (a :func:`relative` latency; None:
    not reached)."""
    if target is None:
        return None
    return next((p.tune_s for p in points if (r := relative(p, regime)) is not None and r <= target), None)


def summarize(curves: dict[str, list[Point]]) -> dict:
    """Per regime: each variant's last and best latency relative to onnxruntime's, and its time to (a)'s final
    relative latency, to (b)'s, and to onnxruntime's (1.0)."""
    out = {}
    for regime in ("warm", "cold"):
        final = {v: next((r for p in reversed(pts) if (r := relative(p, regime)) is not None), None)
                 for v, pts in curves.items()}
        best = {v: min((r for p in pts if (r := relative(p, regime)) is not None), default=None)
                for v, pts in curves.items()}
        out[regime] = {"final_relative": final, "best_relative": best,
                       "time_to": {v: {"a_final": time_to(pts, final.get("a"), regime),
                                       "b_final": time_to(pts, final.get("b"), regime),
                                       "onnxruntime": time_to(pts, 1.0, regime)} for v, pts in curves.items()}}
    return out


def merge(paths: list[Path]) -> dict:
    """Runs of one model (the same machine, another time: a variant run again) as one document: a later run's
    curve of a variant replaces an earlier one's; the summary made again."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if len({d["model"] for d in docs}) != 1:
        raise SystemExit(f"runs of different models: {sorted({d['model'] for d in docs})}")
    merged = {**docs[-1], "merged_from": [str(p) for p in paths], "curves": {}}
    for d in docs:
        merged["curves"].update(d["curves"])
        merged["variants"] = {**merged.get("variants", {}), **d["variants"]}
    merged["curves"] = dict(sorted(merged["curves"].items()))
    merged["summary"] = summarize({v: [Point(**p) for p in pts] for v, pts in merged["curves"].items()})
    return merged


COLOURS = {"a": (200, 64, 64), "b": (70, 110, 170), "c": (46, 139, 87)}
LEGEND = {"a": "stock MetaSchedule", "b": "agoc", "c": "agoc + library"}


def chart(document: dict, path: Path) -> Path:
    """Warm latency relative to onnxruntime's (measured: lines) against tuning minutes, per variant, with 1.0
    (onnxruntime) as a grey line; log scale, so that 0.03 and 1.2 both read (Pillow, no plotting stack)."""
    import math

    from PIL import Image, ImageDraw

    w, h, m = 760, 420, 56
    curves = {v: [Point(**p) for p in pts] for v, pts in document["curves"].items()}
    xs = [p.tune_s / 60 for pts in curves.values() for p in pts] or [1.0]
    ys = [r for pts in curves.values() for p in pts if (r := relative(p, "warm"))] + [1.0]
    x_max, lo, hi = max(xs) or 1.0, math.log2(min(ys)) - 0.2, math.log2(max(ys)) + 0.2

    def at(x: float, y: float) -> tuple[float, float]:
        return m + (w - 2 * m) * x / x_max, h - m - (h - 2 * m) * (math.log2(y) - lo) / (hi - lo)

    image = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(image)
    ink = (30, 30, 30)
    draw.line([(m, h - m), (w - m, h - m)], fill=ink)
    draw.line([(m, h - m), (m, m)], fill=ink)
    draw.text((m, 8), f"{document['model']}: warm latency / onnxruntime's (log) against tuning minutes", fill=ink)
    draw.text((w - m - 40, h - m + 6), f"{x_max:.0f} min", fill=ink)
    draw.line([at(0, 1.0), at(x_max, 1.0)], fill=(160, 160, 160))
    draw.text(at(0, 1.0), "onnxruntime", fill=(120, 120, 120))
    for y in (2 ** e for e in range(math.ceil(lo), math.floor(hi) + 1)):
        draw.text((4, at(0, y)[1] - 6), f"{y:g}x", fill=ink)
    for i, (v, pts) in enumerate(curves.items()):
        colour = COLOURS.get(v, (0, 0, 0))
        line = [at(p.tune_s / 60, r) for p in pts if (r := relative(p, "warm"))]
        if len(line) > 1:
            draw.line(line, fill=colour, width=2)
        for x, y in line:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        draw.text((w - m - 150, m + 16 * i), f"({v}) {LEGEND.get(v, v)}", fill=colour)
    image.save(path)
    return path


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="zoo:mobilenet-v2@1x3x112x112", help="a zoo model (zoo:NAME@SHAPE)")
    p.add_argument("--checkpoints", default="5,15,45", help="tuning minutes at which each variant is built and "
                   "timed (comma-separated; the last is each variant's budget)")
    p.add_argument("--checkpoints-c", default="", help="(c)'s checkpoints when not --checkpoints' (the must-show "
                   "asks whether (c) reaches (b)'s last within 5 minutes: 2,5)")
    p.add_argument("--variants", default="a,b,c")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stock-scheduler", default="gradient", choices=("gradient", "round-robin"),
                   help="(a)'s task scheduler: TVM's default, gradient, records nothing before every task has had a "
                   "batch; round-robin records each batch as it goes")
    p.add_argument("--library", type=Path, metavar="DIR", help="(c)'s record library (agoc library build), less "
                   "the model's own records; default: the packaged one of this host's target")
    p.add_argument("--work", type=Path, default=Path("build/bench-tuning"))
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--merge", nargs="+", type=Path, metavar="RUN.json",
                   help="instead of running: runs of one model as one document (a later run's variant replaces an "
                   "earlier one's), written with its chart to --out")
    p.add_argument("--together", type=Path, metavar="RUN.json", help="instead of running: time a (merged) run's "
                   "builds again side by side — (b)'s last, every (c) point, (a)'s last — and judge whether (c) "
                   "reached (b)'s last latency (host/bench/together.py); written with the run to --out as …-together")
    args = p.parse_args(argv)
    if args.merge:
        return _write(merge(args.merge), args.out, f"tuning-curves-{Path(args.merge[-1]).stem.split('-', 2)[-1]}"
                      "-merged")
    if args.together:
        document = json.loads(args.together.read_text())
        if "curves" not in document:
            raise SystemExit(f"{args.together} is not a tuning-curves run (no curves in it)")
        judged_together(document, args)
        return _write(document, args.out, f"{args.together.stem.removesuffix('-together')}-together")
    args.checkpoints = sorted(float(c) for c in args.checkpoints.split(",") if c.strip())
    args.checkpoints_c = sorted(float(c) for c in args.checkpoints_c.split(",") if c.strip())
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if not args.model.startswith("zoo:") or "@" not in args.model or unknown or not args.checkpoints:
        print("give --model zoo:NAME@SHAPE, --variants of a,b,c and at least one checkpoint", file=sys.stderr)
        return 1

    import onnx

    from host.source import load_source
    from toolchain.targets import resolve_target

    proto, _, _ = load_source(args.model, [])
    name = args.model[4:].split("@")[0]
    spec = resolve_target("host", num_cores=args.threads)
    given = None
    if args.library is not None and "c" in variants:
        from toolchain.tune.library import Library, LibraryError

        try:  # no library, or not for this target: said before anything is written
            given = Library.load(args.library)
            given.check(spec)
        except LibraryError as exc:
            print(exc, file=sys.stderr)
            return 1
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    work = args.work / f"{name}-{stamp}"
    work.mkdir(parents=True)
    log = work / "commands.log"
    model_path = work / "model.onnx"
    onnx.save(proto, str(model_path))
    library = loo_library(name, spec, work / "library", given) if "c" in variants else None
    document = {"bench": "tuning-curves", "model": args.model, "date": stamp, "threads": args.threads,
                "checkpoints_min": args.checkpoints, "rounds": args.rounds, "calls": args.calls, "seed": args.seed,
                "stock_scheduler": args.stock_scheduler,
                "variants": {v: VARIANTS[v] for v in variants}, "work": str(work),
                "library": None if library is None else {"sources": [s.get("command") for s in library.sources],
                                                         "kernels": len(library.entries),
                                                         "cost_model": library.cost_model is not None}}
    if "c" in variants and library is None:
        print(f"no record library for this target without {name}: (c) is skipped (give one: --library DIR)",
              file=sys.stderr)
        variants.remove("c")
    until = ", ".join(f"{v} to {checkpoints(args, v)[-1]:g} min" for v in variants)
    print(f"{args.model}: {until}; log {log}", flush=True)
    curves: dict[str, list[Point]] = {}
    for v in [v for v in variants if v != "a"]:
        curves[v] = agoc_curve(args, v, work / "library" if v == "c" else None, work, log)
    if "a" in variants:
        template = next((work / v / "at-0m" for v in ("b", "c") if (work / v / "at-0m").is_dir()), None)
        if template is None:
            template = work / "template"
            run_logged([agoc_path(), "compile", args.model, "-o", str(template), "--no-library"], log)
        curves["a"] = stock_curve(args, spec, model_path, template, work, log)
    document["curves"] = {v: [asdict(p) for p in pts] for v, pts in sorted(curves.items())}
    document["summary"] = summarize({v: curves[v] for v in sorted(curves)})
    if {"b", "c"} <= set(curves):
        try:
            judged_together(document, args)
        except SystemExit as exc:  # nothing of (b) to judge against: the curves are written all the same
            document["together"] = {"skipped": str(exc)}
    return _write(document, args.out, f"tuning-curves-{name}-{stamp}")


def judged_together(document: dict, args) -> None:
    """``document["together"]``: its builds timed again side by side and the verdict (host/bench/together.py)."""
    from host.bench import together

    builds = together.contenders(document)
    rounds = max(args.rounds, together.JUDGE_ROUNDS)
    print(f"timing {', '.join(builds)} and onnxruntime side by side ({rounds} rounds × {args.calls} calls)", flush=True)
    judged = together.judge(builds, args.threads, rounds, args.calls, args.seed)
    verdicts = together.verdict(judged)
    document["together"] = {"rounds": rounds, "calls": args.calls, "builds": {n: str(d) for n, d in builds.items()},
                            "judged": judged, "verdict": verdicts}
    print(together.table(judged, verdicts), flush=True)


def _write(document: dict, out: Path, stem: str) -> int:
    """The document and its chart in ``out``; its summary printed."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    chart(document, path.with_suffix(".png"))
    for regime, s in document["summary"].items():
        print(f"{regime}: latency / onnxruntime's, last {s['final_relative']}, best {s['best_relative']}; "
              f"seconds to (a)'s last, (b)'s last, onnxruntime: {s['time_to']}")
    print(f"wrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
