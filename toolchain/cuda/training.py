"""Training graphs: forward + loss + backward as one Relax function ``main``.

Built with Relax's training utilities: the forward ("backbone") is written
with Relax primitives, :class:`tvm.relax.training.utils.AppendLoss` appends a
loss (:class:`tvm.relax.training.loss.MSELoss` against a target tensor), and
:func:`tvm.relax.transform.Gradient` differentiates it with respect to the
parameters. ``main(inputs..., params..., target)`` returns ``(loss, grads)``:
one training step without the optimizer update.

The zoo blocks use the zoo's architectures and sizes (weights are seeded, not
the zoo's initializers): BERT-tiny encoder layers (hidden 128, 2 heads of 64,
feed-forward 512, post-norm LayerNorm, GELU; sequence 128) and a MobileNet-V2
inverted-residual block (1x1 expand, ReLU6, 3x3 depthwise, ReLU6, 1x1
project, residual) with BatchNorm in training mode (batch statistics).

Relax 0.27 has no gradient for ``layer_norm``, ``batch_norm``, ``gelu`` or
``erf``, so those are written as primitives (mean, subtract, multiply, sqrt,
divide, tanh): this is APOLLO's "opening compound operators" (§3.2) done at
the source, and GELU is the tanh form of the original BERT code. Softmax
keeps its Relax op (it has a gradient); its legalized PrimFunc is typed
block by block (:mod:`toolchain.cuda.optype`).

ONNX models go through :func:`from_onnx`: weights become parameters,
``LayerNormalization`` is opened into primitives, ``erf`` gets the gradient
Relax lacks; any other op without a gradient is reported by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from toolchain.build import error_line
from toolchain.errors import UnsupportedModelError

F32 = "float32"


@dataclass(frozen=True)
class TrainingGraph:
    """A training step as a Relax module plus what is needed to run it."""

    name: str
    mod: object = field(repr=False)  # IRModule; main(inputs..., params..., target) -> (loss, grads)
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # data inputs, then params, then the loss target
    num_data: int  # how many of ``inputs`` are data inputs (the rest: params, then the target)
    num_params: int
    description: str

    def sample_args(self, seed: int = 0) -> list[np.ndarray]:
        """Deterministic arguments: data ~ N(0,1), weights ~ N(0, 1/fan_in), norm scales ~ 1, target ~ N(0,1)."""
        rng = np.random.default_rng(seed)
        args = []
        for i, (name, shape) in enumerate(self.inputs):
            is_param = self.num_data <= i < self.num_data + self.num_params
            if is_param and name.endswith(("gamma", "_g")):
                value = 1.0 + 0.1 * rng.standard_normal(shape)
            elif is_param and name.endswith(("beta", "_b", "bias")):
                value = 0.1 * rng.standard_normal(shape)
            elif is_param:
                fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else (shape[0] if shape else 1)
                value = rng.standard_normal(shape) / math.sqrt(max(fan_in, 1))
            else:
                value = rng.standard_normal(shape)
            args.append(value.astype(F32))
        return args


def _t(*shape):
    from tvm import relax

    return relax.TensorType(list(shape), F32)


def _c(value):
    from tvm import relax

    return relax.const(np.float32(value), F32)


class _Builder:
    """Tiny helper over a BlockBuilder: named parameters and the layers both zoo blocks need."""

    def __init__(self, bb):
        self.bb = bb
        self.params: list = []

    def param(self, name, *shape):
        from tvm import relax

        var = relax.Var(name, _t(*shape))
        self.params.append(var)
        return var

    def emit(self, expr):
        return self.bb.emit(expr)

    def linear(self, x, din, dout, name):
        from tvm.relax import op

        w, b = self.param(f"{name}_w", din, dout), self.param(f"{name}_bias", dout)
        return self.emit(op.add(self.emit(op.matmul(x, w)), b))

    def layernorm(self, x, dim, name, eps=1e-12):
        """LayerNorm over the last axis, opened into primitives."""
        from tvm.relax import op

        g, b = self.param(f"{name}_gamma", dim), self.param(f"{name}_beta", dim)
        mean = self.emit(op.mean(x, axis=[-1], keepdims=True))
        d = self.emit(op.subtract(x, mean))
        var = self.emit(op.mean(self.emit(op.multiply(d, d)), axis=[-1], keepdims=True))
        std = self.emit(op.sqrt(self.emit(op.add(var, _c(eps)))))
        y = self.emit(op.divide(d, std))
        return self.emit(op.add(self.emit(op.multiply(y, g)), b))

    def batchnorm(self, x, channels, name, eps=1e-5):
        """BatchNorm (training mode: batch statistics over N, H, W) in NCHW, opened into primitives."""
        from tvm.relax import op

        g, b = self.param(f"{name}_gamma", channels, 1, 1), self.param(f"{name}_beta", channels, 1, 1)
        mean = self.emit(op.mean(x, axis=[0, 2, 3], keepdims=True))
        d = self.emit(op.subtract(x, mean))
        var = self.emit(op.mean(self.emit(op.multiply(d, d)), axis=[0, 2, 3], keepdims=True))
        std = self.emit(op.sqrt(self.emit(op.add(var, _c(eps)))))
        y = self.emit(op.divide(d, std))
        return self.emit(op.add(self.emit(op.multiply(y, g)), b))

    def gelu(self, x):
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -- the original BERT code's GELU."""
        from tvm.relax import op

        cube = self.emit(op.multiply(x, self.emit(op.multiply(x, x))))
        inner = self.emit(op.multiply(_c(math.sqrt(2.0 / math.pi)),
                                      self.emit(op.add(x, self.emit(op.multiply(_c(0.044715), cube))))))
        return self.emit(op.multiply(self.emit(op.multiply(_c(0.5), x)),
                                     self.emit(op.add(_c(1.0), self.emit(op.tanh(inner))))))

    def relu6(self, x):
        from tvm.relax import op

        return self.emit(op.minimum(self.emit(op.maximum(x, _c(0.0))), _c(6.0)))

    def conv(self, x, cin, cout, k, name, groups=1, stride=1):
        from tvm.relax import op

        w = self.param(f"{name}_w", cout, cin // groups, k, k)
        return self.emit(op.nn.conv2d(x, w, strides=stride, padding=k // 2, groups=groups))


def _bert_layer(m: _Builder, x, n, s, hidden, heads, ffn, name):
    from tvm.relax import op

    d = hidden // heads

    def split_heads(t, perm):
        return m.emit(op.permute_dims(m.emit(op.reshape(t, (n, s, heads, d))), perm))

    q = split_heads(m.linear(x, hidden, hidden, f"{name}_q"), (0, 2, 1, 3))
    k = split_heads(m.linear(x, hidden, hidden, f"{name}_k"), (0, 2, 3, 1))
    v = split_heads(m.linear(x, hidden, hidden, f"{name}_v"), (0, 2, 1, 3))
    scores = m.emit(op.divide(m.emit(op.matmul(q, k)), _c(math.sqrt(d))))
    probs = m.emit(op.nn.softmax(scores, axis=-1))
    ctx = m.emit(op.permute_dims(m.emit(op.matmul(probs, v)), (0, 2, 1, 3)))
    ctx = m.emit(op.reshape(ctx, (n, s, hidden)))
    attn = m.linear(ctx, hidden, hidden, f"{name}_o")
    h = m.layernorm(m.emit(op.add(x, attn)), hidden, f"{name}_ln1")
    f = m.gelu(m.linear(h, hidden, ffn, f"{name}_ffn1"))
    f = m.linear(f, ffn, hidden, f"{name}_ffn2")
    return m.layernorm(m.emit(op.add(h, f)), hidden, f"{name}_ln2")


def _mbv2_block(m: _Builder, x, cin, t, name):
    from tvm.relax import op

    hidden = cin * t
    y = m.relu6(m.batchnorm(m.conv(x, cin, hidden, 1, f"{name}_expand"), hidden, f"{name}_bn1"))
    y = m.relu6(m.batchnorm(m.conv(y, hidden, hidden, 3, f"{name}_dw", groups=hidden), hidden, f"{name}_bn2"))
    y = m.batchnorm(m.conv(y, hidden, cin, 1, f"{name}_project"), cin, f"{name}_bn3")
    return m.emit(op.add(x, y))


def _backbone(data_shapes, body):
    """Module with ``backbone(data..., params...)`` built by ``body(m, data_vars) -> output``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    m = _Builder(bb)
    data = [relax.Var(name, _t(*shape)) for name, shape in data_shapes]
    # the function's params are known only after the body ran: build it in a scratch function first
    with bb.function("backbone_scratch", data):
        with bb.dataflow():
            out = body(m, data)
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    scratch = bb.get()["backbone_scratch"]
    body_expr = scratch.body
    func = relax.Function(data + m.params, body_expr, scratch.ret_ty, is_pure=True).with_attr(
        "global_symbol", "backbone"
    )
    import tvm

    return tvm.IRModule({"backbone": func}), [(p.name, tuple(int(d) for d in p.ty.shape)) for p in m.params]


def differentiate(backbone_mod, data_shapes, param_shapes, out_shape, name: str, description: str) -> TrainingGraph:
    """AppendLoss (MSE against a target) + Gradient w.r.t. the params → TrainingGraph with ``main``."""
    import tvm
    from tvm import relax
    from tvm.relax.training.loss import MSELoss
    from tvm.relax.training.utils import AppendLoss

    loss = MSELoss(reduction="mean")(_t(*out_shape), _t(*out_shape))
    mod = AppendLoss("backbone", loss, num_backbone_outputs=1)(backbone_mod)
    func = mod["backbone_loss"]
    require = list(func.params[len(data_shapes) : len(data_shapes) + len(param_shapes)])
    try:
        mod = relax.transform.Gradient("backbone_loss", require_grads=require)(mod)
    except Exception as exc:
        raise UnsupportedModelError(f"Relax cannot differentiate {name}: {error_line(exc)}") from exc
    main = unique_names(mod["backbone_loss_adjoint"].with_attr("global_symbol", "main"))
    inputs = tuple(data_shapes) + tuple(param_shapes) + (("target", tuple(out_shape)),)
    return TrainingGraph(name, tvm.IRModule({"main": main}), inputs, len(data_shapes), len(param_shapes), description)


def unique_names(func):
    """Give every binding a distinct name (Gradient reuses ``lv``…; agoc's op graph keys ops by name)."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Renamer(PyExprMutator):
        def __init__(self):
            super().__init__()
            self.used: set[str] = set()

        def _fresh(self, name):
            candidate, i = name, 0
            while candidate in self.used:
                i += 1
                candidate = f"{name}_{i}"
            self.used.add(candidate)
            return candidate

        def visit_var_def_(self, var):
            name = self._fresh(var.name)
            return var if name == var.name else relax.Var(name, var.ty)

        def visit_dataflow_var_def_(self, var):
            name = self._fresh(var.name)
            return var if name == var.name else relax.DataflowVar(name, var.ty)

    return _Renamer().visit_expr(func)


def bert_tiny(layers: int = 2, batch: int = 1, seq: int = 128) -> TrainingGraph:
    """BERT-tiny's encoder (the zoo's sizes) as a training step: forward, MSE loss, backward."""
    hidden, heads, ffn = 128, 2, 512
    shape = (batch, seq, hidden)

    def body(m, data):
        x = data[0]
        for i in range(layers):
            x = _bert_layer(m, x, batch, seq, hidden, heads, ffn, f"l{i}")
        return x

    backbone, params = _backbone([("x", shape)], body)
    what = "encoder layer" if layers == 1 else f"{layers} encoder layers"
    return differentiate(
        backbone, [("x", shape)], params, shape, "bert-tiny" if layers == 2 else f"bert-tiny-{layers}l",
        f"BERT-tiny {what} (hidden 128, 2 heads, FFN 512, seq {seq}): forward + MSE loss + backward",
    )


def mobilenet_v2_block(channels: int = 32, size: int = 28, expand: int = 6, batch: int = 1) -> TrainingGraph:
    """A MobileNet-V2 inverted-residual block with training-mode BatchNorm: forward, MSE loss, backward."""
    shape = (batch, channels, size, size)

    def body(m, data):
        return _mbv2_block(m, data[0], channels, expand, "b")

    backbone, params = _backbone([("x", shape)], body)
    return differentiate(
        backbone, [("x", shape)], params, shape, "mobilenet-v2-block",
        f"MobileNet-V2 inverted residual (c={channels}, t={expand}, {size}x{size}, BatchNorm) : "
        "forward + MSE loss + backward",
    )


def subgraph(kind: str, rows: int = 128, hidden: int = 128, sizes: str = "BERT-tiny sizes") -> TrainingGraph:
    """The memory-bound subgraphs alone: ``layernorm``, ``softmax`` or ``bias-gelu`` (the FFN's
    4 × hidden columns) over ``rows`` rows -- forward + MSE loss + backward."""
    from tvm.relax import op

    cols = 4 * hidden if kind == "bias-gelu" else hidden
    shape = (1, rows, cols)

    def body(m, data):
        x = data[0]
        if kind == "layernorm":
            return m.layernorm(x, cols, "ln")
        if kind == "softmax":  # attention probabilities with a learned score bias, so there is a gradient
            return m.emit(op.nn.softmax(m.emit(op.add(x, m.param("score_bias", cols))), axis=-1))
        if kind == "bias-gelu":
            return m.gelu(m.emit(op.add(x, m.param("ffn_bias", cols))))
        raise UnsupportedModelError(f"unknown subgraph '{kind}'")

    backbone, params = _backbone([("x", shape)], body)
    return differentiate(backbone, [("x", shape)], params, shape, kind,
                         f"{kind} over [{rows}, {cols}] ({sizes}): forward + MSE loss + backward")


#: The built-in training graphs (``--training`` with ``zoo:NAME``).
GRAPHS = {
    "bert-tiny": lambda: bert_tiny(layers=2),
    "bert-tiny-block": lambda: bert_tiny(layers=1),
    "mobilenet-v2-block": lambda: mobilenet_v2_block(),
    "layernorm": lambda: subgraph("layernorm"),
    "softmax": lambda: subgraph("softmax"),
    "bias-gelu": lambda: subgraph("bias-gelu"),
    # server-side sizes: BERT-base (hidden 768, 12 heads), 32 sequences of 128 tokens
    "layernorm-base": lambda: subgraph("layernorm", rows=32 * 128, hidden=768, sizes="BERT-base, 32 × 128 tokens"),
    "softmax-base": lambda: subgraph("softmax", rows=32 * 12 * 128, hidden=128,
                                     sizes="BERT-base attention, 32 sequences × 12 heads × 128 queries"),
    "bias-gelu-base": lambda: subgraph("bias-gelu", rows=32 * 128, hidden=768, sizes="BERT-base FFN, 32 × 128 tokens"),
}


def builtin(name: str) -> TrainingGraph:
    if name not in GRAPHS:
        raise UnsupportedModelError(f"no built-in training graph '{name}'; choose one of: {', '.join(GRAPHS)}")
    return GRAPHS[name]()


# ------------------------------------------------------------------ ONNX models


def _register_missing_gradients() -> None:
    """Gradients Relax 0.27 lacks and ONNX graphs need (erf, for the erf-GELU of BERT)."""
    import tvm
    from tvm import relax
    from tvm.relax.op import register_gradient

    op = tvm.ir.Op.get("relax.erf")
    if op.get_attr("FPrimalGradient") is not None:
        return

    def erf_grad(orig_var, orig_call, output_grad, ctx):
        x = orig_call.args[0]
        two_over_sqrt_pi = relax.const(np.float32(2.0 / math.sqrt(math.pi)), F32)
        gauss = relax.op.exp(relax.op.negative(relax.op.multiply(x, x)))
        return [relax.op.multiply(output_grad, relax.op.multiply(two_over_sqrt_pi, gauss))]

    register_gradient("relax.erf", erf_grad)


def open_compound_ops(func):
    """Rewrite ``nn.layer_norm`` into primitives (APOLLO §3.2; Relax has no gradient for it)."""
    from tvm.relax import op
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Open(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if getattr(call.op, "name", "") != "relax.nn.layer_norm":
                return call
            x, g, b = call.args
            axes = [int(a) for a in call.attrs.axes]
            eps = float(call.attrs.epsilon)
            bb = self.builder_
            mean = bb.emit(op.mean(x, axis=axes, keepdims=True))
            d = bb.emit(op.subtract(x, mean))
            var = bb.emit(op.mean(bb.emit(op.multiply(d, d)), axis=axes, keepdims=True))
            std = bb.emit(op.sqrt(bb.emit(op.add(var, _c(eps)))))
            y = bb.emit(op.divide(d, std))
            return op.add(bb.emit(op.multiply(y, g)), b)

    return _Open().visit_expr(func)


def from_onnx(model, inputs, name: str) -> TrainingGraph:
    """An ONNX model as a training step: its initializers become parameters, MSE loss on its first output."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx as import_onnx

    _register_missing_gradients()
    try:
        mod = import_onnx(
            model,
            shape_dict={i.name: list(i.shape) for i in inputs},
            dtype_dict={i.name: i.dtype for i in inputs},
            keep_params_in_input=True,
        )
    except Exception as exc:
        raise UnsupportedModelError(f"TVM's ONNX importer rejected the model: {error_line(exc)}") from exc
    if any(i.dtype != F32 for i in inputs):
        raise UnsupportedModelError("--training needs float32 inputs (integer inputs have no gradient)")
    func = mod["main"]
    num_data = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(inputs)
    func = relax.transform.Normalize()(tvm.IRModule({"main": open_compound_ops(func)}))["main"]
    out_ty = func.ret_ty
    if not hasattr(out_ty, "shape") or out_ty.shape is None:
        raise UnsupportedModelError("--training needs a model with one tensor output (the loss is MSE on it)")
    out_shape = tuple(int(d) for d in out_ty.shape)
    params = func.params[num_data:]
    backbone = tvm.IRModule({"backbone": func.with_attr("global_symbol", "backbone").without_attr("num_input")})
    data_shapes = [(p.name, tuple(int(d) for d in p.ty.shape)) for p in func.params[:num_data]]
    param_shapes = [(p.name, tuple(int(d) for d in p.ty.shape)) for p in params]
    return differentiate(backbone, data_shapes, param_shapes, out_shape, name,
                         f"{name} (ONNX): forward + MSE loss + backward")
