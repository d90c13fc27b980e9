"""`agoc models list|export`: the built-in model zoo."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from host.commands.common import write_file
from host.console import console
from toolchain.errors import UnsupportedModelError


def list_models():
    """List the zoo models and their shapes."""
    import models

    table = Table(title="model zoo", title_justify="left")
    for col in ("name", "family", "shapes", "params (published)", "description"):
        table.add_column(col)
    for spec in models.registry.MODELS:
        shapes = ", ".join("x".join(map(str, s)) for s in spec.shapes)
        params = f"{spec.published_params:,}" if spec.published_params else "-"
        table.add_row(spec.name, spec.family, shapes, params, spec.description)
    console.print(table)


def export(
    name: Annotated[str, typer.Argument(help="Zoo model name (see `agoc models list`).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="ONNX file to write.")],
    shape: Annotated[Optional[str], typer.Option(
        help="Input shape, e.g. 1x3x112x112 (default: the model's first).")] = None,
):
    """Write a zoo model to an ONNX file."""
    import models

    try:
        spec, dims = models.registry.get(name), None
        if shape:
            dims = models.registry.parse_shape(shape)
            if len(dims) != len(spec.default_shape):
                raise ValueError(f"--shape {shape}: the input of {name} has {len(spec.default_shape)} dimensions, "
                                 f"e.g. --shape {'x'.join(map(str, spec.default_shape))}")
        proto = models.build(name, dims)
    except (models.UnknownModelError, ValueError) as exc:
        raise UnsupportedModelError(str(exc)) from None
    except MemoryError:
        raise UnsupportedModelError(f"{name} at {shape} has weights too large for this machine's memory; give a "
                                    "smaller --shape") from None
    if output.is_dir():
        raise UnsupportedModelError(f"-o {output} is a directory; give a file name, e.g. -o {output / name}.onnx")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_file(output, proto.SerializeToString())
    console.print(f"[green]✓[/green] {name} → {escape(str(output))}")
