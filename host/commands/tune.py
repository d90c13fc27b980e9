"""`agoc tune`: every kernel of a model searched on MetaSchedule and verified, into a tuning database."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from host import render
from host.commands.common import check_search, load_supported, partition_settings
from host.console import console, err_console
from host.options import (
    FastMathOpt,
    GeometryOpt,
    InputShapeOpt,
    KeepInsideOpt,
    LayoutOpt,
    NoPrepackOpt,
    PadChannelsOpt,
    PopulationOpt,
    PrecisionOpt,
    SchedulerOpt,
    ThresholdOpt,
    TransferOpt,
    WinogradOpt,
)
from toolchain.errors import UnsupportedModelError

AgainstOpt = Annotated[Optional[Path], typer.Option(
    "--against", help="With --status: also compare its kernels with those another database tuned for the same ops "
    "(e.g. the stock partition's): verified latency of each, and their geometric mean ratio.")]
DevicesOpt = Annotated[Optional[list[str]], typer.Option(
    "--device", help="Where candidates are measured: local (default), qemu, or a phone's serial; repeat for several.")]
BaseOpt = Annotated[Optional[Path], typer.Option(
    "--from", help="Start from another tuning database (same target): its records of the kernels this session "
    "tunes — the same PrimFuncs, whatever its partition called them — are copied in and count as their trials "
    "(e.g. AGO on top of a stock-partition session, or a retune after a model change).")]
WarmWeightsOpt = Annotated[bool, typer.Option(
    "--warm-weights", help="Time candidates with their weights in cache (repeated calls, as a micro-benchmark "
    "does) instead of flushed (as the model runs them: the default).")]
LibraryOpt = Annotated[Optional[Path], typer.Option(
    "--library", help="Start new kernels' searches from a record library's schedules of kernels like them "
    "(`agoc library build`; default: the one packaged for the target, when there is one).")]
NoLibraryOpt = Annotated[bool, typer.Option("--no-library", help="Use no record library.")]


#: the options of `agoc tune` declared here, once, so that its signature stays readable
TuneDbOpt = Annotated[Optional[Path], typer.Option(
    "--db", help="Tuning database directory (created; re-running resumes).")]
StatusOpt = Annotated[Optional[Path], typer.Option(
    "--status", help="Show a database's per-kernel progress and exit.")]
TrackerOpt = Annotated[Optional[str], typer.Option(
    help="HOST:PORT of a TVM RPC tracker (a farm; default: a private one).")]
KeyOpt = Annotated[Optional[str], typer.Option(
    help="Tracker key of the devices to use (default: their target, e.g. linux-arm64).")]
TrialsOpt = Annotated[Optional[int], typer.Option(
    help="Trial budget for the whole model, never exceeded (split over kernels by AGO weight) "
    "[default: 256 and at most 30 minutes; with --time: as many as the time is expected to fit].")]
TimeOpt = Annotated[Optional[str], typer.Option(
    "--time", metavar="DURATION", help="Wall-clock limit for the whole command, e.g. 90s, 10m, 1h30m: the search "
    "stops in time to verify what it found (the database is usable at once).")]
RoofOpt = Annotated[float, typer.Option(
    "--roof", metavar="SHARE", help="Search a kernel no further once it runs at this share of the compute roof (a "
    "register-blocked matmul timed where candidates run, at the session's start); its trials go to the others. "
    "0: every kernel to its budget.")]
SearchThreadsOpt = Annotated[int, typer.Option(
    help="Threads of the evolutionary search: 1 makes a session reproducible (the same seed, budget and "
    "library give the same candidates); 0: all cores (faster search, candidates depend on thread timing).")]


def tune(
    model: Annotated[Optional[str], typer.Argument(help="An ONNX file or zoo:NAME[@SHAPE].")] = None,
    db: TuneDbOpt = None,
    status_dir: StatusOpt = None,
    against: AgainstOpt = None,
    target: Annotated[Optional[str], typer.Option(
        "--target", "-t", help="Target preset (default: what the device runs).")] = None,
    device: DevicesOpt = None,
    rpc: Annotated[bool, typer.Option(
        "--rpc", help="Measure on this machine through the runner's RPC server too.")] = False,
    tracker: TrackerOpt = None,
    key: KeyOpt = None,
    cooldown: Annotated[float, typer.Option(help="Seconds to pause before each candidate (RPC measurements).")] = 0.0,
    max_spread: Annotated[float, typer.Option(
        help="Re-measure a candidate whose repeats spread more than this.")] = 0.15,
    input_shape: InputShapeOpt = None,
    trials: TrialsOpt = None,
    time_limit: TimeOpt = None,
    partition: Annotated[str, typer.Option(
        help="ago, or stock (TVM FuseOps kernels + default space: the Ansor-like baseline).")] = "ago",
    threshold: ThresholdOpt = None,
    keep_inside: KeepInsideOpt = None,
    geometry: GeometryOpt = None,
    no_intensive: Annotated[bool, typer.Option(
        "--no-intensive", help="Ablation AGO-NI: no intensive-fusion space.")] = False,
    no_reformer: Annotated[bool, typer.Option(
        "--no-reformer", help="Ablation AGO-NR: tune subgraphs directly, no split/join.")] = False,
    split_fraction: Annotated[float, typer.Option(
        help="Share of a subgraph's budget spent on its mini-subgraphs first.")] = 0.5,
    base: BaseOpt = None,
    library: LibraryOpt = None,
    no_library: NoLibraryOpt = False,
    per_iter: Annotated[int, typer.Option(help="Candidates per search batch.")] = 16,
    population: PopulationOpt = 128,
    scheduler: SchedulerOpt = "weight",
    warmup: Annotated[int, typer.Option(help="--scheduler latency: every kernel's first batch.")] = 8,
    no_prepack: NoPrepackOpt = False,
    warm_weights: WarmWeightsOpt = False,
    transfer: TransferOpt = 2,
    seed: Annotated[int, typer.Option(help="Search seed.")] = 0,
    search_threads: SearchThreadsOpt = 1,
    roof: RoofOpt = 0.85,
    layout: LayoutOpt = "NHWC",
    pad_channels: PadChannelsOpt = True,
    fast_math: FastMathOpt = True,
    winograd: WinogradOpt = True,
    precision: PrecisionOpt = "fp32",
):
    """Tune every kernel on MetaSchedule (AGO divide-and-conquer), keeping only verified schedules."""
    started = time.monotonic()
    from toolchain import tune as tuning

    if status_dir is not None:
        return _status(status_dir, against)
    if against is not None:
        raise UnsupportedModelError("--against compares two databases: give it with --status DIR")
    if model is None or db is None:
        raise UnsupportedModelError("give MODEL and --db DIR (or --status DIR to look at a database)")
    where = _Where.of(device or [], tracker, key, rpc, target)
    _check_precision(precision, where.target)
    parts, tile_cache, kept = partition_settings(partition, threshold, keep_inside, where.target, None, geometry)
    _check_databases(db, base)
    default_budget = trials is None and time_limit is None
    open_ended = trials is None and time_limit is not None  # the time is the budget (the trials a forecast)
    clock = _clock(db, where, DEFAULT_TIME if default_budget else time_limit, started)
    trials = DEFAULT_TRIALS if default_budget else trials if trials is not None else _default_trials(clock, db)
    _check(scheduler, transfer, population, per_iter, warmup, trials, split_fraction, max_spread, cooldown)
    if search_threads < 0:
        raise UnsupportedModelError(f"--search-threads {search_threads}: give 1 (reproducible), more, or 0 (all cores)")
    if not 0 <= roof <= 1:
        raise UnsupportedModelError(f"--roof {roof:g}: give a share of the roof between 0 (never stop) and 1")
    settings = tuning.TuneSettings(
        trials=trials, partition=parts, tile_cache=tile_cache,
        intensive=not no_intensive, reformer=not no_reformer, split_fraction=split_fraction, per_iter=per_iter,
        seed=seed, cold_weights=not warm_weights, scheduler=scheduler, warmup=warmup, prepack=not no_prepack,
        transfer=transfer, population=population, search_threads=search_threads, roof_share=roof,
    )
    proto, label, mod, spec = _legalized(model, input_shape or [], where, layout, pad_channels, fast_math, precision,
                                         winograd)
    _describe(label, db, where, settings, spec, kept)
    if default_budget:
        err_console.print(f"[dim]tuning with no budget given: {DEFAULT_TRIALS} trials or {DEFAULT_TIME}, whichever "
                          "ends first (--trials N, --time DURATION)[/dim]")
    records = _library(library, no_library, spec)
    summary, report = _run(mod, proto, spec, settings, db, base, where, max_spread, cooldown, clock,
                           library=records, open_ended=open_ended)
    console.print(render.tune_status_table(summary, db))
    if report is not None:
        console.print(render.rpc_report_table(report))
    if summary.get("phases") and summary["phases"][-1].get("disturbed"):
        err_console.print(f"[yellow]warning: {escape(render.disturbed_note(summary['phases'][-1]))}[/yellow]")
    console.print(f"[green]✓[/green] build with: {escape(_build_command(model, db, input_shape))}")


def _status(status_dir: Path, against: Optional[Path]) -> None:
    """`agoc tune --status DIR [--against OTHER]`."""
    from toolchain import tune as tuning

    console.print(render.tune_status_table(tuning.status(status_dir), status_dir))
    if against is not None:
        console.print(render.tune_compare_table(tuning.compare(status_dir, against), status_dir, against))


class _Where:
    """Where candidates are measured: devices (over RPC unless this machine alone), or a tracker's farm."""

    def __init__(self, devices: list, tracker: Optional[str], key: Optional[str], rpc: bool, target: str):
        self.devices, self.tracker, self.key, self.target = devices, tracker, key, target
        self.farm = tracker is not None and not devices
        self.local_only = not self.farm and all(d.kind == "local" for d in devices) and not rpc and len(devices) == 1

    @classmethod
    def of(cls, names: list[str], tracker: Optional[str], key: Optional[str], rpc: bool, target: Optional[str]):
        from host import rpc as rpc_mod
        from host.devices import get_device
        from toolchain.targets import PRESETS_BY_NAME

        devices = [get_device(name) for name in names]
        farm = tracker is not None and not devices
        if not devices and not farm:
            devices = [get_device("local")]
        if farm and key is None:
            raise UnsupportedModelError("with --tracker and no --device, say which devices with --key (e.g. "
                                        "linux-arm64)")
        if farm and target is None and key not in PRESETS_BY_NAME:
            raise UnsupportedModelError(f"key '{key}' is not a target name: say what the devices run with --target "
                                        f"({', '.join(PRESETS_BY_NAME)})")
        target = target or (rpc_mod.device_target(devices[0]) if devices else key)
        if devices and len({rpc_mod.device_target(d) for d in devices}) > 1:
            raise UnsupportedModelError("the devices of one tuning run must run the same target; tune them separately")
        return cls(devices, tracker, key, rpc, target)

    def describe(self) -> str:
        if self.local_only:
            return "this machine"
        if self.farm:
            return f"tracker {self.tracker} key {self.key}"
        return ", ".join(d.name for d in self.devices) + " over RPC"


def _check(scheduler: str, transfer: int, population: int, per_iter: int, warmup: int, trials: int,
           split_fraction: float, max_spread: float, cooldown: float) -> None:
    """The session's search knobs, checked before anything is written."""
    if min(per_iter, warmup, trials) < 1:
        raise UnsupportedModelError("--trials, --per-iter and --warmup must be at least 1")
    check_search(scheduler, transfer, population, per_iter)
    if not 0 <= split_fraction <= 1:
        raise UnsupportedModelError(f"--split-fraction must be between 0 and 1 (got {split_fraction})")
    if not (max_spread > 0 and cooldown >= 0):
        raise UnsupportedModelError("--max-spread must be above 0 and --cooldown 0 or more")


def _check_precision(precision: str, target: Optional[str]) -> None:
    """``--precision`` checked against where the candidates run, before the model is even loaded."""
    from toolchain.targets import PRESETS_BY_NAME, check_precision

    if target in PRESETS_BY_NAME:
        check_precision(precision, PRESETS_BY_NAME[target])


def _check_databases(db: Path, base: Optional[Path]) -> None:
    from toolchain import tune as tuning

    tuning.TuneDB(db).check_own()  # before anything is written into it (the RPC session's files included)
    if base is not None and tuning.TuneDB(base).session is None:
        raise tuning.TuningError(f"--from {base} is not a tuning database (no session.json); give one that "
                                 "`agoc tune` made")


def _legalized(model: str, shapes: list[str], where: _Where, layout: str, pad_channels: bool, fast_math: bool,
               precision: str = "fp32", winograd: bool = True):
    """(ModelProto, name, legalized module, target spec): the model as the devices will run it (in
    ``precision``: an fp16 session tunes the float16 kernels an fp16 build runs)."""
    from toolchain import frontend
    from toolchain.targets import resolve_target

    proto, label, _, overrides = load_supported(model, shapes)
    cores = None
    if where.devices and where.devices[0].kind != "local":
        cores = where.devices[0].describe().get("cores")
    spec = resolve_target(where.target, num_cores=cores, layout=layout, pad_channels=pad_channels, fast_math=fast_math,
                          precision=precision, winograd=winograd)
    return proto, label, frontend.prepare(proto, spec, overrides)[0], spec


def _describe(label: str, db: Path, where: _Where, s, spec, kept: str = "") -> None:
    """The resolved settings, echoed before the long work."""
    err_console.print(
        f"[dim]tuning {escape(label)} into {escape(str(db))} measured on {escape(where.describe())}: "
        f"{s.trials} trials, partition {s.partition.method}, intensive {'on' if s.intensive else 'off'}, "
        f"reformer {'on' if s.reformer else 'off'}, split {s.split_fraction:g}, {s.per_iter}/batch from a "
        f"population of {s.population}, scheduler {s.scheduler}"
        f"{f' (warm-up {s.warmup})' if s.scheduler == 'latency' else ''}, "
        f"{f'tensors of {s.partition.locality_unit // 1024} KiB or more kept inside ({kept}), ' if kept else ''}"
        f"weights {'cold' if s.cold_weights else 'warm'}"
        f"{', prepacked' if s.prepack else ', not prepacked'}"
        f"{f', seeds from up to {s.transfer} similar kernels' if s.transfer else ', every search from scratch'}"
        f"{'' if spec.pad_channels else ', channels not padded'}{', float16' if spec.precision == 'fp16' else ''}"
        f", target {escape(json.dumps(spec.tvm_target))}[/dim]",
        soft_wrap=True,
    )


def _clock(db: Path, where: "_Where", time_limit: Optional[str], started: float):
    """The session's clock: the rates the database measured before (else the prior for where candidates run),
    and ``--time``'s deadline counted from the command's start."""
    from toolchain import tune as tuning

    seconds = tuning.parse_duration(time_limit) if time_limit is not None else None
    saved = tuning.TuneDB(db).clock if (db / "session.json").is_file() else {}
    return tuning.Clock.prior("local" if where.local_only else "device", saved,
                              deadline=started + seconds if seconds is not None else None)


#: the budget when neither ``--trials`` nor ``--time`` is given: this many trials, or this long, whichever ends first
#: (docs/tuning.md, Budget: what that is on this host)
DEFAULT_TRIALS, DEFAULT_TIME = 256, "30m"


def _default_trials(clock, db: Path) -> int:
    """``--time`` without ``--trials``: the trials its search part is expected to fit (the deadline still
    decides: a faster search spends more in rounds, a slower one stops in time) on top of the records ``db``
    holds already (``--trials`` counts them: a resumed ``--time`` run spends its time)."""
    from toolchain import tune as tuning

    held = tuning.status(db)["trials"] if (db / "session.json").is_file() else 0
    return held + max(1, int(clock.trials_that_fit() * SEARCH_SHARE))


#: with ``--time`` alone, the share of the time planned as search trials (the rest: importing, verifying,
#: pairing; a session that runs faster spends what is left in rounds)
SEARCH_SHARE = 0.8


def _library(path: Optional[Path], none: bool, spec):
    """The record library the session starts from (``--library``, else the packaged one for the target), or
    None; one line says which."""
    from host.commands.library import describe
    from toolchain.tune import library

    if path is not None and none:
        raise UnsupportedModelError("--library and --no-library: give one of them")
    path = None if none else (path or library.default_for(spec))
    found = library.Library.load(path) if path is not None else None
    if found is not None:
        found.check(spec)
    err_console.print(f"[dim]{escape(describe(found))}[/dim]", soft_wrap=True)
    return found


def _run(mod, proto, spec, settings, db: Path, base: Optional[Path], where: _Where, max_spread: float,
         cooldown: float, clock=None, library=None, open_ended: bool = False) -> tuple[dict, Optional[dict]]:
    """The session, on this machine or through an RPC session (whose device report is kept in the database):
    (summary, device report or None)."""
    from host.commands.common import interruptible
    from host.progress import TuneProgress
    from toolchain import onnx_import
    from toolchain import tune as tuning

    view = TuneProgress(err_console, settings.trials, settings.unit, settings.scheduler)
    # the session in a worker thread, this one waiting: Ctrl-C or SIGTERM raised inside one of MetaSchedule's Python
    # callbacks (the cost model, the runner) came back from TVM as a RuntimeError the session survived
    if where.local_only:
        with view:
            return interruptible(tuning.tune_model, mod, onnx_import.model_hash(proto), spec, settings, db, view,
                                 base=base, clock=clock, library=library, open_ended=open_ended), None
    from host import rpc as rpc_mod
    from host.measure import Hygiene
    from toolchain.timing import Timing

    hygiene = Hygiene(Timing(max_spread=max_spread, cold=settings.cold_weights), cooldown_s=cooldown)
    db.mkdir(parents=True, exist_ok=True)
    session = rpc_mod.RpcSession(
        spec, where.devices, rpc_mod.parse_address(where.tracker) if where.tracker else None, where.key, hygiene,
        db / "measurements.jsonl", work_dir=db / "agents",
    )
    with view, session:
        summary = interruptible(tuning.tune_model, mod, onnx_import.model_hash(proto), spec, settings, db, view,
                                measure=session.measure(), base=base, clock=clock, library=library,
                                open_ended=open_ended)
        report = session.report()
    (db / "devices.json").write_text(json.dumps(report, indent=2))
    return summary, report


def _build_command(model: str, db: Path, shapes: Optional[list[str]]) -> str:
    """The command that builds what ``agoc tune`` tuned (the target and settings come from the database)."""
    import shlex

    words = ["agoc", "compile", model, "--db", str(db), *[w for s in shapes or [] for w in ("-s", s)], "-o", "OUT"]
    return " ".join(shlex.quote(w) for w in words)
