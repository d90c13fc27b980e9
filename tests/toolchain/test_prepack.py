"""Weights pre-packed: a kernel's constant weights are layout-free, a schedule may rewrite their layout,
and the rewrite is done once at build time, not on every call."""

import numpy as np
import pytest

import models
from toolchain import build, onnx_import
from toolchain.reference import run_onnxruntime
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune.adapter import postprocess, space_for, workload_module
from toolchain.tune.apply import apply_verified
from toolchain.tune.db import TuneDB
from toolchain.tune.intrinsics import tune_context
from toolchain.tune.plan import group_kernels, task_name
from toolchain.tune.settings import SCHEMA, Task, TuneSettings
from toolchain.tune.traces import plain

SPEC = resolve_target("host")


@pytest.fixture(scope="module")
def cnn():
    model = models.build("tiny-cnn")
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    return model, build.fuse_stock(mod, SPEC)


def _param_shapes(mod) -> set[tuple[int, ...]]:
    """Shapes of every parameter of the kernels ``main`` calls."""
    return {tuple(int(d) for d in p.ty.shape) for name, _ in build.kernel_calls(mod["main"]) for p in mod[name].params}


def _vector(arg) -> bool:
    import tvm

    return isinstance(arg, tvm.ir.Constant) and sum(1 for d in arg.value.shape if int(d) > 1) <= 1


def test_the_weights_of_every_kernel_are_marked_layout_free(cnn):
    """Every constant float tensor with two or more dimensions longer than 1 (conv and matmul weights);
    biases are read in order anyway, 1-D or broadcast as (1, 1, 1, C) (and rewriting them miscompiled,
    see mark_weights)."""
    import tvm

    _, fused = cnn
    marked = build.mark_weights(fused)
    assert {gv.name_hint for gv in marked.functions} == {gv.name_hint for gv in fused.functions}  # none renamed
    calls = build.kernel_calls(fused["main"])
    assert any(_vector(a) and len(a.value.shape) == 4 for _, args in calls for a in args)  # an NHWC conv's bias
    for name, args in calls:
        constant = [i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant) and not _vector(a)]
        attr = marked[name].attrs.get("layout_free_buffers") if marked[name].attrs else None
        assert ([int(i) for i in attr] if attr is not None else []) == constant, name
        assert 0 not in constant  # the activation a kernel reads is never layout-free
        assert not fused[name].attrs or "layout_free_buffers" not in fused[name].attrs  # the input stays as it was


def _prepacked_db(fused, db_dir):
    """A database tuned with prepack whose one verified schedule (a conv kernel's first design)
    rewrites its weight's layout. The design's tiles are sampled: a fixed ``rand_state`` whose tiling
    stores the weight in a new shape (some draws tile it back into the shape it had)."""

    marked = build.mark_weights(fused)
    name, func = next((n, f) for n, f in group_kernels(marked) if "conv2d" in n)
    ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(),
                       space_generator=space_for(func, SPEC, False).generator, num_threads=1, rand_state=0)
    sch = postprocess(ctx.generate_design_space()[0], SPEC)
    assert "meta_schedule.layout_rewrite_preproc" in sch.mod["main"].script()
    db = TuneDB(db_dir)
    db.open_session({"schema": SCHEMA, "model_sha256": "0" * 64, "target": SPEC.tvm_target, "layout": SPEC.layout,
                     "settings": TuneSettings().to_json()})
    task = task_name(name, func)
    db.save_tasks([Task(task, "kernel", (), None, 1.0, 16)])
    db.save_verified({task: {"status": "verified", "trace": plain(sch.trace.as_json()), "latency_ms": 0.1}})
    return name


def test_a_rewritten_weight_is_folded_at_build_time_and_the_model_still_matches_onnxruntime(cnn, tmp_path):
    """A database tuned with prepack holds a schedule whose weight layout is rewritten inside the
    kernel; compiling with it stores the weight rewritten (a new constant) and leaves no rewrite
    block in any kernel — and the model computes what onnxruntime does."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    model, fused = cnn
    _prepacked_db(fused, tmp_path)
    out, applied, _ = apply_verified(fused, tmp_path, SPEC)
    assert applied == 1
    assert "layout_rewrite_preproc" not in out.script()
    assert _param_shapes(out) - _param_shapes(fused)  # the weight, stored in the schedule's order
    prim = {gv.name_hint for gv, f in out.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert prim == {k.name for k in build.kernels(out)}  # the folded rewrite kernels are not built

    (info,) = onnx_import.resolve_inputs(model, {})
    x = np.random.default_rng(0).standard_normal(info.shape).astype("float32")
    expected = next(iter(run_onnxruntime(model, {info.name: x}).values()))
    vm = relax.VirtualMachine(build.lower_and_compile(out, SPEC.tvm(), cpu, ""), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_database_tuned_without_prepack_compiles_with_the_weights_as_they_are(cnn, tmp_path):
    _, fused = cnn
    name, func = group_kernels(fused)[0]
    db = TuneDB(tmp_path)
    db.open_session({"schema": SCHEMA, "model_sha256": "0" * 64, "target": SPEC.tvm_target, "layout": SPEC.layout,
                     "settings": TuneSettings(prepack=False).to_json()})
    db.save_tasks([Task(task_name(name, func), "kernel", (), None, 1.0, 16)])
    out, applied, _ = apply_verified(fused, tmp_path, SPEC)
    assert applied == 0 and _param_shapes(out) == _param_shapes(fused)
    assert not any(f.attrs and "layout_free_buffers" in f.attrs for f in out.functions.values()
                   if hasattr(f, "attrs") and type(f).__name__ == "PrimFunc")


def test_an_artifact_lists_its_kernels_by_the_names_they_are_built_under(cnn, tmp_path):
    """A pre-packed kernel is renamed ``…_prepacked`` when its rewrite is split out: the manifest names
    the kernels the library holds (the proxy finds a kernel's cost by its symbol; with the pre-rewrite
    names every kernel read 0), and only kernels it calls (a reshape the lowering turns into a view is
    not one: the proxy would report it not found)."""
    import subprocess

    from toolchain.artifact import LIBRARY
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler

    model, fused = cnn
    name = _prepacked_db(fused, tmp_path / "db")
    request = CompileRequest(model, "tiny-cnn", SPEC, partition=PartitionSettings("stock"), db=tmp_path / "db")
    artifact = compile_model(request, find_compiler(SPEC), tmp_path / "out")
    names = [k["name"] for k in artifact.manifest.kernels]
    assert f"{name}_prepacked" in names and name not in names
    # tiny-cnn's flatten is a kernel in the fused module, but the lowering makes it a view: never called
    assert [n for n in names if n.startswith("reshape")] == [], names
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(artifact.root / LIBRARY)],
                             capture_output=True, text=True, check=True).stdout.split()
    assert all(f"__tvm_ffi_{n}" in symbols for n in names), (names, [s for s in symbols if "fused" in s])
    # each kernel's weights, pre-packed or not, as the model passes them (the proxy's per-kernel floor)
    from host.bench.proxy import weight_bytes

    by_name = {k["name"]: k["weight_bytes"] for k in artifact.manifest.kernels}
    assert by_name[f"{name}_prepacked"] > 0
    assert abs(sum(by_name.values()) - weight_bytes(artifact.model_path)) <= 64


def test_an_index_constant_is_not_a_weight(layer_norm_take):
    """Only floating-point tensors are marked layout-free: the gather's 0-d int64 index is not."""
    import tvm

    fused, (name, args) = layer_norm_take
    kinds = {i: (len(a.value.shape), str(a.value.dtype)) for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant)}
    assert (0, "int64") in kinds.values()
    attrs = build.mark_weights(fused)[name].attrs
    marked = [int(i) for i in attrs["layout_free_buffers"]] if attrs and "layout_free_buffers" in attrs else []
    assert marked == sorted(i for i, (rank, dtype) in kinds.items() if rank > 1 and dtype == "float32")


def test_a_postprocessor_failing_a_tvm_check_gives_no_schedule_not_an_error(layer_norm_take):
    """With the index marked layout-free as well (how the weights were marked before), MetaSchedule's
    RewriteLayout fails a TVM check on some of this kernel's schedules: postprocess then returns
    None, as the search itself treats such a candidate, instead of raising and ending the session."""

    fused, (name, args) = layer_norm_take
    import tvm

    every = [i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant)]
    func = fused[name].with_attr("layout_free_buffers", every)
    results = []
    for seed in range(1, 4):
        ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), rand_state=seed,
                           space_generator=space_for(func, SPEC, False).generator, num_threads=1)
        results += [postprocess(sch, SPEC) is not None for sch in ctx.generate_design_space()]
    assert False in results and True in results
