"""The `agoc` command line: compile, verify, inspect, models, targets.

Every user-caused failure is an :class:`toolchain.errors.AgocError`, printed
once as one red line with its fix, exit code 1; ``--debug`` shows the
traceback instead. Anything else is a bug: exit code 2.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional

# TVM's CPU thread pool reads this once; unset, it uses half the hardware threads
# (1 on a 2-core machine), silently halving every measurement (design §3).
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from host import render  # noqa: E402
from toolchain import __version__  # noqa: E402
from toolchain.errors import AgocError, InputShapeError, UnsupportedModelError, first_line  # noqa: E402

# exit codes: 0 success, 1 anything the user can fix (click's usage errors included: click says 2), 2 our
# bugs, 130 Ctrl-C, 143 SIGTERM
# (typer 0.29 carries its own click; its UsageError is the base of every bad-parameter error)
next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError").exit_code = 1

app = typer.Typer(
    name="agoc",
    help="Compile ONNX models into fused, tuned kernels for ARM64 phones (and check them against onnxruntime).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="The built-in model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")
tracker_app = typer.Typer(
    help="A farm of devices: TVM's RPC tracker, and devices serving it (see README, 'RPC tuning').",
    no_args_is_help=True,
)
app.add_typer(tracker_app, name="tracker")

console = Console()
err_console = Console(stderr=True)
_state = {"debug": False}


def _guard(func):
    """Render AgocError as one line (exit 1), other exceptions as an internal error (exit 2)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except AgocError as exc:
            if _state["debug"]:
                raise
            err_console.print(f"[bold red]error:[/bold red] {escape(_one_line(str(exc)))}", soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt as exc:
            _stop(getattr(exc, "exit_code", 130))
        except (OSError, MemoryError) as exc:  # the machine's state, not agoc's logic: a path, a permission, space
            if _state["debug"]:
                raise
            err_console.print(f"[bold red]error:[/bold red] {escape(_one_line(_os_message(exc)))}", soft_wrap=True)
            raise typer.Exit(1) from None
        except Exception as exc:
            if _state["debug"]:
                raise
            err_console.print(
                f"[bold red]internal error:[/bold red] {escape(type(exc).__name__)}: {escape(str(exc)[:500])}\n"
                "rerun with --debug for the traceback and report it",
                soft_wrap=True,
            )
            raise typer.Exit(2) from None

    return wrapper


def _one_line(message: str) -> str:
    """An error message as the one line it must be: control characters (a newline or tab in a file or tensor
    name the message quotes) shown escaped, as Python writes them in a string."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message.strip())


def _os_message(exc: BaseException) -> str:
    """One line for an operating-system error, naming the path and what to do."""
    if isinstance(exc, MemoryError):
        return "out of memory: the model or its input shapes are too large for this machine; give smaller " \
               "shapes with --input-shape"
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{exc.strerror or exc}{where}: check the path, its permissions and the free disk space"


def _check_output_file(path: Optional[Path], flag: str) -> None:
    """Refuse now, before long work, an output file path that cannot be written (a directory, a missing or
    read-only parent, one where no file can be made, such as /proc)."""
    import tempfile

    if path is None:
        return
    if path.is_dir():
        raise UnsupportedModelError(f"{flag} {path} is a directory; give a file name, e.g. {flag} "
                                    f"{path / 'graph'}{path.suffix or ''}")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if not parent.is_dir():
            raise NotADirectoryError(20, "missing, or not a directory")
        fd, probe = tempfile.mkstemp(prefix=".agoc-probe.", dir=parent)  # root passes os.access everywhere
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UnsupportedModelError(f"{flag} {path}: cannot write in {parent} ({exc.strerror or exc}); give a path "
                                    "in a directory you can write") from None


def _write_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: into a temporary file beside it, renamed over it when complete (a full
    disk or an interrupt leaves no half-written file, and an existing one as it was)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""

    exit_code = 143


def _on_sigterm(signum, frame):
    raise Terminated()


def _stop(code: int) -> None:
    """End the process now, on Ctrl-C (130) or SIGTERM (143): staging directories removed, nothing else
    touched; a hard exit, so a build running in a worker thread does not hold it up."""
    from toolchain.artifact import discard_staging

    discard_staging()
    err_console.print("[yellow]interrupted[/yellow]" if code == 130 else "[yellow]terminated[/yellow]")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _interruptible(func, *args, **kwargs):
    """``func(*args, **kwargs)`` in a worker thread, this thread waiting: a long TVM call (which does not
    return to Python for tens of seconds) then cannot delay Ctrl-C or SIGTERM beyond a fraction of a second."""
    import threading

    result: dict = {}

    def work():
        try:
            result["value"] = func(*args, **kwargs)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            result["error"] = exc

    worker = threading.Thread(target=work, name="agoc-work", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _version(value: bool):
    if value:
        from toolchain.pipeline import package_versions

        console.print(" ".join(f"{k} {v}" for k, v in package_versions().items()))
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print versions."),
):
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")


def _load_source(model: str, shapes: list[str]):
    """MODEL.onnx or zoo:NAME[@SHAPE] → (ModelProto, name, input-shape overrides)."""
    from toolchain import onnx_import

    if model.startswith("zoo:"):
        import models

        try:
            name, shape = models.parse_zoo_ref(model)
        except (models.UnknownModelError, ValueError) as exc:
            raise UnsupportedModelError(str(exc)) from None
        try:
            proto = models.build(name, shape)
        except MemoryError:
            raise UnsupportedModelError(f"zoo:{name} at {'x'.join(map(str, shape or ()))} has weights too large for "
                                        f"this machine's memory; give a smaller shape, e.g. zoo:{name}@"
                                        f"{'x'.join(map(str, models.registry.get(name).default_shape))}") from None
        label = name if shape is None else f"{name}@{'x'.join(map(str, shape))}"
    else:
        proto = onnx_import.load_model(model)
        label = Path(model).stem
    overrides = onnx_import.parse_input_shapes(shapes, onnx_import.declared_inputs(proto))
    return proto, label, overrides


def _compile_cuda(model: str, output: Path, shapes: list[str], arch: str, training: bool) -> None:
    """--target cuda: APOLLO/FusionStitching fusion → CUDA source (+ PTX with nvcc); see toolchain/cuda."""
    from toolchain import onnx_import
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
        proto, label, overrides = _load_source(model, shapes)
        onnx_import.check_supported(proto)
        inputs = onnx_import.resolve_inputs(proto, overrides)
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
        f"[green]✓[/green] {escape(graph.name)} → {escape(str(output))}  ({counts['fused']['launches_per_step']} kernel "
        f"launches per step fused vs {counts['stock']['launches_per_step']} stock TVM, "
        f"{counts['fused']['stitched_groups']} stitched groups; {escape(str(ptx))})"
    )


def _keep_inside_option():
    return typer.Option(0, "--keep-inside", metavar="KIB", help="AGO, for a phone's cache: a conv feeding a "
                        "depthwise / pointwise conv or matmul through a tensor of at least KIB KiB stays in one "
                        "subgraph with it, and (tune) every intensive tile's slice of its intermediate is at most "
                        "KIB KiB, so that it stays in cache (e.g. 256: half a Cortex-A76's L2). 0: off.")


def _keep_inside(kib: int) -> int:
    if kib < 0:
        raise UnsupportedModelError("--keep-inside must be 0 (off) or a size in KiB")
    return kib * 1024


def _layout_option():
    return typer.Option("NHWC", "--layout", help="Activation layout of the kernels: NHWC (channels innermost "
                        "and vectorised, the default) or NCHW (ONNX's own).")


def _fast_math_option():
    return typer.Option(True, "--fast-math/--exact-math",
                        help="exp, erf, tanh, sigmoid and softmax as vectorised polynomials (≤ 3e-7 from the exact "
                        "functions; 4-80x faster than one libm call per element, toolchain/fastmath.py).")


def _pad_channels_option():
    return typer.Option(True, "--pad-channels/--no-pad-channels",
                        help="Convs and matmuls with 512 or more output channels that 16 does not divide (e.g. a "
                        "1000-class classifier conv) and 16 or more rows compute up to 5 % more zero channels, "
                        "sliced off, so that their kernels vectorise in whole registers (toolchain/padding.py).")


@app.command()
@_guard
def compile(
    model: str = typer.Argument(..., help="An ONNX file, or zoo:NAME[@SHAPE] (see `agoc models list`)."),
    output: Path = typer.Option(..., "-o", "--output", help="Artifact directory to write."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target preset (see `agoc targets`; "
                                         "default: host, or with --db the target it was tuned for)."),
    input_shape: Optional[list[str]] = typer.Option(
        None, "--input-shape", "-s", help="Fix an input's shape: NAME=1x3x224x224 (repeatable)."
    ),
    mcpu: Optional[str] = typer.Option(None, help="LLVM CPU name (default: the preset's; detected for host)."),
    num_cores: Optional[int] = typer.Option(None, help="Cores the kernels may use (default: preset's)."),
    layout: str = _layout_option(),
    pad_channels: bool = _pad_channels_option(),
    fast_math: bool = _fast_math_option(),
    partition: str = typer.Option("ago", help="How ops are grouped into kernels: ago (AGO clustering) or stock (TVM FuseOps)."),
    threshold: Optional[float] = typer.Option(None, help="AGO's subgraph weight threshold Td (default: shipped with the weight fit)."),
    keep_inside: int = _keep_inside_option(),
    seed: int = typer.Option(0, help="Seed of the sample inputs stored for verification."),
    dump_dir: Optional[Path] = typer.Option(None, help="Write the IR after each stage here."),
    db: Optional[Path] = typer.Option(None, "--db", help="Apply the verified schedules of this tuning database."),
    joins: str = typer.Option("latency", "--joins", help="With --db: how a subgraph the reformer split is built: "
                              "latency (the joined kernel unless it is slower than its minis, timed together), "
                              "joined, minis, or a cache geometry (a76, a55, small-slc: whichever moves fewer "
                              "simulated DRAM bytes in that phone cache, judged under valgrind on this machine "
                              "and kept in the database)."),
    arch: str = typer.Option("sm_90", "--arch", help="CUDA compute capability (--target cuda only)."),
    training: bool = typer.Option(False, "--training", help="Compile forward + loss + backward (--target cuda only)."),
    samples: Optional[Path] = typer.Option(None, "--inputs", help="Sample inputs to store, check and verify "
                                           "with: an .npz holding one array per model input (default: seeded "
                                           "random data, see README)."),
    check: bool = typer.Option(True, "--check/--no-check", help="Run the built library on the sample inputs and "
                               "compare with onnxruntime before writing the artifact (ARM targets under qemu, when "
                               "present); --no-check writes it unchecked."),
    other_target: bool = typer.Option(False, "--other-target", help="With --db and --target: apply records "
                                      "tuned for another target than the one built for."),
):
    """Compile MODEL into an artifact directory: kernel library, manifest, sample inputs and expected outputs."""
    from toolchain.artifact import check_replaceable, check_writable

    check_replaceable(output)  # before any long work: nothing of the user's is ever replaced
    check_writable(output)
    if target == "cuda":
        return _compile_cuda(model, output, input_shape or [], arch, training)
    from toolchain.pipeline import CompileRequest, check_sizes, compile_model
    from toolchain.targets import find_compiler, resolve_target

    from toolchain import onnx_import

    from toolchain.partition import DEFAULT_THRESHOLD

    rule = _join_rule(joins, db)
    if partition not in ("ago", "stock"):
        raise UnsupportedModelError(f"unknown --partition '{partition}'; choose ago or stock")
    if seed < 0:
        raise InputShapeError(f"--seed must be 0 or more (got {seed})")
    if dump_dir is not None and dump_dir.exists() and not dump_dir.is_dir():
        raise UnsupportedModelError(f"--dump-dir {dump_dir} is a file; give a directory for the IR dumps")
    if threshold is not None and not threshold > 0:  # NaN included
        raise UnsupportedModelError(f"--threshold must be a positive weight (got {threshold}); the default is "
                                    f"{DEFAULT_THRESHOLD:g}")
    if db is not None:  # kernels must be cut exactly as they were tuned
        from toolchain.tune import TuneDB, TuningError

        session = TuneDB(db).session
        if session is None:
            raise TuningError(f"{db} is not a tuning database (no session.json); create one with `agoc tune`")
        partition, threshold = session["settings"]["partition"], session["settings"]["threshold"]
        keep_inside = session["settings"].get("keep_inside", 0)
        layout = TuneDB(db).activation_layout
        pad_channels = TuneDB(db).channel_padding
        fast_math = TuneDB(db).fast_math
        target, mcpu, num_cores = _tuned_target(db, session["target"], target, mcpu, num_cores, other_target)
    else:
        keep_inside = _keep_inside(keep_inside)
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    spec = resolve_target("host" if target is None else target, mcpu=mcpu, num_cores=num_cores, layout=layout,
                          pad_channels=pad_channels, fast_math=fast_math)
    compiler = find_compiler(spec)
    proto, label, overrides = _load_source(model, input_shape or [])
    onnx_import.check_supported(proto)
    inputs = onnx_import.resolve_inputs(proto, overrides)
    check_sizes(inputs)
    for notice in onnx_import.defaulted_batch(proto, overrides):
        err_console.print(f"[yellow]{escape(notice)}[/yellow]", soft_wrap=True)
    shapes = ", ".join(f"{i.name}={'x'.join(map(str, i.shape))}" for i in inputs)
    err_console.print(
        f"[dim]compiling {escape(label)} ({escape(shapes)}) for {spec.preset} {escape(json.dumps(spec.tvm_target))} "
        f"with {escape(compiler.version)}, partition={partition}, layout {spec.layout}"
        f"{'' if spec.pad_channels else ', channels not padded'}{'' if spec.fast_math else ', exact math'}"
        f"{f' (Td {threshold:g})' if partition == 'ago' else ''}"
        f"{f', keeping tensors of {keep_inside // 1024} KiB or more inside' if partition == 'ago' and keep_inside else ''}"
        "[/dim]",
        soft_wrap=True,
    )
    if rule.startswith("traffic:") and partition == "ago":
        _judge(proto, label, overrides, db, joins)
    request = CompileRequest(proto, label, spec, overrides, partition, threshold, seed, dump_dir, db,
                             keep_inside=keep_inside, joins=rule, check=check,
                             samples=_load_samples(samples) if samples else None)
    device = _check_device(spec, compiler) if check else None
    with err_console.status("compiling") as status:
        artifact = _interruptible(compile_model, request, compiler, output, on_stage=lambda s: status.update(s),
                                  device=device)
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
    padded = collections.Counter(f"{p['channels']} → {p['padded']}" for p in (m.partition_info or {}).get("padded") or [])
    if padded:
        console.print(f"  {sum(padded.values())} conv/matmul op(s) compute padded output channels "
                      f"({', '.join(f'{k} ×{n}' if n > 1 else k for k, n in padded.items())}; whole vectors; "
                      f"manifest partition_info.padded)")
    unfused = (m.partition_info or {}).get("unfused") or []
    if unfused:
        why = ("the model moved no fewer simulated DRAM bytes with it joined" if rule.startswith("traffic:")
               else "the joined kernel measured slower than the minis together" if rule == "latency" else f"--joins {rule}")
        console.print(f"  {len(unfused)} AGO subgraph(s) built as their mini-subgraphs: {why}, or it has no "
                      f"verified schedule (manifest partition_info.unfused)")


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
    """Where compile's self-check runs a target this machine does not: qemu, when it and the linux-arm64
    runner are here and the library is glibc-linked (not the NDK's bionic); None otherwise (in-process for
    host targets; recorded as unchecked for the rest)."""
    import shutil

    from toolchain.errors import DeviceError

    if spec.runs_on_host or compiler.kind == "ndk" or not shutil.which("qemu-aarch64"):
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
                  other: bool) -> tuple[str, Optional[str], Optional[int]]:
    """compile --db: the target the database was tuned for (preset, mcpu, cores), or the one asked for when it
    is the same target; another target only with ``other`` (--other-target)."""
    from toolchain.errors import TargetError
    from toolchain.targets import preset_of, resolve_target

    preset = preset_of(tuned)
    if target is None:
        err_console.print(f"[dim]building for {preset} (mcpu {escape(str(tuned.get('mcpu')))}): the target "
                          f"{escape(str(db))} was tuned for[/dim]", soft_wrap=True)
        return preset, mcpu or tuned.get("mcpu"), num_cores or tuned.get("num-cores")
    asked = resolve_target(target, mcpu=mcpu, num_cores=num_cores).tvm_target
    keys = ("mtriple", "mcpu", "mattr")
    if any(asked.get(k) != tuned.get(k) for k in keys) and not other:
        raise TargetError(
            f"{db} was tuned for {preset} ({', '.join(f'{k} {tuned.get(k)}' for k in keys if tuned.get(k))}), not "
            f"for --target {target} ({', '.join(f'{k} {asked.get(k)}' for k in keys if asked.get(k))}): drop "
            "--target to build what was tuned, or add --other-target to apply its records anyway")
    return target, mcpu, num_cores


def _join_rule(joins: str, db: Optional[Path]) -> str:
    """``compile --joins`` as a rule of pairing.JOIN_RULES; a geometry name becomes ``traffic:NAME``."""
    from host import proxy

    if joins != "latency" and db is None:
        raise UnsupportedModelError("--joins decides between a tuned join and its tuned minis: it needs --db")
    from toolchain.tune.pairing import TRAFFIC, rule_for

    rule, names = rule_for(joins), [g.name for g in proxy.GEOMETRIES]
    if rule.startswith(TRAFFIC) and joins not in names:
        raise UnsupportedModelError(f"unknown --joins '{joins}': latency, joined, minis, or a cache geometry "
                                    f"({', '.join(names)})")
    return rule


def _judge(proto, label: str, overrides: dict, db: Path, geometry: str) -> None:
    """Judge the database's pending joins in ``geometry`` (host/judge.py), with progress and a table."""
    from host import judge
    from toolchain.tune import TuneDB

    pending = judge.pending_joins(db, geometry)
    if pending:
        err_console.print(f"[dim]judging {len(pending)} join(s) by the model's simulated DRAM traffic in {geometry}'s "
                          f"caches: {len(pending) + 1} builds, one join flipped in each, each checked and run under "
                          "valgrind (about a minute each for a mobile CNN at 112; kept in the database)[/dim]")
        with err_console.status("judging joins") as status:
            record = judge.judge_joins(proto, label, overrides, db, geometry, on_stage=lambda s: status.update(s))
    else:
        record = TuneDB(db).traffic.get(geometry, {})
    if record.get("joins"):  # a database without joins (tuned without the reformer): nothing to judge
        console.print(render.traffic_table(record, pending))


@app.command()
@_guard
def verify(
    artifact_dir: Path = typer.Argument(..., help="Artifact directory from `agoc compile`."),
    device: Optional[str] = typer.Option(None, help="local (default), qemu, or a phone's serial."),
    atol: float = typer.Option(None, help="Absolute tolerance (default 1e-5)."),
    rtol: float = typer.Option(None, help="Tolerance relative to the output's max |value| (default 1e-4)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
):
    """Run the artifact on its sample inputs and compare with onnxruntime; exit 1 if over tolerance."""
    from host.devices import get_device
    from toolchain.artifact import load_artifact
    from toolchain.errors import VerifyError
    from toolchain.verify import DEFAULT_ATOL, DEFAULT_RTOL, verify_artifact

    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not value >= 0:  # NaN included
            raise VerifyError(f"{name} must be a tolerance of 0 or more (got {value})")
    art = load_artifact(artifact_dir)
    dev = get_device(device, default="local")
    if dev.kind != "local":
        err_console.print(f"[dim]running {escape(str(artifact_dir))} on {escape(dev.name)} ({dev.kind})[/dim]")
    report = verify_artifact(art, dev, DEFAULT_ATOL if atol is None else atol, DEFAULT_RTOL if rtol is None else rtol)
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        console.print(render.verify_table(report))
    if not report.passed:
        raise typer.Exit(1)


@app.command()
@_guard
def inspect(
    path: str = typer.Argument(..., help="An artifact directory, an ONNX file, or zoo:NAME[@SHAPE]."),
    input_shape: Optional[list[str]] = typer.Option(None, "--input-shape", "-s", help="NAME=1x3x224x224."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
):
    """Show inputs, outputs, op counts and fused kernels of an artifact or a model."""
    from toolchain import onnx_import

    if Path(path).is_dir():
        from toolchain.artifact import load_artifact

        art = load_artifact(path)
        m = art.manifest
        if as_json:
            print(json.dumps(m.to_json()))
            return
        console.print(render.artifact_summary(art))
        console.print(render.tensors_table("inputs", [(t.info.name, render._shape(t.info.shape), t.info.dtype) for t in m.inputs]))
        console.print(render.tensors_table("outputs", [(t.info.name, render._shape(t.info.shape), t.info.dtype) for t in m.outputs]))
        console.print(render.op_counts_table(m.op_counts))
        console.print(render.kernels_table(list(m.kernels)))
        return

    proto, label, overrides = _load_source(path, input_shape or [])
    declared = onnx_import.declared_inputs(proto)
    counts = onnx_import.op_counts(proto)
    kernels, note = None, ""
    try:
        from toolchain import build
        from toolchain.targets import resolve_target

        onnx_import.check_supported(proto)
        spec = resolve_target("host")
        inputs = onnx_import.resolve_inputs(proto, overrides)
        mod = build.fuse_stock(build.legalize(onnx_import.to_relax(proto, inputs), spec), spec)
        kernels = [k.to_json() for k in build.kernels(mod)]
    except (UnsupportedModelError, InputShapeError) as exc:
        note = f"no kernels: {exc}"
    if as_json:
        print(
            json.dumps(
                {
                    "model": label,
                    "inputs": [{"name": i.name, "shape": list(i.dims), "dtype": i.dtype} for i in declared],
                    "outputs": onnx_import.declared_outputs(proto),
                    "op_counts": counts,
                    "kernels": kernels,
                    "note": note,
                }
            )
        )
        return
    console.print(render.tensors_table(f"{label}: inputs", render.declared_inputs_rows(declared)))
    console.print(render.tensors_table("outputs", [(n, "", "") for n in onnx_import.declared_outputs(proto)]))
    console.print(render.op_counts_table(counts))
    if kernels is not None:
        console.print(render.kernels_table(kernels))
    else:
        console.print(f"[yellow]{escape(note)}[/yellow]")


@app.command()
@_guard
def devices(as_json: bool = typer.Option(False, "--json", help="Print one JSON list.")):
    """List the devices agoc can run on: local, qemu (if installed) and attached phones."""
    from host import devices as dv

    rows = [{"name": "local", "kind": "local", "usable": True, **dv.LocalDevice().describe()}]
    try:
        qemu = dv.qemu_device()
        dv.runner_build(qemu.runner_target)
        rows.append({"name": "qemu", "kind": "qemu", "usable": True, **qemu.describe()})
    except AgocError as exc:
        rows.append({"name": "qemu", "kind": "qemu", "usable": False, "note": str(exc)})
    for serial in dv.adb_serials():
        try:
            info = dv.adb_device(serial).describe()
            usable = str(info.get("abi", "")).startswith("arm64")
            rows.append({"name": serial, "kind": "adb", "usable": usable, **info,
                         **({} if usable else {"note": "not an arm64 device"})})
        except AgocError as exc:
            rows.append({"name": serial, "kind": "adb", "usable": False, "note": str(exc)})
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title="devices", title_justify="left")
    for col in ("name", "kind", "usable", "abi", "cores", "model", "note"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(escape(str(r.get(c, "") if r.get(c) is not None else "")) for c in
                        ("name", "kind", "usable", "abi", "cores", "model", "note")))
    console.print(table)


@app.command()
@_guard
def deploy(
    artifact_dir: Path = typer.Argument(..., help="Artifact directory from `agoc compile`."),
    device: Optional[str] = typer.Option(None, help="qemu, local, or a phone's serial (default: ANDROID_SERIAL or the only phone)."),
):
    """Push the runner, the TVM runtime and the artifact to a device; print where it landed."""
    from host.devices import get_device
    from toolchain.artifact import load_artifact

    art = load_artifact(artifact_dir)
    dev = get_device(device, default=None)
    with err_console.status(f"deploying to {dev.name}"):
        remote = dev.deploy(art)
    console.print(f"[green]✓[/green] {escape(str(artifact_dir))} → {escape(dev.name)}:{escape(remote)}")


@app.command()
@_guard
def bench(
    artifact_dir: Path = typer.Argument(..., help="Artifact directory from `agoc compile`."),
    device: Optional[str] = typer.Option(None, help="qemu, local, or a phone's serial (default: ANDROID_SERIAL or the only phone)."),
    threads: Optional[int] = typer.Option(None, help="Runtime threads (default: the runtime's)."),
    cores: Optional[str] = typer.Option(None, help="Pin to these cores, e.g. 4,5,6,7 (the big cluster)."),
    warmup: Optional[int] = typer.Option(None, help="Untimed runs first (default 5; with --proxy 2)."),
    repeat: Optional[int] = typer.Option(None, help="Timed runs (default 20; with --proxy 1)."),
    min_time_ms: float = typer.Option(0.0, help="Keep timing until this much time has passed."),
    per_kernel: bool = typer.Option(False, "--per-kernel", help="Also time each fused kernel."),
    proxy: Optional[str] = typer.Option(
        None, "--proxy", help="Instead of timing: simulate this phone cache geometry under valgrind (a76, a55, "
        "small-slc) and report instructions, D1 misses, L2 traffic and DRAM bytes per inference."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with median_ms)."),
):
    """Time the artifact on a device with the C++ runner (median, spread, cpufreq, temperature)."""
    from host.devices import BenchOptions, get_device
    from toolchain.artifact import load_artifact

    if threads is not None and threads < 1:
        raise InputShapeError(f"--threads must be at least 1 (got {threads}); leave it out for the runtime's default")
    if (warmup is not None and warmup < 0) or (repeat is not None and repeat < 1) or not min_time_ms >= 0:
        raise InputShapeError(f"--warmup must be 0 or more, --repeat at least 1 and --min-time-ms 0 or more (got "
                              f"{warmup}, {repeat}, {min_time_ms}); e.g. --warmup 5 --repeat 20")
    if proxy is not None:
        _bench_proxy(artifact_dir, device, proxy, 2 if warmup is None else warmup, 1 if repeat is None else repeat,
                     as_json)
        return
    warmup = 5 if warmup is None else warmup
    repeat = 20 if repeat is None else repeat
    try:
        core_list = tuple(int(c) for c in cores.split(",")) if cores else None
        if core_list and min(core_list) < 0:
            raise ValueError(cores)
    except ValueError:
        raise InputShapeError(f"--cores '{cores}': expected comma-separated core numbers like 4,5,6,7") from None
    art = load_artifact(artifact_dir)
    dev = get_device(device, default=None)
    options = BenchOptions(warmup, repeat, min_time_ms, threads, core_list, per_kernel)
    err_console.print(
        f"[dim]bench {escape(art.manifest.model_name)} on {escape(dev.name)} ({dev.kind}): warm-up {warmup}, "
        f"repeat {repeat}, threads {threads or 'default'}, cores {cores or 'any'}[/dim]",
        soft_wrap=True,
    )
    with err_console.status(f"running on {dev.name}"):
        result = dev.bench(art, options)
    result = {**result, "device": dev.name, "device_kind": dev.kind, "model": art.manifest.model_name,
              "target": art.target_preset, "warmup": warmup, "repeat": repeat}
    if as_json:
        print(json.dumps(result))
        return
    console.print(render.bench_result_table(result))
    if dev.kind == "qemu":
        err_console.print("[yellow]note: times under qemu are emulated (≈25× slow): correctness only[/yellow]")


def _bench_proxy(artifact_dir: Path, device: Optional[str], geometry: str, warmup: int, calls: int,
                 as_json: bool) -> None:
    """`agoc bench OUT --proxy GEOMETRY`: the phone-cache proxy (host/proxy.py) on this machine."""
    from host import proxy
    from toolchain.artifact import load_artifact

    if device not in (None, "local"):
        raise proxy.ProxyError(f"--proxy simulates a phone cache on this machine; drop --device {device}")
    if calls < 1:
        raise proxy.ProxyError("--repeat must be at least 1")
    geo = proxy.geometry(geometry)
    art = load_artifact(artifact_dir)
    sizes = ", ".join(c.label for c in (geo.l2, *geo.llc))
    err_console.print(
        f"[dim]phone-cache proxy {geo.name}: {escape(art.manifest.model_name)} under valgrind callgrind, "
        f"D1 {geo.l1d.label} {geo.l1d.assoc}-way, LL {sizes}; warm-up {warmup}, {calls} collected call(s), "
        f"1 thread, env -i[/dim]",
        soft_wrap=True,
    )
    with err_console.status(f"simulating {geo.name} caches"):
        result = proxy.measure(art, geo, warmup=warmup, calls=calls)
    if as_json:
        print(json.dumps(result))
        return
    console.print(render.proxy_result_table(result))


@app.command()
@_guard
def tune(
    model: Optional[str] = typer.Argument(None, help="An ONNX file or zoo:NAME[@SHAPE]."),
    db: Optional[Path] = typer.Option(None, "--db", help="Tuning database directory (created; re-running resumes)."),
    status_dir: Optional[Path] = typer.Option(None, "--status", help="Show a database's per-kernel progress and exit."),
    against: Optional[Path] = typer.Option(
        None, "--against", help="With --status: also compare its kernels with those another database tuned for "
        "the same ops (e.g. the stock partition's): verified latency of each, and their geometric mean ratio."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target preset (default: what the device runs)."),
    device: Optional[list[str]] = typer.Option(
        None, help="Where candidates are measured: local (default), qemu, or a phone's serial; repeat for several."),
    rpc: bool = typer.Option(False, "--rpc", help="Measure on this machine through the runner's RPC server too."),
    tracker: Optional[str] = typer.Option(None, help="HOST:PORT of a TVM RPC tracker (a farm; default: a private one)."),
    key: Optional[str] = typer.Option(None, help="Tracker key of the devices to use (default: their target, e.g. linux-arm64)."),
    cooldown: float = typer.Option(0.0, help="Seconds to pause before each candidate (RPC measurements)."),
    max_spread: float = typer.Option(0.15, help="Re-measure a candidate whose repeats spread more than this."),
    input_shape: Optional[list[str]] = typer.Option(None, "--input-shape", "-s", help="NAME=1x3x224x224."),
    trials: int = typer.Option(256, help="Trial budget for the whole model (split over kernels by AGO weight)."),
    partition: str = typer.Option("ago", help="ago, or stock (TVM FuseOps kernels + default space: the Ansor-like baseline)."),
    threshold: Optional[float] = typer.Option(None, help="AGO's Td (default: shipped with the weight fit)."),
    keep_inside: int = _keep_inside_option(),
    no_intensive: bool = typer.Option(False, "--no-intensive", help="Ablation AGO-NI: no intensive-fusion space."),
    no_reformer: bool = typer.Option(False, "--no-reformer", help="Ablation AGO-NR: tune subgraphs directly, no split/join."),
    split_fraction: float = typer.Option(0.5, help="Share of a subgraph's budget spent on its mini-subgraphs first."),
    base: Optional[Path] = typer.Option(
        None, "--from", help="Start from another tuning database (same target): its records of the kernels this "
        "session tunes — the same PrimFuncs, whatever its partition called them — are copied in and count as "
        "their trials (e.g. AGO on top of a stock-partition session, or a retune after a model change)."),
    per_iter: int = typer.Option(16, help="Candidates per search batch."),
    population: int = typer.Option(128, help="Candidates the search's cost model scores and evolves before each "
                                   "batch (MetaSchedule's evolutionary search; smaller: faster batches)."),
    scheduler: str = typer.Option("weight", help="How the budget is spread over the kernels: weight (planned "
                                  "by AGO weight), latency (a first batch each, then rounds where they save most) or "
                                  "roofline (three quarters by weight, the last quarter in rounds to the kernels "
                                  "furthest above their roofline floor)."),
    warmup: int = typer.Option(8, help="--scheduler latency: every kernel's first batch."),
    no_prepack: bool = typer.Option(
        False, "--no-prepack", help="Keep every weight in the model's layout (by default a schedule may store "
        "each weight in the order it reads it, rewritten once at build time)."),
    warm_weights: bool = typer.Option(
        False, "--warm-weights", help="Time candidates with their weights in cache (repeated calls, as a "
        "micro-benchmark does) instead of flushed (as the model runs them: the default)."),
    transfer: int = typer.Option(
        2, "--transfer", help="Start each kernel's search from the verified schedules of up to this many "
        "kernels with the same blocks, or the same conv with another epilogue, re-fitted to its loops (0: from scratch)."),
    seed: int = typer.Option(0, help="Search seed."),
    layout: str = _layout_option(),
    pad_channels: bool = _pad_channels_option(),
    fast_math: bool = _fast_math_option(),
):
    """Tune every kernel on MetaSchedule (AGO divide-and-conquer), keeping only verified schedules."""
    from toolchain import tune as tuning

    if status_dir is not None:
        console.print(render.tune_status_table(tuning.status(status_dir), status_dir))
        if against is not None:
            console.print(render.tune_compare_table(tuning.compare(status_dir, against), status_dir, against))
        return
    if against is not None:
        raise UnsupportedModelError("--against compares two databases: give it with --status DIR")
    if model is None or db is None:
        raise UnsupportedModelError("give MODEL and --db DIR (or --status DIR to look at a database)")
    from toolchain import build, onnx_import
    from toolchain.targets import resolve_target

    from host import rpc as rpc_mod
    from host.devices import get_device

    devices = [get_device(name) for name in (device or [])]
    farm = tracker is not None and not devices
    if not devices and not farm:
        devices = [get_device("local")]
    local_only = not farm and all(d.kind == "local" for d in devices) and not rpc and len(devices) == 1
    if farm and key is None:
        raise UnsupportedModelError("with --tracker and no --device, say which devices with --key (e.g. linux-arm64)")
    from toolchain.targets import PRESETS_BY_NAME

    if farm and target is None and key not in PRESETS_BY_NAME:
        raise UnsupportedModelError(f"key '{key}' is not a target name: say what the devices run with --target "
                                    f"({', '.join(PRESETS_BY_NAME)})")
    target = target or (rpc_mod.device_target(devices[0]) if devices else key)
    if devices and len({rpc_mod.device_target(d) for d in devices}) > 1:
        raise UnsupportedModelError("the devices of one tuning run must run the same target; tune them separately")
    if partition not in ("ago", "stock"):
        raise UnsupportedModelError(f"unknown partition '{partition}'; choose ago or stock")
    if scheduler not in tuning.SCHEDULERS:
        raise UnsupportedModelError(f"unknown scheduler '{scheduler}'; choose "
                                    + " or ".join(f"{k} ({v})" for k, v in tuning.SCHEDULERS.items()))
    if min(per_iter, warmup, trials) < 1:
        raise UnsupportedModelError("--trials, --per-iter and --warmup must be at least 1")
    if population < per_iter:
        raise UnsupportedModelError(f"--population ({population}) must be at least --per-iter ({per_iter}): "
                                    "each batch is picked from it")
    if transfer < 0:
        raise UnsupportedModelError("--transfer must be 0 (off) or more")
    if threshold is not None and not threshold > 0:
        raise UnsupportedModelError(f"--threshold must be a positive weight (got {threshold})")
    if not 0 <= split_fraction <= 1:
        raise UnsupportedModelError(f"--split-fraction must be between 0 and 1 (got {split_fraction})")
    if not (max_spread > 0 and cooldown >= 0):
        raise UnsupportedModelError("--max-spread must be above 0 and --cooldown 0 or more")
    tuning.TuneDB(db).check_own()  # before anything is written into it (the RPC session's files included)
    if base is not None and tuning.TuneDB(base).session is None:
        raise tuning.TuningError(f"--from {base} is not a tuning database (no session.json); give one that "
                                 "`agoc tune` made")
    settings = tuning.TuneSettings(
        trials=trials, partition=partition, threshold=threshold, keep_inside=_keep_inside(keep_inside),
        intensive=not no_intensive,
        reformer=not no_reformer, split_fraction=split_fraction, per_iter=per_iter, seed=seed,
        cold_weights=not warm_weights, scheduler=scheduler, warmup=warmup, prepack=not no_prepack,
        transfer=transfer, population=population,
    )
    proto, label, overrides = _load_source(model, input_shape or [])
    onnx_import.check_supported(proto)
    cores = None
    if devices and devices[0].kind != "local":
        cores = devices[0].describe().get("cores")
    spec = resolve_target(target, num_cores=cores, layout=layout, pad_channels=pad_channels, fast_math=fast_math)
    mod = build.legalize(onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, overrides)), spec)
    where = "this machine" if local_only else (
        f"tracker {tracker} key {key}" if farm else ", ".join(d.name for d in devices) + " over RPC")
    err_console.print(
        f"[dim]tuning {escape(label)} into {escape(str(db))} measured on {escape(where)}: {trials} trials, partition {partition}, "
        f"intensive {'on' if settings.intensive else 'off'}, reformer {'on' if settings.reformer else 'off'}, "
        f"split {split_fraction:g}, {per_iter}/batch from a population of {population}, scheduler {scheduler}"
        f"{f' (warm-up {warmup})' if scheduler == 'latency' else ''}, weights {'warm' if warm_weights else 'cold'}"
        f"{', not prepacked' if no_prepack else ', prepacked'}"
        f"{f', seeds from up to {transfer} similar kernels' if transfer else ', every search from scratch'}"
        f"{'' if pad_channels else ', channels not padded'}, target {escape(json.dumps(spec.tvm_target))}[/dim]",
        soft_wrap=True,
    )
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} trials"),
                        TimeElapsedColumn(), console=err_console)
    state = {"bar": None, "budgets": {}, "done": {}}

    def on_event(kind, **info):
        if kind == "plan":
            state["budgets"] = {t["name"]: t["budget"] for t in info["tasks"]}
            total, tasks = info.get("total", sum(state["budgets"].values())), info["tasks"]
            first = info.get("first_pass", total)
            phases = {p: sum(t["phase"] == p for t in tasks) for p in ("kernel", "mini", "joined")}
            kernels = phases["kernel"] + phases["joined"]
            progress.console.print(
                f"[dim]plan: {kernels} kernel{'s' * (kernels != 1)} ({phases['joined']} split into "
                f"{phases['mini']} minis), {total} trials"
                f"{f' (more than --trials {trials}: at least one batch of {settings.unit} per task)' if total > trials else ''}"
                f"{f', {first} of them a first batch per task' if scheduler == 'latency' else ''}"
                f"{f', {first} of them planned by weight, the rest in rounds' if scheduler == 'roofline' else ''}"
                "[/dim]", soft_wrap=True)
            state["bar"] = progress.add_task("tuning", total=total)
        elif kind == "round":
            progress.console.print(
                f"[dim]round for {escape(info['task'])}: {info['model_ms']:.4f} ms of the model, expected to save "
                f"{info['gain_ms']:.4f} ms; {info['left']} trials left[/dim]", soft_wrap=True)
        elif kind == "task":
            state["done"][info["task"]] = min(info["done"], info["budget"])
            progress.update(state["bar"], completed=sum(state["done"].values()),
                            description=f"{info['phase']} {info['task'][:40]}")
        elif kind == "trials":
            state["done"][info["task"]] = min(info["done"], info["budget"])
            progress.update(state["bar"], completed=sum(state["done"].values()),
                            description=f"{info['task'][:40]} best {info['best_ms']:.4f} ms")
        elif kind == "stable":
            left = state["budgets"].get(info["task"], info["done"]) - info["done"]
            progress.console.print(f"[dim]{escape(info['task'])}: stable after {info['done']} trials"
                                   f"{f', {left} left to its join' if left > 0 else ''}[/dim]")
        elif kind == "exhausted":
            progress.console.print(f"[dim]{escape(info['task'])}: every schedule of its space measured after "
                                   f"{info['done']} trials; {info['left']} left go to the next kernel[/dim]")
        elif kind == "search_failed":
            progress.console.print(f"[yellow]{escape(info['task'])}: the search failed ({escape(info['reason'])}); "
                                   "keeping what it found, going on[/yellow]", soft_wrap=True)
        elif kind == "join_yields":
            minis = f", its minis together {info['minis_ms']:.4f} ms" if info.get("minis_ms") is not None else ""
            if info.get("together"):  # timed in turn with its minis
                t = info["together"]
                minis = f"; timed next to its minis {t['joined_ms']:.4f} vs {t['minis_ms']:.4f} ms"
            progress.console.print(
                f"[dim]{escape(info['task'])}: {info['best_ms']:.4f} ms after a batch{minis} ({info['reason']}): "
                f"its {info['left']} remaining trials go to its minis[/dim]", soft_wrap=True)
        elif kind == "seeded":
            parts = []
            if info.get("composed"):
                parts.append("the composed mini schedules")
            if info.get("siblings"):
                parts.append(f"the schedules of {len(info['siblings'])} kernel(s) like it")
            best = f" (best {info['best_ms']:.4f} ms)" if info.get("best_ms") is not None else ""
            how = "composed again from its minis" if info.get("again") else f"starts from {' and '.join(parts)}{best}"
            progress.console.print(f"[dim]{escape(info['task'])}: {how}[/dim]")
        elif kind == "imported":
            tasks = info["tasks"]
            progress.console.print(
                f"[dim]from {escape(info['base'])}: {sum(tasks.values())} records of {len(tasks)} kernel(s) copied in"
                f"{'' if tasks else ' (none: no kernel in common, or each already has records here)'}[/dim]",
                soft_wrap=True)
        elif kind == "pairing":
            progress.update(state["bar"], description=f"timing {info['task'][:40]} next to its {info['minis']} minis")
        elif kind == "paired":
            verdict = (f"error: {escape(info['error'])}" if "error" in info else
                       f"{info['joined_ms']:.4f} ms, its minis together {info['minis_ms']:.4f} ms → "
                       f"{'kept' if info['ratio'] >= 1 else 'built as its minis'}")
            progress.console.print(f"[dim]{escape(info['task'])} timed next to its minis: {verdict}[/dim]", soft_wrap=True)
        elif kind == "task_done":
            r = info["result"]
            note = f"{r.get('latency_ms', 0):.4f} ms verified" if r.get("status") == "verified" else r.get("status")
            rejected = f", {len(r.get('rejected', []))} wrong candidates rejected" if r.get("rejected") else ""
            progress.console.print(f"{escape(info['task'])}: {note}{rejected}")

    if local_only:
        with progress:
            summary = tuning.tune_model(mod, onnx_import.model_hash(proto), spec, settings, db, on_event, base=base)
        console.print(render.tune_status_table(summary, db))
        console.print(f"[green]✓[/green] build with: {escape(_build_command(model, db, input_shape))}")
        return
    from host.measure import Hygiene
    from toolchain.timing import Timing

    hygiene = Hygiene(Timing(max_spread=max_spread, cold=settings.cold_weights), cooldown_s=cooldown)
    db.mkdir(parents=True, exist_ok=True)
    session = rpc_mod.RpcSession(
        spec, devices, rpc_mod.parse_address(tracker) if tracker else None, key, hygiene,
        db / "measurements.jsonl", work_dir=db / "agents",
    )
    with progress, session:
        summary = tuning.tune_model(mod, onnx_import.model_hash(proto), spec, settings, db, on_event,
                                    measure=session.measure(), base=base)
        report = session.report()
    (db / "devices.json").write_text(json.dumps(report, indent=2))
    console.print(render.tune_status_table(summary, db))
    console.print(render.rpc_report_table(report))
    console.print(f"[green]✓[/green] build with: {escape(_build_command(model, db, input_shape))}")


def _build_command(model: str, db: Path, shapes: Optional[list[str]]) -> str:
    """The command that builds what ``agoc tune`` tuned (the target and settings come from the database)."""
    import shlex

    words = ["agoc", "compile", model, "--db", str(db), *[w for s in shapes or [] for w in ("-s", s)], "-o", "OUT"]
    return " ".join(shlex.quote(w) for w in words)


@app.command("partition")
@_guard
def partition_cmd(
    model: str = typer.Argument(..., help="An ONNX file or zoo:NAME[@SHAPE]."),
    input_shape: Optional[list[str]] = typer.Option(None, "--input-shape", "-s", help="NAME=1x3x224x224."),
    threshold: Optional[float] = typer.Option(None, help="AGO's subgraph weight threshold Td (default: shipped with the weight fit)."),
    trivial_cut: Optional[float] = typer.Option(None, help="Subgraphs lighter than this count as trivial (default 5 ≈ trials)."),
    keep_inside: int = _keep_inside_option(),
    explain: bool = typer.Option(False, "--explain", help="Show why merges were declined."),
    dot: Optional[Path] = typer.Option(None, "--dot", help="Write the AGO-partitioned graph as Graphviz DOT."),
    png: Optional[Path] = typer.Option(None, "--png", help="Render the partitioned graph to PNG (needs graphviz `dot`)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: {model, ago: {...}, stock: {...}}."),
    layout: str = _layout_option(),
    pad_channels: bool = _pad_channels_option(),
    fast_math: bool = _fast_math_option(),
):
    """Partition MODEL with AGO and with stock TVM; print subgraphs and AGO's statistics side by side."""
    from host import graphviz
    from toolchain import build, onnx_import, partition
    from toolchain.opgraph import op_graph
    from toolchain.targets import resolve_target

    _check_output_file(dot, "--dot")
    _check_output_file(png, "--png")
    if threshold is not None and not threshold > 0:
        raise UnsupportedModelError(f"--threshold must be a positive weight (got {threshold})")
    if trivial_cut is not None and not trivial_cut >= 0:  # NaN included
        raise UnsupportedModelError(f"--trivial-cut must be a weight of 0 or more (got {trivial_cut}); the default is "
                                    f"{partition.TRIVIAL_CUT:g}")
    threshold = partition.DEFAULT_THRESHOLD if threshold is None else threshold
    trivial_cut = partition.TRIVIAL_CUT if trivial_cut is None else trivial_cut
    keep_inside = _keep_inside(keep_inside)
    proto, label, overrides = _load_source(model, input_shape or [])
    onnx_import.check_supported(proto)
    spec = resolve_target("host", layout=layout, pad_channels=pad_channels, fast_math=fast_math)
    mod = build.legalize(onnx_import.to_relax(proto, onnx_import.resolve_inputs(proto, overrides)), spec)
    graph = op_graph(mod)
    plans = {
        "ago": partition.plan("ago", mod, spec, threshold, graph, keep_inside),
        "stock": partition.plan("stock", mod, spec, graph=graph),
    }
    for p in plans.values():
        partition.check(graph, p)
    summary = {name: partition.stats(graph, p, trivial_cut) for name, p in plans.items()}
    if dot or png:
        text = graphviz.partition_dot(graph, plans["ago"], label)
        if dot:
            _write_file(dot, text.encode())
        if png:
            graphviz.render_png(text, png)
    if as_json:
        print(json.dumps({"model": label, "threshold": threshold, "trivial_cut": trivial_cut, **summary}))
        return
    console.print(render.partition_stats_table(label, summary, threshold, trivial_cut))
    console.print(render.subgraphs_table(graph, plans["ago"], trivial_cut))
    if explain:
        console.print(render.decisions_table(plans["ago"].decisions, graph))
    for path in (dot, png):
        if path:
            console.print(f"[green]✓[/green] wrote {escape(str(path))}")


@app.command()
@_guard
def targets():
    """List the target presets."""
    from toolchain.targets import PRESETS

    table = Table(title="target presets", title_justify="left")
    for col in ("name", "triple", "mcpu", "linker", "description"):
        table.add_column(col)
    for p in PRESETS:
        table.add_row(p.name, p.mtriple or "(host)", p.mcpu or "(detected)", p.linker, p.description)
    console.print(table)


def _cache_regime(name: str) -> str:
    from host.cache_regime import regime

    try:
        return regime(name).name
    except ValueError as exc:
        raise UnsupportedModelError(str(exc)) from None


@app.command("bench-suite")
@_guard
def bench_suite(
    suite: str = typer.Argument("host", help="Suite: host (zoo, untuned), e2e (zoo @112, tuned), pairs (AGO micro-benchmarks), tiny."),
    models_: Optional[str] = typer.Option(None, "--models", help="Comma-separated zoo models (default: the suite's)."),
    shapes: Optional[str] = typer.Option(None, help="Comma-separated spatial sizes to keep, e.g. 56,112."),
    variants: Optional[str] = typer.Option(None, help="Comma-separated variants (default: the suite's)."),
    quick: bool = typer.Option(False, "--quick", help="Smallest shape per model, 3 rounds × 3 calls."),
    threads: Optional[int] = typer.Option(None, help="Threads for every engine (default: all cores)."),
    rounds: Optional[int] = typer.Option(None, help="Measurement rounds (default 10, quick 3)."),
    calls: Optional[int] = typer.Option(None, help="Timed calls per engine per round (default 10, quick 3)."),
    seed: int = typer.Option(0, help="Seed of tuning and, unless --order-seed, of the per-round engine order."),
    order_seed: Optional[int] = typer.Option(None, "--order-seed", help="Seed of the per-round engine order alone "
                                             "(default: --seed): time a work dir again in another order without "
                                             "re-tuning."),
    trials: Optional[int] = typer.Option(None, help="Tuning budget per tuned variant and model (default: the suite's)."),
    scheduler: str = typer.Option("weight", help="How every tuned variant spreads its budget: weight, latency "
                                  "or roofline (see agoc tune --help)."),
    no_prepack: bool = typer.Option(False, "--no-prepack", help="Tune every variant with weights in the model's "
                                    "layout (see agoc tune --help)."),
    transfer: int = typer.Option(2, "--transfer", help="Seeds from similar kernels per search, for every tuned "
                                 "variant (see agoc tune --help; 0: from scratch)."),
    population: int = typer.Option(128, help="Search population per batch, for every tuned variant "
                                   "(see agoc tune --help)."),
    layout: str = _layout_option(),
    pad_channels: bool = _pad_channels_option(),
    fast_math: bool = _fast_math_option(),
    cache: str = typer.Option("cold", "--cache", help="What each timed call finds in cache: cold (each engine's "
                              "calls back to back, every core's caches overwritten before each: weights from "
                              "memory, as on a phone), warm (back to back, nothing between) or shared (engines "
                              "in turn, nothing between: the old protocol)."),
    out: Path = typer.Option(Path("bench/results"), help="Where the JSON and PNG go."),
    work_dir: Path = typer.Option(Path("build/bench"), help="Where the compiled artifacts go."),
    proxy: Optional[str] = typer.Option(
        None, "--proxy", help="Also simulate this phone cache geometry (a76, a55, small-slc) for every TVM variant: "
        "DRAM bytes, L2 traffic, D1 misses, instructions beside latency (needs valgrind)."),
):
    """Compile each model with each variant, verify it, time it against onnxruntime; write JSON + PNG."""
    from dataclasses import replace

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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
    from toolchain.tune import SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise UnsupportedModelError(f"unknown scheduler '{scheduler}'; choose {' or '.join(SCHEDULERS)}")
    if transfer < 0:
        raise UnsupportedModelError("--transfer must be 0 (off) or more")
    from toolchain.tune import TuneSettings

    if population < TuneSettings().per_iter:
        raise UnsupportedModelError(f"--population must be at least {TuneSettings().per_iter} (a search batch)")
    from toolchain.targets import check_layout

    layout = check_layout(layout)
    names = [m.strip() for m in models_.split(",")] if models_ else None
    settings = bench.default_settings(quick, threads, seed, bench.SUITES[suite])
    settings = replace(settings, rounds=rounds or settings.rounds, calls_per_round=calls or settings.calls_per_round,
                       trials=settings.trials if trials is None else trials, proxy=proxy, scheduler=scheduler,
                       prepack=not no_prepack, transfer=transfer, layout=layout, pad_channels=pad_channels,
                       fast_math=fast_math, population=population, cache=_cache_regime(cache), order_seed=order_seed)
    if proxy is not None:  # fail before compiling anything
        from host import proxy as proxy_mod

        proxy_mod.geometry(proxy)
        proxy_mod.find_valgrind()
    cases = bench.suite_cases(bench.SUITES[suite], quick, names, sizes)
    if not cases:
        raise UnsupportedModelError("no (model, shape) pairs selected; check --models and --shapes")
    err_console.print(
        f"[dim]suite {suite}: {len(cases)} cases × {', '.join(chosen or bench.SUITES[suite].variants)}; "
        f"{settings.threads} threads, {settings.rounds} rounds × {settings.calls_per_round} calls, "
        f"warm-up {settings.warmup}, gap {settings.gap_s}s, order seed {settings.order}"
        f"{f', at least {settings.trials} tuning trials per tuned variant (each model: an equal budget for its partitions)' if settings.trials else ''}"
        f"{f', phone-cache proxy {proxy}' if proxy else ''}[/dim]",
        soft_wrap=True,
    )
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=err_console, transient=True,
    )
    with progress:
        overall = progress.add_task("cases", total=len(cases))
        current = progress.add_task("", total=settings.rounds)

        logged = not err_console.is_terminal  # a log file (CI, nohup): one line per stage instead of a live bar

        def on_event(kind, **info):
            if kind == "case":
                progress.update(current, description=info["case"], completed=0)
            elif kind == "stage":
                progress.update(current, description=f"{info['case']}: {info['stage']}")
                if logged:
                    err_console.print(f"{time.strftime('%H:%M:%S')} {escape(info['case'])}: {escape(info['stage'])}",
                                      soft_wrap=True)
            elif kind == "round":
                progress.update(current, completed=info["round"])
            elif kind == "tuning" and info["event"] == "task" and logged:
                err_console.print(f"{time.strftime('%H:%M:%S')} {escape(info['case'])}: tuning {info['variant']} "
                                  f"{escape(info['task'])} ({info['phase']}, {info['done']}/{info['budget']})",
                                  soft_wrap=True)
            elif kind == "tuning" and info["event"] == "trials":
                progress.update(current, description=f"{info['case']}: tuning {info['variant']} "
                                f"{info['task'][:24]} {info['done']}/{info['budget']}")
            elif kind == "case_done":
                progress.advance(overall)

        document = bench.run_suite(bench.SUITES[suite], cases, settings, work_dir, chosen, on_event)
    json_path, png_path = bench.write_results(document, out)
    console.print(render.bench_table(document))
    console.print(render.partition_bench_table(document))
    if proxy:
        console.print(render.proxy_bench_table(document))
    if len(document["results"]) > 1:
        console.print(render.geomean_table(bench.geomean_speedups([document]), 1))
    console.print(f"[green]✓[/green] {escape(str(json_path))}  {escape(str(png_path))}  ({document['seconds']:.0f} s)")
    if any(r["status"] != "ok" or r["proxy_status"] not in (None, "ok") for r in bench.summary_rows(document)):
        raise typer.Exit(1)


@app.command("bench-report")
@_guard
def bench_report(
    results: list[Path] = typer.Argument(..., help="Results JSON written by `agoc bench-suite` (bench/results/*.json); "
                                         "several: their tables, then the geomean speed-ups over all their cases."),
    png: Optional[Path] = typer.Option(None, "--png", help="Also redraw the (first) run's chart to this PNG."),
):
    """Print the tables of saved benchmark runs (latency, ratios, phone-cache proxy) and the geomean speed-ups over
    their cases; optionally redraw the chart."""
    from host import bench
    from host.chart import speedup_chart

    documents = []
    for path in results:
        if not path.is_file():
            raise AgocError(f"{path}: no such file (results are in bench/results/)")
        try:
            document = json.loads(path.read_text())
        except ValueError as exc:
            raise AgocError(f"{path}: not JSON ({exc})") from None
        if not isinstance(document, dict) or document.get("schema") != bench.SCHEMA:
            raise AgocError(f"{path}: not an agoc benchmark result (schema {bench.SCHEMA})")
        documents.append(document)
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


def _tracker_address(tracker: Optional[str]) -> tuple[str, int]:
    from host import rpc as rpc_mod
    from toolchain.errors import DeviceError

    text = tracker or os.environ.get("AGOC_TRACKER")
    if text:
        return rpc_mod.parse_address(text)
    found = rpc_mod.tracker_from_state()
    if found is None:
        raise DeviceError("no tracker: start one with `agoc tracker start`, or pass --tracker HOST:PORT")
    return found


@tracker_app.command("start")
@_guard
def tracker_start(
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default; 0.0.0.0 serves a network)."),
    port: int = typer.Option(9190, help="First port to try (the next free one up to PORT+100 is taken)."),
):
    """Start TVM's RPC tracker in the background and remember where it is."""
    from host import rpc as rpc_mod

    known = rpc_mod.tracker_from_state()
    if known is not None:
        try:
            rpc_mod.tracker_summary(*known, timeout=3)
            console.print(f"a tracker already runs at {known[0]}:{known[1]} (`agoc tracker stop` first)")
            return
        except (OSError, AgocError):
            pass  # a stale state file
    info = rpc_mod.start_tracker(host, port, detach=True)
    state = rpc_mod.state_file()
    state.write_text(json.dumps({k: info[k] for k in ("pid", "host", "port")}))
    console.print(f"[green]✓[/green] RPC tracker at {info['host']}:{info['port']} (pid {info['pid']}); "
                  f"devices join with `agoc tracker serve --device D`")


@tracker_app.command("status")
@_guard
def tracker_status(
    tracker: Optional[str] = typer.Option(None, help="HOST:PORT (default: the one `agoc tracker start` started)."),
    as_json: bool = typer.Option(False, "--json", help="Print the tracker's summary as JSON."),
):
    """Devices registered with the tracker, per key, and queued requests."""
    from host import rpc as rpc_mod

    host, port = _tracker_address(tracker)
    summary = rpc_mod.tracker_summary(host, port)
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(render.tracker_table(summary, f"{host}:{port}"))


@tracker_app.command("stop")
@_guard
def tracker_stop():
    """Stop the tracker `agoc tracker start` started."""
    from host import rpc as rpc_mod

    state = rpc_mod.state_file()
    if not state.exists():
        console.print("no tracker was started here")
        return
    info = json.loads(state.read_text())
    rpc_mod.stop_process(int(info["pid"]))
    state.unlink()
    console.print(f"stopped the tracker at {info['host']}:{info['port']}")


@tracker_app.command("serve")
@_guard
def tracker_serve(
    device: str = typer.Option(..., help="The device to offer: local, qemu, or a phone's serial."),
    key: Optional[str] = typer.Option(None, help="Tracker key (default: the device's target, e.g. linux-arm64)."),
    tracker: Optional[str] = typer.Option(None, help="HOST:PORT (default: the one `agoc tracker start` started)."),
    name: Optional[str] = typer.Option(None, help="Name in logs and reports (default: the device's)."),
    bind: str = typer.Option("127.0.0.1", help="Address the agent listens on for sessions (loopback by default)."),
    status_file: Optional[Path] = typer.Option(None, help="Keep the agent's state (JSON) in this file."),
):
    """Offer one device to the tracker until interrupted.

    Starts the device's runner in RPC mode, relays the sessions the tracker sends it, restarts the
    runner when it dies and re-attaches the device when it returns."""
    import threading

    from host import rpc as rpc_mod
    from host.devices import get_device

    address = _tracker_address(tracker)
    dev = get_device(device)
    key = key or rpc_mod.device_target(dev)

    def on_event(kind, **info):
        detail = info.get("error") or info.get("reason") or (f"port {info['port']}" if "port" in info else "")
        if kind != "session":
            err_console.print(f"[dim]{escape(info['device'])}: {kind} {escape(str(detail))}[/dim]")

    import signal

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)  # stop cleanly: the runner on the device is stopped too
    agent = rpc_mod.Agent(rpc_mod.DeviceServer(dev, name), address, key, bind=bind, on_event=on_event,
                          status_file=status_file)
    agent.start()
    console.print(f"serving {escape(agent.server.name)} to the tracker {address[0]}:{address[1]} under key "
                  f"'{escape(key)}' (Ctrl-C to stop)")
    stopped = threading.Event()
    try:
        while not stopped.wait(30):
            err_console.print(f"[dim]{escape(agent.server.name)}: {agent.stats.sessions} sessions, "
                              f"{agent.stats.failed} lost, {agent.stats.restarts} restarts; {agent.stats.state}[/dim]")
    except KeyboardInterrupt:
        pass  # Ctrl-C or SIGTERM: the normal way to stop serving
    finally:
        agent.stop()
        console.print(f"{escape(agent.server.name)}: served {agent.stats.sessions} sessions, lost {agent.stats.failed}, "
                      f"restarted the runner {agent.stats.restarts} times")


@app.command("bench-rpc")
@_guard
def bench_rpc(
    model: str = typer.Option("zoo:pair-pw-dw@1x24x28x28", help="Model whose first conv/matmul kernel is tuned."),
    device: str = typer.Option("local", help="Device measured through RPC (local: the overhead of the path itself)."),
    trials: int = typer.Option(32, help="Trials per run (same for both paths)."),
    per_iter: int = typer.Option(8, help="Candidates per search batch."),
    repeats: int = typer.Option(2, help="Runs per path, interleaved (the median is reported)."),
    out: Path = typer.Option(Path("bench/results"), help="Results directory."),
):
    """Tuning throughput, local runner vs RPC path, on the same kernel: trials per minute and the ratio."""
    from host import bench_rpc as bench_rpc_mod

    def on_event(kind, **info):
        if kind == "start":
            how = {"local": "by the local runner", "rpc": "through RPC", "warm-up": "(warm-up)"}[info["path"]]
            err_console.print(f"[dim]tuning {trials} trials measured {how}...[/dim]")
        else:
            err_console.print(f"[dim]{info['path']}: {info['trials']} trials in {info['seconds']:.1f} s "
                              f"({info['trials_per_min']:.1f}/min, {info['failed']} failed)[/dim]")

    doc = bench_rpc_mod.run(model, device, trials, per_iter, repeats, out, on_event)
    table = Table(title=f"tuning throughput: {doc['model']} kernel {doc['kernel']} on {doc['device']}",
                  title_justify="left")
    for col in ("path", "trials/min (median)", "best ms"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for path in ("local", "rpc"):
        runs = doc["runs"][path]
        if runs:
            best = min((r["best_ms"] for r in runs if r["best_ms"] is not None), default=None)
            tpm = doc[f"{path}_trials_per_min"]
            table.add_row(path, f"{tpm:.1f}", "" if best is None else f"{best:.4f}")
    console.print(table)
    if doc["rpc_overhead"]:
        console.print(f"RPC path: {doc['rpc_overhead']:.2f}× the time per trial of the local runner")
    console.print(f"[green]✓[/green] {escape(doc['path'])}")


@app.command("bench-cuda")
@_guard
def bench_cuda(
    graphs: Optional[str] = typer.Option(None, "--graphs", help="Comma-separated: bert-tiny, mobilenet-v2-block, layernorm, softmax, bias-gelu (default: all)."),
    arch: str = typer.Option("sm_90", "--arch", help="CUDA compute capability."),
    rounds: int = typer.Option(20, help="Timing rounds on the GPU."),
    number: int = typer.Option(50, help="Calls per timing sample."),
    seed: int = typer.Option(0, help="Seed of the inputs and of the per-round order."),
    out: Path = typer.Option(Path("bench/results"), help="Where the JSON goes."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Only compile: write the executables, inputs and reference outputs to this directory, to time on a GPU machine with --time-bundle (which needs only TVM's runtime)."),
    time_bundle: Optional[Path] = typer.Option(None, "--time-bundle", help="Time a bundle written by --bundle on this machine's GPU."),
):
    """Fused (APOLLO + FusionStitching) vs stock TVM CUDA training steps: kernel counts always, times on a GPU."""
    from host import bench_cuda as suite

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
                      f"`agoc bench-cuda --time-bundle {escape(str(bundle))}` or `python -m host.bench_cuda time {escape(str(bundle))}`")
        return
    _, path = suite.run(names, arch=arch, rounds=rounds, number=number, seed=seed, out_dir=out, on_event=show)
    console.print(f"wrote {escape(str(path))}")


@models_app.command("list")
@_guard
def models_list():
    """List the zoo models and their shapes."""
    import models

    table = Table(title="model zoo", title_justify="left")
    for col in ("name", "family", "shapes", "params (published)", "description"):
        table.add_column(col)
    for spec in models.registry.MODELS:
        shapes = ", ".join("x".join(map(str, s)) for s in spec.shapes)
        params = f"{spec.published_params:,}" if spec.published_params else "-"
        table.add_row(spec.name, spec.family, shapes, params, spec.description)
    console.print(table)


@models_app.command("export")
@_guard
def models_export(
    name: str = typer.Argument(..., help="Zoo model name (see `agoc models list`)."),
    output: Path = typer.Option(..., "-o", "--output", help="ONNX file to write."),
    shape: Optional[str] = typer.Option(None, help="Input shape, e.g. 1x3x112x112 (default: the model's first)."),
):
    """Write a zoo model to an ONNX file."""
    import models

    try:
        spec, dims = models.registry.get(name), None
        if shape:
            dims = models.registry.parse_shape(shape)
            if len(dims) != len(spec.default_shape):
                raise ValueError(f"--shape {shape}: the input of {name} has {len(spec.default_shape)} dimensions, "
                                 f"e.g. --shape {'x'.join(map(str, spec.default_shape))}")
        proto = models.build(name, dims)
    except (models.UnknownModelError, ValueError) as exc:
        raise UnsupportedModelError(str(exc)) from None
    except MemoryError:
        raise UnsupportedModelError(f"{name} at {shape} has weights too large for this machine's memory; give a "
                                    "smaller --shape") from None
    if output.is_dir():
        raise UnsupportedModelError(f"-o {output} is a directory; give a file name, e.g. -o {output / name}.onnx")
    output.parent.mkdir(parents=True, exist_ok=True)
    _write_file(output, proto.SerializeToString())
    console.print(f"[green]✓[/green] {name} → {escape(str(output))}")


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="agoc")


if __name__ == "__main__":
    sys.exit(main())
