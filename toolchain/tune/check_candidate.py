"""Numeric check of one tuned schedule against the unscheduled kernel, run in a fresh process with glibc's
malloc perturbation: ``python -m toolchain.tune.check_candidate`` (JSON request on stdin, one JSON line out),
or ``--serve``: one request per line, each in a child forked from a process that has imported TVM.
The request and why a fresh process: docs/tuning-internals.md."""

from __future__ import annotations

import json
import sys

#: environment for the checking process: fresh mmaps for big buffers, perturbed malloc contents
CHECK_ENV = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.perturb=129"}
RTOL = 1e-4
ATOL = 1e-5
#: (atol, rtol) of an output by its dtype, the rtol relative to the reference's largest value: a float16 kernel
#: (``--precision fp16``) keeps 11 significant bits, and a schedule that sums its reduction in another order moves
#: each output by a few of them (toolchain/verify.py TOLERANCES: what a whole fp16 model is held to)
TOLERANCES = {"float16": (1e-3, 2e-2)}


def tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) a candidate's output of ``dtype`` is held to."""
    return TOLERANCES.get(str(dtype), (ATOL, RTOL))


def _buffers(func, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for param in func.params:  # in TVM 0.27 a PrimFunc param carries its buffer type directly
        shape = [int(d) for d in param.ty.shape]
        dtype = str(param.ty.dtype)
        if dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.startswith(("int", "uint")):
            arrays.append(np.zeros(shape, dtype))
        else:
            arrays.append(np.zeros(shape, dtype))
    return arrays


def check(workload_json: str, trace_json, target: dict, seed: int = 0) -> dict:
    import numpy as np
    import tvm
    from tvm import s_tir

    from toolchain.tune.rolling import rolled

    mod = tvm.ir.load_json(workload_json)
    sch = s_tir.Schedule(mod)
    s_tir.Trace.apply_json_to_schedule(trace_json, sch)
    tgt = tvm.target.Target(target)
    ref_lib = tvm.compile(mod, target=tgt)
    cand_lib = tvm.compile(rolled(sch.mod), target=tgt)
    func = mod["main"]
    host = _buffers(func, seed)
    dev = tvm.cpu()
    ref = [tvm.runtime.tensor(a.copy(), dev) for a in host]
    cand = [tvm.runtime.tensor(a.copy(), dev) for a in host]
    # first a run on NaN: every buffer and workspace it writes holds NaN, so that a read of memory the candidate never
    # writes (a tile's halo) shows in the real run below, whatever the memory held before
    cand_lib["main"](*[tvm.runtime.tensor(np.full_like(a, np.nan) if a.dtype.kind == "f" else a.copy(), dev)
                       for a in host])
    cand_lib["main"](*cand)  # before the reference: what the reference leaves in freed memory is right
    ref_lib["main"](*ref)
    worst_abs, worst_ref = 0.0, 0.0
    for r, c in zip(ref, cand):
        rn, cn = r.numpy().astype(np.float64), c.numpy().astype(np.float64)
        if not np.all(np.isfinite(cn) | ~np.isfinite(rn)):
            return {"ok": False, "max_abs": float("inf"), "max_ref": 0.0, "reason": "NaN/Inf in candidate output"}
        diff = float(np.abs(cn - rn).max()) if rn.size else 0.0
        scale = float(np.abs(rn).max()) if rn.size else 0.0
        worst_abs, worst_ref = max(worst_abs, diff), max(worst_ref, scale)
        atol, rtol = tolerance(r.dtype)
        if diff > atol + rtol * scale:
            return {"ok": False, "max_abs": diff, "max_ref": scale,
                    "reason": "outputs differ from the unscheduled kernel"}
    return {"ok": True, "max_abs": worst_abs, "max_ref": worst_ref, "reason": ""}


def answer(request: dict) -> dict:
    """The check's answer to one request; a candidate that fails to apply or build is a failed candidate."""
    try:
        return check(request["workload"], request["trace"], request["target"], int(request.get("seed", 0)))
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "max_abs": None, "max_ref": None, "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}


def serve(stdin, stdout) -> int:
    """Answer one JSON request per line of ``stdin``, each in a child forked from this process: it has imported
    TVM and run nothing, so each check starts, as a fresh process does, with no memory an earlier check wrote."""
    import tvm  # noqa: F401 - imported once here, for every child
    from tvm import s_tir  # noqa: F401

    try:
        for line in stdin:
            stdout.write(json.dumps(forked(json.loads(line))) + "\n")
            stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the session stops, so does this
        return 130
    return 0


def forked(request: dict) -> dict:
    """:func:`answer` in a forked child, killed after ``request["timeout"]`` seconds."""
    from toolchain.tune import forked as fork

    ok, value = fork.call(lambda: answer(request), float(request.get("timeout", 300)))
    return value if ok else {"ok": False, "reason": f"check {value}" if "timed out" in value else f"checker {value}"}


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return serve(sys.stdin, sys.stdout)
    sys.stdout.write(json.dumps(answer(json.loads(sys.stdin.read()))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
