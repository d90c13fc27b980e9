"""The ONNX ops agoc compiles (default domain only), by family, with the attribute limits it refuses up front.

docs/ops.md is generated from these tables (:func:`markdown`); ``onnx_import.check_supported`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import helper

#: where a user reads the list; quoted by every refusal
DOC = "docs/ops.md"

#: family → what it is for (the conformance suite's families are these)
FAMILIES = {
    "conv": "convolutions",
    "pool": "pooling",
    "norm": "normalization",
    "activation": "activations and softmax",
    "math": "elementwise arithmetic and comparisons",
    "matmul": "matrix products",
    "reduce": "reductions",
    "shape": "reshaping, indexing and data movement",
    "graph": "constants, casts and shape plumbing that exporters write",
}

#: op → family (domain "" / "ai.onnx")
OPS = {
    "Conv": "conv",
    "ConvTranspose": "conv",
    "MaxPool": "pool",
    "AveragePool": "pool",
    "GlobalAveragePool": "pool",
    "GlobalMaxPool": "pool",
    "BatchNormalization": "norm",
    "InstanceNormalization": "norm",
    "LayerNormalization": "norm",
    "Relu": "activation",
    "Clip": "activation",
    "Sigmoid": "activation",
    "HardSigmoid": "activation",
    "HardSwish": "activation",
    "LeakyRelu": "activation",
    "PRelu": "activation",
    "Elu": "activation",
    "Selu": "activation",
    "Gelu": "activation",
    "Tanh": "activation",
    "Softplus": "activation",
    "Softsign": "activation",
    "Mish": "activation",
    "Softmax": "activation",
    "LogSoftmax": "activation",
    "Add": "math",
    "Sub": "math",
    "Mul": "math",
    "Div": "math",
    "Pow": "math",
    "Sqrt": "math",
    "Reciprocal": "math",
    "Exp": "math",
    "Log": "math",
    "Erf": "math",
    "Abs": "math",
    "Neg": "math",
    "Floor": "math",
    "Ceil": "math",
    "Min": "math",
    "Max": "math",
    "Sum": "math",
    "Mean": "math",
    "Equal": "math",
    "Less": "math",
    "Greater": "math",
    "Not": "math",
    "Where": "math",
    "MatMul": "matmul",
    "Gemm": "matmul",
    "ReduceMean": "reduce",
    "ReduceSum": "reduce",
    "ReduceMax": "reduce",
    "TopK": "reduce",
    "CumSum": "math",
    "ReduceMin": "reduce",
    "Reshape": "shape",
    "Transpose": "shape",
    "Flatten": "shape",
    "Squeeze": "shape",
    "Unsqueeze": "shape",
    "Concat": "shape",
    "Split": "shape",
    "Slice": "shape",
    "Gather": "shape",
    "Pad": "shape",
    "Resize": "shape",
    "Tile": "shape",
    "Expand": "shape",
    "DepthToSpace": "shape",
    "SpaceToDepth": "shape",
    "Identity": "graph",
    "Constant": "graph",
    "Shape": "graph",
    "Cast": "graph",
    "ConstantOfShape": "graph",
    "Range": "graph",
    "CastLike": "graph",
}


@dataclass(frozen=True)
class AttrLimit:
    """An attribute value agoc refuses: ``allowed`` lists the values it takes (``None``: must be absent)."""

    op: str
    attribute: str
    allowed: tuple | None
    why: str

    def violated_by(self, node, runtime: set[str]) -> bool:
        attr = next((a for a in node.attribute if a.name == self.attribute), None)
        if attr is None:
            return False
        if self.allowed is None:
            return True
        value = helper.get_attribute_value(attr)
        return (value.decode() if isinstance(value, bytes) else value) not in self.allowed

    def describe(self) -> str:
        rule = "not supported" if self.allowed is None else "only " + ", ".join(map(str, self.allowed))
        return f"`{self.attribute}` {rule} ({self.why})"


@dataclass(frozen=True)
class OutputLimit:
    """At most ``count`` of the op's outputs may be used."""

    op: str
    count: int
    why: str

    def violated_by(self, node, runtime: set[str]) -> bool:
        return any(name for name in node.output[self.count:])

    def describe(self) -> str:
        first = "the first output" if self.count == 1 else f"the first {self.count} outputs"
        return f"only {first} ({self.why})"


@dataclass(frozen=True)
class ConstantInput:
    """Inputs (by position) that must be known at compile time: initializers, constants, or computed from
    them and from tensor shapes — never from a graph input's values."""

    op: str
    positions: tuple[int, ...]
    why: str = "TVM's importer needs it at compile time"

    def violated_by(self, node, runtime: set[str]) -> bool:
        return any(i < len(node.input) and node.input[i] in runtime for i in self.positions)

    def describe(self) -> str:
        which = "input" if len(self.positions) == 1 else "inputs"
        return f"{which} {', '.join(map(str, self.positions))} must be constant ({self.why})"


#: what agoc refuses up front although the op is listed (each one fails in the conformance suite otherwise)
LIMITS = (
    AttrLimit("BatchNormalization", "training_mode", (0,), "inference only"),
    OutputLimit("BatchNormalization", 1, "running statistics are training outputs"),
    OutputLimit("MaxPool", 1, "no Indices output"),
    AttrLimit("Resize", "coordinate_transformation_mode",
              ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"),
              "what TVM's resize and agoc's interpolation matrices implement"),
    AttrLimit("Resize", "keep_aspect_ratio_policy", ("stretch",), "sizes are taken as given"),
    *(AttrLimit("Constant", name, None, "strings and sparse tensors are not float model data")
      for name in ("value_string", "value_strings", "sparse_value")),
    ConstantInput("Reshape", (1,)),
    ConstantInput("Split", (1,)),
    ConstantInput("Pad", (1, 2, 3)),
    ConstantInput("Resize", (1, 2, 3)),
    ConstantInput("ReduceMean", (1,)),
    ConstantInput("ReduceSum", (1,)),
    ConstantInput("ReduceMax", (1,)),
    ConstantInput("ReduceMin", (1,)),
    ConstantInput("ConstantOfShape", (0,)),
    ConstantInput("Range", (0, 1, 2)),
    ConstantInput("TopK", (1,)),
    ConstantInput("CumSum", (1,)),
    ConstantInput("Expand", (1,), "a runtime shape builds the wrong output shape"),
)

#: ops whose output is known at compile time whatever their input's values (static shapes)
SHAPE_ONLY = frozenset({"Shape"})

#: op → known failures that are not refused up front (the conformance suite lists the cases)
NOTES: dict[str, str] = {
    "Resize": "`align_corners` when downsampling follows onnxruntime (the reference agoc checks against), which "
              "differs from ONNX's reference implementation",
}


def runtime_values(graph) -> set[str]:
    """Names of the values that depend on a graph input's values (not only on its shape)."""
    constant = {t.name for t in graph.initializer}
    runtime = {vi.name for vi in graph.input if vi.name not in constant}
    for node in graph.node:
        if node.op_type not in SHAPE_ONLY and any(name in runtime for name in node.input):
            runtime.update(name for name in node.output if name)
    return runtime


def qualified_name(node) -> str:
    """``Relu``, or ``com.example.Relu`` for an op in another domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def is_listed(node) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in OPS


def violated_limit(node, runtime: set[str]) -> AttrLimit | OutputLimit | ConstantInput | None:
    """The first limit ``node`` is over (``runtime``: see :func:`runtime_values`), or None."""
    return next((lim for lim in LIMITS if lim.op == node.op_type and lim.violated_by(node, runtime)), None)


def markdown() -> str:
    """docs/ops.md: the supported ops by family, what is refused up front, and what is known to fail."""
    lines = [
        "# Supported ONNX ops",
        "",
        "Generated from `toolchain/op_support.py` (a test keeps the two equal). agoc compiles static-shape",
        "float models. Only these ops of the default domain (`\"\"` / `ai.onnx`) are accepted: any other op,",
        "an op in another domain, or a listed op over one of its limits is refused before any work, every",
        "offending node named. How each family fares on ONNX's own backend node tests:",
        "`make test-conformance` (`python -m host.bench.conformance`, results in `bench/results/conformance-*.json`).",
        "",
    ]
    for family, title in FAMILIES.items():
        lines += [f"## {family}: {title}", "", "| op | refused up front | known to fail |", "| --- | --- | --- |"]
        for op in sorted(o for o, f in OPS.items() if f == family):
            refused = "; ".join(lim.describe() for lim in LIMITS if lim.op == op) or "—"
            lines.append(f"| {op} | {refused} | {NOTES.get(op, '—')} |")
        lines.append("")
    return "\n".join(lines)
