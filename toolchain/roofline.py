"""A kernel's roofline floor: the least time its work and its bytes allow at the best throughputs the
session has measured on this target (``--scheduler roofline``'s forward estimate, as Ansor's task
scheduler estimates what a task could reach from the best throughput of tasks like it).

Counted from the kernel's PrimFunc alone, so the same for every partition of a model:

* work: the iteration points of every block (a conv's multiply-add counts one, its padding copy one
  per element) — arithmetic intensity without a per-op FLOP table;
* bytes: its arguments' sizes — what it must read and write at least once (weights, inputs, outputs);
  a fused intermediate is no argument, so a join's floor counts less traffic than its minis'.

The peaks are the largest work / latency and bytes / latency among the session's measured tasks: no
hardware table, the target's own measurements. A kernel at a peak has no gap; a kernel 2× off both is
half gap. Optimistic by design (the byte peak may come from a kernel whose activations stayed in cache),
so the gap says where the search has most to find, not what it will find.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    work: int  # iteration points of the kernel's blocks
    bytes: int  # its arguments' bytes
    reduce: int = 0  # iteration points of its reduction blocks alone (a conv's multiply-adds; the roof's measure)


@dataclass(frozen=True)
class Peaks:
    work_per_ms: float
    bytes_per_ms: float


def cost(func) -> Cost:
    """The work and the argument bytes of a PrimFunc."""
    from toolchain.opgraph import block_nests

    nests = block_nests(func)
    work = sum(math.prod(e for _, e, _ in b.iters) for b in nests)
    reduce = sum(math.prod(e for _, e, _ in b.iters) for b in nests if any(k == "R" for *_, k in b.iters))
    return Cost(work, arg_bytes(func), reduce)


def arg_bytes(func) -> int:
    """The bytes of a PrimFunc's arguments of static shape."""
    import tvm

    nbytes = 0
    for param in func.params:  # in TVM 0.27 a PrimFunc param carries its buffer type
        ty = getattr(param, "ty", None)
        if ty is None or not hasattr(ty, "shape") or not all(hasattr(d, "value") or isinstance(d, int)
                                                             for d in ty.shape):
            continue
        dtype = tvm.runtime.DataType(str(ty.dtype))
        nbytes += math.prod(int(d) for d in ty.shape) * dtype.bits * dtype.lanes // 8
    return nbytes


def peaks(costs: dict[str, Cost], latency_ms: dict[str, float | None]) -> Peaks | None:
    """The best work and byte rates among the tasks with a measured latency (None: none measured)."""
    timed = [(costs[n], t) for n, t in latency_ms.items() if n in costs and t and t > 0]
    if not timed:
        return None
    return Peaks(max(c.work / t for c, t in timed), max(c.bytes / t for c, t in timed))


def floor_ms(c: Cost, p: Peaks) -> float:
    """The least time ``c`` takes at the peaks: the slower of its work and its traffic."""
    return max(c.work / p.work_per_ms, c.bytes / p.bytes_per_ms)


#: the kernel whose rate is a target's compute roof in a tuning session (``agoc tune --roof``): C = A · B of
#: (M × K) · (K × N) float32, with its register block — a kernel of the kind the models' convs are, its operands a
#: few hundred KiB (in cache), its work divisible by every block shape and vector width
ROOF_PROBE = (480, 256, 192)


def roof_probe(dtype: str = "float32"):
    """The PrimFunc of :data:`ROOF_PROBE`, in ``dtype`` (a float16 session's roof: twice the lanes)."""
    from tvm import te

    m, k, n = ROOF_PROBE
    a, b = te.placeholder((m, k), name="A", dtype=dtype), te.placeholder((k, n), name="B", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def roof_share(c: Cost, best_ms: float | None, roof_per_ms: float | None) -> float | None:
    """The share of the roof (reduction iteration points per ms: multiply-adds) a kernel's best time reaches
    (None: either unknown). Its elementwise blocks do not count: a conv of few input channels would seem faster
    than it is."""
    if not best_ms or best_ms <= 0 or not roof_per_ms:
        return None
    return c.reduce / best_ms / roof_per_ms


def gflops(per_ms: float) -> float:
    """A rate of multiply-adds per ms in GFLOP/s (two flops each)."""
    return 2 * per_ms / 1e6


def kernel_rates(timed: list[dict], built: list[dict], peak_gflops: float | None) -> list[dict]:
    """The runner's per-kernel times (``timed``: name, calls_per_run, median_ms) with each kernel's work from the
    manifest (``built``: name, flops and arg_bytes of one call): GFLOP/s, GB/s of its arguments and the fraction of
    ``peak_gflops`` (None where a count or the peak is missing)."""
    work = {k["name"]: k for k in built}
    out = []
    for k in timed:
        one = work.get(k["name"], {})
        per_run_ms, calls = k.get("median_ms") or 0.0, k.get("calls_per_run") or 0.0
        flops, nbytes = one.get("flops", 0) * calls, one.get("arg_bytes", 0) * calls
        gflops = flops / per_run_ms / 1e6 if flops and per_run_ms > 0 else None
        out.append({**k, "flops": one.get("flops"), "arg_bytes": one.get("arg_bytes"), "gflops": gflops,
                    "gbytes_s": nbytes / per_run_ms / 1e6 if nbytes and per_run_ms > 0 else None,
                    "peak_fraction": gflops / peak_gflops if gflops is not None and peak_gflops else None})
    return out
