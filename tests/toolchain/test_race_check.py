"""A data race in a parallel loop that writes a fused intermediate is caught."""

import numpy as np
import tvm
from tvm.script import tirx as T

from toolchain.tune.race_check import parallel_races


@T.prim_func(s_tir=True)
def racy(A: T.Buffer((16, 8), "float32"), B: T.Buffer((16, 8), "float32")):
    # the fused intermediate is allocated once, outside the parallel loop, and indexed by j only:
    # every i-thread writes the same 8 elements
    tmp = T.sblock_alloc_buffer((8,), "float32")
    for i in T.parallel(16):
        for j in range(8):
            with T.sblock("produce"):
                vi, vj = T.axis.remap("SS", [i, j])
                tmp[vj] = A[vi, vj] * T.float32(2)
            with T.sblock("consume"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = tmp[vj] + T.float32(1)


@T.prim_func(s_tir=True)
def private_per_row(A: T.Buffer((16, 8), "float32"), B: T.Buffer((16, 8), "float32")):
    tmp = T.sblock_alloc_buffer((16, 8), "float32")
    for i in T.parallel(16):
        for j in range(8):
            with T.sblock("produce"):
                vi, vj = T.axis.remap("SS", [i, j])
                tmp[vi, vj] = A[vi, vj] * T.float32(2)
            with T.sblock("consume"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = tmp[vi, vj] + T.float32(1)


@T.prim_func(s_tir=True)
def parallel_reduction(A: T.Buffer((16, 8), "float32"), S: T.Buffer((8,), "float32")):
    for k in T.parallel(16):
        for j in range(8):
            with T.sblock("sum"):
                vj, vk = T.axis.remap("SR", [j, k])
                with T.init():
                    S[vj] = T.float32(0)
                S[vj] = S[vj] + A[vk, vj]


@T.prim_func(s_tir=True)
def overlapping_output(A: T.Buffer((2048,), "float32"), B: T.Buffer((2048,), "float32")):
    # a library schedule re-fitted to a kernel ending in a reshape (seen on tiny-cnn): every iteration of the
    # parallel loop writes B[p : p + 2033], the whole output nearly, while the others still compute theirs
    for p in T.parallel(16):
        for i in range(2033):
            with T.sblock("reshape"):
                v = T.axis.spatial(2048, p + i)
                B[v] = A[v] * T.float32(2)


@T.prim_func(s_tir=True)
def tiled_output(A: T.Buffer((2048,), "float32"), B: T.Buffer((2048,), "float32")):
    for p in T.parallel(16):
        for i in range(128):
            with T.sblock("scale"):
                v = T.axis.spatial(2048, p * 128 + i)
                B[v] = A[v] * T.float32(2)


@T.prim_func(s_tir=True)
def vectors_across_rows(A: T.Buffer((14, 14, 96), "float32"), B: T.Buffer((14, 14, 96), "float32")):
    # an elementwise epilogue fused over its three axes and split into vectors of 64: a vector crosses a row of
    # 96 channels, so each axis's range meets its neighbour's, the elements do not (MobileNet-V3-Small's SE join)
    for f in T.parallel(294):
        for v in T.vectorized(64):
            with T.sblock("scale"):
                h = T.axis.spatial(14, (f * 64 + v) // 1344)
                w = T.axis.spatial(14, (f * 64 + v) % 1344 // 96)
                c = T.axis.spatial(96, (f * 64 + v) % 96)
                B[h, w, c] = A[h, w, c] * T.float32(2)


@T.prim_func(s_tir=True)
def rows_overlapping(A: T.Buffer((14, 96), "float32"), B: T.Buffer((14, 96), "float32")):
    # each iteration writes its row and the next one's first channels: the offsets meet too
    for f in T.parallel(13):
        for v in range(100):
            with T.sblock("scale"):
                h = T.axis.spatial(14, (f * 96 + v) // 96)
                c = T.axis.spatial(96, (f * 96 + v) % 96)
                B[h, c] = A[h, c] * T.float32(2)


def test_parallel_iterations_writing_overlapping_parts_of_an_output_are_a_race():
    (race,) = parallel_races(overlapping_output)
    assert race.overlap and race.block == "reshape" and "overlap" in str(race)
    assert parallel_races(tiled_output) == []
    assert parallel_races(vectors_across_rows) == []  # the elements' offsets: 0–63, then 64–127
    (race,) = parallel_races(rows_overlapping)
    assert race.overlap


def test_shared_intermediate_in_a_parallel_loop_is_a_race():
    (race,) = parallel_races(racy)
    assert (race.block, race.buffer, race.loop) == ("produce", "tmp", "i")
    assert "independently of parallel loop 'i'" in str(race)


def test_per_iteration_intermediate_is_not_a_race():
    assert parallel_races(private_per_row) == []


def test_a_parallelised_reduction_is_a_race():
    assert [(r.block, r.buffer) for r in parallel_races(parallel_reduction)] == [("sum", "S")]


def test_the_correct_schedule_also_computes_the_right_values():
    lib = tvm.compile(tvm.IRModule({"main": private_per_row}), target="llvm")
    a = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    b = tvm.runtime.tensor(np.zeros((16, 8), "float32"))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_allclose(b.numpy(), a * 2 + 1, rtol=1e-6)
