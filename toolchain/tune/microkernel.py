"""A register-blocked inner block for a matmul-like reduction: rows × vectors of accumulators held in registers
across the reduction loop, its shape chosen from the target's vector registers (the MLAS / XNNPACK micro-kernel).
Not yet in the search space: toolchain/asm.py checks what it compiles to (docs/tuning-internals.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VectorUnit:
    registers: int  # architectural vector registers
    lanes: int  # FP32 lanes per register


#: the vector units of the targets' ISAs (the key: toolchain.asm's architecture, or "avx2" for x86 without AVX-512)
UNITS = {
    "aarch64": VectorUnit(32, 4),  # NEON: v0–v31, 128 bits
    "x86_64": VectorUnit(32, 16),  # AVX-512: zmm0–zmm31
    "avx2": VectorUnit(16, 8),  # ymm0–ymm15
}

MAX_ROWS, MAX_VECTORS = 8, 4


def block_shape(unit: VectorUnit) -> tuple[int, int]:
    """(rows, vectors) of accumulators: the most that leave a register for each vector of the other operand and one
    for the broadcast row value (rows · vectors + vectors + 1 ≤ registers), the rows the more when they tie."""
    fits = [(r * v, r, v) for r in range(1, MAX_ROWS + 1) for v in range(1, MAX_VECTORS + 1)
            if r * v + v + 1 <= unit.registers]
    _, rows, vectors = max(fits)
    return rows, vectors


def block_matmul(sch, block: str, rows: int, vectors: int, lanes: int, parallel: bool = True):
    """Schedule ``block`` (C[i, j] += A[i, k] · B[k, j], spatial loops i, j then the reduction k) with a ``rows`` ×
    ``vectors``·``lanes`` register block: accumulators written to a local buffer inside the (i, j) tile, the row and
    vector loops unrolled around a vectorised lane loop, innermost under k; the tiles in parallel. Returns ``sch``."""
    c = sch.get_sblock(block)
    i, j, k = sch.get_loops(c)[-3:]
    io, ii = sch.split(i, [None, rows])
    jo, jj, jv = sch.split(j, [None, vectors, lanes])
    sch.reorder(io, jo, k, ii, jj, jv)
    acc = sch.cache_write(c, 0, "local")
    sch.reverse_compute_at(acc, jo)
    if parallel:  # before the reduction is split into init and update: parallel needs one complete block
        sch.parallel(sch.fuse(io, jo))
    sch.unroll(ii)
    sch.unroll(jj)
    sch.vectorize(jv)
    sch.decompose_reduction(c, k)
    sch.vectorize(sch.get_loops(acc)[-1])
    return sch
