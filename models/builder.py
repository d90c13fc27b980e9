"""A small, boring helper for writing zoo networks with ``onnx.helper``.

:class:`GraphBuilder` keeps the node list, the initializers and a seeded numpy
generator, and offers one method per layer kind the zoo needs. Every method
takes the input tensor name and a ``name`` for the layer and returns the name
of the tensor it produced (which is the node's name, so a tensor and the node
that makes it read the same in Netron and in TVM's imported function).

Conventions:

* weights are drawn from ``numpy.random.default_rng(seed)`` in build order, so
  a network built twice gives byte-identical protobufs;
* convolutions are inference convolutions: BatchNorm is folded in, so a conv
  "with BN" is a Conv with a bias and no BatchNormalization node;
* weights are He/Xavier scaled (``gain / sqrt(fan_in)``) so activations stay
  O(1) through a whole network with random weights;
* only parameters (weights, biases, norm scales, embeddings) are float tensors
  with at least one dimension; everything else (Clip bounds, scalar factors)
  is a 0-d float constant or an int64 tensor, so :func:`count_params` can tell
  them apart.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models.registry import IR_VERSION, OPSET

#: Weight gain per activation that follows the layer (He for ReLU-like units).
_GAINS = {None: 1.0, "relu": math.sqrt(2.0), "relu6": math.sqrt(2.0), "silu": math.sqrt(2.0), "gelu": math.sqrt(2.0),
          "hardswish": math.sqrt(2.0)}


def count_params(model: onnx.ModelProto) -> int:
    """Number of elements in the float initializers with at least one dimension.

    That is the weights, biases, norm scales/shifts and embedding tables; it
    leaves out 0-d float constants (Clip bounds, scalar factors) and integer
    tensors (shapes, split sizes, position ids).
    """
    total = 0
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT and len(init.dims) >= 1:
            total += math.prod(init.dims)
    return total


class GraphBuilder:
    """Accumulates one ONNX graph; :meth:`finish` turns it into a ModelProto."""

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}

    # ------------------------------------------------------------------ names

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate tensor/node name '{name}' in {self.name}")
        self._names.add(name)
        return name

    # ----------------------------------------------------- inputs and tensors

    def input(self, name: str, shape: tuple[int, ...], elem_type: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(self._claim(name), elem_type, list(shape)))
        return name

    def param(self, name: str, array: np.ndarray) -> str:
        """A float32 parameter (counted by :func:`count_params`)."""
        array = np.asarray(array, dtype=np.float32)
        assert array.ndim >= 1, f"parameter '{name}' must have at least one dimension"
        self.initializers.append(numpy_helper.from_array(array, self._claim(name)))
        return name

    def weight(self, name: str, shape: tuple[int, ...], std: float) -> str:
        return self.param(name, self.rng.normal(0.0, std, size=shape))

    def bias(self, name: str, size: int, std: float = 0.05) -> str:
        return self.param(name, self.rng.normal(0.0, std, size=(size,)))

    def const(self, name: str, value) -> str:
        """A non-parameter constant: a 0-d float, or an int64 tensor. Shared by value."""
        array = np.asarray(value)
        if array.dtype.kind == "f":
            assert array.ndim == 0, "float constants must be scalars (tensors are parameters)"
            array = array.astype(np.float32)
        else:
            array = array.astype(np.int64)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self.initializers.append(numpy_helper.from_array(array, self._claim(name)))
            self._consts[key] = name
        return self._consts[key]

    # ------------------------------------------------------------------ nodes

    def op(self, op_type: str, inputs: list[str], name: str, outputs: list[str] | None = None, **attrs) -> str:
        """Append one node; its (first) output tensor is called ``name`` unless ``outputs`` says otherwise."""
        outputs = outputs or [name]
        for out in outputs:
            self._claim(out)
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs[0]

    # ------------------------------------------------------------ activations

    def act(self, x: str, kind: str | None, name: str) -> str:
        """``kind``: None, "relu", "relu6" (Clip 0..6), "silu" (x*sigmoid(x)), "gelu" (erf form) or
        "hardswish" (ONNX HardSwish, x * relu6(x + 3) / 6)."""
        if kind is None:
            return x
        if kind == "relu":
            return self.op("Relu", [x], f"{name}_relu")
        if kind == "relu6":
            lo, hi = self.const("relu6_min", 0.0), self.const("relu6_max", 6.0)
            return self.op("Clip", [x, lo, hi], f"{name}_relu6")
        if kind == "hardswish":
            return self.op("HardSwish", [x], f"{name}_hardswish")
        if kind == "silu":
            sig = self.op("Sigmoid", [x], f"{name}_sigmoid")
            return self.op("Mul", [x, sig], f"{name}_silu")
        if kind == "gelu":  # 0.5 * x * (1 + erf(x / sqrt(2)))
            scaled = self.op("Div", [x, self.const("sqrt2", math.sqrt(2.0))], f"{name}_gelu_div")
            erf = self.op("Erf", [scaled], f"{name}_gelu_erf")
            shifted = self.op("Add", [erf, self.const("one", 1.0)], f"{name}_gelu_add")
            prod = self.op("Mul", [x, shifted], f"{name}_gelu_mul")
            return self.op("Mul", [prod, self.const("half", 0.5)], f"{name}_gelu")
        raise ValueError(f"unknown activation '{kind}'")

    # ----------------------------------------------------------------- layers

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int,
        *,
        name: str,
        stride: int = 1,
        groups: int = 1,
        pad: int | None = None,
        act: str | None = None,
        bias: bool = True,
        gain: float | None = None,
    ) -> str:
        """Conv (BN folded into weight + bias) followed by an optional activation.

        ``pad`` defaults to ``k // 2`` ("same" for odd kernels). ``gain``
        overrides the He/Xavier gain, e.g. to damp the last conv of a residual
        branch as a trained network's small BN gammas would.
        """
        pad = k // 2 if pad is None else pad
        fan_in = (cin // groups) * k * k
        std = (_GAINS[act] if gain is None else gain) / math.sqrt(fan_in)
        inputs = [x, self.weight(f"{name}.weight", (cout, cin // groups, k, k), std)]
        if bias:
            inputs.append(self.bias(f"{name}.bias", cout))
        y = self.op(
            "Conv", inputs, name,
            kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups, dilations=[1, 1],
        )
        return self.act(y, act, name)

    def linear(self, x: str, din: int, dout: int, *, name: str, act: str | None = None,
               gain: float | None = None) -> str:
        """``x @ W + b`` over the last axis (MatMul + Add; works on any rank)."""
        std = (_GAINS[act] if gain is None else gain) / math.sqrt(din)
        w = self.weight(f"{name}.weight", (din, dout), std)
        y = self.op("MatMul", [x, w], f"{name}_matmul")
        y = self.op("Add", [y, self.bias(f"{name}.bias", dout)], name)
        return self.act(y, act, name)

    def gemm(self, x: str, din: int, dout: int, *, name: str, output: str | None = None) -> str:
        """Classifier head: Gemm on a [N, din] matrix (torch Linear layout, transB=1)."""
        w = self.weight(f"{name}.weight", (dout, din), 1.0 / math.sqrt(din))
        b = self.bias(f"{name}.bias", dout)
        return self.op("Gemm", [x, w, b], name, outputs=[output] if output else None, transB=1)

    def layernorm(self, x: str, dim: int, *, name: str, eps: float = 1e-5) -> str:
        """LayerNormalization over the last axis with a (random, near-identity) affine."""
        scale = self.param(f"{name}.weight", 1.0 + self.rng.normal(0.0, 0.1, size=(dim,)))
        shift = self.param(f"{name}.bias", self.rng.normal(0.0, 0.1, size=(dim,)))
        return self.op("LayerNormalization", [x, scale, shift], name, axis=-1, epsilon=eps)

    # ------------------------------------------------------- plumbing helpers

    def add(self, a: str, b: str, *, name: str) -> str:
        return self.op("Add", [a, b], name)

    def mul(self, a: str, b: str, *, name: str) -> str:
        return self.op("Mul", [a, b], name)

    def concat(self, xs: list[str], *, name: str, axis: int = 1) -> str:
        return self.op("Concat", xs, name, axis=axis)

    def reshape(self, x: str, shape: tuple[int, ...], *, name: str) -> str:
        """Reshape to a static shape (an int64 initializer; no Shape ops)."""
        shape_name = "shape_" + "x".join(str(d) for d in shape)
        return self.op("Reshape", [x, self.const(shape_name, list(shape))], name)

    def transpose(self, x: str, perm: tuple[int, ...], *, name: str) -> str:
        return self.op("Transpose", [x], name, perm=list(perm))

    def split(self, x: str, sizes: tuple[int, ...], *, name: str, axis: int = 1) -> list[str]:
        """Split along ``axis`` into pieces of ``sizes``; outputs are ``{name}_0``, ``{name}_1``, ..."""
        outs = [f"{name}_{i}" for i in range(len(sizes))]
        sizes_name = "split_" + "_".join(str(d) for d in sizes)
        self.op("Split", [x, self.const(sizes_name, list(sizes))], name, outputs=outs, axis=axis)
        return outs

    def max_pool(self, x: str, k: int, stride: int, *, name: str, pad: int = 0, ceil_mode: bool = False) -> str:
        return self.op(
            "MaxPool", [x], name,
            kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, ceil_mode=int(ceil_mode),
        )

    def global_pool_flatten(self, x: str, *, name: str) -> str:
        """GlobalAveragePool + Flatten: [N, C, H, W] -> [N, C] (torch's ``x.mean([2, 3])``)."""
        pooled = self.op("GlobalAveragePool", [x], f"{name}_gap")
        return self.op("Flatten", [pooled], f"{name}_flatten", axis=1)

    # ----------------------------------------------------------------- finish

    def finish(self, output: str, shape: tuple[int, ...], elem_type: int = TensorProto.FLOAT,
               doc: str = "") -> onnx.ModelProto:
        """Wrap everything into a ModelProto (IR 9, opset 17). ``output`` must already be named as wanted."""
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            [helper.make_tensor_value_info(output, elem_type, list(shape))],
            initializer=self.initializers,
        )
        model = helper.make_model(
            graph,
            ir_version=IR_VERSION,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="agoc.models",
            doc_string=doc,
        )
        return model
