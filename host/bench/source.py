"""A model reference as the research tools take it: ``zoo:NAME[@SHAPE]`` or an ONNX file."""

from __future__ import annotations

from pathlib import Path


def load(ref: str):
    """``ref`` → (ModelProto, label); UnsupportedModelError names an unknown zoo model or a bad shape."""
    from toolchain import onnx_import
    from toolchain.errors import UnsupportedModelError

    if not ref.startswith("zoo:"):
        return onnx_import.load_model(ref), Path(ref).stem
    import models

    try:
        name, shape = models.parse_zoo_ref(ref)
    except (models.UnknownModelError, ValueError) as exc:
        raise UnsupportedModelError(str(exc)) from None
    return models.build(name, shape), name if shape is None else f"{name}@{'x'.join(map(str, shape))}"
