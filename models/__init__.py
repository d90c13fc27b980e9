"""The agoc model zoo: deterministic ONNX builders for the benchmark networks, built in-process from a
fixed seed (these machines cannot reach model hubs); look models up through :mod:`models.registry`."""

from models.registry import (
    ModelSpec,
    UnknownModelError,
    build,
    get,
    names,
    parse_zoo_ref,
)

__all__ = ["ModelSpec", "UnknownModelError", "build", "get", "names", "parse_zoo_ref"]
