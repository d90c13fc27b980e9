"""The hot loop of a kernel read from its assembly (toolchain/asm.py), on ARM without a phone: a register-blocked
matmul (toolchain/tune/microkernel.py) keeps its accumulators in registers; one too large for them spills."""

import pytest

from toolchain import asm
from toolchain.tune.microkernel import UNITS, VectorUnit, block_matmul, block_shape

#: (architecture for the reader, its vector unit, a TVM target that emits it; compiled here, never run)
TARGETS = {
    "neon": ("aarch64", UNITS["aarch64"], {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                                          "mattr": ["+neon"]}),
    "avx512": ("x86_64", UNITS["x86_64"], {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}),
    "avx2": ("x86_64", UNITS["avx2"], {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}),
}


def matmul(rows: int, vectors: int, lanes: int, m: int = 48, k: int = 64, dtype: str = "float32"):
    from tvm import s_tir, te

    n = 2 * vectors * lanes
    a, b = te.placeholder((m, k), name="A", dtype=dtype), te.placeholder((k, n), name="B", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    sch = s_tir.Schedule(te.create_prim_func([a, b, c]))
    return block_matmul(sch, "C", rows, vectors, lanes).mod["main"]


def hot_loop(func, target: dict, arch: str):
    import tvm

    return asm.hottest(asm.innermost_loops(asm.assembly(func, tvm.target.Target(target)), arch))


def test_the_block_leaves_a_register_for_each_operand_vector_and_the_broadcast():
    for unit in (*UNITS.values(), VectorUnit(8, 4)):
        rows, vectors = block_shape(unit)
        assert rows * vectors + vectors + 1 <= unit.registers
    assert block_shape(UNITS["aarch64"]) == (8, 3)  # 24 accumulators of v0–v31
    assert block_shape(UNITS["avx2"]) == (6, 2)  # 12 of ymm0–ymm15, as MLAS's 6×16 AVX2 kernel
    assert block_shape(UNITS["x86_64"]) == (5, 3)  # 15 of zmm0–zmm31: 16 would be 1 KiB, a heap workspace per tile


@pytest.mark.parametrize("isa", TARGETS)
def test_the_blocks_accumulators_are_a_stack_array_not_a_workspace_allocated_per_tile(isa):
    """TVM lowers a "local" buffer, and any of 1 KiB or more, to a heap workspace allocated and freed in every
    parallel tile (its accumulators then live in memory): the block's must be neither."""
    import tvm

    arch, unit, target = TARGETS[isa]
    rows, vectors = block_shape(unit)
    code = asm.assembly(matmul(rows, vectors, unit.lanes), tvm.target.Target(target))
    assert "TVMBackendAllocWorkspace" not in code


@pytest.mark.parametrize("isa", TARGETS)
def test_the_register_block_compiles_to_fmas_without_spills(isa):
    arch, unit, target = TARGETS[isa]
    rows, vectors = block_shape(unit)
    loop = hot_loop(matmul(rows, vectors, unit.lanes), target, arch)
    assert loop is not None and loop.spills == 0, loop
    assert loop.fmas >= rows * vectors and loop.fmas % (rows * vectors) == 0, loop  # (LLVM may unroll k)


def test_a_block_larger_than_the_registers_spills_and_the_reader_sees_it():
    arch, unit, target = TARGETS["neon"]
    loop = hot_loop(matmul(8, 8, unit.lanes), target, arch)  # 64 accumulators for 32 registers
    assert loop is not None and loop.spills > 0, loop


def test_the_register_block_computes_the_matmul_in_parallel_without_a_race():
    import numpy as np
    import tvm

    from toolchain.tune.race_check import parallel_races

    func = matmul(8, 3, 8)  # 8-lane vectors: any x86-64 or AArch64 host runs them
    assert parallel_races(func) == []
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target("llvm"))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((48, 64)).astype("float32"), rng.standard_normal((64, 48)).astype("float32")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((48, 48), "float32"), dev)
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_a_float16_block_fills_the_neon_registers_with_eight_lanes():
    """--precision fp16: the same registers hold twice the lanes, the block keeps its shape, and the hot loop's FMAs
    are whole-register ``fmla v.8h`` (a float32 block's 4 lanes would use half of each register)."""
    import re

    import tvm

    arch, unit, target = TARGETS["neon"]
    half = unit.of("float16")
    assert (half.lanes, half.element_bytes) == (8, 2) and block_shape(half) == block_shape(unit)
    rows, vectors = block_shape(half)
    code = asm.assembly(matmul(rows, vectors, half.lanes, dtype="float16"),
                        tvm.target.Target({**target, "mattr": ["+neon", "+fullfp16"]}))
    loop = asm.hottest(asm.innermost_loops(code, arch))
    assert loop is not None and loop.spills == 0 and loop.fmas >= rows * vectors, loop
    assert re.search(r"fmla\s+v\d+\.8h", code) and not re.search(r"fmla\s+v\d+\.4h", code)


def test_a_5x5_depthwise_block_on_neon_keeps_its_window_rolled_and_barely_spills():
    """NEON's FMLA takes no memory operand: a 5 × 5 window unrolled around a 7 × 3 block kept every tap's loads in
    registers and spilled (MnasNet-B1 @112's 7 × 7 × 240 depthwise conv: 623 stack accesses in its FMA loops). Its
    window stays a loop on ARM (3 × 3 unrolled) and stays unrolled on x86, whose FMAs read memory."""
    from tests.toolchain.test_microkernel import _kernels
    from toolchain.targets import resolve_target
    from toolchain.tune import microkernel as mk
    from toolchain.tune.adapter import postprocess

    arm = resolve_target("linux-arm64")
    assert UNITS["aarch64"].window == 9 and UNITS["avx2"].window == UNITS["x86_64"].window == 49
    five = {name: func for name, func in _kernels("mnasnet", (1, 3, 112, 112), arm).items()
            if (k := mk.matmul_like(func)) is not None and k.depthwise and k.reduce[:2] == (5, 5)}
    assert len(five) >= 3
    for name, func in five.items():
        sch, _ = mk.register_block(func, arm.tvm())
        code = asm.assembly(postprocess(sch, arm).mod["main"], arm.tvm())
        loops = [loop for loop in asm.innermost_loops(code, "aarch64") if loop.fmas]
        assert loops and sum(loop.spills for loop in loops) <= 24, (name, loops)


@pytest.mark.parametrize("isa", TARGETS)
def test_a_winograd_convs_matmuls_compile_to_fmas_without_spills(isa):
    """The (m + 2)² matmuls of a Winograd conv (toolchain/tune/winograd.py) are the same register block, its tiles
    rounded up to whole rows of it as the rewrite does: the matmuls' loop (the most FMAs of a loop that stores
    nothing) holds every
    accumulator's FMA and spills nothing, on NEON as on x86 (a masked last row of tiles spilled on AVX2)."""
    from dataclasses import replace

    import tvm

    from toolchain import winograd
    from toolchain.tune import winograd as winograd_schedule

    arch, unit, target = TARGETS[isa]
    conv = winograd.Conv(28, 28, 32, 64, (1, 1, 1, 1), 4)  # 49 tiles: no row count but 7 divides them
    conv = replace(conv, rows=winograd_schedule.tile_rows(conv, tvm.target.Target(target)))
    sch, shape = winograd_schedule.schedule(winograd.kernel(conv), tvm.target.Target(target))
    rows, vectors, lanes = map(int, shape.split("×"))
    assert lanes == unit.lanes and rows * vectors >= 12, shape  # a full block, not the 7 × 1 that divides 49
    loops = asm.innermost_loops(asm.assembly(sch.mod["main"], tvm.target.Target(target)), arch)
    loop = max((loop for loop in loops if not loop.stores), key=lambda loop: loop.fmas, default=None)
    assert loop is not None and loop.spills == 0 and loop.fmas % (rows * vectors) == 0, loops
