"""Layout ops on constants (a weight's transpose, a bias's reshape) folded with numpy before Relax's FoldConstant,
which builds and runs a PrimFunc for each (~50 ms each: most of a CNN's legalizing time)."""

from __future__ import annotations

import numpy as np


def _permute_dims(x: np.ndarray, call) -> np.ndarray:
    axes = call.attrs.axes
    return np.ascontiguousarray(np.transpose(x, [int(a) for a in axes] if axes is not None else None))


def _reshape(x: np.ndarray, call) -> np.ndarray | None:
    values = getattr(call.args[1], "values", None)  # a ShapeExpr; symbolic dims are not folded
    if values is None or not all(hasattr(v, "value") for v in values):
        return None
    return x.reshape([int(v.value) for v in values])


#: relax op -> numpy of the call on its first argument (a constant), None where it cannot tell; only ops whose
#: result is a function of that argument's values and the call's static attributes
FOLDS = {
    "relax.permute_dims": _permute_dims,
    "relax.reshape": _reshape,
}


def fold_layout_constants(mod):
    """``mod`` with every call of a :data:`FOLDS` op on a constant (chains of them too) in ``main`` replaced by its
    value; ``mod`` itself when there is none."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    folded = []

    def rewriter(call, _matches):
        data = getattr(call.args[0], "value", None)
        data = data.numpy() if hasattr(data, "numpy") else None
        value = FOLDS[call.op.name](data, call) if data is not None else None
        if value is None:
            return call
        folded.append(call.op.name)
        return relax.const(value, str(data.dtype))

    pattern = None
    for name in FOLDS:
        this = is_op(name)(is_const()) | is_op(name)(is_const(), wildcard())
        pattern = this if pattern is None else pattern | this
    gv = mod.get_global_var("main")
    func = rewrite_call(pattern, rewriter, mod[gv])
    if not folded:
        return mod
    out = type(mod)(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    out[gv] = func
    return out

