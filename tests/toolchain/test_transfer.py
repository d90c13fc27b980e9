"""Sibling seeds (toolchain/tune/transfer.py): a kernel's search starts from the verified schedule of a
kernel with the same blocks at other loop extents, re-fitted, measured and checked like any candidate."""

import math
from dataclasses import replace

import pytest

import models
from toolchain import build, onnx_import
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune import transfer
from toolchain.tune.adapter import postprocess, trial_latencies, workload_module
from toolchain.tune.candidates import check_candidate
from toolchain.tune.compose import seed_from_siblings
from toolchain.tune.db import TuneDB
from toolchain.tune.intrinsics import tune_context
from toolchain.tune.plan import TaskPlan, group_kernels
from toolchain.tune.settings import Task, TuneSettings
from toolchain.tune.space import make_space_generator
from toolchain.tune.traces import plain, rename_blocks

SPEC = resolve_target("host")


@pytest.mark.parametrize(
    "factors, extent, max_inner, expected",
    [
        ([2, 4, 8], 64, 0, [2, 4, 8]),  # same extent: the same split
        ([2, 4, 8], 128, 0, [4, 4, 8]),  # larger: the outermost takes what is new
        ([4, 4, 8], 32, 0, [1, 4, 8]),  # smaller
        ([2, 4, 8], 48, 0, [2, 3, 8]),  # 48 = 16 x 3: the largest divisor not above each factor
        ([1, 1, 16], 7, 0, [1, 1, 7]),  # a prime extent
        ([1, 2, 32], 96, 16, [3, 2, 16]),  # the innermost kept under the space's cap
    ],
)
def test_a_tile_split_is_refitted_to_the_new_extent(factors, extent, max_inner, expected):
    got = transfer.refit_tile(factors, extent, max_inner)
    assert got == expected
    assert math.prod(got) == extent


@pytest.mark.parametrize("extent", [1, 7, 12, 56, 96, 384, 960, 1280])
def test_a_refitted_split_always_multiplies_out_to_the_extent(extent):
    for factors in ([1, 1, 1, 1], [4, 2, 7, 8], [16, 1, 1, 64], [1, 24, 2, 4]):
        got = transfer.refit_tile(factors, extent, 64)
        assert math.prod(got) == extent and got[-1] <= 64


def _conv_kernels(shape):
    model = models.build("tiny-dwsep", shape)
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    return dict(group_kernels(build.fuse_stock(mod, SPEC)))


@pytest.fixture(scope="module")
def two_sizes():
    """tiny-dwsep's kernels at two sizes: the same blocks, other loop extents."""
    return _conv_kernels((1, 8, 8, 8)), _conv_kernels((1, 16, 12, 12))


PW1 = "fused_conv2d_add_maximum_minimum"  # tiny-dwsep's expanding pointwise conv (+ bias, ReLU6)


def test_siblings_are_kernels_with_the_same_blocks_nearest_in_extents_first(two_sizes):
    small, large = two_sizes
    near = _conv_kernels((1, 8, 10, 10))
    assert transfer.signature(small[PW1]) == transfer.signature(large[PW1]) == transfer.signature(near[PW1])
    assert transfer.extents(small[PW1]) != transfer.extents(large[PW1])
    candidates = {f"large {n}": f for n, f in large.items()}
    candidates.update({f"near {n}": f for n, f in near.items()})
    candidates.update({f"small {n}": f for n, f in small.items() if n != PW1})  # its dw and project convs
    project = "fused_conv2d2_add1_add2"  # the projecting pointwise conv: bias and the residual add, no ReLU6
    assert transfer.core_signature(small[project]) == transfer.core_signature(small[PW1])
    # the nearest of the same blocks, the nearest of another epilogue, then the same blocks, then the others
    assert transfer.siblings(small[PW1], candidates, 5) == [f"near {PW1}", f"small {project}", f"large {PW1}",
                                                            f"near {project}", f"large {project}"]
    assert transfer.siblings(small[PW1], candidates, 1) == [f"near {PW1}"]
    assert transfer.siblings(small[PW1], candidates, 0) == []


def _conv(cin, cout, size, k):
    from tvm import te, topi

    data = te.placeholder((1, cin, size, size), name="data")
    weight = te.placeholder((cout, cin, k, k), name="weight")
    out = topi.nn.conv2d_nchw(data, weight, 1, k // 2, 1)
    return te.create_prim_func([data, weight, out])


def test_a_1x1_conv_is_no_sibling_of_a_kxk_conv_of_the_same_blocks():
    """Same block names and iterator kinds, but a 3×3 window against a 1×1 one: a pointwise schedule
    is no start for a 3×3 conv (seen: on MobileNet-V2's stem, pointwise seeds ran about 16× slower than its best)."""
    pw, pw2, stem = _conv(16, 32, 14, 1), _conv(32, 64, 7, 1), _conv(3, 32, 56, 3)
    assert [b.block for b in transfer.block_nests(pw)] == [b.block for b in transfer.block_nests(stem)]
    assert transfer.signature(pw) == transfer.signature(pw2) != transfer.signature(stem)
    assert transfer.siblings(stem, {"pw": pw, "pw2": pw2}, 2) == []
    assert transfer.siblings(pw2, {"pw": pw, "stem": stem}, 2) == ["pw"]


def _spaces(func, intensive: bool = False):
    """MetaSchedule's design spaces of the kernel ``func``, as a session generates them without a register block
    (a block's trace is not carried to other kernels: each pointwise conv starts from its own block)."""

    ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), space_generator=make_space_generator(
        func, SPEC.tvm(), intensive, num_cores=SPEC.num_cores, block=False).generator, num_threads=1)
    return ctx.generate_design_space()


def _session_after(src, dst, db_dir):
    """A session's state when it has verified ``src`` (its first design space) and comes to ``dst``:
    the plan, the verified records and the database."""
    sch = postprocess(_spaces(src)[0], SPEC)
    plan = TaskPlan(
    tasks=(Task("src", "kernel", (), None, 1.0, 16), Task("dst", "kernel", (), None, 1.0, 16)),
    funcs={"src": src, "dst": dst}, compositions={})
    verified = {"src": {"status": "verified", "trace": plain(sch.trace.as_json()), "latency_ms": 0.1}}
    return plan, verified, TuneDB(db_dir)


def test_a_schedule_carries_over_to_a_kernel_of_other_extents_and_computes_the_same(two_sizes):
    """A sampled schedule of the small kernel, replayed on the large one with re-fitted splits, builds
    and passes the numeric check against the unscheduled kernel (what verify_task runs)."""
    small, large = two_sizes
    name = PW1
    sch = _spaces(small[name])[0]
    trace = plain(sch.trace.as_json())
    assert any(inst[0] == "SamplePerfectTile" for inst in trace[0])
    moved = transfer.transfer_schedule(workload_module(small[name]), rename_blocks(trace, {}),
                        workload_module(large[name]))
    assert moved is not None

    def splits(sch):
        return [math.prod(int(x) for x in sch.trace.decisions[inst])
                for inst in sch.trace.insts if inst.kind.name == "SamplePerfectTile"]

    # every split multiplies out to one of the large kernel's loop extents, not the small one's
    assert len(splits(moved)) == len(splits(sch))
    assert set(splits(moved)) <= set(transfer.extents(large[name]))
    assert splits(moved) != splits(sch)
    moved = postprocess(moved, SPEC)
    assert moved is not None

    class Record:  # what check_candidate reads of a tuning record
        trace = moved.trace

    assert check_candidate(large[name], Record(), SPEC)["ok"]


def _joined_kernel(shape):
    """tiny-dwsep's AGO subgraph (pointwise → depthwise → pointwise, one kernel) at ``shape``."""
    from toolchain import partition
    from toolchain.fusion import fuse_groups
    from toolchain.opgraph import op_graph

    model = models.build("tiny-dwsep", shape)
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    plan = partition.plan(PartitionSettings(threshold=1e9), mod, SPEC, graph=op_graph(mod))
    # NHWC: the input's transpose (8 channels: more than partition.PROLOGUES take) is a kernel of its own
    (func,) = [f for name, f in group_kernels(fuse_groups(mod, plan.groups, SPEC)) if "conv2d" in name]
    return func


def test_an_intensive_join_schedule_carries_over_to_a_join_of_other_extents():
    """A join's schedule from the intensive-fusion space (the upstream conv computed inside the
    downstream tile) replays on the same join at other extents, and the result computes the same."""
    small, large = _joined_kernel((1, 8, 8, 8)), _joined_kernel((1, 16, 12, 12))
    assert transfer.signature(small) == transfer.signature(large)
    spaces = _spaces(small, intensive=True)
    assert spaces
    carried = 0
    for sch in spaces:
        moved = transfer.transfer_schedule(workload_module(small),
                                           rename_blocks(plain(sch.trace.as_json()), {}),
                                    workload_module(large))
        moved = postprocess(moved, SPEC) if moved is not None else None
        if moved is None:
            continue

        class Record:  # what check_candidate reads of a tuning record
            trace = moved.trace

        assert check_candidate(large, Record(), SPEC)["ok"]
        carried += 1
    assert carried  # (the intensive space's schedule and the fallback ones alike)


def test_a_schedule_that_does_not_replay_is_no_seed(two_sizes):
    small, large = two_sizes
    bogus = [[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []]
    assert transfer.transfer_schedule(workload_module(small[PW1]), bogus,
                                      workload_module(large[PW1])) is None


def test_seeds_from_siblings_are_measured_and_committed_as_records(two_sizes, tmp_path):
    """seed_from_siblings commits the re-fitted schedule of a verified sibling as the kernel's first
    record, measured (a real latency), and names the sibling it came from."""
    small, large = two_sizes
    name = PW1
    plan, verified, db = _session_after(small[name], large[name], tmp_path)
    database = db.ms_database()
    settings = TuneSettings(transfer=2)
    assert seed_from_siblings(plan.tasks[1], plan, database, SPEC, verified, settings) == ["src"]
    (lat,) = trial_latencies(db.ms_dir, large[name])
    assert 0 < lat < math.inf
    assert seed_from_siblings(plan.tasks[1], plan, database, SPEC, verified, replace(settings, transfer=0)) == []


def test_a_negative_transfer_is_refused_before_anything_runs(cli, tmp_path):
    result = cli("tune", "zoo:tiny-cnn", "--db", tmp_path / "db", "--transfer", "-1")
    assert result.exit_code == 1 and "--transfer must be 0 (off) or more" in result.stderr
    assert not (tmp_path / "db").exists()
    result = cli("bench-suite", "tiny", "--transfer", "-1", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "--transfer must be 0 (off) or more" in result.stderr


def _pointwise(act, size, cin=8, cout=16):
    """A 1×1 conv (+ bias, + ``act``) in the default NHWC layout, as its one stock kernel."""
    from models.builder import GraphBuilder

    g = GraphBuilder("pw", seed=1)
    x = g.conv(g.input("input", (1, cin, size, size)), cin, cout, 1, name="c", act=act)
    model = g.finish(g.op("Identity", [x], "o", outputs=["output"]), (1, cout, size, size))
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    (func,) = [f for name, f in group_kernels(build.fuse_stock(mod, SPEC)) if "conv2d" in name]
    return func


@pytest.fixture(scope="module")
def epilogues():
    """The same pointwise conv with bias only, with hard-swish (a diamond: x · relu6(x + 3) / 6) at two
    sizes, and with ReLU6."""
    return {"bias": _pointwise(None, 8), "hswish": _pointwise("hardswish", 8),
            "hswish-large": _pointwise("hardswish", 12), "relu6": _pointwise("relu6", 10)}


def test_kernels_that_differ_only_in_their_epilogue_share_a_core_signature(epilogues):
    bias, hswish, relu6 = epilogues["bias"], epilogues["hswish"], epilogues["relu6"]
    assert transfer.epilogue(bias) == ("T_add",)
    assert len(transfer.epilogue(hswish)) > 2 and transfer.epilogue(hswish)[-1] == "T_multiply"
    assert transfer.signature(bias) != transfer.signature(hswish) != transfer.signature(relu6)
    assert transfer.core_signature(bias) == transfer.core_signature(hswish) == transfer.core_signature(relu6)
    assert transfer.core_signature(_conv(16, 32, 14, 1)) != transfer.core_signature(_conv(3, 32, 56, 3))
    # nothing reduces: no core, and no sibling of anything by it
    from tvm import te

    a = te.placeholder((4, 4), name="a")
    elementwise = te.create_prim_func([a, te.compute((4, 4), lambda i, j: a[i, j] + 1.0, name="b")])
    assert transfer.core_signature(elementwise) is None and transfer.epilogue(elementwise) == ()


def test_the_nearest_kernel_with_the_same_epilogue_and_the_nearest_with_another_come_first(epilogues):
    candidates = {"bias": epilogues["bias"], "relu6": epilogues["relu6"], "hswish-large": epilogues["hswish-large"]}
    hswish = epilogues["hswish"]
    assert transfer.siblings(hswish, candidates, 1) == ["hswish-large"]  # one: the same blocks, as before
    assert transfer.siblings(hswish, candidates, 2) == ["hswish-large", "bias"]  # bias is nearer than relu6 (8 vs 10)
    assert transfer.siblings(hswish, candidates, 3) == ["hswish-large", "bias", "relu6"]
    assert transfer.siblings(hswish, {"relu6": epilogues["relu6"]}, 1) == ["relu6"]  # another epilogue or nothing
    assert transfer.siblings(epilogues["bias"], {"stem": _conv(3, 32, 56, 3)}, 2) == []


def test_steps_on_dropped_blocks_leave_the_trace_and_decisions_follow_their_steps():
    trace = [[["GetSBlock", [], ["T_add", "main"], ["b0"]],
              ["GetSBlock", [], ["conv", "main"], ["b1"]],
              ["ComputeInline", ["b0"], [], []],
              ["GetLoops", ["b1"], [], ["l2", "l3"]],
              ["SamplePerfectTile", ["l2"], [2, 64], ["v4", "v5"]]],
             [[4, [2, 4]]]]
    kept, decisions = transfer.without_blocks(trace, {"T_add"})
    assert [inst[0] for inst in kept] == ["GetSBlock", "GetLoops", "SamplePerfectTile"]
    assert decisions == [[2, [2, 4]]]
    assert transfer.without_blocks(trace, set()) == trace
    assert transfer.uses_block(trace, "T_add") and transfer.uses_block(trace, "conv")
    assert not transfer.uses_block(transfer.without_blocks(trace, {"T_add"}), "T_add")
    assert not transfer.uses_block([[["GetSBlock", [], ["T_add", "main"], ["b0"]]], []], "T_add")  # looked up only


def test_a_plain_conv_schedule_carries_over_to_the_conv_with_hard_swish_and_computes_the_same(epilogues):
    """Every design space of the bias-only conv replays on the hard-swish conv (its epilogue inlined into
    the output block first), keeps the tile decisions, and the result passes the numeric check."""
    bias, hswish = epilogues["bias"], epilogues["hswish"]
    spaces = _spaces(bias)
    assert spaces

    def tiles(sch):
        return [tuple(int(x) for x in sch.trace.decisions[inst])
                for inst in sch.trace.insts if inst.kind.name == "SamplePerfectTile"]

    for sch in spaces:
        moved = transfer.transfer_schedule(workload_module(bias),
                                           rename_blocks(plain(sch.trace.as_json()), {}),
                                    workload_module(hswish))
        assert moved is not None
        assert tiles(moved) == tiles(sch)  # same extents: the plain conv's own tiles
        moved = postprocess(moved, SPEC)
        assert moved is not None

        class Record:  # what check_candidate reads of a tuning record
            trace = moved.trace

        assert check_candidate(hswish, Record(), SPEC)["ok"]


def test_a_conv_with_hard_swish_is_seeded_from_the_verified_plain_conv(epilogues, tmp_path):
    """seed_from_siblings finds the bias-only conv as the hard-swish conv's sibling, and commits its
    schedule as the hard-swish conv's first record, measured."""
    bias, hswish = epilogues["bias"], epilogues["hswish-large"]
    plan, verified, db = _session_after(bias, hswish, tmp_path)
    assert seed_from_siblings(plan.tasks[1], plan, db.ms_database(), SPEC, verified,
                              TuneSettings(transfer=2)) == ["src"]
    (lat,) = trial_latencies(db.ms_dir, hswish)
    assert 0 < lat < math.inf
