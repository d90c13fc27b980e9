"""The intensive join's composed seed: a point of the Fig. 7 space whose choices come from the minis
(toolchain/tune/intensive_seed.py), exact, and committed beside the side-by-side composition."""

from dataclasses import replace

import numpy as np
import pytest

from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune import intensive_seed, pairs
from toolchain.tune.adapter import postprocess, trial_latencies, workload_module
from toolchain.tune.candidates import random_args, run
from toolchain.tune.compose import seed_joined
from toolchain.tune.db import TuneDB
from toolchain.tune.intrinsics import tune_context
from toolchain.tune.plan import map_blocks, plan_tasks
from toolchain.tune.schedule_check import execution_counts, format_counts
from toolchain.tune.settings import TuneSettings
from toolchain.tune.space import rest_complex
from toolchain.tune.traces import plain, unroll_of

SPEC = resolve_target("host", num_cores=2)


def test_the_tile_fits_its_budget_keeps_a_tile_per_core_and_prefers_whole_register_tiles():
    # MobileNet-V2 block 3 at 56×56, dw downstream: 144 padded 58×58 planes of 13.5 KB
    assert intensive_seed.tile_factors("dw", (1, 144, 58, 58), 2, 128 * 1024) == {1: 8}  # 9 fit; 8 aligns
    assert intensive_seed.tile_factors("dw", (1, 144, 58, 58), 2, 512 * 1024) == {1: 24}
    # pw downstream: whole rows of 144 channels × 56 (32 KB each), as many as fit
    assert intensive_seed.tile_factors("pw", (1, 144, 56, 56), 2, 128 * 1024) == {2: 4, 3: 56}
    assert intensive_seed.tile_factors("pw", (1, 144, 56, 56), 2, 512 * 1024) == {2: 8, 3: 56}
    # a row too wide for the budget: part of one row per tile
    assert intensive_seed.tile_factors("pw", (1, 960, 8, 128), 2, 128 * 1024) == {2: 1, 3: 32}
    # matmul rows, at most TILE_FACTOR_MAX, and at least a tile per core
    assert intensive_seed.tile_factors("matmul", (1, 128, 256), 2) == {1: 64}
    assert intensive_seed.tile_factors("dw", (1, 8, 4, 4), 4) == {1: 2}
    # NHWC: the same tiles, on D's NHWC iterators (n, y, x, f)
    assert intensive_seed.tile_factors("dw", (1, 58, 58, 144), 2, 128 * 1024, "NHWC") == {3: 8}
    assert intensive_seed.tile_factors("pw", (1, 56, 56, 144), 2, 512 * 1024, "NHWC") == {1: 8, 2: 56}
    assert intensive_seed.tile_factors("pw", (1, 8, 128, 960), 2, 128 * 1024, "NHWC") == {1: 1, 2: 32}
    # an NHWC dw tile's channels are the vector: whole registers (AVX-512: 16 lanes) even over the budget
    assert intensive_seed.tile_factors("dw", (1, 58, 58, 144), 2, 128 * 1024, "NHWC", lanes=16) == {3: 16}
    assert intensive_seed.tile_factors("dw", (1, 114, 114, 32), 2, 128 * 1024, "NHWC") == {3: 4}  # NEON: 1 fits
    assert intensive_seed.tile_factors("dw", (1, 32, 114, 114), 2, 128 * 1024) == {1: 2}  # NCHW: W is the vector


def test_a_register_factor_divides_its_loop_within_the_cap_and_the_minis_choice():
    assert intensive_seed.register_factor(56, 16, 16) == 14
    assert intensive_seed.register_factor(9, 8, 8) == 3
    assert intensive_seed.register_factor(24, 8, 6) == 6
    assert intensive_seed.register_factor(7, 4, 1) == 1


@pytest.fixture(scope="module")
def dwsep(dwsep_split):
    """tiny-dwsep (pw → dw → pw) as one joined kernel, and its three minis with sampled schedules."""

    mod, graph, plan, split, (_, joined), minis = dwsep_split
    parts = []
    for (_, func), group in zip(minis, split.plan.groups):
        ctx = tune_context(mod=workload_module(func), target=SPEC.tvm(), space_generator="post-order-apply",
                           num_threads=1, rand_state=7)
        (design, *_) = ctx.space_generator.generate_design_space(ctx.mod)
        parts.append((plain(design.trace.as_json()), map_blocks(graph, group, plan.groups[0], func, joined)))
    return mod, graph, plan, joined, parts


def test_the_seeds_vector_is_the_widest_the_space_allows_or_the_minis_own_register_tile(dwsep):
    *_, joined, parts = dwsep
    pair = pairs.find_pair(joined)
    d_factors = intensive_seed.MiniChoices(pair, parts, {}).factors[pair.downstream]
    it, factors = max(d_factors.items())  # D's last spatial loop: its mini's register tile there
    register = factors[-1] * factors[-2]
    widest = intensive_seed.MiniChoices(pair, parts, {}, "widest", lanes=4)
    own = intensive_seed.MiniChoices(pair, parts, {}, "mini", lanes=4)
    assert widest("vector", pair.downstream, it, 64, 64) == 64
    assert own("vector", pair.downstream, it, 64, 64) == intensive_seed.register_factor(64, 64, max(register, 4))
    assert own("vector", pair.downstream, it, 64, 2) <= 2  # never over the space's cap
    assert own("vector", "no-such-block", it, 64, 16) == 16  # no mini choice to take: the widest
    # the other register dims are the mini's, whichever the vector
    assert own("register", pair.downstream, it, 64, 64) == widest("register", pair.downstream, it, 64, 64)
    with pytest.raises(ValueError):
        intensive_seed.MiniChoices(pair, parts, {}, "narrowest")
    seeds = intensive_seed.intensive_seeds(joined, pair, parts, SPEC.tvm(), 2)
    assert 1 <= len(seeds) <= len(intensive_seed.TILE_BYTES) * len(intensive_seed.VECTORS)


def test_a_traces_tile_decisions_are_read_per_loop_of_a_block(dwsep):
    from tvm import s_tir

    *_, joined, _ = dwsep
    sch = s_tir.Schedule(workload_module(joined))
    loops = sch.get_loops(sch.get_sblock("conv2d_nchw1"))
    sch.sample_perfect_tile(loops[1], n=4, max_innermost_factor=64, decision=[1, 2, 2, 2])
    sch.sample_perfect_tile(loops[3], n=2, max_innermost_factor=64, decision=[2, 8])
    trace = plain(sch.trace.as_json())
    assert intensive_seed.tile_decisions(trace, "conv2d_nchw1") == {1: [1, 2, 2, 2], 3: [2, 8]}
    assert intensive_seed.tile_decisions(trace, "conv2d_nchw") == {}


def test_the_seed_is_the_fig7_structure_with_the_minis_choices_exact_and_mutable(dwsep):
    *_, joined, parts = dwsep
    pair = pairs.find_pair(joined)
    assert pair.kind == "dw->pw"  # the third conv (the first pw) is tiled as in its mini
    sch = intensive_seed.intensive_seed(joined, pair, parts, SPEC.tvm(), 2)
    assert sch is not None
    counts = {c.name: c for c in execution_counts(sch.mod)}
    table = format_counts(counts.values())
    assert not any(c.dropped for c in counts.values()), table
    for name in (pair.upstream, pair.downstream):
        assert counts[name].executed == counts[name].needed == counts[name].domain, table  # nothing recomputed
    u_loops, d_loops = (sch.get_loops(sch.get_sblock(b)) for b in (pair.upstream, pair.downstream))
    assert sch.get(u_loops[0]).same_as(sch.get(d_loops[0]))  # U inside D's tile
    trace = plain(sch.trace.as_json())
    # D's tile: what tile_factors says for its 32-channel 16×16 intermediate (rows of 16, 2 tiles for 2 cores)
    assert pair.layout == "NCHW"
    tile = intensive_seed.tile_factors("pw", pairs.data_shape(joined, pair), 2)
    assert tile == {2: 8, 3: 16}
    first = intensive_seed.tile_decisions(trace, pair.downstream)
    assert first[2] == [2, 8] and first[3] == [1, 16]
    # the block outside the pair: MultiLevelTiling with exactly its mini's decisions
    (rest,) = rest_complex(sch, pair)
    mini_trace, block_map = next((t, m) for t, m in parts if rest in m.values())
    mini_block = next(k for k, v in block_map.items() if v == rest)
    assert intensive_seed.tile_decisions(trace, rest) == intensive_seed.tile_decisions(mini_trace, mini_block)
    # the auto-unroll depth: D's mini's
    d_trace = next(t for t, m in parts if pair.downstream in m.values())
    assert unroll_of(trace) == unroll_of(d_trace)
    # every choice is a sampling decision: the search can mutate the seed
    kinds = [inst[0] for inst in trace[0]]
    assert kinds.count("SamplePerfectTile") >= 6 and len(trace[1]) == kinds.count("SamplePerfectTile") + 1
    # and it computes what the unscheduled kernel computes, postprocessed as a candidate would be
    done = postprocess(sch, SPEC)
    args = random_args(joined, 0)
    want = run(joined, args, SPEC.tvm())
    got = run(done.mod, args, SPEC.tvm())
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, got)) <= 1e-5


def test_a_join_is_seeded_in_its_own_space_too_but_not_under_ago_ni(dwsep, tmp_path):
    """seed_joined commits the side-by-side composition and the intensive seeds (measured like any
    candidate); AGO-NI searches the stock space, so it gets the side-by-side one only."""
    mod, graph, _, joined, parts = dwsep
    for intensive_on, want in ((True, 1 + len(intensive_seed.TILE_BYTES) * len(intensive_seed.VECTORS)), (False, 1)):
        settings = TuneSettings(trials=64, per_iter=8, partition=PartitionSettings(threshold=1e9),
                                intensive=intensive_on)
        _, plan = plan_tasks(mod, graph, SPEC, settings)
        (task,) = [t for t in plan.tasks if t.phase == "joined"]
        by_block = {frozenset(m.values()): t for t, m in parts}
        verified = {name: {"status": "verified", "trace": by_block[frozenset(m.values())]}
                    for name, m in plan.compositions[task.name]}
        db = TuneDB(tmp_path / str(intensive_on))
        assert seed_joined(task, plan, db.ms_database(), SPEC, verified, settings)
        latencies = trial_latencies(db.ms_dir, plan.funcs[task.name])
        assert len(latencies) <= want and len(latencies) >= (2 if intensive_on else 1)
        assert all(0 < x < float("inf") for x in latencies)
        # a mini not measured yet: its blocks would stay unscheduled in the join, so nothing is composed
        first = next(name for name, mapping in plan.compositions[task.name] if mapping)
        partly = {**verified, first: {"status": "untuned"}}
        db = TuneDB(tmp_path / f"partly-{intensive_on}")
        assert not seed_joined(task, plan, db.ms_database(), SPEC, partly, settings)
        assert trial_latencies(db.ms_dir, plan.funcs[task.name]) == []


def test_a_fused_kernel_without_minis_is_seeded_from_its_convs_register_blocks_in_the_widest_tile(monkeypatch):
    """A chain (a locality unit: no minis to compose) starts from each conv's register block — rows × vectors from
    the target's registers, as a single conv's block (microkernel.block_for) — in the widest row tile the cache
    holds; one seed per unroll depth, exact; seed_from_block commits them as the kernel's first records."""
    from types import SimpleNamespace

    from tests.toolchain.test_intensive import chain_of_three, reference_of
    from toolchain.tune import compose, microkernel
    from toolchain.tune.intensive import vector_lanes

    avx2 = resolve_target("host-avx2")  # 8 lanes divide D's 24 channels (AVX-512's 16 do not)
    func, budget, chain = chain_of_three()  # 7 rows a tile
    _, h, w, _ = pairs.data_shape(func, pairs.find_pair(func))
    assert chain.kind == "pw->dw->pw"
    choices = intensive_seed.BlockChoices(func, chain, avx2.tvm(), 2, budget)
    unit = microkernel.unit_of(avx2.tvm())
    assert choices("tile", chain.downstream, 1, h, 7) == 7  # the cap: the fewest halo rows computed twice
    assert choices("other", chain.head, 1, 9, 4) == 1
    rows, vectors, lanes = microkernel.block_for(24, w, unit, min_lanes=1)  # D: 24 channels × 14 columns
    assert lanes == vector_lanes(avx2.tvm())
    assert choices("register", chain.downstream, 2, w, 8) == rows
    assert choices("vector", chain.downstream, 3, 24, 32) == vectors * lanes
    assert choices("vector", chain.downstream, 3, 24, 4) == 4  # never over the space's cap
    assert choices("unroll", chain.downstream, -1, 0, 0) == intensive_seed.BLOCK_UNROLLS[0]
    seeds = intensive_seed.block_seeds(func, avx2.tvm(), 2, budget)
    assert len(seeds) == len(intensive_seed.BLOCK_UNROLLS)
    args, want = reference_of(func)
    for sch, shape in seeds:
        assert shape == f"{rows}×{vectors}×{lanes}"
        trace = plain(sch.trace.as_json())
        assert intensive_seed.tile_decisions(trace, chain.downstream)[1] == [h // 7, 7]
        done = postprocess(sch, avx2)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(done.mod, args, avx2.tvm()))) <= 1e-5
    committed = []
    monkeypatch.setattr(compose, "commit_seed", lambda sch, *a: committed.append(sch) or True)
    task, plan = SimpleNamespace(name="chain"), SimpleNamespace(funcs={"chain": func})
    settings = TuneSettings(tile_cache=budget)
    assert compose.seed_from_block(task, plan, None, avx2, {}, settings) == f"fused {rows}×{vectors}×{lanes}"
    assert len(committed) == 2
    assert compose.seed_from_block(task, plan, None, avx2, {}, replace(settings, intensive=False)) == ""
