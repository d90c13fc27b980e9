"""Kernels without a tuned schedule (toolchain/tune/untuned.py): the record library's nearest schedule
re-fitted, else a sample of the search space; checked, deterministic, and dropped when the model's
self-check fails with them."""

import json

import numpy as np
import pytest

import models
from tests.toolchain.test_library import DW, PW, SPEC, _database, _kernels
from toolchain import build, onnx_import
from toolchain.errors import SelfCheckError
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.targets import find_compiler
from toolchain.tune import library, untuned
from toolchain.tune.plan import group_kernels
from toolchain.tune.settings import TuningError
from toolchain.tune.traces import plain, unroll_of


def _fused(shape):
    model = models.build("tiny-dwsep", shape)
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    return model, build.fuse_stock(mod, SPEC)


def _run(mod, x):
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    vm = relax.VirtualMachine(build.lower_and_compile(mod, SPEC.tvm(), cpu, ""), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """A library of tiny-dwsep's pointwise and depthwise convs at 8×8 (one verified record each)."""
    root = tmp_path_factory.mktemp("untuned")
    return library.build([_database(root / "db", _kernels((1, 8, 8, 8)), {PW: 0.05, DW: 0.02})], root / "lib")


def test_untuned_kernels_get_the_librarys_schedule_refitted_else_a_sample_and_compute_the_same(lib, tmp_path,
                                                                                               monkeypatch):
    """At 12×12 with 16 channels (no record of it anywhere) the pointwise and depthwise convs get their register
    blocks, the other kernels a block or a sample of the space; without blocks, the library's schedules re-fitted.
    Every kernel is scheduled (parallel loops) and the model computes what the unscheduled one does either way. At
    8×8 the library's own records of the convs come before the blocks."""
    _, mod = _fused((1, 16, 12, 12))
    x = np.random.default_rng(0).standard_normal((1, 16, 12, 12)).astype("float32")
    out, given = untuned.schedule_untuned(mod, SPEC, "library", lib)
    sources = {f.kernel: f.source for f in given}
    assert sources[PW] == "block" and sources[DW] == "block"
    assert set(sources.values()) <= {"library", "block", "sampled"} and len(sources) == len(group_kernels(mod))
    np.testing.assert_allclose(_run(out, x), _run(mod, x), rtol=1e-4, atol=1e-5)
    monkeypatch.setitem(untuned.ORDER, "library", tuple(o for o in untuned.ORDER["library"] if o[1] != "block"))
    out, given = untuned.schedule_untuned(mod, SPEC, "library", lib)
    sources = {f.kernel: f.source for f in given}
    assert sources[PW] == "library" and sources[DW] == "library"
    assert {f.detail for f in given if f.source == "library"} == {f"{'a' * 8}/{PW}-0", f"{'a' * 8}/{DW}-0"}
    assert set(sources.values()) <= {"library", "sampled"}
    assert all(untuned._is_scheduled(f) for _, f in group_kernels(out))
    assert "parallel" in out.script()
    np.testing.assert_allclose(_run(out, x), _run(mod, x), rtol=1e-4, atol=1e-5)
    monkeypatch.undo()
    _, mod = _fused((1, 8, 8, 8))  # the library's kernels as a tune leaves them: weights marked for pre-packing
    marked = {name: f for name, f in group_kernels(build.mark_weights(mod)) if name in (PW, DW)}
    own = library.build([_database(tmp_path / "db", marked, {PW: 0.05, DW: 0.02})], tmp_path / "lib")
    sources = {f.kernel: f.source for f in untuned.schedule_untuned(mod, SPEC, "library", own)[1]}
    assert sources[PW] == "library" and sources[DW] == "library"


def test_the_same_kernels_get_the_same_schedules_and_plain_leaves_them_alone(lib):
    import tvm_ffi

    _, mod = _fused((1, 16, 12, 12))
    first, _ = untuned.schedule_untuned(mod, SPEC, "sampled")
    again, given = untuned.schedule_untuned(mod, SPEC, "sampled")
    assert tvm_ffi.structural_equal(first, again)
    assert {f.source for f in given} == {"sampled"}
    other, _ = untuned.schedule_untuned(mod, SPEC, "sampled", seed=1)
    assert not tvm_ffi.structural_equal(first, other)  # the seed draws other tiles
    same, given = untuned.schedule_untuned(mod, SPEC, "plain", lib)
    assert same is mod and {f.source for f in given} == {"plain"}
    for _, func in group_kernels(mod):  # no sample unrolls deeper than the cap (deeper ones build for minutes)
        trace = plain(untuned.sampled(func, SPEC, 0).trace.as_json())
        assert (unroll_of(trace) or 0) <= untuned.MAX_SAMPLED_UNROLL
    with pytest.raises(TuningError, match="choose one of: library, sampled, plain"):
        untuned.schedule_untuned(mod, SPEC, "fastest")


def test_a_compile_records_each_kernels_schedule_and_builds_plain_when_the_self_check_fails(tmp_path, monkeypatch):
    """The manifest says what each kernel got; a model whose self-check fails with its untuned kernels
    scheduled is built again with them plain, and says why."""
    import toolchain.pipeline as pipeline

    model, _ = _fused((1, 8, 8, 8))
    request = CompileRequest(model, "tiny-dwsep", SPEC, partition=pipeline.PartitionSettings(method="stock"),
                             untuned="sampled")
    artifact = compile_model(request, find_compiler(SPEC), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["untuned"]["rule"] == "sampled" and manifest["untuned"]["counts"] == {
        "sampled": len(manifest["kernels"])}
    assert {k["schedule"] for k in manifest["kernels"]} == {"sampled"} and manifest["untuned"]["given"] == []
    assert artifact.manifest.check["status"] == "passed"

    real = pipeline.self_check

    def fails_when_scheduled(artifact, *args, **kw):
        if any(k.get("schedule") == "sampled" for k in artifact.manifest.kernels):
            raise SelfCheckError("output differs (max abs 1.0)")
        return real(artifact, *args, **kw)

    monkeypatch.setattr(pipeline, "self_check", fails_when_scheduled)
    artifact = compile_model(request, find_compiler(SPEC), tmp_path / "b")
    record = artifact.manifest.untuned
    assert record["rule"] == "plain" and record["asked"] == "sampled" and "max abs 1.0" in record["why_plain"]
    assert {k["schedule"] for k in artifact.manifest.kernels} == {"plain"}
    assert {g["detail"] for g in record["given"]} == {"--untuned plain"}
    assert artifact.manifest.check["status"] == "passed"


def test_without_a_database_an_ago_join_is_built_as_its_minis_unless_asked_for_joined(tmp_path):
    """A join's untuned schedule is a random sample of its space; its minis' are the library's: compiled without
    a database, each subgraph of several reducing ops is built as its minis (the manifest says why); ``joins=
    "joined"`` keeps the joins, and ``--untuned plain`` builds what the partition says."""
    import toolchain.pipeline as pipeline

    model = models.build("tiny-dwsep")  # one AGO subgraph: pw → dw → pw
    ago = pipeline.PartitionSettings(method="ago", threshold=1e9)
    minis = compile_model(CompileRequest(model, "tiny-dwsep", SPEC, partition=ago, untuned="sampled"),
                          find_compiler(SPEC), tmp_path / "minis")
    (record,) = minis.manifest.partition_info["unfused"]
    assert record["minis"] == 3 and "no tuning database" in record["reason"]
    convs = [k for k in minis.manifest.kernels if "conv" in k["name"]]
    assert len(convs) == 3 and minis.manifest.check["status"] == "passed"
    for name, untuned_rule, joins in (("joined", "sampled", "joined"), ("plain", "plain", "latency")):
        kept = compile_model(CompileRequest(model, "tiny-dwsep", SPEC, partition=ago, untuned=untuned_rule,
                                            joins=joins), find_compiler(SPEC), tmp_path / name)
        assert kept.manifest.partition_info["unfused"] == []
        assert len([k for k in kept.manifest.kernels if "conv" in k["name"]]) == 1, name


def _spatial(size: int):
    """A model of one 3×3 conv of 16 → 32 channels (+ bias, ReLU) at ``size`` × ``size``, fused."""
    from models.builder import GraphBuilder

    g = GraphBuilder("spatial", seed=5)
    x = g.input("input", (1, 16, size, size))
    model = g.finish(g.conv(x, 16, 32, 3, name="conv3", act="relu"), (1, 32, size, size))
    return build.fuse_stock(build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC),
                            SPEC)


def test_a_spatial_conv_gets_its_register_block_before_the_librarys_refitted_records(tmp_path):
    """A 3×3 conv at 12 × 12 whose like at 8 × 8 the library holds: its register block (the padding a pass before
    it), not the library's record re-fitted — and it computes what the unscheduled one does."""
    kernels = {name: f for name, f in group_kernels(_spatial(8)) if "conv2d" in name}
    lib = library.build([_database(tmp_path / "db", kernels, dict.fromkeys(kernels, 0.05))], tmp_path / "lib")
    mod = _spatial(12)
    out, given = untuned.schedule_untuned(mod, SPEC, "library", lib)
    (conv,) = [f for f in given if "conv2d" in f.kernel]
    from toolchain.tune.microkernel import unit_of

    lanes = unit_of(SPEC.tvm()).lanes  # 16 with AVX-512, 8 with AVX2 (32 output channels: whole vectors either way)
    assert conv.source == "block" and conv.detail.endswith(f"×{lanes}")
    x = np.random.default_rng(1).standard_normal((1, 16, 12, 12)).astype("float32")
    np.testing.assert_allclose(_run(out, x), _run(mod, x), rtol=1e-4, atol=1e-5)


def test_a_pair_kept_together_for_the_cache_is_built_as_its_minis_without_a_database():
    """--keep-inside (an ARM target's default) makes a pw → dw pair (here with the project conv, a chain) one unit
    that AGO's clustering never splits; without a tuning database it is still built as its minis (its joined
    schedule would be a sample)."""
    from toolchain import partition
    from toolchain.opgraph import op_graph
    from toolchain.settings import PartitionSettings

    model = models.build("tiny-dwsep", (1, 8, 32, 32))
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    graph = op_graph(mod)
    kept = partition.plan(PartitionSettings(threshold=1.0, locality_unit=64 * 1024), mod, SPEC, graph)
    pairs = [g for g in kept.groups if len(graph.reducing_ids.intersection(g)) == 3]
    assert pairs  # kept together, although Td 1 merges nothing
    split, records = untuned.split_untuned(graph, kept)
    assert all(len(graph.reducing_ids.intersection(g)) <= 1 for g in split.groups) and len(records) == len(pairs)
    partition.check(graph, split)


def test_a_transformers_attention_is_register_blocked_and_its_norms_and_softmax_row_scheduled(tmp_path):
    """tiny-transformer compiled without a database: the weight matmuls and the attention's batch matmuls of two
    activations take the register block, the softmax and the layer norm the row schedule; nothing is left to a
    sample, and the model checks against onnxruntime."""
    model = models.build("tiny-transformer")
    artifact = compile_model(CompileRequest(model, "tiny-transformer", SPEC, no_library=True),
                             find_compiler(SPEC), tmp_path / "a")
    schedules = {k["name"]: k["schedule"] for k in artifact.manifest.kernels}
    assert {s for n, s in schedules.items() if "softmax" in n or "layer_norm" in n} == {"rows"}
    assert {s for n, s in schedules.items() if "matmul" in n} == {"block"}
    assert sum("prepacked" not in n and "matmul" in n for n in schedules) >= 2  # Q·Kᵀ and softmax·V
    assert artifact.manifest.check["status"] == "passed"
