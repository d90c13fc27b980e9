"""The zoo as a table: one :class:`ModelSpec` row per network.

A builder is referenced as ``"module:function"`` and imported only when the
model is built, so listing the zoo stays cheap. A builder takes the input
shape (a tuple of ints) and returns an ``onnx.ModelProto`` with
deterministic weights (fixed seed), ``ir_version`` <= 9 and opset 17.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import onnx

#: ONNX IR version every builder writes. onnx >= 1.23 defaults to IR 14, which
#: onnxruntime 1.31 refuses ("max supported IR version: 13").
IR_VERSION = 9
OPSET = 17


class UnknownModelError(KeyError):
    """A zoo name or shape that the table does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; we do not want that
        return str(self.args[0])


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    builder: str  # "module:function"
    shapes: tuple[tuple[int, ...], ...]  # the shapes the benchmarks use; shapes[0] is the default
    input_dtype: str = "float32"
    published_params: int | None = None  # parameter count from the paper / reference implementation
    params_tolerance: float = 0.0  # allowed relative deviation from published_params
    family: str = "cnn"  # cnn | transformer | tiny
    source: str = ""  # where the architecture and published_params come from

    @property
    def default_shape(self) -> tuple[int, ...]:
        return self.shapes[0]


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="tiny-cnn",
        description="conv → relu → add (residual) → flatten → gemm; the demo model",
        builder="models.tiny:tiny_cnn",
        shapes=((1, 3, 16, 16), (1, 3, 32, 32)),
        family="tiny",
    ),
    ModelSpec(
        name="tiny-transformer",
        description="one attention-like block: matmul → softmax → matmul → add → layernorm",
        builder="models.tiny:tiny_transformer",
        shapes=((1, 16, 32),),
        family="tiny",
    ),
    ModelSpec(
        name="tiny-dwsep",
        description="MobileNet-style pointwise → depthwise → pointwise chain with relu6 (Clip)",
        builder="models.tiny:tiny_dwsep",
        shapes=((1, 8, 16, 16),),
        family="tiny",
    ),
)

_BY_NAME = {spec.name: spec for spec in MODELS}


def names() -> list[str]:
    return [spec.name for spec in MODELS]


def get(name: str) -> ModelSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown zoo model '{name}'; available: {', '.join(names())} (see `agoc models list`)"
        ) from None


def _resolve(ref: str):
    module_name, func_name = ref.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def build(name: str, shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """Build zoo model ``name`` at ``shape`` (default: the spec's first shape)."""
    spec = get(name)
    shape = tuple(shape) if shape else spec.default_shape
    model = _resolve(spec.builder)(shape)
    model.graph.name = model.graph.name or spec.name
    return model


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` → ``(1, 3, 224, 224)``."""
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"bad shape '{text}': expected dimensions joined by 'x', e.g. 1x3x224x224") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"bad shape '{text}': every dimension must be a positive integer")
    return dims


def parse_zoo_ref(ref: str) -> tuple[str, tuple[int, ...] | None]:
    """``"zoo:mobilenet-v2@1x3x112x112"`` → ``("mobilenet-v2", (1, 3, 112, 112))``."""
    body = ref[len("zoo:"):] if ref.startswith("zoo:") else ref
    name, _, shape = body.partition("@")
    get(name)  # raises UnknownModelError with the list of names
    return name, (parse_shape(shape) if shape else None)
