"""Concatenations written in place (toolchain/concat.py): one copy block per input, the kernel's own conv storing
its outputs straight into its slice of the result."""

import numpy as np
import pytest

import models
from tests.toolchain.kernels import run_kernel
from toolchain import build, concat, onnx_import, partition
from toolchain.fusion import fuse_groups
from toolchain.opgraph import op_graph
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune import microkernel as mk
from toolchain.tune.adapter import postprocess
from toolchain.tune.plan import block_names, group_kernels
from toolchain.tune.race_check import parallel_races

HOST = resolve_target("host")


def _run(func, seed: int = 0) -> list[np.ndarray]:
    return run_kernel(func, HOST.tvm(), seed)


def _topi_concat(*channels: int):
    from tvm import te, topi

    xs = [te.placeholder((1, 4, 5, c), name=f"x{i}") for i, c in enumerate(channels)]
    return te.create_prim_func([*xs, topi.concatenate(xs, axis=3)])


def test_a_concatenation_becomes_one_copy_per_input_in_the_order_asked_computing_the_same():
    func = _topi_concat(8, 24, 4)
    found = concat.concat_of(func)
    assert found == concat.Concat(3, ((1, 4, 5, 8), (1, 4, 5, 24), (1, 4, 5, 4)), "float32", found.index_dtype)
    assert found.offsets == [0, 8, 32] and found.shape == (1, 4, 5, 36)
    copies = concat.in_place(found, (1, 2, 0))
    assert block_names(copies) == ["T_concat_1", "T_concat_2_view", "T_concat_2", "T_concat_0_view", "T_concat_0"]
    expect, got = _run(func), _run(copies)
    np.testing.assert_array_equal(got[-1], np.concatenate(got[:3], axis=3))
    np.testing.assert_array_equal(got[-1], expect[-1])


def test_only_concatenations_are_recognised():
    from tvm import te, topi

    x = te.placeholder((2, 8), name="x")
    assert concat.concat_of(te.create_prim_func([x, topi.nn.relu(x)])) is None
    y = te.placeholder((2, 8), name="y")
    assert concat.concat_of(te.create_prim_func([x, y, x + y])) is None  # three buffers, no axis stacked


@pytest.fixture(scope="module")
def fire_kernels():
    """SqueezeNet-1.1 @64 in AGO's kernels and the reformer's minis: {name: PrimFunc}."""
    from toolchain import reform

    model = models.build("squeezenet-1.1", (1, 3, 64, 64))
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), HOST)
    graph = op_graph(mod)
    plan = partition.plan(PartitionSettings(), mod, HOST, graph=graph)
    split = reform.split_plan(graph, plan)
    return {**dict(group_kernels(fuse_groups(mod, split.plan.groups, HOST))),
            **dict(group_kernels(fuse_groups(mod, plan.groups, HOST)))}


@pytest.mark.parametrize("channels, piece", [
    ((64, 64), 64), ((16, 32, 16), 16), ((8, 16, 8), 8), ((8,) * 9, None),  # 9 pieces: more than MAX_PIECES
    ((3, 5), 1), ((3, 61), None)])
def test_a_concatenation_along_the_last_axis_is_read_in_pieces_each_within_one_input(channels, piece):
    from tvm import s_tir

    sch = s_tir.Schedule(_topi_concat(*channels))
    assert concat.piece_of(sch.get(sch.get_sblock(concat.CONCAT_BLOCK))) == piece


def test_a_concatenation_along_another_axis_or_a_copy_is_not_read_in_pieces():
    from tvm import s_tir, te, topi

    xs = [te.placeholder((1, 4, 5, 8), name=f"x{i}") for i in range(2)]
    sch = s_tir.Schedule(te.create_prim_func([*xs, topi.concatenate(xs, axis=2)]))
    assert concat.piece_of(sch.get(sch.get_sblock(concat.CONCAT_BLOCK))) is None
    copy = te.compute((1, 4, 5, 8), lambda *i: xs[0][i], name="copy")
    sch = s_tir.Schedule(te.create_prim_func([xs[0], copy]))
    assert concat.piece_of(sch.get(sch.get_sblock("copy"))) is None


def test_a_fire_modules_conv_stores_into_its_slice_of_the_concatenation(fire_kernels):
    """A kernel of one conv whose result is the concatenation of its output and another kernel's: the copy of its
    own output right after its epilogue, reverse-inlined into the register block's write-back (no buffer of the
    conv's output left), the other input's copy a pass of its own; the same numbers as the unscheduled kernel."""
    found = {n: f for n, f in fire_kernels.items() if n.count("conv2d") == 1 and mk.matmul_like(f) is not None
             and any(b.startswith(f"{concat.CONCAT_BLOCK}_") for b in block_names(f))}
    assert found, sorted(fire_kernels)
    for name, func in found.items():
        blocks = block_names(func)
        copies = [b for b in blocks if b.startswith(concat.CONCAT_BLOCK)]
        assert len(copies) == 3 and concat.is_view(copies[1]) and concat.CONCAT_BLOCK not in blocks, blocks
        kernel = mk.matmul_like(func)
        assert kernel.epilogue[-1] == copies[0] and kernel.rest == (copies[1],), (name, kernel)
        sch, why = mk.register_block(func, HOST.tvm(), spatial=True)
        assert sch is not None, (name, why)
        sch = postprocess(sch, HOST)
        assert sch is not None and parallel_races(sch.mod) == [], name
        own = _reads(func, copies[0])  # the epilogue's result, which the copy read
        assert own <= _allocated(func) and not own & _allocated(sch.mod["main"]), (name, own)
        np.testing.assert_allclose(_run(sch.mod["main"])[-1], _run(func)[-1], rtol=1e-5, atol=1e-5)


def _reads(func, block: str) -> set[str]:
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return {r.source.name for r in sch.get(sch.get_sblock(block)).reads}


def _allocated(func) -> set[str]:
    """Names of the buffers ``func``'s blocks (the root's too) allocate."""
    from tvm import s_tir

    from toolchain.tune.schedule_check import _blocks

    root = [func.body.block] if isinstance(func.body, s_tir.SBlockRealize) else []
    return {b.name for block in [*root, *_blocks(func)] for b in block.alloc_buffers}


def test_a_join_computing_two_inputs_keeps_its_concatenation_and_still_composes_onto_its_minis():
    """A fire module's join computes both expand convs: its concatenation stays one select block (a schedule that
    inlines into a view's copy makes it a second writer of the result), while the mini of one expand conv writes
    it in place. AGO's reformer still seeds the join block by block from its minis: every mini maps, its copies
    onto nothing."""
    from toolchain.tune.plan import plan_tasks
    from toolchain.tune.settings import TuneSettings

    model = models.build("squeezenet-1.1", (1, 3, 64, 64))
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), HOST)
    _, plan = plan_tasks(mod, op_graph(mod), HOST, TuneSettings(trials=64))
    joins = {j: c for j, c in plan.compositions.items() if "concatenate" in j}
    assert joins, sorted(plan.compositions)
    in_place = 0
    for join, minis in joins.items():
        assert concat.CONCAT_BLOCK in block_names(plan.funcs[join]), join
        assert all(mapping for _, mapping in minis), (join, minis)
        for mini, mapping in minis:
            copies = [b for b in block_names(plan.funcs[mini]) if b.startswith(f"{concat.CONCAT_BLOCK}_")]
            in_place += bool(copies)
            assert not set(copies) & set(mapping), (join, mini, mapping)
    assert in_place, joins


def _conv_concat_input():
    """A 3×3 conv, a 1×1 conv, their output concatenated with the model's input: AGO's join computes one input."""
    from models.builder import GraphBuilder

    g = GraphBuilder("conv-concat-input")
    x = g.input("x", (1, 16, 20, 20))
    a = g.conv(x, 16, 32, 3, name="a", act="relu")
    b = g.conv(a, 32, 48, 1, name="b", act="relu")
    return g.finish(g.concat([b, x], name="out"), (1, 64, 20, 20))


def test_a_join_computing_one_input_writes_it_in_place_and_its_minis_copies_map_onto_its_own():
    """Groups chosen by hand: conv a, conv b and the concatenation of b with the model's input (the join computes
    one input: written in place), and its minis (conv a; conv b + the concatenation, in place too)."""
    from toolchain.tune.plan import map_blocks

    model = _conv_concat_input()
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), HOST)
    graph = op_graph(mod)
    ids = [n.id for n in graph.nodes]
    kinds = [n.func for n in graph.nodes]
    at = kinds.index(next(k for k in kinds if k.startswith("concatenate")))
    first = kinds.index(next(k for k in kinds if k.startswith("conv2d")))
    second = kinds.index(next(k for k in kinds[first + 1:] if k.startswith("conv2d")))
    rest = [[i] for i in ids[:first] + ids[at + 1:]]
    join, mini_a, mini_b = tuple(ids[first:at + 1]), tuple(ids[first:second]), tuple(ids[second:at + 1])
    joined = dict(zip([join], [f for _, f in group_kernels(fuse_groups(mod, [*rest[:first], join, *rest[first:]],
                                                                           HOST))][first:first + 1]))
    minis = [f for _, f in group_kernels(fuse_groups(mod, [*rest[:first], mini_a, mini_b, *rest[first:]], HOST))]
    split = {mini_a: minis[first], mini_b: minis[first + 1]}
    copies = [b for b in block_names(joined[join]) if b.startswith(f"{concat.CONCAT_BLOCK}_")]
    assert len(copies) == 3 and concat.is_view(copies[1]), block_names(joined[join])
    assert [b for b in block_names(split[mini_b]) if b.startswith(f"{concat.CONCAT_BLOCK}_")] == copies
    mapping = map_blocks(graph, mini_b, join, split[mini_b], joined[join])
    assert {k: v for k, v in mapping.items() if k in copies} == {b: b for b in copies}, mapping
    assert len(mapping) == len(block_names(split[mini_b]))
    assert len(map_blocks(graph, mini_a, join, split[mini_a], joined[join])) == len(block_names(split[mini_a]))


def test_squeezenet_with_its_concatenations_in_place_matches_onnxruntime(tmp_path):
    from host.devices import LocalDevice
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler
    from toolchain.verify import verify_artifact

    model = models.build("squeezenet-1.1", (1, 3, 64, 64))
    artifact = compile_model(CompileRequest(model, "squeezenet-1.1", HOST), find_compiler(HOST), tmp_path / "a")
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed and all(o.max_rel < 1e-4 for o in report.outputs), report.to_json()
