"""The benchmark commands: `bench-suite`, `bench-report`, `bench-rpc` and `bench-cuda` (the suites live in
host/bench/)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from host import render
from host.commands.common import check_search
from host.console import console, err_console
from host.options import FastMathOpt, LayoutOpt, NoPrepackOpt, PadChannelsOpt, PopulationOpt, SchedulerOpt, TransferOpt
from toolchain.errors import AgocError, InputShapeError, UnsupportedModelError

RESULTS = Path("bench/results")
SuiteArg = Annotated[str, typer.Argument(
    help="Suite: host (zoo, unscheduled), untuned (zoo CNNs as compile builds them untuned), e2e (zoo @112, "
         "tuned), pairs (AGO micro-benchmarks), tiny.")]
OrderSeedOpt = Annotated[Optional[int], typer.Option(
    "--order-seed", help="Seed of the per-round engine order alone (default: --seed): time a work dir again in "
    "another order without re-tuning.")]
CacheOpt = Annotated[str, typer.Option(
    "--cache", help="What each timed call finds in cache: cold (each engine's calls back to back, every core's "
    "caches overwritten before each: weights from memory, as on a phone), warm (back to back, nothing between) or "
    "shared (engines in turn, nothing between: the old protocol).")]
SuiteProxyOpt = Annotated[Optional[str], typer.Option(
    "--proxy", help="Also simulate this phone cache geometry (a76, a78, x1, a55, small-slc) for every TVM variant: "
    "DRAM bytes, L2 traffic, D1 misses, instructions beside latency (needs valgrind).")]
BundleOpt = Annotated[Optional[Path], typer.Option(
    "--bundle", help="Only compile: write the executables, inputs and reference outputs to this directory, to time "
    "on a GPU machine with --time-bundle (which needs only TVM's runtime).")]


def bench_suite(
    suite: SuiteArg = "host",
    models_: Annotated[Optional[str], typer.Option(
        "--models", help="Comma-separated zoo models (default: the suite's).")] = None,
    shapes: Annotated[Optional[str], typer.Option(help="Comma-separated spatial sizes to keep, e.g. 56,112.")] = None,
    variants: Annotated[Optional[str], typer.Option(help="Comma-separated variants (default: the suite's).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smallest shape per model, 3 rounds × 3 calls.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="Threads for every engine (default: all cores).")] = None,
    rounds: Annotated[Optional[int], typer.Option(help="Measurement rounds (default 10, quick 3).")] = None,
    calls: Annotated[Optional[int], typer.Option(
        help="Timed calls per engine per round (default 10, quick 3).")] = None,
    seed: Annotated[int, typer.Option(
        help="Seed of tuning and, unless --order-seed, of the per-round engine order.")] = 0,
    order_seed: OrderSeedOpt = None,
    trials: Annotated[Optional[int], typer.Option(
        help="Tuning budget per tuned variant and model (default: the suite's).")] = None,
    scheduler: SchedulerOpt = "weight",
    no_prepack: NoPrepackOpt = False,
    transfer: TransferOpt = 2,
    population: PopulationOpt = 128,
    layout: LayoutOpt = "NHWC",
    pad_channels: PadChannelsOpt = True,
    fast_math: FastMathOpt = True,
    cache: CacheOpt = "cold",
    out: Annotated[Path, typer.Option(help="Where the JSON and PNG go.")] = RESULTS,
    work_dir: Annotated[Path, typer.Option(help="Where the compiled artifacts go.")] = Path("build/bench"),
    proxy: SuiteProxyOpt = None,
):
    """Compile each model with each variant, verify it, time it against onnxruntime; write JSON + PNG."""
    from host import bench
    from host.progress import SuiteProgress
    from toolchain.targets import check_layout

    chosen, sizes = _suite_choice(suite, variants, shapes)
    check_search(scheduler, transfer, population)
    settings = bench.default_settings(quick, threads, seed, bench.SUITES[suite])
    settings = replace(settings, rounds=rounds or settings.rounds, calls_per_round=calls or settings.calls_per_round,
                       trials=settings.trials if trials is None else trials, proxy=proxy, scheduler=scheduler,
                       prepack=not no_prepack, transfer=transfer, layout=check_layout(layout),
                       pad_channels=pad_channels, fast_math=fast_math, population=population,
                       cache=_cache_regime(cache), order_seed=order_seed)
    if proxy is not None:  # fail before compiling anything
        from host.bench import proxy as proxy_mod

        proxy_mod.geometry(proxy)
        proxy_mod.find_valgrind()
    names = [m.strip() for m in models_.split(",")] if models_ else None
    cases = bench.suite_cases(bench.SUITES[suite], quick, names, sizes)
    if not cases:
        raise UnsupportedModelError("no (model, shape) pairs selected; check --models and --shapes")
    _describe_suite(suite, cases, chosen or bench.SUITES[suite].variants, settings, proxy)
    from host.commands.common import interruptible

    with SuiteProgress(err_console, len(cases), settings.rounds) as view:  # Ctrl-C stops it mid-tune too (tune.py)
        document = interruptible(bench.run_suite, bench.SUITES[suite], cases, settings, work_dir, chosen, view)
    json_path, png_path = bench.write_results(document, out)
    _suite_tables(document, proxy)
    console.print(f"[green]✓[/green] {escape(str(json_path))}  {escape(str(png_path))}  ({document['seconds']:.0f} s)")
    if any(r["status"] != "ok" or r["proxy_status"] not in (None, "ok") for r in bench.summary_rows(document)):
        raise typer.Exit(1)


def _suite_choice(suite: str, variants: Optional[str], shapes: Optional[str]):
    """The suite, variants (None: the suite's) and spatial sizes asked for, checked."""
    from host import bench

    if suite not in bench.SUITES:
        raise UnsupportedModelError(f"unknown suite '{suite}'; choose one of: {', '.join(bench.SUITES)}")
    chosen = [v.strip() for v in variants.split(",")] if variants else None
    for v in chosen or []:
        if v not in bench.VARIANTS_BY_NAME:
            raise UnsupportedModelError(f"unknown variant '{v}'; choose from: {', '.join(bench.VARIANTS_BY_NAME)}")
    try:
        sizes = [int(x) for x in shapes.split(",")] if shapes else None
    except ValueError:
        raise InputShapeError(f"--shapes '{shapes}': expected comma-separated integers like 56,112") from None
    return chosen, sizes


def _cache_regime(name: str) -> str:
    from host.bench.cache_regime import regime

    try:
        return regime(name).name
    except ValueError as exc:
        raise UnsupportedModelError(str(exc)) from None


def _describe_suite(suite: str, cases: list, variants, settings, proxy: Optional[str]) -> None:
    budget = (f", at least {settings.trials} tuning trials per tuned variant (each model: an equal budget for its "
              "partitions)")
    err_console.print(
        f"[dim]suite {suite}: {len(cases)} cases × {', '.join(variants)}; "
        f"{settings.threads} threads, {settings.rounds} rounds × {settings.calls_per_round} calls, "
        f"warm-up {settings.warmup}, gap {settings.gap_s}s, order seed {settings.order}"
        f"{budget if settings.trials else ''}"
        f"{f', phone-cache proxy {proxy}' if proxy else ''}[/dim]",
        soft_wrap=True,
    )


def _suite_tables(document: dict, proxy: Optional[str]) -> None:
    from host import bench

    console.print(render.bench_table(document))
    console.print(render.partition_bench_table(document))
    if proxy:
        console.print(render.proxy_bench_table(document))
    if len(document["results"]) > 1:
        console.print(render.geomean_table(bench.geomean_speedups([document]), 1))


def bench_report(
    results: Annotated[list[Path], typer.Argument(
        help="Results JSON written by `agoc bench-suite` (bench/results/*.json); several: their tables, then the "
        "geomean speed-ups over all their cases.")],
    png: Annotated[Optional[Path], typer.Option(
        "--png", help="Also redraw the (first) run's chart to this PNG.")] = None,
):
    """Print the tables of saved benchmark runs (latency, ratios, phone-cache proxy) and the geomean speed-ups over
    their cases; optionally redraw the chart."""
    from host import bench
    from host.chart import speedup_chart

    documents = [_result_document(path) for path in results]
    for document in documents:
        console.print(render.bench_table(document))
        if any("partition" in entry for entry in document["results"]):
            console.print(render.partition_bench_table(document))
        if document["context"].get("proxy"):
            console.print(render.proxy_bench_table(document))
    geomeans = bench.geomean_speedups(documents)
    if geomeans:
        console.print(render.geomean_table(geomeans, len(documents)))
    if png is not None:
        speedup_chart(documents[0], png)
        console.print(f"[green]✓[/green] {escape(str(png))}")


def _result_document(path: Path) -> dict:
    """A results JSON of `agoc bench-suite`, checked."""
    from host import bench

    if not path.is_file():
        raise AgocError(f"{path}: no such file (results are in bench/results/)")
    try:
        document = json.loads(path.read_text())
    except ValueError as exc:
        raise AgocError(f"{path}: not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("schema") != bench.SCHEMA:
        raise AgocError(f"{path}: not an agoc benchmark result (schema {bench.SCHEMA})")
    return document


def bench_rpc(
    model: Annotated[str, typer.Option(
        help="Model whose first conv/matmul kernel is tuned.")] = "zoo:pair-pw-dw@1x24x28x28",
    device: Annotated[str, typer.Option(
        help="Device measured through RPC (local: the overhead of the path itself).")] = "local",
    trials: Annotated[int, typer.Option(help="Trials per run (same for both paths).")] = 32,
    per_iter: Annotated[int, typer.Option(help="Candidates per search batch.")] = 8,
    repeats: Annotated[int, typer.Option(help="Runs per path, interleaved (the median is reported).")] = 2,
    out: Annotated[Path, typer.Option(help="Results directory.")] = RESULTS,
):
    """Tuning throughput, local runner vs RPC path, on the same kernel: trials per minute and the ratio."""
    from host.bench import rpc_cost

    def on_event(kind, **info):
        if kind == "start":
            how = {"local": "by the local runner", "rpc": "through RPC", "warm-up": "(warm-up)"}[info["path"]]
            err_console.print(f"[dim]tuning {trials} trials measured {how}...[/dim]")
        else:
            err_console.print(f"[dim]{info['path']}: {info['trials']} trials in {info['seconds']:.1f} s "
                              f"({info['trials_per_min']:.1f}/min, {info['failed']} failed)[/dim]")

    doc = rpc_cost.run(model, device, trials, per_iter, repeats, out, on_event)
    table = Table(title=f"tuning throughput: {doc['model']} kernel {doc['kernel']} on {doc['device']}",
                  title_justify="left")
    for col in ("path", "trials/min (median)", "best ms"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for path in ("local", "rpc"):
        runs = doc["runs"][path]
        if runs:
            best = min((r["best_ms"] for r in runs if r["best_ms"] is not None), default=None)
            table.add_row(path, f"{doc[f'{path}_trials_per_min']:.1f}", "" if best is None else f"{best:.4f}")
    console.print(table)
    if doc["rpc_overhead"]:
        console.print(f"RPC path: {doc['rpc_overhead']:.2f}× the time per trial of the local runner")
    console.print(f"[green]✓[/green] {escape(doc['path'])}")


def bench_cuda(
    graphs: Annotated[Optional[str], typer.Option(
        "--graphs", help="Comma-separated: bert-tiny, mobilenet-v2-block, layernorm, softmax, bias-gelu (default: "
        "all).")] = None,
    arch: Annotated[str, typer.Option("--arch", help="CUDA compute capability.")] = "sm_90",
    rounds: Annotated[int, typer.Option(help="Timing rounds on the GPU.")] = 20,
    number: Annotated[int, typer.Option(help="Calls per timing sample.")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of the inputs and of the per-round order.")] = 0,
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = RESULTS,
    bundle: BundleOpt = None,
    time_bundle: Annotated[Optional[Path], typer.Option(
        "--time-bundle", help="Time a bundle written by --bundle on this machine's GPU.")] = None,
):
    """Fused (APOLLO + FusionStitching) vs stock TVM CUDA training steps: kernel counts always, times on a GPU."""
    from host.bench import cuda as suite

    show = lambda line: console.print(escape(line), soft_wrap=True)  # noqa: E731
    if bundle is not None and time_bundle is not None:
        raise typer.BadParameter("--bundle writes a bundle and --time-bundle times one: give one of them")
    if time_bundle is not None:
        _, path = suite.time_bundle(time_bundle, rounds=rounds, number=number, seed=seed, out_dir=out, on_event=show)
        console.print(f"wrote {escape(str(path))}")
        return
    names = [g.strip() for g in graphs.split(",")] if graphs else list(suite.GRAPHS)
    unknown = sorted(set(names) - set(suite.GRAPHS))
    if unknown:
        raise typer.BadParameter(f"unknown graph(s) {', '.join(unknown)}; choose from {', '.join(suite.GRAPHS)}")
    if bundle is not None:
        suite.export_bundle(names, arch=arch, rounds=rounds, number=number, seed=seed, bundle_dir=bundle, on_event=show)
        console.print(f"wrote the bundle {escape(str(bundle))}; time it on a GPU machine with "
                      f"`agoc bench-cuda --time-bundle {escape(str(bundle))}` or `python -m host.bench.cuda time "
                      f"{escape(str(bundle))}`")
        return
    _, path = suite.run(names, arch=arch, rounds=rounds, number=number, seed=seed, out_dir=out, on_event=show)
    console.print(f"wrote {escape(str(path))}")
