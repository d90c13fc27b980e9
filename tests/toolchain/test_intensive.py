"""Intensive fusion: finding the pair, the Fig. 7 schedule (exact, nothing recomputed), the space."""

import math

import numpy as np
import pytest

from host.bench.fit_weights import Calibration, extract
from models.builder import GraphBuilder
from toolchain import build, onnx_import
from toolchain.fusion import fuse_groups
from toolchain.opgraph import op_graph
from toolchain.targets import resolve_target
from toolchain.tune.candidates import random_args, run
from toolchain.tune.intensive import intensive_schedule
from toolchain.tune.intrinsics import load as load_intrinsics
from toolchain.tune.intrinsics import tune_context
from toolchain.tune.pairs import block_infos, find_pair
from toolchain.tune.schedule_check import execution_counts, format_counts
from toolchain.tune.space import make_space_generator

# NHWC activations (the default); the fixtures' convs keep their channel counts on every host (padding a narrow conv
# to the host's vector, toolchain/padding.py, would change the kernels by machine)
SPEC = resolve_target("host", pad_channels=False, winograd=False)  # the intensive space's direct convs
NCHW = resolve_target("host", layout="NCHW", pad_channels=False)
M56 = (1, 3, 56, 56)  # MobileNet-V2 at 56: the stem leaves 28×28


def zoo(anchor, nth, take, model="mobilenet-v2", shape=M56, spec=SPEC):
    return extract(Calibration("test", model, shape, anchor, nth, take), spec).func


def tiny(kind, spec=SPEC):
    """A two-conv ONNX graph on a 1×16×14×14 input, fused into one PrimFunc."""
    g = GraphBuilder(f"tiny-{kind}", seed=0)
    x = g.input("input", (1, 16, 14, 14))
    if kind == "pw->pw":
        h = g.conv(x, 16, 32, 1, name="pw1", act="relu6")
        y, c = g.conv(h, 32, 24, 1, name="output"), 24
    elif kind == "dw->dw":
        h = g.conv(x, 16, 16, 3, name="dw1", groups=16, act="relu")
        y, c = g.conv(h, 16, 16, 3, name="output", groups=16), 16
    elif kind == "pw->conv":  # a full 3×3 conv downstream: no intensive fusion
        h = g.conv(x, 16, 32, 1, name="pw1", act="relu6")
        y, c = g.conv(h, 32, 8, 3, name="output"), 8
    elif kind == "fire":  # SqueezeNet's expand: a 1×1 and a 3×3 conv into one concat
        a = g.conv(x, 16, 8, 1, name="e1", act="relu")
        b = g.conv(x, 16, 8, 3, name="e3", act="relu")
        y, c = g.concat([a, b], name="output"), 16
    elif kind == "branches":  # ShuffleNet's downsampling unit: dw → pw beside a third conv, into one concat
        a = g.conv(g.conv(x, 16, 16, 3, name="dw1", groups=16), 16, 8, 1, name="pw1", act="relu")
        b = g.conv(x, 16, 8, 1, name="pw2", act="relu")
        y, c = g.concat([a, b], name="output"), 16
    else:
        raise ValueError(kind)
    model = g.finish(y, (1, c, 14, 14))
    inputs = onnx_import.resolve_inputs(model, {})
    mod = build.legalize(onnx_import.to_relax(model, inputs), spec)
    fused = fuse_groups(mod, [[n.id for n in op_graph(mod).nodes]], spec)
    (kernel,) = build.kernels(fused)
    return fused[kernel.name]


#: kind -> how to get a fused PrimFunc holding it
CASES = {
    "pw->dw": lambda: zoo("class:pointwise_conv", 3, 8),  # expand 24→144 + relu6 → dw 3×3/1
    "pw->dw/2": lambda: zoo("class:pointwise_conv", 1, 8),  # expand 16→96 → dw 3×3/2
    "dw->pw": lambda: zoo("class:depthwise_conv", 2, 6),  # dw 144 + relu6 → project 144→24 + bias
    "conv->dw": lambda: zoo("class:conv", 0, 8),  # stem 3×3/2 conv → dw (U may be any conv)
    "pw->pw": lambda: tiny("pw->pw"),
    "dw->dw": lambda: tiny("dw->dw"),
    "matmul->matmul": lambda: zoo("class:matmul", 6, 8, "bert-tiny", (1, 128)),  # FFN: matmul+GELU → matmul
    # the four AGO kinds in ONNX's own layout (--layout NCHW)
    "pw->dw/nchw": lambda: zoo("class:pointwise_conv", 3, 8, spec=NCHW),
    "dw->pw/nchw": lambda: zoo("class:depthwise_conv", 2, 6, spec=NCHW),
    "pw->pw/nchw": lambda: tiny("pw->pw", NCHW),
    "dw->dw/nchw": lambda: tiny("dw->dw", NCHW),
}
EXPECTED_KIND = {"pw->dw/2": "pw->dw", **{k: k.split("/")[0] for k in CASES if k.endswith("/nchw")}}

_FUNCS: dict = {}
_REFS: dict = {}


def func_of(case):
    if case not in _FUNCS:
        _FUNCS[case] = CASES[case]()
    return _FUNCS[case]


def reference(case):
    """(inputs, outputs of the unscheduled function) — computed once per case."""
    if case not in _REFS:
        func = func_of(case)
        args = random_args(func, 0)
        _REFS[case] = (args, run(func, args, SPEC.tvm()))
    return _REFS[case]


def schedule(func, seed=1):
    import tvm
    from tvm import s_tir

    return s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=seed)


@pytest.mark.parametrize("case", list(CASES))
def test_find_pair_classifies_the_ago_kinds(case):
    pair = find_pair(func_of(case))
    assert pair is not None
    assert pair.kind == EXPECTED_KIND.get(case, case)
    if pair.downstream_kind == "dw":
        assert "channel" in pair.tiled
    elif pair.downstream_kind == "pw":
        assert "H × W" in pair.tiled
    else:
        assert "row" in pair.tiled
    assert pair.upstream != pair.downstream and pair.downstream not in pair.chain


@pytest.mark.parametrize("case, layout", [("pw->dw", "nhwc"), ("pw->dw/nchw", "nchw")])
def test_find_pair_names_the_blocks_of_an_inverted_residual(case, layout):
    pair = find_pair(func_of(case))
    assert pair.layout == layout.upper()
    assert (pair.upstream, pair.downstream) == (f"conv2d_{layout}", f"group_conv2d_{layout}")
    assert pair.chain == ("T_add", "T_maximum", "T_minimum", "pad_temp1")  # bias, relu6, dw padding
    assert pair.epilogue == ("T_add1", "T_maximum1", "T_minimum1")
    assert pair.upstream_input == "pad_temp"


def test_no_pair_for_one_complex_op_or_a_full_conv_downstream():
    assert find_pair(zoo("class:conv", 0, 4)) is None  # stem conv + bias + relu6 alone
    assert find_pair(zoo("class:depthwise_conv", 0, 4)) is None  # dw + bias + relu6 alone
    assert find_pair(tiny("pw->conv")) is None  # 3×3 downstream would recompute its halo


@pytest.mark.parametrize("seed", [1, 7, 42])
@pytest.mark.parametrize("case", list(CASES))
def test_intensive_schedule_is_exact_and_computes_upstream_once(case, seed):
    func = func_of(case)
    pair = find_pair(func)
    sch = schedule(func, seed)
    intensive_schedule(sch, pair, SPEC.num_cores)
    counts = {c.name: c for c in execution_counts(sch.mod)}
    table = format_counts(counts.values())
    assert not any(c.dropped for c in counts.values()), table
    for name in (pair.upstream, pair.downstream):
        assert counts[name].executed == counts[name].needed == counts[name].domain, table
    # U really sits inside D's tile loop: they share the outermost loop
    u_loops = sch.get_loops(sch.get_sblock(pair.upstream))
    d_loops = sch.get_loops(sch.get_sblock(pair.downstream))
    assert sch.get(u_loops[0]).same_as(sch.get(d_loops[0]))
    args, want = reference(case)
    got = run(sch.mod, args, SPEC.tvm())
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(want, got))
    assert err <= 1e-5, f"{case} seed {seed}: max abs error {err}"


@pytest.mark.parametrize("case", ["dw->pw", "conv->dw", "pw->dw/2"])
def test_upstream_input_padding_is_copied_per_tile_where_tiles_read_part_of_it(case):
    """dw→pw: each row tile reads a few input rows (+ halo), so U's padding is done inside the tile
    instead of a padded copy of the whole input before it; conv→dw: every channel tile reads all of
    U's input, so the padding stays one nest before the tile loop."""
    func = func_of(case)
    pair = find_pair(func)
    sch = schedule(func, 3)
    intensive_schedule(sch, pair, SPEC.num_cores)
    tile = sch.get(sch.get_loops(sch.get_sblock(pair.downstream))[0])
    if case == "pw->dw/2":  # a pointwise U's input "padding" is an identity copy: inlined
        assert pair.upstream_input and pair.upstream_input not in {b.name for b in block_infos(sch.mod["main"])}
        return
    pad_loops = sch.get_loops(sch.get_sblock(pair.upstream_input))
    in_tile = bool(pad_loops) and sch.get(pad_loops[0]).same_as(tile)
    assert in_tile == (case == "dw->pw"), sch.mod.script()
    counts = {c.name: c for c in execution_counts(sch.mod)}
    pad = counts[pair.upstream_input]
    assert not pad.dropped and pad.executed >= pad.needed  # halos copied again by neighbouring tiles, nothing lost
    args, want = reference(case)
    got = run(sch.mod, args, SPEC.tvm())
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, got)) <= 1e-5


def test_tile_sizes_are_sampled_decisions():
    func = func_of("pw->dw")
    seen = set()
    for seed in range(1, 9):
        sch = schedule(func, seed)
        intensive_schedule(sch, find_pair(func), SPEC.num_cores)
        decisions = {str(inst.kind.name): 0 for inst in sch.trace.insts}
        assert "SamplePerfectTile" in decisions and "SampleCategorical" in decisions
        tile = sch.get_loops(sch.get_sblock("group_conv2d_nhwc"))[0]
        seen.add(int(sch.get(tile).extent))
    assert len(seen) > 1  # different seeds, different channel tiles


def test_space_choice():
    pw_dw = func_of("pw->dw")
    single = zoo("class:conv", 0, 4)
    chosen = make_space_generator(pw_dw, SPEC.tvm())
    assert chosen.kind == "intensive" and chosen.pair.kind == "pw->dw"
    assert make_space_generator(pw_dw, SPEC.tvm(), intensive=False).kind == "default"
    assert make_space_generator(pw_dw, SPEC.tvm(), include_default=True).kind == "intensive+default"
    fallback = make_space_generator(single, SPEC.tvm())  # a conv of its own: its register block beside the stock space
    assert fallback.kind == "block+default" and fallback.pair is None
    assert make_space_generator(single, SPEC.tvm(), block=False).kind == "default"


def test_two_convs_into_one_concat_get_the_stock_space_without_consumer_fusion():
    """TVM's stock space fails on it as a whole (MultiLevelTiling moves the concat under one conv's
    tile, where the other conv is not): the space leaves consumer fusion out, so the kernel is tuned."""

    from toolchain.tune import space
    from toolchain.tune.adapter import workload_module

    func = tiny("fire")
    assert "consumer T_concat has other producers" in space.shared_consumer(func)
    assert space.shared_consumer(func_of("pw->dw")) is None
    stock = tune_context(mod=workload_module(func), target=SPEC.tvm(), num_threads=1,
                         space_generator=space.space(None, SPEC.tvm()))
    with pytest.raises(Exception, match="reverse-compute-at"):
        stock.generate_design_space()  # the TVM behaviour this works around: if it goes, so can the workaround
    chosen = make_space_generator(func, SPEC.tvm())
    assert chosen.kind == "default-no-write-fusion" and "T_concat" in chosen.reason
    ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), space_generator=chosen.generator,
                       num_threads=1)
    (design, *_) = ctx.generate_design_space()
    args = random_args(func, 0)
    np.testing.assert_allclose(run(design.mod, args, SPEC.tvm())[-1], run(func, args, SPEC.tvm())[-1],
                               rtol=1e-5, atol=1e-5)


def test_a_pair_beside_a_conv_into_one_concat_gets_the_intensive_space_tiling_the_conv_without_consumer_fusion():
    """dw → pw beside a third conv, both into one concat (ShuffleNet-V2's downsampling unit): the
    third conv's MultiLevelTiling fails with consumer fusion on every sample (``reverse-compute-at``:
    the concat's other producer is outside its tile), so the space tiles it without, as the stock space
    does — before, the join's search failed and it kept its seed. The space's dry run applies the
    whole schedule now, so a failure outside the pair falls back to the stock space, not a dead search."""

    from toolchain.tune import space
    from toolchain.tune.adapter import workload_module

    func = tiny("branches")
    pair = find_pair(func)
    assert pair is not None and pair.kind == "dw->pw"
    assert "T_concat" in space.shared_consumer(func)
    chosen = make_space_generator(func, SPEC.tvm(), num_cores=2)
    assert chosen.kind == "intensive", chosen.reason
    ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), space_generator=chosen.generator,
                       num_threads=1)
    args = random_args(func, 0)
    want = run(func, args, SPEC.tvm())[-1]
    for seed in (1, 2, 3):
        sch = space.schedule_fn(pair, SPEC.tvm(), 2)(schedule(func, seed))[0]
        counts = execution_counts(sch.mod)
        assert not any(c.dropped for c in counts), format_counts(counts)
        np.testing.assert_allclose(run(sch.mod, args, SPEC.tvm())[-1], want, rtol=1e-5, atol=1e-5)
    (design, *_) = ctx.generate_design_space()
    np.testing.assert_allclose(run(design.mod, args, SPEC.tvm())[-1], want, rtol=1e-5, atol=1e-5)


def test_the_space_carries_the_check_and_the_llvm_mutators():
    from tvm.s_tir.meta_schedule.space_generator import ScheduleFn

    gen = make_space_generator(func_of("pw->dw"), SPEC.tvm()).generator
    assert isinstance(gen, ScheduleFn)
    names = [type(p).__name__ for p in gen.postprocs]
    assert names == ["DisallowDynamicLoop", "RewriteParallelVectorizeUnroll", "RewriteReductionBlock",
                     "RewriteLayout", "_PyPostproc"]  # the last one is RejectDroppedIterations
    assert {type(m).__name__ for m in gen.mutator_probs} >= {"MutateTileSize", "MutateUnroll"}


def test_the_tuners_space_tiles_the_complex_ops_outside_the_pair():
    """pw → dw → pw through ``space_for`` (what ``agoc tune`` uses): the first pw is not left as a
    naive loop nest (it once was, when the tuner built the space without a target: 10-20x slower kernels)."""

    from toolchain.tune.adapter import space_for, workload_module

    func = zoo("class:pointwise_conv", 3, 11)
    pair = find_pair(func)
    rest = [b.name for b in block_infos(func) if b.kind != "simple" and b.name not in pair.blocks]
    assert pair.kind == "dw->pw" and rest
    gen = space_for(func, SPEC, intensive=True).generator
    ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), space_generator=gen, num_threads=1)
    (first, *_) = ctx.generate_design_space()
    assert any(inst.kind.name == "SamplePerfectTile" for inst in first.trace.insts)  # tile sizes are sampled ...
    names = {str(a) for inst in first.trace.insts if inst.kind.name == "GetSBlock" for a in inst.attrs[:1]}
    assert set(rest) <= names  # ... and the trace schedules every complex block outside the pair
    loops = first.get_loops(first.get_sblock(rest[0]))
    assert len(loops) > 7  # MultiLevelTiling's SSRSRS nest, not the naive n, c, h, w, rc, ry, rx


def test_a_third_convs_epilogue_is_inlined_as_the_stock_space_does():
    """pw → dw → pw: the first pw's bias + relu6 (three elementwise blocks) become one block that its
    tiling can fuse, as AutoInline does in the stock space — not three full passes over the expanded
    tensor (they were until 2026-11-23: the e2e run showed those joins losing to their minis) —
    and nothing is inlined into the pair (that made MultiLevelTiling drop iterations)."""
    from toolchain.tune.space import schedule_fn

    func = zoo("class:pointwise_conv", 3, 11)
    pair = find_pair(func)
    outside = [b.name for b in block_infos(func) if b.kind == "simple" and b.name not in pair.blocks]
    assert len(outside) >= 3  # the first pw's input copy, bias add, max, min
    for sch in schedule_fn(pair, SPEC.tvm(), SPEC.num_cores)(schedule(func, 3)):
        names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
        assert len(set(outside) & names) == 1  # one epilogue block left, the one feeding the pair
        assert not any(c.dropped for c in execution_counts(sch.mod)), format_counts(execution_counts(sch.mod))


@pytest.mark.slow
def test_other_complex_ops_get_multilevel_tiling(tmp_path):
    """pw → dw → pw: the (dw, pw) pair is fused; the first pw gets the stock MultiLevelTiling branches."""
    from toolchain.tune.space import schedule_fn

    func = zoo("class:pointwise_conv", 3, 11)
    pair = find_pair(func)
    assert pair.kind == "dw->pw"
    schedules = schedule_fn(pair, SPEC.tvm(), SPEC.num_cores)(schedule(func, 3))
    assert len(schedules) >= 2
    args = random_args(func, 0)
    want = run(func, args, SPEC.tvm())
    for sch in schedules:
        assert not any(c.dropped for c in execution_counts(sch.mod))
        got = run(sch.mod, args, SPEC.tvm())
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, got)) <= 1e-5


def _tune_alone(func, work_dir, trials: int):
    """Tune ``func`` alone in the intensive space with the dropped-iteration check: (space choice, database,
    trial latencies, candidates checked, candidates rejected)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from toolchain.timing import Timing, local_runner
    from toolchain.tune import space
    from toolchain.tune.adapter import BUILD_TIMEOUT_S, fast_build, trial_latencies

    work_dir.mkdir(parents=True)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    choice = make_space_generator(func, SPEC.tvm(), True, False, SPEC.num_cores, True)
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    before = dict(space.STATS)
    load_intrinsics(SPEC.tvm())  # the target's tensor intrinsics only, as agoc's own searches (tune_context)
    ms.tune_tir(
        mod, target=SPEC.tvm(), work_dir=str(work_dir), max_trials_global=trials, num_trials_per_iter=trials,
        builder=ms.builder.LocalBuilder(f_build=fast_build, max_workers=SPEC.num_cores, timeout_sec=BUILD_TIMEOUT_S),
        runner=local_runner(Timing(number=3, repeat=5, min_repeat_ms=30)), database=database,
        space=choice.generator, num_tuning_cores=SPEC.num_cores, seed=0,
    )
    checked = space.STATS["applied"] - before["applied"]
    return choice, database, trial_latencies(work_dir), checked, space.STATS["rejected"] - before["rejected"]


@pytest.mark.slow
def test_tuning_smoke_with_the_intensive_space(tmp_path, monkeypatch):
    import os

    import tvm
    from tvm import s_tir

    if "TVM_NUM_THREADS" not in os.environ:
        monkeypatch.setenv("TVM_NUM_THREADS", str(SPEC.num_cores))
    func = func_of("pw->dw")
    choice, database, latencies, checked, rejected = _tune_alone(func, tmp_path / "tune", trials=8)
    assert choice.kind == "intensive" and choice.pair.kind == "pw->dw"
    assert len(latencies) == 8 and all(math.isfinite(x) for x in latencies)
    assert rejected == 0 and checked > 0
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    (best,) = database.get_top_k(database.commit_workload(mod), 1)
    sch = s_tir.Schedule(mod)
    best.trace.apply_to_schedule(sch, remove_postproc=False)
    assert not any(c.dropped for c in execution_counts(sch.mod))
    args, want = reference("pw->dw")
    got = run(sch.mod, args, SPEC.tvm())
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, got)) <= 1e-5


def test_the_vector_cap_follows_the_targets_registers():
    from toolchain.tune.intensive import VECTOR_FACTOR_MAX, vector_cap, vector_lanes

    assert vector_lanes(resolve_target("linux-arm64").tvm()) == 4  # NEON: 128 bits
    assert vector_lanes(resolve_target("host-avx2").tvm()) == 8
    assert vector_cap(4) == VECTOR_FACTOR_MAX == 16 and vector_cap(8) == 32 and vector_cap(16) == 64


@pytest.mark.parametrize("lanes, cap", [(4, 16), (16, 64)])
def test_the_schedule_offers_the_vector_four_registers(lanes, cap):
    from tvm import s_tir

    func = tiny("pw->pw")
    pair = find_pair(func)
    caps = []

    def decide(role, block, it, extent, offered):
        if role == "vector":
            caps.append(offered)
        return None

    intensive_schedule(s_tir.Schedule(func.with_attr("global_symbol", "main")), pair, SPEC.num_cores, decide, lanes)
    assert caps == [cap, cap]  # U's and D's vector


def test_cache_lines_a_slice_touches():
    """A tile's slice is counted in the cache lines it touches: in NHWC one channel of every pixel touches a
    line per pixel, as 16 float32 channels do; contiguous slices and NCHW planes count their bytes."""
    from toolchain.tune import tiles

    assert tiles.touched(1, 100, 0) == 128 and tiles.touched(10, 16, 128) == 640
    assert tiles.touched(10, 16, 32) == 320  # runs closer than a line: every line of their span
    (extent, plane, lines), = tiles.tile_units("dw", (1, 8, 8, 144), "NHWC").values()
    assert extent == 144 and plane == 256 and lines(1) == lines(16) == 64 * 64 < lines(17) == 2 * 64 * 64
    (extent, plane, lines), = tiles.tile_units("dw", (1, 144, 8, 8), "NCHW").values()
    assert lines(1) == 256 and lines(16) == 16 * 256


def test_a_tile_cache_bounds_each_tiles_slice_of_the_intermediate():
    """--keep-inside KIB also bounds the intensive tile: the lines its slice of the intermediate touches fit
    KIB (a phone core's L2 share), where the uncapped space samples wider tiles too (the host's L2 is 4x a
    phone's: tuned there, MobileNet-V2's 56x56 expand + dw pair kept a 602 KB slice); and in NHWC a tile
    is a whole number of lines wide (16 channels): a narrower one touches the same lines in more passes
    (MobileNet-V2 @224's stem pair, tuned to 4-channel tiles, moved more than stock's two kernels)."""
    from toolchain.tune import pairs, tiles

    func = func_of("pw->dw")
    pair = find_pair(func)
    _, h, w, channels = pairs.data_shape(func, pair)  # NHWC, padded for the 3x3 dw: 144 channels
    budget = 3 * 64 * h * w  # three lines of every pixel: 48 channels

    def widths(tile_cache):
        out = set()
        for seed in range(1, 13):
            sch = schedule(func, seed)
            intensive_schedule(sch, pair, SPEC.num_cores, tile_cache=tile_cache)
            tile = sch.get_loops(sch.get_sblock("group_conv2d_nhwc"))[0]
            out.add(channels // int(sch.get(tile).extent))  # channels per tile
        return out

    assert pairs.tile_bounds(func, pair, budget) == {3: (16, 48)}
    assert pairs.tile_bounds(func, pair, budget, cores=16) == {3: (9, 48)}  # a tile per core
    assert widths(budget) <= {16, 48} and any(t % 16 for t in widths(0)) and max(widths(0)) > 16
    for wanted, got in ((4, 16), (36, 16), (48, 48), (144, 48)):  # a seed's tile, moved into the bounds
        sch = schedule(func)
        intensive_schedule(sch, pair, SPEC.num_cores, lambda role, *_, w=wanted: w if role == "tile" else None,
                           tile_cache=budget)
        assert channels // int(sch.get(sch.get_loops(sch.get_sblock("group_conv2d_nhwc"))[0]).extent) == got
    args, want = reference("pw->dw")  # the floor's split computes what the pair computes
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(sch.mod, args, SPEC.tvm()))) <= 1e-5
    # a budget below one line of every pixel: tiles of rows with every channel (a line-wide channel tile's slice
    # would not fit, and every channel tile reads all of U's input again), which compute what the pair computes
    small = 64 * h * w // 2
    assert pairs.tile_bounds(func, pair, small) == {1: (1, 1)}
    sch = schedule(func)
    intensive_schedule(sch, pair, SPEC.num_cores, tile_cache=small)
    cores, runs = (int(sch.get(lp).extent) for lp in sch.get_loops(sch.get_sblock("group_conv2d_nhwc"))[:2])
    assert cores * runs == h - 2  # one output row per tile (3 x 3, stride 1: the padded rows less 2), a run a core
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(sch.mod, args, SPEC.tvm()))) <= 1e-5
    nchw = func_of("pw->dw/nchw")
    _, _, h, w = pairs.data_shape(nchw, find_pair(nchw))
    plane = tiles.touched(1, 8 * h * w * 4, 0)
    assert pairs.tile_bounds(nchw, find_pair(nchw), plane) == {1: (1, 8)}


def test_a_chain_of_three_convs_is_computed_in_one_row_tile():
    """Under a tile cache an inverted residual (expand → depthwise → project, NHWC) is one chain: D's row tiles
    hold the expand head's rows of every channel, and inside a tile the depthwise U and D go row by row, both
    intermediates within the cache (their lines counted, the window's halo included); U runs once, the head again
    only at the tiles' seams, and the kernel computes what the unscheduled one does. Where the cache holds too few
    rows (the head would compute more than a quarter of its rows twice) the kernel is the pair with the larger
    intermediate; without a tile cache, the dw → pw pair as before."""
    from toolchain.tune import pairs

    func = zoo("class:pointwise_conv", 3, 9)  # expand 24→144 + relu6 → dw 3×3/1 + relu6 → project 144→24
    assert find_pair(func).kind == "dw->pw"
    _, h, w, c = pairs.data_shape(func, find_pair(func))  # the dw's output, 14 × 14 × 144
    _, h_in, w_in, c_in = pairs.data_shape(func, find_pair(func), "group_conv2d_nhwc")  # the expand's, padded
    budget = 4 * (w * c + 9 * w_in * c_in)  # a row of U's output (U and D go row by row), the head's 9 for 7
    chain = find_pair(func, budget, cores=2)
    assert chain.kind == "pw->dw->pw" and chain.head == "conv2d_nhwc" and chain.upstream_input is None
    assert chain.blocks[:2] == ("pad_temp", "conv2d_nhwc") and chain.head_chain[-1] == "pad_temp1"
    assert pairs.tile_bounds(func, chain, budget, cores=1) == {1: (1, 7)}
    assert pairs.tile_bounds(func, chain, budget, cores=7) == {1: (1, 2)}  # a tile per core
    assert pairs.chain_recompute(func, chain, budget, cores=2) == 2 * 9 / 16 - 1  # a tile a core: 9 of 16 rows each
    assert pairs.chain_recompute(func, chain, budget, cores=7) == 7 * 4 / 16 - 1
    assert pairs.chain_recompute(func, chain, budget) == 0  # one core's two tiles in order: each row once
    two_rows = 4 * (w * c + 4 * w_in * c_in)  # 2-row tiles, 7 of them: a core's run of 4 (8 rows, reading 10), then 3
    assert pairs.chain_recompute(func, chain, two_rows, cores=2) == (10 + 8) / 16 - 1
    assert find_pair(func, budget, cores=7).kind == "pw->dw"  # 16 padded rows of 144 channels > the dw's 14
    args, want = reference_of(func)
    for seed in (1, 2):
        sch = schedule(func, seed)
        intensive_schedule(sch, chain, SPEC.num_cores, tile_cache=budget)
        d_loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock(chain.downstream))]
        shared = [lp for lp in map(sch.get, sch.get_loops(sch.get_sblock(chain.upstream)))
                  if any(lp.same_as(d) for d in d_loops)]
        *tiles, rows = [int(lp.extent) for lp in shared]  # U and D share the tiles (a run per core) and the row loop
        assert rows <= 7 and h % rows == 0 and tiles[-1] == -(-(h // rows) // math.prod(tiles[:-1]))  # a run a core
        counts = {c.name: c for c in execution_counts(sch.mod)}
        assert counts[chain.upstream].executed == counts[chain.upstream].needed
        head = counts[chain.head]
        assert head.needed < head.executed <= head.needed * (rows + 2) / rows
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(sch.mod, args, SPEC.tvm()))) <= 1e-5
    choice = make_space_generator(func, SPEC.tvm(), num_cores=2, tile_cache=budget, block=False)
    assert choice.kind == "intensive" and choice.pair == chain
    assert make_space_generator(func, SPEC.tvm(), num_cores=2, block=False).pair.head is None


def chain_of_three():
    """An inverted residual (expand 24→144 → dw 3×3 → project 144→24, 14×14, NHWC) as a chain at a tile cache of 7
    rows (:func:`test_a_chain_of_three_convs_is_computed_in_one_row_tile`): (func, the cache's bytes, the chain)."""
    from toolchain.tune import pairs

    func = zoo("class:pointwise_conv", 3, 9)
    pair = find_pair(func)
    _, _, w, c = pairs.data_shape(func, pair)
    _, _, w_in, c_in = pairs.data_shape(func, pair, "group_conv2d_nhwc")
    budget = 4 * (w * c + 9 * w_in * c_in)  # a row of U's output (U and D go row by row), the head's 9 for 7
    return func, budget, find_pair(func, budget, cores=2)


def reference_of(func):
    args = random_args(func, 0)
    return args, run(func, args, SPEC.tvm())


def test_a_vector_of_several_registers_is_whole_registers_the_postprocessor_leaves_apart():
    """A register tile's vector of several registers (AVX2: 24 of 144 channels) and the tile's pads and elementwise
    passes (96- or 144-channel rows) are vectorised one register wide, the registers' loop unrolled and kept out of
    the postprocessor's fusing (LLVM lowers a 24-lane vector through lane inserts); the kernel stays exact."""
    from toolchain.tune import intensive
    from toolchain.tune.adapter import postprocess
    from toolchain.tune.intensive_seed import BlockChoices
    from toolchain.tune.space import schedule_fn

    spec = resolve_target("host-avx2")  # 8 lanes: 24 channels are 3 registers (AVX-512's 16 do not divide them)
    target = spec.tvm()
    lanes = intensive.vector_lanes(target)
    func, budget, chain = chain_of_three()

    def wide(role, block, it, extent, cap):  # every vector as wide as the space allows: several registers
        return max(d for d in range(1, cap + 1) if extent % d == 0) if role == "vector" else None

    args, want = reference_of(func)
    for decide in (wide, BlockChoices(func, chain, target, 2, budget)):
        sch = schedule_fn(chain, target, 2, decide, budget)(schedule(func, 1))[0]
        done = postprocess(sch, spec)
        inside = [n for b in chain.blocks for n in (b, f"{b}_init", f"{b}_update") if intensive.block_exists(done, n)]
        vectors = {b: int(done.get(lp).extent) for b in inside for lp in done.get_loops(done.get_sblock(b))[-1:]
                   if int(done.get(lp).kind) == 2}  # ForKind.VECTORIZED
        assert vectors and max(vectors.values()) <= lanes, vectors
        assert vectors[f"{chain.downstream}_update"] == lanes and vectors["pad_temp1"] == lanes  # 144: 18 registers
        kept = [lp for b in inside for lp in done.get_loops(done.get_sblock(b))
                if intensive.WHOLE_REGISTERS in done.get(lp).annotations]
        assert kept
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(done.mod, args, target))) <= 1e-5
