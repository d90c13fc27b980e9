"""`agoc compile`: a model into an artifact directory (ARM/x86 through TVM, or CUDA source)."""

from __future__ import annotations

import collections
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from host import render
from host.commands.common import load_supported, partition_settings
from host.console import console, err_console
from host.options import (
    FastMathOpt,
    GeometryOpt,
    KeepInsideOpt,
    LayoutOpt,
    PadChannelsOpt,
    PrecisionOpt,
    ThresholdOpt,
    WinogradOpt,
)
from toolchain.errors import InputShapeError, UnsupportedModelError, first_line

JOINS_HELP = ("How an AGO subgraph the reformer splits is built: latency (the joined kernel unless it is slower "
              "than its minis, timed together; without --db, where nothing was timed, its minis), joined, minis, "
              "or with --db a cache geometry (a76, a78, x1, a55, small-slc: whichever moves fewer simulated DRAM bytes "
              "in that phone cache, judged under valgrind on this machine, or as the database keeps it judged: a "
              "compile never writes the database). Default: with --db, the target's cache geometry (--geometry) "
              "where the database keeps a current judgement for it, else latency.")


def compile(
    model: Annotated[str, typer.Argument(help="An ONNX file, or zoo:NAME[@SHAPE] (see `agoc models list`).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Artifact directory to write.")],
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Target preset (see `agoc targets`; "
                                                  "default: host, or with --db the target it was tuned for).")] = None,
    input_shape: Annotated[Optional[list[str]], typer.Option(
        "--input-shape", "-s", help="Fix an input's shape: NAME=1x3x224x224 (repeatable).")] = None,
    mcpu: Annotated[Optional[str], typer.Option(
        help="LLVM CPU name (default: the preset's; detected for host).")] = None,
    num_cores: Annotated[Optional[int], typer.Option(help="Cores the kernels may use (default: preset's).")] = None,
    layout: LayoutOpt = "NHWC",
    pad_channels: PadChannelsOpt = True,
    fast_math: FastMathOpt = True,
    winograd: WinogradOpt = True,
    precision: PrecisionOpt = "fp32",
    weight_prefetch: Annotated[bool, typer.Option(
        "--weight-prefetch/--no-weight-prefetch", help="Late convs and matmuls over pre-packed weights ask for the "
        "next task's weight panel while computing with this one, where toolchain/prefetch.py's rules say it pays "
        "(weights from memory: 10-15 % faster such kernels).")] = True,
    partition: Annotated[str, typer.Option(help="How ops are grouped into kernels: ago (AGO clustering) or stock "
                                           "(TVM FuseOps).")] = "ago",
    threshold: ThresholdOpt = None,
    keep_inside: KeepInsideOpt = None,
    geometry: GeometryOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the sample inputs stored for verification.")] = 0,
    dump_dir: Annotated[Optional[Path], typer.Option(help="Write the IR after each stage here.")] = None,
    db: Annotated[Optional[Path], typer.Option(
        "--db", help="Apply the verified schedules of this tuning database.")] = None,
    joins: Annotated[Optional[str], typer.Option("--joins", help=JOINS_HELP, show_default=False)] = None,
    arch: Annotated[str, typer.Option("--arch", help="CUDA compute capability (--target cuda only).")] = "sm_90",
    training: Annotated[bool, typer.Option(
        "--training", help="Compile forward + loss + backward (--target cuda only).")] = False,
    samples: Annotated[Optional[Path], typer.Option(
        "--inputs", help="Sample inputs to store, check and verify with: an .npz holding one array per model input "
        "(default: seeded random data, see README).")] = None,
    check: Annotated[bool, typer.Option(
        "--check/--no-check", help="Run the built library on the sample inputs and compare with onnxruntime before "
        "writing the artifact (ARM targets under qemu, when present); --no-check writes it unchecked.")] = True,
    other_target: Annotated[bool, typer.Option(
        "--other-target", help="With --db and --target: apply records tuned for another target than the one built "
        "for.")] = False,
    untuned: Annotated[str, typer.Option("--untuned", help="What a kernel without a tuned schedule gets: library "
                                         "(the record library's schedule of the nearest kernel like it, re-fitted; "
                                         "else a sample of the search space), sampled (a sample only), or plain "
                                         "(TVM's unscheduled loops: one core, no vectors).")] = "library",
    library: Annotated[Optional[Path], typer.Option(
        "--library", help="With --untuned library: the record library (`agoc library build`; default: the one "
        "packaged for the target, when there is one).")] = None,
    no_library: Annotated[bool, typer.Option(
        "--no-library", help="With --untuned library: use no record library (register blocks, else samples).")] = False,
):
    """Compile MODEL into an artifact directory: kernel library, manifest, sample inputs and expected outputs."""
    from toolchain.artifact import check_replaceable, check_writable
    from toolchain.tune.library import Library

    check_replaceable(output)  # before any long work: nothing of the user's is ever replaced
    check_writable(output)
    if target == "cuda":
        return _compile_cuda(model, output, input_shape or [], arch, training)
    rule = _join_rule(joins, db) if joins is not None else None
    _check_untuned(untuned, library, no_library)
    # a compile tiles nothing: no tile cache
    parts, _, kept = partition_settings(partition, threshold, keep_inside, target, mcpu, geometry)
    _check_request(seed, dump_dir)
    knobs = dict(partition=parts, layout=layout, pad_channels=pad_channels, fast_math=fast_math, winograd=winograd,
                 target=target,
                 mcpu=mcpu, num_cores=num_cores, kept=kept, precision=precision, weight_prefetch=weight_prefetch)
    if db is not None:
        knobs = {**_from_db(db, knobs, other_target), "kept": "as the database was tuned"}
    rule = rule or _default_joins(db, knobs["target"], knobs["mcpu"], geometry)
    spec, compiler, request = _request(model, input_shape or [], knobs, seed, dump_dir, db, rule, check, samples)
    if library is not None:  # before the long work: the model is loaded, nothing built
        Library.load(library).check(spec)
    request = replace(request, untuned=untuned, library=library, no_library=no_library)
    if rule.startswith("traffic:") and request.partition.method == "ago":  # judged for this build: db is only read
        request = replace(request, traffic=_judge(request.model, request.model_name, request.input_shapes, db,
                                                  rule[len("traffic:"):]))
    device = _check_device(spec, compiler) if check else None
    from host.commands.common import interruptible
    from toolchain.pipeline import compile_model

    with err_console.status("compiling") as status:
        artifact = interruptible(compile_model, request, compiler, output, on_stage=lambda s: status.update(s),
                                  device=device)
    _report(artifact, request.model_name, spec, rule)


def _check_untuned(untuned: str, library: Optional[Path], no_library: bool) -> None:
    from toolchain.tune.untuned import check_rule

    check_rule(untuned)
    if library is not None and no_library:
        raise UnsupportedModelError("--library and --no-library: give one of them")
    for flag, given in (("--library", library is not None), ("--no-library", no_library)):
        if given and untuned != "library":
            raise UnsupportedModelError(f"{flag} is read only with --untuned library (not {untuned}): drop one")


def _check_request(seed: int, dump_dir: Optional[Path]) -> None:
    if seed < 0:
        raise InputShapeError(f"--seed must be 0 or more (got {seed})")
    if dump_dir is not None and dump_dir.exists() and not dump_dir.is_dir():
        raise UnsupportedModelError(f"--dump-dir {dump_dir} is a file; give a directory for the IR dumps")


def _from_db(db: Path, knobs: dict, other_target: bool) -> dict:
    """compile --db: the kernels cut exactly as they were tuned (the database's settings), for its target."""
    from toolchain.tune import TuneDB, TuningError

    tuned = TuneDB(db)
    session = tuned.session
    if session is None:
        raise TuningError(f"{db} is not a tuning database (no session.json); create one with `agoc tune`")
    target, mcpu, num_cores = _tuned_target(db, session["target"], knobs["target"], knobs["mcpu"],
                                            knobs["num_cores"], other_target, tuned.precision)
    asked = knobs["precision"].lower()
    if asked != "fp32" and asked != tuned.precision:  # fp32 is the option's default: the database's then decides
        raise UnsupportedModelError(f"--precision {asked} with --db {db}: its kernels were tuned in "
                                    f"{tuned.precision}; tune them with `agoc tune --precision {asked}`, or drop "
                                    "--precision (the database's is used)")
    return {**knobs, "partition": tuned.settings.partition, "layout": tuned.activation_layout,
            "pad_channels": tuned.channel_padding, "fast_math": tuned.fast_math, "winograd": tuned.winograd,
            "precision": tuned.precision,
            "target": target, "mcpu": mcpu, "num_cores": num_cores}


def _request(model: str, shapes: list[str], knobs: dict, seed: int, dump_dir, db, rule: str, check: bool, samples):
    """(target spec, compiler, CompileRequest) for the resolved knobs; the model loaded and described."""
    from toolchain import onnx_import
    from toolchain.pipeline import CompileRequest, check_sizes
    from toolchain.targets import find_compiler, resolve_target

    spec = resolve_target("host" if knobs["target"] is None else knobs["target"], mcpu=knobs["mcpu"],
                          num_cores=knobs["num_cores"], layout=knobs["layout"], pad_channels=knobs["pad_channels"],
                          fast_math=knobs["fast_math"], precision=knobs.get("precision", "fp32"),
                          weight_prefetch=knobs.get("weight_prefetch", True), winograd=knobs.get("winograd", True))
    compiler = find_compiler(spec)
    proto, label, inputs, overrides = load_supported(model, shapes)
    check_sizes(inputs)
    for notice in onnx_import.defaulted_batch(proto, overrides):
        err_console.print(f"[yellow]{escape(notice)}[/yellow]", soft_wrap=True)
    parts = knobs["partition"]
    partition, threshold, keep_inside = parts.method, parts.td, parts.locality_unit
    kept = f", keeping tensors of {keep_inside // 1024} KiB or more inside ({knobs['kept']})"
    shown = ", ".join(f"{i.name}={'x'.join(map(str, i.shape))}" for i in inputs)
    err_console.print(
        f"[dim]compiling {escape(label)} ({escape(shown)}) for {spec.preset} {escape(json.dumps(spec.tvm_target))} "
        f"with {escape(compiler.version)}, partition={partition}, layout {spec.layout}"
        f"{'' if spec.pad_channels else ', channels not padded'}{'' if spec.fast_math else ', exact math'}"
        f"{'' if spec.winograd else ', direct 3×3 convs'}"
        f"{', float16' if spec.precision == 'fp16' else ''}{'' if spec.weight_prefetch else ', no weight prefetch'}"
        f"{f' (Td {threshold:g})' if partition == 'ago' else ''}"
        f"{kept if partition == 'ago' and keep_inside else ''}"
        "[/dim]",
        soft_wrap=True,
    )
    request = CompileRequest(proto, label, spec, overrides, parts, seed, dump_dir, db, joins=rule, check=check,
                             samples=_load_samples(samples) if samples else None)
    return spec, compiler, request


def _report(artifact, label: str, spec, rule: str) -> None:
    """The one line of a compiled artifact, and what was built differently from the plan."""
    m = artifact.manifest
    checked = m.check or {}
    console.print(
        f"[green]✓[/green] {escape(label)} → {escape(str(artifact.root))}  "
        f"({len(m.kernels)} kernels"
        + (f", {m.tuning['applied']} tuned" if m.tuning else "")
        + f", {m.compile_seconds:.1f} s, target {spec.preset}"
        + (f", checked on {escape(checked['device'])}: max error {checked['max_abs']:.2g})"
           if checked.get("status") == "passed" else ")")
    )
    if checked.get("status") != "passed":
        err_console.print(f"[yellow]not checked against onnxruntime:[/yellow] {escape(checked.get('reason', '?'))}",
                          soft_wrap=True)
    _report_untuned(m.untuned)
    info = m.partition_info or {}
    padded = collections.Counter(f"{p['channels']} → {p['padded']}" for p in info.get("padded") or [])
    if padded:
        console.print(f"  {sum(padded.values())} conv/matmul op(s) compute padded output channels "
                      f"({', '.join(f'{k} ×{n}' if n > 1 else k for k, n in padded.items())}; whole vectors; "
                      f"manifest partition_info.padded)")
    unfused = info.get("unfused") or []
    if unfused and m.tuning is None:  # compiled without a database (toolchain.tune.untuned.split_untuned)
        console.print(f"  {len(unfused)} AGO subgraph(s) built as their mini-subgraphs: without a tuning database a "
                      "join gets a random sample of its space, its minis the record library's schedules (manifest "
                      "partition_info.unfused; `agoc tune` measures the joins)")
    elif unfused:
        why = ("the model moved no fewer simulated DRAM bytes with it joined" if rule.startswith("traffic:")
               else "the joined kernel measured slower than the minis together" if rule == "latency"
               else f"--joins {rule}")
        console.print(f"  {len(unfused)} AGO subgraph(s) built as their mini-subgraphs: {why}, or it has no "
                      f"verified schedule (manifest partition_info.unfused)")


#: how the report names each source of an untuned kernel's schedule (toolchain.tune.untuned.RULES)
UNTUNED_WORDS = {"library": "from the record library", "block": "register-blocked", "rows": "row-scheduled",
                 "sampled": "sampled from the search space",
                 "plain": "plain (unscheduled)"}


def _report_untuned(record: dict | None) -> None:
    """One line on the kernels built without a tuned schedule; a warning when their schedules were dropped."""
    counts = (record or {}).get("counts") or {}
    if counts:
        parts = ", ".join(f"{n} {UNTUNED_WORDS.get(k, k)}" for k, n in counts.items())
        console.print(f"  untuned kernels: {parts} (manifest untuned; `agoc tune` measures better ones)")
    for step in (record or {}).get("fell_back") or []:
        then = "sampled instead" if step["from"] == "library" else "built plain"
        err_console.print(f"[yellow]the untuned kernels' {step['from']} schedules failed the self-check and were "
                          f"{then}:[/yellow] {escape(step['why'])}", soft_wrap=True)


def _compile_cuda(model: str, output: Path, shapes: list[str], arch: str, training: bool) -> None:
    """--target cuda: APOLLO/FusionStitching fusion → CUDA source (+ PTX with nvcc); see toolchain/cuda."""
    from toolchain.cuda import codegen
    from toolchain.cuda import compile as cuda_compile
    from toolchain.cuda import training as cuda_training
    from toolchain.pipeline import package_versions

    started = time.perf_counter()
    target_spec = codegen.cuda_target(arch)
    builtin = None
    if model.startswith("zoo:") and training:
        name = model[4:].split("@")[0]
        builtin = {"bert-tiny": "bert-tiny", "mobilenet-v2": "mobilenet-v2-block"}.get(name, name)
        if builtin not in cuda_training.GRAPHS:
            builtin = None
    if builtin is None:
        proto, label, inputs, _ = load_supported(model, shapes)
    else:
        proto, label, inputs = None, builtin, []
    graph = cuda_compile.graph_from_source(proto, label, inputs, training, builtin)
    err_console.print(f"[dim]compiling {escape(graph.description)} for cuda {escape(arch)}[/dim]", soft_wrap=True)
    with err_console.status("compiling") as status:
        compiled = cuda_compile.compile_graph(graph, target_spec, on_stage=lambda s: status.update(s))
        manifest = cuda_compile.write_artifact(graph, target_spec, compiled, output, started=started,
                                               versions=package_versions())
    counts = manifest["kernel_counts"]
    ptx = manifest["nvcc"].get("ptx") or manifest["nvcc"].get("skipped", "no PTX")
    console.print(
        f"[green]✓[/green] {escape(graph.name)} → {escape(str(output))}  "
        f"({counts['fused']['launches_per_step']} kernel "
        f"launches per step fused vs {counts['stock']['launches_per_step']} stock TVM, "
        f"{counts['fused']['stitched_groups']} stitched groups; {escape(str(ptx))})"
    )


def _load_samples(path: Path) -> dict:
    """``--inputs FILE.npz`` as name → array (no pickled objects)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as exc:  # a user's file: whatever numpy cannot read in it is the file's problem
        raise InputShapeError(f"--inputs {path} is not a readable .npz of arrays ({first_line(exc)}); write it "
                              "with numpy.savez(path, input_name=array, ...)") from None


def _check_device(spec, compiler):
    """Where compile's self-check runs: a host target with the host runner in a process of its own (in-process
    when it is not built); others on qemu, when it and the linux-arm64 runner are here and the library is
    glibc-linked (not the NDK's bionic); None otherwise (recorded as unchecked)."""
    import shutil

    from toolchain.errors import DeviceError

    if spec.runs_on_host:  # the host runner when it is built (a fresh process, as bench runs it), else in-process
        from host.devices import LocalRunner, runner_build

        try:
            runner_build("host")
        except DeviceError:
            return None
        return LocalRunner()
    if compiler.kind == "ndk" or not shutil.which("qemu-aarch64"):
        return None
    if not spec.tvm_target.get("mtriple", "").startswith("aarch64"):
        return None
    from host.devices import qemu_device, runner_build

    try:
        runner_build("linux-arm64")
    except DeviceError:
        return None
    return qemu_device()


def _tuned_target(db: Path, tuned: dict, target: Optional[str], mcpu: Optional[str], num_cores: Optional[int],
                  other: bool, precision: str = "fp32") -> tuple[str, Optional[str], Optional[int]]:
    """compile --db: the target the database was tuned for (preset, mcpu, cores; in ``precision``), or the one asked
    for when it is the same target; another target only with ``other`` (--other-target)."""
    from toolchain.errors import TargetError
    from toolchain.targets import preset_of, resolve_target

    preset = preset_of(tuned)
    if target is None:
        err_console.print(f"[dim]building for {preset} (mcpu {escape(str(tuned.get('mcpu')))}): the target "
                          f"{escape(str(db))} was tuned for[/dim]", soft_wrap=True)
        return preset, mcpu or tuned.get("mcpu"), num_cores or tuned.get("num-cores")
    asked = resolve_target(target, mcpu=mcpu, num_cores=num_cores, precision=precision).tvm_target
    keys = ("mtriple", "mcpu", "mattr")
    if any(asked.get(k) != tuned.get(k) for k in keys) and not other:
        raise TargetError(
            f"{db} was tuned for {preset} ({', '.join(f'{k} {tuned.get(k)}' for k in keys if tuned.get(k))}), not "
            f"for --target {target} ({', '.join(f'{k} {asked.get(k)}' for k in keys if asked.get(k))}): drop "
            "--target to build what was tuned, or add --other-target to apply its records anyway")
    return target, mcpu, num_cores


def _default_joins(db: Optional[Path], target: Optional[str], mcpu: Optional[str], geometry: Optional[str]) -> str:
    """``--joins`` unset: the target's cache geometry where the database keeps a current judgement of its joins in
    it (``python -m host.bench.judge``), else latency."""
    from host.bench import judge
    from toolchain import geometry as geometries
    from toolchain.tune.pairing import TRAFFIC

    geo, why = geometries.of_preset(target, mcpu, geometry)
    if db is None or geo is None or not (judge.current_judgement(db, geo.name) or {}).get("joins"):
        return "latency"
    err_console.print(f"[dim]joins as {escape(str(db))} keeps them judged in the {geo.name} cache geometry ({why}; "
                      "--joins latency builds by measured time)[/dim]", soft_wrap=True)
    return TRAFFIC + geo.name


def _join_rule(joins: str, db: Optional[Path]) -> str:
    """``compile --joins`` as a rule of pairing.JOIN_RULES; a geometry name becomes ``traffic:NAME``."""
    from host.bench import proxy

    if joins not in ("latency", "joined", "minis") and db is None:
        raise UnsupportedModelError(f"--joins {joins} judges a tuned join against its tuned minis: it needs --db "
                                    "(without one: latency, joined or minis)")
    from toolchain.tune.pairing import TRAFFIC, rule_for

    rule, names = rule_for(joins), [g.name for g in proxy.GEOMETRIES]
    if rule.startswith(TRAFFIC) and joins not in names:
        raise UnsupportedModelError(f"unknown --joins '{joins}': latency, joined, minis, or a cache geometry "
                                    f"({', '.join(names)})")
    return rule


def _judge(proto, label: str, overrides: dict, db: Path, geometry: str) -> dict:
    """The joins of ``db`` judged in ``geometry`` (host/bench/judge.py): the database's judgement when current,
    else one made for this compile and not kept (a compile only reads a database); with progress and a table."""
    from host.bench import judge

    pending = judge.pending_joins(db, geometry)
    if pending:
        err_console.print(f"[dim]judging {len(pending)} join(s) by the model's simulated DRAM traffic in {geometry}'s "
                          f"caches: {len(pending) + 1} builds, one join flipped in each, each checked and run under "
                          "valgrind (about a minute each for a mobile CNN at 112; for this compile: `python -m "
                          "host.bench.judge --db DIR --geometry GEOMETRY MODEL` keeps them in the database)[/dim]",
                          soft_wrap=True)
        with err_console.status("judging joins") as status:
            record = judge.judge_joins(proto, label, overrides, db, geometry, on_stage=lambda s: status.update(s))
    else:
        record = judge.current_judgement(db, geometry) or {}
    if record.get("joins"):  # a database without joins (tuned without the reformer): nothing to judge
        console.print(render.traffic_table(record, pending))
    return record
