"""Layout clean-up after ``ConvertLayout``: transposes moved past the ops that cannot follow a layout.

Relax's ``ConvertLayout`` puts every conv in NHWC and lets the layout flow through the ops that know
how to follow it (elementwise ops, ``concat``, ``split``, pools). A ``reshape`` cannot: it gets a
transpose back to NCHW in front of it, and whatever reads its result in NHWC a transpose again.
ShuffleNet-V2's channel shuffle — ``reshape (N, g, C/g, H, W)`` → ``permute (0, 2, 1, 3, 4)`` →
``reshape (N, C, H, W)`` — and the ``split`` after it sat between such transposes: 12 of the 33
kernels of the stock partition were layout kernels.

The rules (:data:`RULES`, each a pattern and a rewrite, applied until none matches) move an NHWC → NCHW
transpose *down* past a shuffle, a split or a concat, where it meets the NCHW → NHWC transpose that follows and
both cancel:

* ``shuffle``: the channel shuffle of ``permute(x, NHWC→NCHW)`` is the same shuffle done on ``x``'s last
  dim (``reshape (N, H, W, g, C/g)`` → ``permute (0, 1, 2, 4, 3)`` → ``reshape (N, H, W, C)``), then the
  transpose;
* ``split``: an item of ``split(permute(x, p), axis=a)`` is ``permute`` of the same item of ``split(x,
  axis=p[a])``;
* ``concat``: a concat of tensors transposed alike is the transpose of their concat on the matching dim;
* ``cancel``: two transposes in a row compose into one, or into nothing.

Before ``ConvertLayout``, :func:`follow_layout` writes the elementwise ops it has no layout rule for
(:data:`LAYOUT_BLIND_RULES`: ``clip`` from HardSwish / HardSigmoid, ``leakyrelu``) as ops it can carry a
layout through, so they need no transposes at all.

Every rewrite computes the same tensor (tests/toolchain/test_relayout.py runs both); what is left
unused goes with dead-code elimination.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: NHWC → NCHW, as ``permute_dims`` axes
TO_NCHW = (0, 3, 1, 2)


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _shape(expr) -> tuple[int, ...] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        return tuple(int(s) for s in shape.values) if shape is not None else None
    except (TypeError, AttributeError):
        return None  # symbolic


def _axes(call) -> tuple[int, ...] | None:
    axes = call.attrs.axes
    return _ints(axes) if axes is not None else None


@dataclass(frozen=True)
class Rule:
    name: str
    what: str  # the rewrite, in words
    pattern: Callable[[], tuple]  # () -> (root pattern, {role: sub-pattern})
    rewrite: Callable[[object, dict], object]  # (matched root, {role: matched expr}) -> new expr or the root


def _shuffle_pattern():
    from tvm.relax.dpl import is_op, wildcard

    x = wildcard()
    to_nchw = is_op("relax.permute_dims")(x)
    split_groups = is_op("relax.reshape")(to_nchw, wildcard())
    swap = is_op("relax.permute_dims")(split_groups)
    merge = is_op("relax.reshape")(swap, wildcard())
    return merge, {"x": x, "to_nchw": to_nchw, "split_groups": split_groups, "swap": swap}


def _shuffle_rewrite(root, m: dict):
    from tvm import relax

    x, to_nchw, groups, swap = m["x"], m["to_nchw"], m["split_groups"], m["swap"]
    nhwc, grouped, out = _shape(x), _shape(groups), _shape(root)
    if _axes(to_nchw) != TO_NCHW or _axes(swap) != (0, 2, 1, 3, 4) or None in (nhwc, grouped, out) \
            or (len(nhwc), len(grouped)) != (4, 5):
        return root
    n, h, w, c = nhwc
    _, g, per, gh, gw = grouped
    if (gh, gw) != (h, w) or g * per != c or out != (n, c, h, w):
        return root
    shuffled = relax.op.reshape(
        relax.op.permute_dims(relax.op.reshape(x, (n, h, w, g, per)), [0, 1, 2, 4, 3]), (n, h, w, c))
    return relax.op.permute_dims(shuffled, list(TO_NCHW))


def _split_pattern():
    from tvm.relax.dpl import is_op, is_tuple_get_item, wildcard

    x = wildcard()
    transposed = is_op("relax.permute_dims")(x)
    split = is_op("relax.split")(transposed)
    return is_tuple_get_item(split), {"x": x, "transposed": transposed, "split": split}


def _split_rewrite(root, m: dict):
    from tvm import relax

    axes, split = _axes(m["transposed"]), m["split"]
    if axes is None:
        return root
    attrs = split.attrs
    sections = attrs.indices_or_sections  # a count, or the split points
    sections = int(sections) if hasattr(sections, "value") or isinstance(sections, int) else list(_ints(sections))
    inner = relax.op.split(m["x"], sections, axis=axes[int(attrs.axis)])
    return relax.op.permute_dims(relax.TupleGetItem(inner, root.index), list(axes))


def _concat_pattern(arity: int):
    from tvm.relax.dpl import is_op, is_tuple, wildcard

    xs = [wildcard() for _ in range(arity)]
    transposed = [is_op("relax.permute_dims")(x) for x in xs]
    roles = {**{f"x{i}": x for i, x in enumerate(xs)}, **{f"t{i}": t for i, t in enumerate(transposed)}}
    return is_op("relax.concat")(is_tuple(transposed)), roles


def _concat_rewrite(root, m: dict):
    from tvm import relax

    arity = sum(1 for role in m if role.startswith("t"))
    axes = {_axes(m[f"t{i}"]) for i in range(arity)}
    if len(axes) != 1 or None in axes:
        return root
    (perm,) = axes
    inner = relax.op.concat([m[f"x{i}"] for i in range(arity)], axis=perm[int(root.attrs.axis)])
    return relax.op.permute_dims(inner, list(perm))


def _cancel_pattern():
    from tvm.relax.dpl import is_op, wildcard

    x = wildcard()
    first = is_op("relax.permute_dims")(x)
    return is_op("relax.permute_dims")(first), {"x": x, "first": first}


def _cancel_rewrite(root, m: dict):
    from tvm import relax

    inner, outer = _axes(m["first"]), _axes(root)
    if inner is None or outer is None:
        return root
    composed = [inner[a] for a in outer]
    if composed == list(range(len(composed))):
        return m["x"]
    return relax.op.permute_dims(m["x"], composed)


RULES: tuple[Rule, ...] = (
    Rule("shuffle", "channel shuffle of a transposed tensor → the shuffle on its last dim, then the transpose",
         _shuffle_pattern, _shuffle_rewrite),
    Rule("split", "split of a transposed tensor → split on the matching dim, then the transpose",
         _split_pattern, _split_rewrite),
    *(Rule(f"concat{n}", f"concat of {n} tensors transposed alike → concat on the matching dim, then the transpose",
           lambda n=n: _concat_pattern(n), _concat_rewrite) for n in (2, 3, 4)),
    Rule("cancel", "two transposes in a row → one, or none", _cancel_pattern, _cancel_rewrite),
)


def _scalar(expr) -> float | None:
    """A clip bound (``PrimValue`` / ``IntImm`` / ``FloatImm``) as a float; None where it is not a constant."""
    value = expr
    for _ in range(3):
        if isinstance(value, (int, float)):
            return float(value)
        value = getattr(value, "value", None)
    return None


def _clip_rewrite(root):
    x, low, high = root.args
    bounds = _scalar(low), _scalar(high)
    dtype = getattr(getattr(x, "ty", None), "dtype", None)
    if None in bounds or not dtype or bounds[0] > bounds[1]:
        return root
    from tvm import relax

    return relax.op.minimum(relax.op.maximum(x, relax.const(bounds[0], dtype)), relax.const(bounds[1], dtype))


def _leaky_rewrite(root):
    (x,) = root.args
    alpha = float(root.attrs.alpha)
    dtype = getattr(getattr(x, "ty", None), "dtype", None)
    if not 0.0 <= alpha <= 1.0 or not dtype:  # max(x, αx) is leaky ReLU only for 0 ≤ α ≤ 1
        return root
    from tvm import relax

    return relax.op.maximum(x, relax.op.multiply(x, relax.const(alpha, dtype)))


def _squeeze_rewrite(root):
    (x,) = root.args
    axes, shape = root.attrs.axis, _shape(x)
    axes = _ints(axes) if axes is not None else None
    if axes is None or shape is None or all(a >= 0 for a in axes):
        return root
    from tvm import relax

    return relax.op.squeeze(x, [a % len(shape) for a in axes])


@dataclass(frozen=True)
class OpRule:
    op: str  # the Relax op ConvertLayout has no layout rule for
    arity: int
    what: str
    rewrite: Callable[[object], object]  # matched call -> new expr, or the call itself where the rule does not hold


#: Elementwise ops that ``ConvertLayout`` cannot carry a layout through, as ops that it can. In NHWC each
#: would otherwise sit between a transpose back to NCHW and one forward, in a kernel of its own. TVM's ONNX
#: converter writes HardSwish (``x * clip(x + 3, 0, 6) / 6``) and HardSigmoid with ``clip`` — MobileNet-V3's
#: every activation and squeeze-excite gate — and LeakyRelu (YOLO-style detectors) as ``nn.leakyrelu``.
#: ONNX's own Clip is handled at import (:func:`toolchain.onnx_import._clip_as_relax_ops`).
LAYOUT_BLIND_RULES: tuple[OpRule, ...] = (
    OpRule("relax.clip", 3, "clip(x, lo, hi), constant bounds lo ≤ hi → minimum(maximum(x, lo), hi)", _clip_rewrite),
    OpRule("relax.nn.leakyrelu", 1, "leakyrelu(x, α), 0 ≤ α ≤ 1 → maximum(x, x · α)", _leaky_rewrite),
    OpRule("relax.squeeze", 1, "squeeze with negative axes → the same axes counted from the front "
                               "(ConvertLayout runs out of memory on a negative one)", _squeeze_rewrite),
)


def follow_layout(mod, rules: tuple[OpRule, ...] = LAYOUT_BLIND_RULES):
    """``mod`` with the ops of :data:`LAYOUT_BLIND_RULES` written as ops that follow a layout; they compute
    the same (``clip`` legalizes to ``max(min(x, hi), lo)``, ``leakyrelu`` to ``x > 0 ? x : x · α``)."""
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    out = type(mod)(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            for rule in rules:
                pattern = is_op(rule.op)(*(wildcard() for _ in range(rule.arity)))
                func = rewrite_call(pattern, lambda root, _matched, rule=rule: rule.rewrite(root), func)
            out[gv] = func
    return out


def sink_transposes(mod, rules: tuple[Rule, ...] = RULES, max_rounds: int = 8):
    """``mod`` with :data:`RULES` applied to ``main`` until nothing changes (dead bindings removed)."""
    import tvm_ffi
    from tvm import relax
    from tvm.relax.dpl import rewrite_call

    gv = mod.get_global_var("main")
    func = mod[gv]
    for _ in range(max_rounds):
        before = func
        for rule in rules:
            pattern, roles = rule.pattern()
            func = rewrite_call(pattern, lambda root, matched, rule=rule, roles=roles: rule.rewrite(
                root, {role: matched[p] for role, p in roles.items()}), func)
        if tvm_ffi.structural_equal(func, before):
            break
    out = type(mod)(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    out[gv] = func
    return relax.transform.DeadCodeElimination(["main"])(out)
