"""`make library`: tune each zoo CNN for a target into ``build/library-dbs/<model>``, then package their
verified schedules as the target's record library (``library/<target key>/``), every command kept in its
``library.json`` (``python -m host.bench.library_zoo --target host --shape 56 --trials 96``)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

#: the zoo's CNNs: the kernels a phone model is made of (pointwise, depthwise, strided and grouped convs)
CNNS = ("mobilenet-v2", "mnasnet", "mobilenet-v3-small", "squeezenet-1.1", "shufflenet-v2")


def tune_command(model: str, shape: int, db: Path, args) -> list[str]:
    """The `agoc tune` words that tune one model into its database (no library: each database its own work)."""
    return ["agoc", "tune", f"zoo:{model}@1x3x{shape}x{shape}", "--db", str(db), "--target", args.target,
            "--trials", str(args.trials), "--per-iter", str(args.per_iter), "--partition", args.partition,
            "--population", str(args.population), "--seed", str(args.seed), "--no-library"]


def run_tune(words: list[str]) -> bool:
    """Run one `agoc tune` (this environment's); whether it succeeded."""
    import subprocess

    agoc = str(Path(sys.executable).with_name("agoc"))
    started = time.monotonic()
    done = subprocess.run([agoc, *words[1:]], check=False)
    print(f"  exit {done.returncode} after {time.monotonic() - started:.0f} s", flush=True)
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="host")
    parser.add_argument("--models", default=",".join(CNNS))
    parser.add_argument("--shape", type=int, default=56)
    parser.add_argument("--trials", type=int, default=96)
    parser.add_argument("--per-iter", type=int, default=4)
    parser.add_argument("--population", type=int, default=128, help="the search's population (agoc tune's)")
    parser.add_argument("--partition", default="stock", help="stock: one conv per kernel, as the minis are")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="local", help="where the candidates ran (kept in library.json)")
    parser.add_argument("--dbs", type=Path, default=Path("build/library-dbs"))
    parser.add_argument("--out", type=Path, default=None, help="default: library/<target key>/")
    args = parser.parse_args(argv)

    from toolchain.targets import resolve_target
    from toolchain.tune import library

    out = args.out or Path("library") / library.target_key(resolve_target(args.target).tvm_target)
    script = " ".join(shlex.quote(w) for w in ["python", "-m", "host.bench.library_zoo", *sys.argv[1:]])
    built = None
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        # (the first library's databases, stock at 56, are named by the model alone)
        plain = args.partition == "stock" and args.shape == 56
        db = args.dbs / (model if plain else f"{model}@{args.shape}-{args.partition}")
        words = tune_command(model, args.shape, db, args)
        print(f"== {model}: {shlex.join(words)}", flush=True)
        if not run_tune(words):
            continue
        # added model by model: a run cut short still leaves the library of the models done
        command = shlex.join(["agoc", "library", "build", str(db), "--out", str(out), "--device", args.device])
        built = library.build([db], out, device=args.device, command=command, script=script,
                              tuned_by={str(db): shlex.join(words)})
        size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
        print(f"{out}: {len(built.entries)} kernels, {size / 1024:.0f} KiB; per op kind: {built.counts()}", flush=True)
    if built is None:
        print("no model tuned: no library written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
