"""A model source as every command and research tool takes it: an ONNX file or ``zoo:NAME[@SHAPE]`` (the zoo
lives above toolchain, so loading stays in host/)."""

from __future__ import annotations

from pathlib import Path

from toolchain.errors import UnsupportedModelError


def load_source(model: str, shapes: list[str]):
    """MODEL.onnx or zoo:NAME[@SHAPE] → (ModelProto, name, input-shape overrides)."""
    from toolchain import onnx_import

    if model.startswith("zoo:"):
        proto, label = _zoo(model)
    else:
        proto = onnx_import.load_model(model)
        label = Path(model).stem
    overrides = onnx_import.parse_input_shapes(shapes, onnx_import.declared_inputs(proto))
    return proto, label, overrides


def _zoo(model: str):
    """zoo:NAME[@SHAPE] → (ModelProto, label)."""
    import models

    try:
        name, shape = models.parse_zoo_ref(model)
    except (models.UnknownModelError, ValueError) as exc:
        raise UnsupportedModelError(str(exc)) from None
    try:
        proto = models.build(name, shape)
    except MemoryError:
        raise UnsupportedModelError(f"zoo:{name} at {'x'.join(map(str, shape or ()))} has weights too large for "
                                    f"this machine's memory; give a smaller shape, e.g. zoo:{name}@"
                                    f"{'x'.join(map(str, models.registry.get(name).default_shape))}") from None
    return proto, name if shape is None else f"{name}@{'x'.join(map(str, shape))}"
