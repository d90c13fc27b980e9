"""Line buffers (toolchain/tune/rolling.py): each core's row tiles in order, what a tile computes with its window's halo
computing each row once per core into a buffer of one window's rows, allocated per core."""

import numpy as np
import pytest

from toolchain.tune import pairs, rolling
from toolchain.tune.adapter import postprocess
from toolchain.tune.candidates import run
from toolchain.tune.intensive import intensive_schedule
from toolchain.tune.schedule_check import execution_counts

from .test_intensive import SPEC, find_pair, reference_of, schedule, zoo

#: (the nth pointwise conv of MobileNet-V2 @56 the block starts at, the dw's stride, output rows a tile's cache holds,
#: a chain or the expand → dw pair tiled by rows)
CASES = {"chain, stride 1": (3, 1, 4, True), "chain, stride 2": (1, 2, 2, True), "dw pair by rows": (3, 1, 1, False)}


def case_of(case):
    """(func, the pair or chain, the tile cache, the dw's output rows, the block computed with the window's halo, the
    block that writes the padded buffer the dw reads, a block computed once either way)."""
    nth, stride, rows, chain = CASES[case]
    func = zoo("class:pointwise_conv", nth, 9 if chain else 8)
    pair = find_pair(func)
    _, h, w, c = pairs.data_shape(func, pair)
    if not chain:  # a line of every pixel does not fit: rows of every channel (test_intensive, the tile cache)
        _, h_in, w_in, c_in = pairs.data_shape(func, pair, pair.upstream)
        pair = find_pair(func, 64 * h_in * w_in // 2, cores=2)
        assert pair.kind == "pw->dw" and pairs.tile_bounds(func, pair, 64 * h_in * w_in // 2) == {1: (1, 1)}
        return func, pair, 64 * h_in * w_in // 2, h, pair.upstream, pair.chain[-1], pair.downstream
    _, _, w_in, c_in = pairs.data_shape(func, pair, "group_conv2d_nhwc")
    budget = 4 * (w * c + (2 * rows + 3) * w_in * c_in)  # a row of U's output, the head's rows
    chain = find_pair(func, budget, cores=2)
    assert chain.kind == "pw->dw->pw"
    return func, chain, budget, h, chain.head, chain.head_chain[-1], chain.upstream


def _counts(mod) -> dict:
    """Block name -> its static execution count (a reduction's by its update, once decomposed)."""
    return {c.name.removesuffix("_update"): c for c in execution_counts(mod) if not c.name.endswith("_init")}


def _parallel_allocations(mod) -> dict:
    """Buffer name -> shape of every buffer the lowered ``mod`` allocates inside a parallel loop."""
    import tvm
    from tvm import s_tir, tirx

    lower = tvm.transform.Sequential([
        s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerOpaqueBlock()])
    found: dict = {}

    def walk(stmt, parallel: bool):
        if isinstance(stmt, tirx.For):
            walk(stmt.body, parallel or int(stmt.kind) == 1)
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                walk(s, parallel)
        elif isinstance(stmt, tirx.AllocBuffer):
            if parallel:
                found[stmt.buffer.name] = [int(d) for d in stmt.buffer.shape]
            walk(getattr(stmt, "body", None), parallel)
        elif stmt is not None and hasattr(stmt, "body"):
            walk(stmt.body, parallel)

    walk(lower(mod)["main"].body, False)
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_each_core_computes_the_window_rows_once_into_one_window(case):
    """Rolled, what a tile computes with its window's halo (a chain's head and its padding, a row-tiled dw pair's U)
    computes each row once per core — a core's first tile its whole window, each later tile the rows past the one
    before — into buffers of one window's rows allocated inside the parallel loop (each core its own), and the kernel
    computes what the unscheduled one does."""
    func, pair, budget, h, halo, padding, once = case_of(case)
    stride = CASES[case][1]
    args, want = reference_of(func)
    for seed in (1, 2):
        sch = schedule(func, seed)
        intensive_schedule(sch, pair, 2, tile_cache=budget)
        sch = postprocess(sch, SPEC)
        rolled = rolling.rolled(sch.mod)
        assert not rolled.same_as(sch.mod)
        plain, done = _counts(sch.mod), _counts(rolled)
        window = _parallel_allocations(rolled)
        padded = sch.get(sch.get_sblock(padding)).writes[0].source.name  # the buffer the dw reads
        assert window[padded][1] < h * stride  # one tile's window of rows
        overlap = 3 - stride  # a 3 × 3 window's halo rows
        needed = plain[halo].needed
        assert needed < done[halo].executed <= needed * (h * stride + 2 * overlap) / (h * stride)  # a core's halo
        assert done[halo].executed < plain[halo].executed
        assert done[once].executed == plain[once].executed
        assert rolling.rolled(rolled).same_as(rolled)  # once
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(rolled, args, SPEC.tvm()))) <= 1e-5


def test_what_has_no_rolled_loop_is_left_as_it_is():
    """A pair (no head), a chain whose tiles are no more than the cores, and a kernel with no pair are built as
    scheduled."""
    func, chain, budget, *_ = case_of("chain, stride 1")
    sch = schedule(func)
    intensive_schedule(sch, find_pair(func), 2)  # the dw → pw pair, tiled by rows: nothing computed twice
    assert rolling.rolled(sch.mod).same_as(sch.mod)
    sch = schedule(func)
    intensive_schedule(sch, chain, 64, tile_cache=budget)  # 64 cores: a tile each at most
    assert not any(rolling.ROLL in sch.get(lp).annotations for lp in sch.get_loops(sch.get_sblock(chain.head)))
    assert rolling.rolled(sch.mod).same_as(sch.mod)
    unscheduled = schedule(func).mod
    assert rolling.rolled(unscheduled).same_as(unscheduled)
