"""The compile pipeline, straight-line: check → import → legalize → partition → fuse → build → onnxruntime's
reference → self-check, a dump after each; the artifact is assembled beside its place and moved in only
once it has passed (docs/reliability.md)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import importlib.metadata
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from toolchain import (
    __version__,
    build,
    fastmath,
    frontend,
    fusion,
    onnx_import,
    padding,
    partition,
    winograd,
)
from toolchain.artifact import (
    LIBRARY,
    MODEL_COPY,
    Artifact,
    Manifest,
    TensorFile,
    check_replaceable,
    check_writable,
    file_sha256,
    staged_directory,
    write_manifest,
    write_tensor,
)
from toolchain.errors import InputShapeError, SelfCheckError, UnsupportedModelError, first_line
from toolchain.onnx_import import TensorInfo
from toolchain.opgraph import op_graph
from toolchain.reference import run_onnxruntime
from toolchain.samples import sample_inputs
from toolchain.settings import PartitionSettings
from toolchain.targets import Compiler, TargetSpec

log = logging.getLogger("agoc.pipeline")


@dataclass(frozen=True)
class CompileRequest:
    model: onnx.ModelProto = field(repr=False)
    model_name: str
    target: TargetSpec
    input_shapes: dict = field(default_factory=dict, hash=False)  # name -> shape overrides
    partition: PartitionSettings = PartitionSettings()
    seed: int = 0  # of the sample inputs
    dump_dir: Path | None = None
    db: Path | None = None  # a tuning database: apply its verified schedules
    joins: str = "latency"  # how a split subgraph is built (pairing.JOIN_RULES; no db: untuned.split_untuned)
    join_builds: tuple[tuple[str, str], ...] = ()  # with db: (join task, "joined" | "minis") overruling ``joins``
    traffic: dict | None = field(default=None, hash=False, repr=False)  # joins traffic:GEO: its judgement (None: db's)
    check: bool = True  # run the built library on the sample inputs before the artifact is written
    untuned: str = "library"  # what kernels without a tuned schedule get (toolchain.tune.untuned.RULES)
    library: Path | None = None  # the record library for untuned="library" (None: the one packaged for the target)
    no_library: bool = False  # untuned="library" without any record library: register blocks, then samples
    samples: dict | None = field(default=None, hash=False, repr=False)  # name -> array: the user's sample inputs


def package_versions() -> dict[str, str]:
    versions = {"agoc": __version__, "python": platform.python_version()}
    for pkg in ("apache-tvm", "apache-tvm-ffi", "onnx", "onnxruntime", "numpy"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "missing"
    return versions


def _dump(dump_dir: Path | None, name: str, mod) -> None:
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / name).write_text(mod.script())


def given_samples(samples: dict, inputs: list[TensorInfo]) -> dict:
    """The user's sample inputs (``--inputs FILE.npz``), one per model input with its shape and dtype;
    :class:`InputShapeError` naming what does not fit."""
    import numpy as np

    names = [i.name for i in inputs]
    extra = sorted(set(samples) - set(names))
    if extra:
        raise InputShapeError(f"sample inputs {', '.join(extra)} are not inputs of the model ({', '.join(names)})")
    feeds = {}
    for info in inputs:
        if info.name not in samples:
            raise InputShapeError(f"no sample input for '{info.name}': give one array per input ({', '.join(names)})")
        value = np.asarray(samples[info.name])
        if value.shape != tuple(info.shape) or value.dtype != np.dtype(info.dtype):
            raise InputShapeError(
                f"sample input '{info.name}' is {value.dtype}{list(value.shape)}, the model takes "
                f"{info.dtype}{list(info.shape)}; give that shape with --input-shape or fix the array")
        feeds[info.name] = value
    return feeds


#: the largest share of this machine's memory one input tensor may take (the build, onnxruntime's reference
#: run and the self-check each hold it and the activations it makes)
INPUT_MEMORY_SHARE = 0.125


def check_sizes(inputs: list[TensorInfo]) -> None:
    """Refuse, before any build, an input too large for this machine to compile and check the model with."""
    import numpy as np
    import psutil

    limit = psutil.virtual_memory().total * INPUT_MEMORY_SHARE
    for info in inputs:
        size = int(np.prod(info.shape, dtype=np.float64)) * np.dtype(info.dtype).itemsize
        if size > limit:
            raise UnsupportedModelError(
                f"input '{info.name}' of shape {'x'.join(map(str, info.shape))} takes {size / 2**30:.1f} GiB, more "
                f"than this machine can build and check it with ({limit / 2**30:.1f} GiB per input); give a smaller "
                "shape with --input-shape")


def poisoned(feeds: dict) -> dict:
    """``feeds`` with every floating-point input NaN: a run on them leaves NaN in whatever memory the model writes,
    so that a later run reading memory it never wrote (a halo a tiled schedule skipped) gives NaN, not what the
    last run happened to leave there."""
    return {name: np.full_like(value, np.nan) if np.issubdtype(np.asarray(value).dtype, np.floating) else value
            for name, value in feeds.items()}


def self_check(artifact: Artifact, feeds: dict, expected: dict, runs_here: bool, device=None) -> dict:
    """Run the staged ``artifact`` on its sample inputs and compare with onnxruntime's ``expected``
    outputs (verify's tolerances): in this process for a host target (after a run on :func:`poisoned` inputs), on
    ``device`` (a Device of
    toolchain.verify) otherwise, if one is given. The record for the manifest; :class:`SelfCheckError` naming every
    output over tolerance."""
    from toolchain.runtime import VMSession
    from toolchain.verify import compare, tolerance

    if device is None and not runs_here:
        return {"status": "unchecked", "reason": f"nothing here runs {artifact.target_preset} code (no qemu "
                "device); check it with `agoc verify OUT --device qemu` or on the phone"}
    if device is None:
        names = [t.info.name for t in artifact.manifest.outputs]
        session = VMSession(artifact.library_path, [t.info for t in artifact.manifest.inputs], names)
        session.run(poisoned(feeds))  # its buffers and workspaces hold NaN: a read of one it never wrote shows
        actual = session.run(feeds)
        where = "this machine"
    else:
        actual, where = device.run(artifact, feeds), device.name
    atol, rtol = tolerance(artifact.manifest.target)
    checks = [compare(name, actual[name], ref, atol, rtol) for name, ref in expected.items()]
    failed = [c for c in checks if not c.passed]
    if failed:
        worst = "; ".join(f"'{c.name}': " + (f"shape {list(c.shape)} vs {list(c.ref_shape)}" if c.shape != c.ref_shape
                          else f"max abs error {c.max_abs:.3g} ({c.max_rel:.2g} of its largest value)"
                          + (f", {c.nonfinite} non-finite" if c.nonfinite else "")) for c in failed)
        raise SelfCheckError(
            f"the built library disagrees with onnxruntime on {where} — {worst}; nothing was written. This is a "
            "compiler bug: report it; `--layout NCHW`, `--partition stock` or `--mcpu haswell` may avoid it, and "
            "`--no-check` writes the artifact anyway")
    return {"status": "passed", "device": where, "atol": atol, "rtol": rtol,
            "max_abs": max((c.max_abs for c in checks), default=0.0),
            "max_rel": max((c.max_rel for c in checks), default=0.0)}


def compile_model(
    request: CompileRequest,
    compiler: Compiler,
    out_dir: Path,
    on_stage: Callable[[str], None] = lambda stage: None,
    device=None,
) -> Artifact:
    """Compile ``request.model`` into an artifact directory at ``out_dir``, self-checked against
    onnxruntime before it is written (on ``device`` for a target this machine does not run). A build
    whose untuned kernels' schedules fail the self-check is built again: the library's re-fitted schedules replaced by
    samples, then every untuned kernel plain."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    check_replaceable(out_dir)
    check_writable(out_dir)
    tuned = _tuning_db(request)
    mod, inputs = _import(request, on_stage)
    _check_legalized_as_tuned(request, tuned, mod)
    plan, partition_record = _partition(request, mod, on_stage)
    fused = _fuse(request, mod, plan, on_stage)
    built = _schedule(request, fused, on_stage)
    asked, fell_back = request.untuned, []
    while True:
        try:
            return _assemble(request, compiler, out_dir, built, inputs, partition_record, started, on_stage, device)
        except SelfCheckError as exc:
            sources = {k.schedule for k in built[1]}
            if not sources & {"library", "block", "rows", "sampled"}:
                raise
            # the library's schedules and register blocks first give way to samples, then every untuned kernel plain
            rule = "sampled" if sources & {"library", "block", "rows"} and request.untuned == "library" else "plain"
            log.warning("the self-check failed with the untuned kernels scheduled (--untuned %s): building them %s "
                        "(%s)", request.untuned, rule, first_line(exc))
            on_stage(f"the self-check failed: building the untuned kernels {rule}")
            fell_back.append({"from": request.untuned, "why": first_line(exc)})
            request = dataclasses.replace(request, untuned=rule)
            mod, kernels, tuning_record, untuned_record = _schedule(request, fused, on_stage)
            untuned_record = {**untuned_record, "asked": asked, "fell_back": fell_back,
                              **({"why_plain": first_line(exc)} if rule == "plain" else {})}
            built = (mod, kernels, tuning_record, untuned_record)


def _assemble(request: CompileRequest, compiler: Compiler, out_dir: Path, built: tuple, inputs: list[TensorInfo],
              partition_record: dict, started: float, on_stage: Callable[[str], None], device) -> Artifact:
    """Build the scheduled module, write the artifact beside ``out_dir`` and move it in once self-checked."""
    mod, kernels, tuning_record, untuned_record = built
    with staged_directory(out_dir) as staging:
        on_stage(f"building for {request.target.preset} with {Path(compiler.path).name}")
        build.build_library(mod, request.target, compiler, staging / LIBRARY)
        on_stage("computing reference outputs with onnxruntime")
        feeds, expected, in_files, out_files = _reference_data(request, inputs, staging)
        manifest = Manifest(
            model_name=request.model_name,
            model_sha256=onnx_import.model_hash(request.model),
            op_counts=onnx_import.op_counts(request.model),
            inputs=tuple(in_files),
            outputs=tuple(out_files),
            target=request.target.to_json(),
            compiler=compiler.to_json(),
            partition=request.partition.method,
            partition_info=partition_record,
            kernels=tuple(k.to_json() for k in kernels),
            tuning=tuning_record,
            untuned=untuned_record,
            versions=package_versions(),
            sample_seed=request.seed,
            compile_seconds=round(time.perf_counter() - started, 3),
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            library_sha256=file_sha256(staging / LIBRARY),
        )
        write_manifest(staging, manifest)
        if request.check:
            on_stage("checking the built library against onnxruntime")
            record = self_check(Artifact(staging, manifest), feeds, expected, request.target.runs_on_host, device)
        else:
            record = {"status": "skipped", "reason": "--no-check"}
        manifest = dataclasses.replace(manifest, check=record)
        write_manifest(staging, manifest)
    log.info("compiled %s for %s into %s", request.model_name, request.target.preset, out_dir)
    return Artifact(out_dir, manifest)


def _tuning_db(request: CompileRequest):
    """The tuning database the build applies (None without ``--db``), refused when made in another layout."""
    if request.db is None:
        return None
    from toolchain.tune.db import TuneDB

    tuned = TuneDB(request.db)
    made = tuned.activation_layout
    if made != request.target.layout:
        raise UnsupportedModelError(
            f"{request.db} was tuned in layout {made}; compile with --layout {made} "
            "(its kernels are not this layout's)")
    return tuned


def _import(request: CompileRequest, on_stage: Callable[[str], None]) -> tuple[object, list[TensorInfo]]:
    """Check the model and its input sizes, import it into Relax and legalize it (a dump after each)."""
    on_stage("checking model")
    inputs = frontend.checked_inputs(request.model, dict(request.input_shapes))
    check_sizes(inputs)

    on_stage("importing into Relax")
    mod = onnx_import.to_relax(request.model, inputs)
    _dump(request.dump_dir, "01_imported.py", mod)

    on_stage("legalizing")
    mod = build.legalize(mod, request.target)
    _dump(request.dump_dir, "02_legalized.py", mod)
    return mod, inputs


def _check_legalized_as_tuned(request: CompileRequest, tuned, mod) -> None:
    """Refuse a database whose kernels were legalized otherwise (what was done, not the flag: a model with
    nothing to pad or no transcendental op is the same either way)."""
    if tuned is None:
        return
    recorded = [  # (recorded, done here, {value: (tuned ..., flag)})
        (tuned.channel_padding, padding.applied(mod), {True: ("with padded output channels", "--pad-channels"),
                                                       False: ("without padded output channels", "--no-pad-channels")}),
        (tuned.fast_math, fastmath.applied(mod), {True: ("with fast transcendental functions", "--fast-math"),
                                                  False: ("with exact transcendental functions", "--exact-math")}),
        (tuned.winograd, winograd.applied(mod), {True: ("with Winograd 3×3 convs", "--winograd"),
                                                 False: ("with direct 3×3 convs", "--direct-conv")}),
    ]
    for was, now, words in recorded:
        if was != now:
            raise UnsupportedModelError(f"{request.db} was tuned {words[was][0]}; compile with {words[was][1]} "
                                        "(its kernels are not these)")


def _partition(request: CompileRequest, mod, on_stage: Callable[[str], None]) -> tuple[object, dict]:
    """(the checked partition plan, the manifest's record of it)."""
    padded_ops = padding.applied_ops(mod)
    on_stage(f"partitioning ({request.partition.method})")
    graph = op_graph(mod)
    plan = partition.plan(request.partition, mod, request.target, graph)
    ago_db = request.db is not None and request.partition.method == "ago"
    unfused: list[dict] = []
    if ago_db:
        from toolchain.tune.apply import unfuse_slower

        plan, unfused = unfuse_slower(plan, request.db, request.joins, dict(request.join_builds), request.traffic)
    elif request.partition.method == "ago" and request.untuned != "plain" and request.joins != "joined":
        from toolchain.tune.untuned import row_block_groups, split_untuned

        keep = row_block_groups(mod, graph, plan, request.target) if request.untuned == "library" else frozenset()
        plan, unfused = split_untuned(graph, plan, keep=keep)
    partition.check(graph, plan)
    return plan, {
        "method": plan.method,
        "threshold": plan.threshold,
        "keep_inside": plan.settings.locality_unit,  # the locality unit (bytes), under its flag's name
        "settings": plan.settings.to_json(),  # as session.json records them
        **partition.stats(graph, plan),
        "groups": [list(g) for g in plan.groups],
        **({"joins": request.joins} if ago_db else {}),
        "unfused": unfused,  # subgraphs built as their minis, and why (the joins rule above)
        "padded": padded_ops,  # ops computing padded output channels, and why (toolchain/padding.py)
    }


def _fuse(request: CompileRequest, mod, plan, on_stage: Callable[[str], None]):
    """The module with one kernel per partition group, not yet scheduled."""
    on_stage(f"fusing {len(plan.groups)} subgraphs")
    if request.partition.method == "stock":
        mod = build.fuse_stock(mod, request.target)
    else:
        mod = fusion.fuse_groups(mod, plan.groups, request.target)
    _dump(request.dump_dir, "03_fused.py", mod)
    return mod


def _schedule(request: CompileRequest, mod, on_stage: Callable[[str], None]) -> tuple[object, list, dict | None, dict]:
    """(the fused module with the database's verified schedules applied and the other kernels scheduled by
    ``request.untuned``; its kernels; the manifest's record of the tuning, None without a database; and of
    the untuned kernels)."""
    from toolchain.tune import untuned

    tasks: dict[str, str] = {}
    tuning_record = None
    if request.db is not None:
        from toolchain.tune.apply import apply_verified

        on_stage("applying tuned schedules")
        count = len(build.built_kernels(mod, request.target))
        mod, applied, tasks = apply_verified(mod, request.db, request.target)
        tuning_record = {"db": str(request.db), "applied": applied, "kernels": count}
    library = _library(request) if request.untuned == "library" else None
    on_stage(f"scheduling the untuned kernels ({request.untuned})")
    mod, fallbacks = untuned.schedule_untuned(mod, request.target, request.untuned, library, request.seed)
    given = {f.kernel: f.source for f in fallbacks}

    def bare(name: str) -> str:  # a kernel whose weights were pre-packed is renamed …_prepacked
        return name.removesuffix("_prepacked")

    kernels = [dataclasses.replace(k, task=tasks.get(k.name) or tasks.get(bare(k.name)),
                                   schedule=given.get(bare(k.name), "tuned"))
               for k in build.built_kernels(mod, request.target)]
    _dump(request.dump_dir, "04_scheduled.py", mod)
    counts = collections.Counter(k.schedule for k in kernels if k.schedule != "tuned")
    untuned_record = {"rule": request.untuned, "library": str(library.path) if library is not None else None,
                      "counts": dict(counts.most_common()),
                      "given": [f.to_json() for f in fallbacks if f.detail]}  # library records used; why plain
    return mod, kernels, tuning_record, untuned_record


def _library(request: CompileRequest):
    """The record library the untuned kernels' schedules come from: ``request.library``, else the one
    packaged for the target (None when there is none, or ``request.no_library``)."""
    from toolchain.tune.library import Library, default_for

    path = None if request.no_library else request.library or default_for(request.target)
    if path is None:
        return None
    found = Library.load(path)
    found.check(request.target)
    return found


def _reference_data(request: CompileRequest, inputs: list[TensorInfo], staging: Path):
    """The sample inputs and onnxruntime's outputs for them, written into ``staging`` with the model:
    (feeds, expected, input files, output files)."""
    model = request.model
    feeds = given_samples(request.samples, inputs) if request.samples else sample_inputs(model, inputs, request.seed)
    expected = run_onnxruntime(model, feeds)
    in_files = []
    for i, info in enumerate(inputs):
        rel = f"data/input_{i}.bin"
        write_tensor(staging / rel, feeds[info.name])
        in_files.append(TensorFile(info, rel))
    out_files = []
    for i, (name, value) in enumerate(expected.items()):
        rel = f"data/expected_{i}.bin"
        write_tensor(staging / rel, value)
        out_files.append(TensorFile(TensorInfo(name, tuple(value.shape), value.dtype.name), rel))
    onnx.save(model, str(staging / MODEL_COPY))
    return feeds, expected, in_files, out_files
