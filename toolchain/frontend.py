"""The frontend, once: check an ONNX model, resolve its input shapes, import it into Relax and legalize it.

Loading a ``zoo:NAME@SHAPE`` source needs the model zoo, so it stays above toolchain (in host/).
"""

from __future__ import annotations

import onnx

from toolchain import build, onnx_import
from toolchain.onnx_import import TensorInfo, parse_input_shapes, parse_shape
from toolchain.targets import TargetSpec

__all__ = ["checked_inputs", "parse_input_shapes", "parse_shape", "prepare"]


def checked_inputs(model: onnx.ModelProto, overrides: dict[str, tuple[int, ...]] | None = None) -> list[TensorInfo]:
    """The model's inputs with concrete shapes, after checking its opset and ops (errors name the fix)."""
    onnx_import.check_opset(model)
    onnx_import.check_supported(model)
    return onnx_import.resolve_inputs(model, dict(overrides or {}))


def prepare(model: onnx.ModelProto, spec: TargetSpec,
            overrides: dict[str, tuple[int, ...]] | None = None) -> tuple[object, list[TensorInfo]]:
    """(the legalized Relax module for ``spec``, the resolved inputs): :func:`checked_inputs`, import, legalize."""
    inputs = checked_inputs(model, overrides)
    return build.legalize(onnx_import.to_relax(model, inputs), spec), inputs
