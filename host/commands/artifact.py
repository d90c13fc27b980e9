"""`agoc verify` and `agoc inspect`: an artifact checked against onnxruntime; an artifact or a model shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from host import render
from host.commands.common import load_source
from host.console import console, err_console
from host.options import ArtifactArg, InputShapeOpt
from toolchain.errors import InputShapeError, UnsupportedModelError


def verify(
    artifact_dir: ArtifactArg,
    device: Annotated[Optional[str], typer.Option(help="local (default), qemu, or a phone's serial.")] = None,
    atol: Annotated[float, typer.Option(help="Absolute tolerance (default 1e-5).")] = None,
    rtol: Annotated[float, typer.Option(help="Tolerance relative to the output's max |value| (default 1e-4).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
):
    """Run the artifact on its sample inputs and compare with onnxruntime; exit 1 if over tolerance."""
    from host.devices import get_device
    from toolchain.artifact import load_artifact
    from toolchain.errors import VerifyError
    from toolchain.verify import verify_artifact

    for name, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not value >= 0:  # NaN included
            raise VerifyError(f"{name} must be a tolerance of 0 or more (got {value})")
    art = load_artifact(artifact_dir)
    dev = get_device(device, default="local")
    if dev.kind != "local":
        err_console.print(f"[dim]running {escape(str(artifact_dir))} on {escape(dev.name)} ({dev.kind})[/dim]")
    report = verify_artifact(art, dev, atol, rtol)  # None: the tolerance of the precision it was built in
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        console.print(render.verify_table(report))
    if not report.passed:
        raise typer.Exit(1)


def inspect(
    path: Annotated[str, typer.Argument(help="An artifact directory, an ONNX file, or zoo:NAME[@SHAPE].")],
    input_shape: InputShapeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
):
    """Show inputs, outputs, op counts and fused kernels of an artifact or a model."""
    if Path(path).is_dir():
        _inspect_artifact(path, as_json)
    else:
        _inspect_model(path, input_shape or [], as_json)


def _inspect_artifact(path: str, as_json: bool) -> None:
    from toolchain.artifact import load_artifact

    art = load_artifact(path)
    m = art.manifest
    if as_json:
        print(json.dumps(m.to_json()))
        return
    console.print(render.artifact_summary(art))
    for title, tensors in (("inputs", m.inputs), ("outputs", m.outputs)):
        console.print(render.tensors_table(title, [(t.info.name, render._shape(t.info.shape), t.info.dtype)
                                                   for t in tensors]))
    console.print(render.op_counts_table(m.op_counts))
    console.print(render.kernels_table(list(m.kernels)))


def _stock_kernels(proto, overrides: dict) -> tuple[Optional[list], str]:
    """The model's kernels as stock TVM fuses them for this machine, or None and why not."""
    from toolchain import build, frontend
    from toolchain.targets import resolve_target

    try:
        spec = resolve_target("host")
        mod = build.fuse_stock(frontend.prepare(proto, spec, overrides)[0], spec)
        return [k.to_json() for k in build.kernels(mod)], ""
    except (UnsupportedModelError, InputShapeError) as exc:
        return None, f"no kernels: {exc}"


def _inspect_model(path: str, shapes: list[str], as_json: bool) -> None:
    from toolchain import onnx_import

    proto, label, overrides = load_source(path, shapes)
    declared = onnx_import.declared_inputs(proto)
    counts = onnx_import.op_counts(proto)
    kernels, note = _stock_kernels(proto, overrides)
    if as_json:
        print(json.dumps({
            "model": label,
            "inputs": [{"name": i.name, "shape": list(i.dims), "dtype": i.dtype} for i in declared],
            "outputs": onnx_import.declared_outputs(proto),
            "op_counts": counts,
            "kernels": kernels,
            "note": note,
        }))
        return
    console.print(render.tensors_table(f"{label}: inputs", render.declared_inputs_rows(declared)))
    console.print(render.tensors_table("outputs", [(n, "", "") for n in onnx_import.declared_outputs(proto)]))
    console.print(render.op_counts_table(counts))
    if kernels is not None:
        console.print(render.kernels_table(kernels))
    else:
        console.print(f"[yellow]{escape(note)}[/yellow]")
