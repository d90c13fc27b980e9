"""`agoc library build|show`: record libraries, the verified schedules of many tuning databases for one
target, from which `agoc tune` starts new kernels' searches."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from host.console import console, err_console


def build(
    databases: Annotated[list[Path], typer.Argument(
        help="Tuning databases (`agoc tune --db`), of one target and layout.")],
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="The library directory: made, or extended when it is one (the best schedule kept).")],
    device: Annotated[str, typer.Option(
        "--device", help="Where the databases' candidates were measured: local, qemu, or a phone's model.")] = "local",
):
    """Package the verified schedules of tuning databases into a record library (or add them to one)."""
    from toolchain.tune.library import build as build_library

    words = ["agoc", "library", "build", *map(str, databases), "--out", str(out), "--device", device]
    command = " ".join(shlex.quote(w) for w in words)
    library = build_library(list(databases), out, device=device, command=command)
    _show(library)
    console.print(f"[green]✓[/green] {len(library.entries)} kernels in {escape(str(out))}")


def show(
    path: Annotated[Path, typer.Argument(help="A record library directory.")],
):
    """A record library's target, sources and kernels per op kind."""
    from toolchain.tune.library import Library

    _show(Library.load(path))


def _show(library) -> None:
    meta = library.meta
    console.print(f"record library {escape(str(library.path))} (format {meta['format']} v{meta['version']}): "
                  f"target {escape(library.key)}, layout {library.layout}, measured on {escape(library.device)}")
    kinds = Table(title="kernels per op kind", title_justify="left")
    for col in ("op", "kernels"):
        kinds.add_column(col)
    for op, n in library.counts().items():
        kinds.add_row(escape(op), str(n))
    counts = meta.get("counts", {})
    kinds.add_row("all", f"{counts.get('kernels', 0)} ({counts.get('samples', 0)} measured samples)")
    console.print(kinds)
    sources = Table(title="sources", title_justify="left")
    for col in ("model sha256", "database", "kernels", "trials"):
        sources.add_column(col)
    for s in library.sources:
        sources.add_row(s["model_sha256"][:12], escape(s["database"]), str(s.get("kernels", "")),
                        str(s.get("settings", {}).get("trials", "")))
    console.print(sources)
    cost = library.cost_model
    err_console.print(f"[dim]cost model: {escape(cost.name) if cost else 'none'}; made by: "
                      f"{escape('; '.join(meta.get('commands', [])[-3:]) or '-')}[/dim]", soft_wrap=True)


def describe(library: Optional[object]) -> str:
    """The one line `agoc tune` prints about the library it starts from."""
    if library is None:
        return "tuning without a record library: every kernel's search starts from its own model's schedules"
    counts = library.meta.get("counts", {})
    return (f"tuning from the record library {library.path} ({counts.get('kernels', 0)} kernels of "
            f"{len(library.sources)} models, {library.key}{', float16' if library.precision == 'fp16' else ''}): "
            "new kernels start from the schedules of kernels like them")
