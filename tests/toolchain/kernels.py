"""Running one PrimFunc here, as the kernel tests do."""

import numpy as np


def run_kernel(func, target, seed: int = 0) -> list[np.ndarray]:
    """``func`` built for ``target`` and run here on random float32 arguments; every argument after the call."""
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    rng = np.random.default_rng(seed)
    args = [tvm.runtime.tensor(rng.standard_normal([int(x) for x in p.ty.shape]).astype("float32"))
            for p in func.params]
    lib["main"](*args)
    return [a.numpy() for a in args]
