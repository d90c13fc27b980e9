"""Output channels padded to whole vectors (``--pad-channels``, on by default): a conv or matmul by :data:`RULES`, a
conv whose output reaches a depthwise conv or a channel concat by :data:`CHAIN_RULES`, one of few channels by the
target's vector (:data:`NARROW_RULES`); the same tensor computed. Why: docs/partitioning.md (Padded output channels)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain import constfold
from toolchain.relayout import _shape as static_shape

#: float32 lanes of the widest vector agoc builds for (AVX-512); a multiple of NEON's 4 and AVX2's 8
LANES = 16


@dataclass(frozen=True)
class PadRule:
    """Output channels of at least ``min_channels`` that :data:`LANES` does not divide are padded to the
    next multiple of ``multiple`` × :data:`LANES`, when that adds at most ``max_waste`` of the work and
    the op computes at least ``min_rows`` outputs per channel (a conv's N × H × W, a matmul's rows)."""

    min_channels: int
    multiple: int  # of LANES
    max_waste: float
    min_rows: int
    why: str


#: Below this many rows a kernel streams its weights (2 FLOP per weight and row): the vector width
#: hardly matters and the padding's extra weight bytes are the cost. MnasNet-B1's classifier matmul
#: (one row, 1280 → 1000, 5 MB of weights) alone, 128 trials each: 0.062 ms as it is, 0.093 padded to
#: 1024; SqueezeNet's classifier conv (36 rows) 1.58× faster padded.
MIN_ROWS = 16

#: First rule whose padding fits its ``max_waste`` applies; none: the op is left alone.
RULES: tuple[PadRule, ...] = (
    PadRule(512, 4, 0.05, MIN_ROWS, "1000 → 1024 on AVX-512 (64 = four registers): SqueezeNet's classifier "
                                    "conv tuned 1.58× faster (docs/partitioning.md)"),
    PadRule(512, 1, 0.05, MIN_ROWS, "1000 → 1008 (one AVX-512 register): 1.26× in the same measurement"),
)

#: For a conv whose output reaches a depthwise conv or a channel concat (:func:`pad_channel_chains`); first match
#: wins.
CHAIN_RULES: tuple[PadRule, ...] = (
    PadRule(32, 1, 0.125, MIN_ROWS, "58 → 64, 116 → 128, 232 → 240 (whole AVX-512 registers): ShuffleNet-V2 "
                                    "@112 1.09–1.16× faster, stock and AGO builds timed together with the "
                                    "unpadded ones; MnasNet-B1's 72 → 80, 120 → 128 inside the unpadded "
                                    "draws' spread (docs/partitioning.md)"),
)


@dataclass(frozen=True)
class NarrowRule:
    """Output channels that the target's vector does not divide, padded to the next multiple of it where that takes
    at most ``max_vectors`` vectors (the register block's channel tile: the slice back to the real channels is then
    fused into the block's write-back, toolchain/tune/microkernel.py), cuts the vector FMAs by ``min_gain`` (the
    channels over the widest vector that divides them, against the padded channels' whole vectors) and the op
    computes at least ``min_rows`` outputs per channel."""

    max_vectors: int
    min_gain: float
    min_rows: int
    why: str


#: For a conv or matmul of few output channels, after the other rules (a conv they pad is left to them); first match.
NARROW_RULES: tuple[NarrowRule, ...] = (
    NarrowRule(4, 1.25, MIN_ROWS, "24 → 32, 40 → 48 on AVX-512 (8-lane vectors → whole registers, a third fewer "
                                  "FMAs): MobileNet-V2 @224's 56 × 56 projections 1.25–1.47× faster alone "
                                  "(docs/partitioning.md)"),
)


def narrow_channels(channels: int, rows: int, lanes: int,
                    rules: tuple[NarrowRule, ...] = NARROW_RULES) -> tuple[int, NarrowRule | None]:
    """(channels to compute, the rule that chose them) for an op of ``channels`` outputs over ``rows`` rows on a
    target of ``lanes`` float32 lanes per vector — ``(channels, None)`` when left alone."""
    from toolchain.tune.microkernel import dividing_lanes

    if lanes < 2 or channels % lanes == 0:
        return channels, None
    vectors = -(-channels // lanes)
    gain = channels / dividing_lanes(channels, lanes) / vectors
    for rule in rules:
        if vectors <= rule.max_vectors and gain >= rule.min_gain and rows >= rule.min_rows:
            return vectors * lanes, rule
    return channels, None


def padded_channels(channels: int, rows: int, rules: tuple[PadRule, ...] = RULES,
                    lanes: int = LANES) -> tuple[int, PadRule | None]:
    """(channels to compute, the rule that chose them) for an op computing ``rows`` outputs per channel —
    ``(channels, None)`` when left alone."""
    if channels % lanes == 0:
        return channels, None
    for rule in rules:
        step = rule.multiple * lanes
        padded = -(-channels // step) * step
        if channels >= rule.min_channels and rows >= rule.min_rows and padded / channels - 1 <= rule.max_waste:
            return padded, rule
    return channels, None


@dataclass(frozen=True)
class Padded:
    """One op the pass padded, and the rule's reason."""

    op: str  # "conv2d" or "matmul"
    channels: int
    padded: int
    why: str

    def to_json(self) -> dict:
        return {"op": self.op, "channels": self.channels, "padded": self.padded, "why": self.why}


#: module attribute :func:`toolchain.build.legalize` sets where it padded: which ops, with the rule's
#: reason (a JSON list of :meth:`Padded.to_json`)
APPLIED_ATTR = "agoc_padded_ops"


def applied(mod) -> bool:
    """Whether a legalized module computes padded channels (its kernels differ from the unpadded
    model's). A model with nothing to pad is the same either way: a database tuned without padding
    serves it with or without."""
    return bool(applied_ops(mod))


def applied_ops(mod) -> list[dict]:
    """What the padding did to a legalized module (:data:`APPLIED_ATTR`): [] where nothing."""
    import json

    detail = mod.attrs.get(APPLIED_ATTR) if mod.attrs is not None else None
    return json.loads(str(detail)) if detail is not None else []


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` with zero rows appended along axis 0 up to ``rows``."""
    pad = np.zeros((rows - array.shape[0], *array.shape[1:]), dtype=array.dtype)
    return np.concatenate([array, pad], axis=0)


def pad_output_channels(mod, rules: tuple[PadRule, ...] = RULES, lanes: int = 0):
    """``(mod, [Padded])``: ``mod`` (imported, before any layout conversion: NCHW convs with OIHW
    weights) with every conv / matmul :func:`padded_channels` pads computing the padded channels,
    then sliced back; then the chains (:func:`pad_channel_chains`); then, for a target of ``lanes`` float32 lanes
    (0: none), the ops of few channels :func:`narrow_channels` pads. Ops it cannot read (symbolic shapes, other
    layouts, weights computed at run time) are left alone."""
    mod, done = _pad_ops(mod, lambda channels, rows: padded_channels(channels, rows, rules))
    mod, chains = pad_channel_chains(mod)
    narrow = []
    if lanes:
        mod, narrow = _pad_ops(mod, lambda channels, rows: narrow_channels(channels, rows, lanes))
    return mod, done + chains + narrow


def _pad_ops(mod, choose):
    """``(mod, [Padded])``: every conv (one group, constant OIHW weight) and matmul (constant weight) for which
    ``choose(channels, rows)`` gives a rule computing the channels it gives, sliced back to the real ones."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    done: list[Padded] = []

    def constant(expr) -> np.ndarray | None:
        value = expr.value if isinstance(expr, tvm.ir.Constant) else None
        return value.numpy() if hasattr(value, "numpy") else None

    def conv(root, _matched):
        w, shape = _conv_weight(root), static_shape(root)
        if w is None or int(root.attrs.groups) != 1 or shape is None:
            return root
        channels = w.shape[0]
        padded, rule = choose(channels, shape[0] * shape[2] * shape[3])
        if rule is None:
            return root
        wide = _conv(root.args[0], _pad_rows(w, padded), root, 1)
        done.append(Padded("conv2d", channels, padded, rule.why))
        return relax.op.strided_slice(wide, axes=[1], begin=[0], end=[channels])

    def matmul(root, matched):
        x, shape = matched[mm_x], static_shape(root)
        if mm_t in matched:  # Gemm with transB: the weight stored (N, K), transposed into the matmul
            w, axes = constant(matched[mm_tw]), matched[mm_t].attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return root
        else:  # MatMul with a (K, N) weight
            w = constant(matched[mm_w])
            w = w.T if w is not None and w.ndim == 2 else None
        if w is None or w.ndim != 2 or shape is None:
            return root
        channels = w.shape[0]
        padded, rule = choose(channels, math.prod(shape[:-1]))
        if rule is None:
            return root
        wide = relax.op.matmul(x, relax.op.permute_dims(relax.const(_pad_rows(w, padded))))
        done.append(Padded("matmul", channels, padded, rule.why))
        return relax.op.strided_slice(wide, axes=[len(shape) - 1], begin=[0], end=[channels])

    conv_x, conv_w = wildcard(), is_const()
    mm_x, mm_w, mm_tw = wildcard(), is_const(), is_const()
    mm_t = is_op("relax.permute_dims")(mm_tw)
    gv = mod.get_global_var("main")
    func = rewrite_call(is_op("relax.nn.conv2d")(conv_x, conv_w), conv, mod[gv])
    func = rewrite_call(is_op("relax.matmul")(mm_x, mm_t | mm_w), matmul, func)
    if done:
        out = type(mod)(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
        out[gv] = func
        mod = relax.transform.Normalize()(out)
    return mod, done


#: ops that compute each channel from the same channel alone: a padded channel axis passes through them
#: (the binary ones when the other operand is a per-channel or scalar constant, or padded alike)
CARRY_UNARY = frozenset({"relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.nn.silu", "relax.tanh",
                         "relax.nn.gelu", "relax.nn.leakyrelu", "relax.nn.relu6"})
CARRY_BINARY = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
                          "relax.minimum"})


def _per_channel(value: np.ndarray, channels: int) -> bool:
    """Whether ``value`` broadcast against an NCHW tensor of ``channels`` channels is one value per
    channel, or one for all."""
    dims = (1,) * (4 - value.ndim) + value.shape if value.ndim <= 4 else None
    return dims is not None and dims[0] == dims[2] == dims[3] == 1 and dims[1] in (1, channels)


def _pad_channel_axis(value: np.ndarray, padded: int) -> np.ndarray:
    """A per-channel constant (:func:`_per_channel`) with its last channel repeated up to ``padded``."""
    axis = value.ndim - 3
    if axis < 0 or value.shape[axis] == 1:
        return value
    widths = [(0, 0)] * value.ndim
    widths[axis] = (0, padded - value.shape[axis])
    return np.pad(value, widths, mode="edge")


def _conv_weight(call) -> np.ndarray | None:
    """The OIHW constant weight of an NCHW conv2d call, or None."""
    import tvm

    attrs, w = call.attrs, call.args[1]
    if (attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or attrs.out_layout != "NCHW"
            or not isinstance(w, tvm.ir.Constant)):
        return None
    value = w.value.numpy()
    return value if value.ndim == 4 else None


def _conv(x, weight: np.ndarray, like, groups: int):
    """conv2d of ``x`` by ``weight`` with ``like``'s attributes but ``groups``."""
    from tvm import relax

    a = like.attrs
    return relax.op.nn.conv2d(x, relax.const(weight), strides=a.strides, padding=a.padding, dilation=a.dilation,
                              groups=groups, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
                              out_dtype=a.out_dtype)


def _op_name(expr) -> str | None:
    import tvm
    from tvm import relax

    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else None


def _carries(call, var, channels: int) -> bool:
    """Whether ``call`` computes each channel of ``var`` (NCHW, ``channels`` channels) from that channel
    alone, so ``var`` padded makes its result padded alike (before knowing what else is padded: a binary
    op's other operand must be a constant)."""
    import tvm

    name = _op_name(call)
    if name in CARRY_UNARY:
        return call.args[0].same_as(var)
    if name in CARRY_BINARY:
        others = [a for a in call.args if not a.same_as(var)]
        return (len(others) == 1 and isinstance(others[0], tvm.ir.Constant)
                and _per_channel(others[0].value.numpy(), channels))
    return False


def _is_depthwise(call, var, channels: int) -> bool:
    if _op_name(call) != "relax.nn.conv2d" or not call.args[0].same_as(var):
        return False
    w = _conv_weight(call)
    return w is not None and int(call.attrs.groups) == channels == w.shape[0] and w.shape[1] == 1


def _is_channel_concat(call) -> bool:
    """A concat along an NCHW tensor's channels: it copies its inputs whatever they are, so one that reads the
    real channels of a padded tensor (a ``strided_slice`` fused into it) costs no more than before."""
    if _op_name(call) != "relax.concat" or call.attrs.axis is None:
        return False
    shape = static_shape(call)
    return shape is not None and len(shape) == 4 and int(call.attrs.axis) % 4 == 1


def _chain_plan(func, rules: tuple[PadRule, ...]) -> dict:
    """{conv binding var: (channels, padded, rule)} for every conv (one group, constant weight, NCHW)
    whose output reaches a depthwise conv or a channel concat through ops that carry its channels, and a rule
    pads."""
    from tvm import relax

    bindings = [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]
    users: dict = {}
    for b in bindings:
        for var in relax.analysis.free_vars(b.value):  # inside tuples too (a concat's)
            users.setdefault(var, []).append(b)

    def reaches_chain_end(var, channels: int) -> bool:
        for b in users.get(var, ()):
            if _is_depthwise(b.value, var, channels) or _is_channel_concat(b.value):
                return True
            if (isinstance(b.var, relax.DataflowVar) and _carries(b.value, var, channels)
                    and reaches_chain_end(b.var, channels)):
                return True
        return False

    plan = {}
    for b in bindings:
        if _op_name(b.value) != "relax.nn.conv2d" or int(b.value.attrs.groups) != 1:
            continue
        w, shape = _conv_weight(b.value), static_shape(b.value)
        if w is None or shape is None or not isinstance(b.var, relax.DataflowVar):
            continue
        padded, rule = padded_channels(w.shape[0], shape[0] * shape[2] * shape[3], rules)
        if rule is not None and reaches_chain_end(b.var, w.shape[0]):
            plan[b.var] = (w.shape[0], padded, rule)
    return plan


def _carry(call, name: str, padded_arg):
    """A per-channel op on padded channels, carried: (new value, (channels, padded)), or None where it
    cannot be (``padded_arg``: an argument's (padded replacement, channels, padded) or None)."""
    import tvm
    from tvm import relax

    arg = padded_arg(call.args[0]) if call.args else None
    if name in CARRY_UNARY and arg is not None:
        return relax.Call(call.op, [arg[0], *call.args[1:]], call.attrs, call.ty_args), arg[1:]
    if name not in CARRY_BINARY or len(call.args) != 2:
        return None
    ins = [padded_arg(a) for a in call.args]
    known = [i for i in ins if i is not None]
    if not known or any(i[1:] != known[0][1:] for i in known):
        return None
    channels, wide = known[0][1:]
    args = []
    for a, i in zip(call.args, ins):
        if i is not None:
            args.append(i[0])
        elif isinstance(a, tvm.ir.Constant) and _per_channel(a.value.numpy(), channels):
            args.append(relax.const(_pad_channel_axis(a.value.numpy(), wide)))
        else:
            return None
    return relax.Call(call.op, args, call.attrs, call.ty_args), (channels, wide)


def _rewrite_conv(var, call, arg, plan: dict, visit):
    """A conv that reads padded channels (``arg``) or that ``plan`` pads: (new value, (channels, padded)
    or None), or None where it is left as it is; ``visit`` rewrites its input."""
    w = _conv_weight(call)
    if w is None:
        return None
    groups = int(call.attrs.groups)
    if arg is None:
        if var not in plan:
            return None
        x = visit(call.args[0])
    else:
        x, channels, wide = arg
        if groups == channels == w.shape[0] and w.shape[1] == 1:  # depthwise: zero filters
            return _conv(x, _pad_rows(w, wide), call, wide), (channels, wide)
        if groups != 1:
            return None
        w = np.pad(w, [(0, 0), (0, wide - w.shape[1]), (0, 0), (0, 0)])  # zero weights for them
    if var in plan:
        channels, wide, _ = plan[var]
        return _conv(x, _pad_rows(w, wide), call, 1), (channels, wide)
    return _conv(x, w, call, 1), None


def pad_channel_chains(mod, rules: tuple[PadRule, ...] = CHAIN_RULES):
    """``(mod, [Padded])``: ``mod`` (NCHW, before legalizing) with every conv :func:`_chain_plan` picks
    computing padded output channels, carried through the per-channel ops and depthwise convs after it
    into the convs that consume them (their weights' input channels padded with zeros); anything else
    that reads a padded tensor reads a ``strided_slice`` of its real channels. ``mod`` itself when nothing
    is padded."""
    from tvm import relax

    gv = mod.get_global_var("main")
    # the biases: reshapes of constants, as imported (numpy first: FoldConstant builds a PrimFunc for each)
    folded = relax.transform.FoldConstant()(constfold.fold_layout_constants(mod))
    plan = _chain_plan(folded[gv], rules)
    if not plan:
        return mod, []

    @relax.expr_functor.mutator
    class Chains(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.padded: dict = {}  # original var -> (its padded replacement, channels, padded channels)
            self.sliced: set = set()

        def padded_arg(self, arg):
            return self.padded.get(arg) if isinstance(arg, relax.Var) else None

        def rewrite(self, var, call):
            """(new value, (channels, padded) or None) where ``call`` reads or makes padded channels;
            None where it is left as it is."""
            name = _op_name(call)
            if not isinstance(var, relax.DataflowVar) or name is None:
                return None
            if name == "relax.nn.conv2d":
                return _rewrite_conv(var, call, self.padded_arg(call.args[0]), plan, self.visit_expr)
            return _carry(call, name, self.padded_arg)

        def visit_var_binding_(self, binding):
            var = binding.var
            new = self.rewrite(var, binding.value)
            if new is not None:
                value, carried = new
                out = self.builder_.emit(value, name_hint=var.name)
                if carried is None:
                    self.set_var_remap(var, out)
                else:
                    self.padded[var] = (out, *carried)
                return
            for arg in relax.analysis.free_vars(binding.value):  # any other use reads the real channels
                got = self.padded_arg(arg)
                if got is not None and arg not in self.sliced:
                    real = relax.op.strided_slice(got[0], axes=[1], begin=[0], end=[got[1]])
                    self.set_var_remap(arg, self.builder_.emit(real, name_hint=f"{arg.name}_real"))
                    self.sliced.add(arg)
            value = self.visit_expr(binding.value)
            kind = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
            new_var = kind(var.name, var.ty)
            self.builder_.emit_normalized(relax.VarBinding(new_var, value))
            self.set_var_remap(var, new_var)

    out = type(folded)(dict(folded.functions), attrs=folded.attrs, global_infos=folded.global_infos)
    out[gv] = Chains(folded).visit_expr(folded[gv])
    done = [Padded("conv2d", c, p, rule.why) for c, p, rule in plan.values()]
    return relax.transform.Normalize()(relax.transform.DeadCodeElimination()(out)), done
