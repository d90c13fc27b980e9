"""A chain's line buffer (toolchain/tune/rolling.py): each core's row tiles in order, the head computing each row
once per core into a buffer of one window's rows, allocated per core."""

import numpy as np
import pytest

from toolchain.tune import pairs, rolling
from toolchain.tune.adapter import postprocess
from toolchain.tune.candidates import run
from toolchain.tune.intensive import intensive_schedule
from toolchain.tune.schedule_check import execution_counts

from .test_intensive import SPEC, find_pair, reference_of, schedule, zoo

#: (the nth pointwise conv of MobileNet-V2 @56 the block starts at, the dw's stride, output rows a tile's cache holds)
CHAINS = {"stride 1": (3, 1, 4), "stride 2": (1, 2, 2)}


def chain_of(case):
    """(func, the chain at a tile cache of ``rows`` output rows, the dw's output rows) of an inverted residual."""
    nth, stride, rows = CHAINS[case]
    func = zoo("class:pointwise_conv", nth, 9)
    pair = find_pair(func)
    _, h, w, c = pairs.data_shape(func, pair)
    _, _, w_in, c_in = pairs.data_shape(func, pair, "group_conv2d_nhwc")
    budget = 4 * (w * c + (2 * rows + 3) * w_in * c_in)  # a row of U's output, the head's rows
    chain = find_pair(func, budget, cores=2)
    assert chain.kind == "pw->dw->pw"
    return func, chain, budget, h


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


@pytest.mark.parametrize("case", list(CHAINS))
def test_each_core_computes_a_chains_head_rows_once_into_one_window(case):
    """Rolled, a chain's head (and its padding) compute each row once per core — a core's first tile its whole
    window, each later tile the rows past the one before — into buffers of one window's rows allocated inside the
    parallel loop (each core its own), and the kernel computes what the unscheduled one does."""
    func, chain, budget, h = chain_of(case)
    args, want = reference_of(func)
    for seed in (1, 2):
        sch = schedule(func, seed)
        intensive_schedule(sch, chain, 2, tile_cache=budget)
        sch = postprocess(sch, SPEC)
        rolled = rolling.rolled(sch.mod)
        assert not rolled.same_as(sch.mod)
        plain, done = _counts(sch.mod), _counts(rolled)
        head = plain[chain.head]
        window = _parallel_allocations(rolled)
        padded = sch.get(sch.get_sblock(chain.head_chain[-1])).writes[0].source.name  # the buffer U reads
        rows = window[padded][1]  # one tile's window of rows
        overlap = 3 - CHAINS[case][1]  # a 3 × 3 window's halo rows
        assert rows < h
        assert head.needed < done[chain.head].executed <= head.needed * (h * CHAINS[case][1] + 2 * overlap) / (
            h * CHAINS[case][1])  # every row once, a core's first tile its halo too
        assert done[chain.head].executed < head.executed
        assert done[chain.upstream].executed == plain[chain.upstream].executed  # U and D as they were
        assert rolling.rolled(rolled).same_as(rolled)  # once
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, run(rolled, args, SPEC.tvm()))) <= 1e-5


def test_what_has_no_rolled_loop_is_left_as_it_is():
    """A pair (no head), a chain whose tiles are no more than the cores, and a kernel with no pair are built as
    scheduled."""
    func, chain, budget, _ = chain_of("stride 1")
    sch = schedule(func)
    intensive_schedule(sch, find_pair(func), 2)  # the dw → pw pair
    assert rolling.rolled(sch.mod).same_as(sch.mod)
    sch = schedule(func)
    intensive_schedule(sch, chain, 64, tile_cache=budget)  # 64 cores: a tile each at most
    assert not any(rolling.ROLL in sch.get(lp).annotations for lp in sch.get_loops(sch.get_sblock(chain.head)))
    assert rolling.rolled(sch.mod).same_as(sch.mod)
    unscheduled = schedule(func).mod
    assert rolling.rolled(unscheduled).same_as(unscheduled)
