"""The two consoles every command prints on: results on stdout, progress, notes and errors on stderr."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
