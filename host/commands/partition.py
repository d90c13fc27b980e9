"""`agoc partition`: a model partitioned by AGO and by stock TVM, side by side (tables, JSON, DOT, PNG)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from host import render
from host.commands.common import check_output_file, load_supported, partition_settings, write_file
from host.console import console
from host.options import (
    FastMathOpt,
    GeometryOpt,
    InputShapeOpt,
    KeepInsideOpt,
    LayoutOpt,
    ModelArg,
    PadChannelsOpt,
    ThresholdOpt,
    WinogradOpt,
)
from toolchain.errors import UnsupportedModelError


def partition(
    model: ModelArg,
    input_shape: InputShapeOpt = None,
    threshold: ThresholdOpt = None,
    trivial_cut: Annotated[Optional[float], typer.Option(
        help="Subgraphs lighter than this count as trivial (default 5 ≈ trials).")] = None,
    keep_inside: KeepInsideOpt = None,
    geometry: GeometryOpt = None,
    explain: Annotated[bool, typer.Option("--explain", help="Show why merges were declined.")] = False,
    dot: Annotated[Optional[Path], typer.Option(
        "--dot", help="Write the AGO-partitioned graph as Graphviz DOT.")] = None,
    png: Annotated[Optional[Path], typer.Option(
        "--png", help="Render the partitioned graph to PNG (needs graphviz `dot`).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object: {model, ago: {...}, stock: {...}}.")] = False,
    layout: LayoutOpt = "NHWC",
    pad_channels: PadChannelsOpt = True,
    fast_math: FastMathOpt = True,
    winograd: WinogradOpt = True,
):
    """Partition MODEL with AGO and with stock TVM; print subgraphs and AGO's statistics side by side."""
    from toolchain import frontend
    from toolchain import partition as partitioning
    from toolchain.opgraph import op_graph
    from toolchain.settings import PartitionSettings
    from toolchain.targets import resolve_target

    check_output_file(dot, "--dot")
    check_output_file(png, "--png")
    ago, _, _ = partition_settings("ago", threshold, keep_inside, geometry=geometry)
    if trivial_cut is not None and not trivial_cut >= 0:  # NaN included
        raise UnsupportedModelError(f"--trivial-cut must be a weight of 0 or more (got {trivial_cut}); the default is "
                                    f"{partitioning.TRIVIAL_CUT:g}")
    threshold = ago.td
    trivial_cut = partitioning.TRIVIAL_CUT if trivial_cut is None else trivial_cut
    proto, label, _, overrides = load_supported(model, input_shape or [])
    spec = resolve_target("host", layout=layout, pad_channels=pad_channels, fast_math=fast_math, winograd=winograd)
    mod, _ = frontend.prepare(proto, spec, overrides)
    graph = op_graph(mod)
    plans = {
        "ago": partitioning.plan(ago, mod, spec, graph),
        "stock": partitioning.plan(PartitionSettings("stock"), mod, spec, graph),
    }
    for p in plans.values():
        partitioning.check(graph, p)
    summary = {name: partitioning.stats(graph, p, trivial_cut) for name, p in plans.items()}
    _draw(graph, plans["ago"], label, dot, png)
    if as_json:
        print(json.dumps({"model": label, "threshold": threshold, "trivial_cut": trivial_cut, **summary}))
        return
    console.print(render.partition_stats_table(label, summary, threshold, trivial_cut))
    console.print(render.subgraphs_table(graph, plans["ago"], trivial_cut))
    if explain:
        console.print(render.decisions_table(plans["ago"].decisions, graph))
    for path in (dot, png):
        if path:
            console.print(f"[green]✓[/green] wrote {escape(str(path))}")


def _draw(graph, plan, label: str, dot: Optional[Path], png: Optional[Path]) -> None:
    """``--dot`` and ``--png``: the AGO partition as Graphviz DOT, and rendered."""
    from host import graphviz

    if not (dot or png):
        return
    text = graphviz.partition_dot(graph, plan, label)
    if dot:
        write_file(dot, text.encode())
    if png:
        graphviz.render_png(text, png)
