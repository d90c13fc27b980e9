"""`make bench-phases`: where a short tuning session's time goes — seconds per phase, trials, seconds per trial,
the session's estimated model latency — to bench/results/tuning-DATE.json and a PNG bar chart
(``python -m host.bench.tuning --model zoo:mobilenet-v2@1x3x56x56 --trials 64``)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))


def _time_seeds_and_pairings() -> None:
    """Count seeding and pairing as their phases (a session that times them itself is unchanged: a phase inside
    itself counts once)."""
    from toolchain.tune import compose, pairing, phases

    for name in ("seed_joined", "seed_from_siblings", "seed_from_library"):
        if hasattr(compose, name):
            setattr(compose, name, phases.timing("seed")(getattr(compose, name)))
    pairing.pair_joins = phases.timing("pair")(pairing.pair_joins)


class _Forgetful(dict):
    """A memo that keeps nothing."""

    def __setitem__(self, key, value) -> None:
        pass


def tune_once(model: str, trials: int, db: Path, before: bool = False) -> dict:
    """One tuning session of ``model`` (``agoc tune``'s defaults, this machine, no record library) into ``db``
    (new), in this process: its phases, trials and estimate."""
    from host.source import load_source
    from toolchain import frontend, onnx_import
    from toolchain.targets import resolve_target
    from toolchain.tune import TuneDB, TuneSettings, adapter, candidates, phases, tune_model

    adapter.REUSE_WORKERS = not before
    candidates._CHECKED = _Forgetful() if before else {}  # the stock behaviour checks every time
    _time_seeds_and_pairings()
    proto, _, overrides = load_source(model, [])
    spec = resolve_target("host", layout="NHWC", pad_channels=True, fast_math=True)
    mod = frontend.prepare(proto, spec, overrides)[0]
    phases.start()
    summary = tune_model(mod, onnx_import.model_hash(proto), spec, TuneSettings(trials=trials), db)
    tdb = TuneDB(db)
    if not tdb.phases:  # the session did not save its phases itself
        tdb.save_phases(phases.snapshot().to_json())
    return {**tdb.phases[-1], "estimate_ms": summary["estimate_ms"],
            "as": "stock: fresh workers per batch, every check run again" if before else "kept workers, "
            "each candidate checked once"}


def bar_chart(runs: dict[str, dict], path: Path) -> Path:
    """Seconds per phase, one bar group per run (Pillow, no plotting stack)."""
    from PIL import Image, ImageDraw

    from toolchain.tune.phases import PHASES

    row_h, label_w, bar_w, margin = 18, 150, 560, 12
    rows = [(f"{label}: {name}", run["seconds"].get(name, 0.0)) for label, run in runs.items() for name in PHASES]
    top = max((v for _, v in rows), default=1.0) or 1.0
    image = Image.new("RGB", (label_w + bar_w + 2 * margin + 60, margin * 2 + row_h * len(rows)), "white")
    draw = ImageDraw.Draw(image)
    for i, (label, value) in enumerate(rows):
        y = margin + i * row_h
        draw.text((margin, y + 3), label, fill=(30, 30, 30))
        draw.rectangle([label_w, y + 3, label_w + int(bar_w * value / top), y + row_h - 3], fill=(70, 110, 170))
        draw.text((label_w + int(bar_w * value / top) + 4, y + 3), f"{value:.0f} s", fill=(30, 30, 30))
    image.save(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="zoo:mobilenet-v2@1x3x56x56")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--compare", action="store_true",
                   help="first a session as before the cut: fresh builder/runner workers per batch, a candidate "
                   "checked again every time")
    args = p.parse_args(argv)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="agoc-bench-tuning-") as tmp:
        if args.compare:
            runs["before"] = tune_once(args.model, args.trials, Path(tmp) / "before", before=True)
        runs["after" if args.compare else "session"] = tune_once(args.model, args.trials, Path(tmp) / "after")
    stamp = datetime.datetime.now(datetime.UTC)
    document = {"suite": "tuning", "model": args.model, "trials": args.trials,
                "created": stamp.isoformat(timespec="seconds"), "threads": os.environ["TVM_NUM_THREADS"], "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"tuning-{stamp:%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(document, indent=1) + "\n")
    bar_chart(runs, out.with_suffix(".png"))
    for label, run in runs.items():
        shares = ", ".join(f"{k} {v:.0f} s" for k, v in run["seconds"].items() if v)
        print(f"{label}: {run['wall_s']:.0f} s, {run['trials']} trials, {run['s_per_trial']} s/trial "
              f"(estimate {run['estimate_ms']:.3f} ms): {shares}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
