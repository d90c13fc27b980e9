"""Every command's options and arguments match golden_help.json, and `--help` reads well at 80 and 100 columns.

Regenerate the golden after a deliberate option change with ``AGOC_UPDATE_GOLDEN=1 pytest tests/host/test_help.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).with_name("golden_help.json")


def _commands():
    """(path words, click command) for the app, every group and every command, depth first."""
    import typer.main

    from host.cli import app

    found = []

    def walk(command, path):
        found.append((path, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _jsonable(value):
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _signature(command) -> dict:
    """A command's interface: its option strings, argument names and each option's default."""
    options, arguments, defaults = [], [], {}
    for param in command.params:
        if param.param_type_name == "argument":
            arguments.append(param.name)
            continue
        names = [*param.opts, *param.secondary_opts]
        options.extend(names)
        defaults[max(names, key=len)] = _jsonable(param.default)
    return {"options": sorted(options), "arguments": arguments, "defaults": defaults}


def _live() -> dict:
    return {" ".join(["agoc", *path]): _signature(command) for path, command in _commands()}


def test_options_match_the_golden_list():
    live = _live()
    if os.environ.get("AGOC_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(live, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(live) == sorted(golden), "commands added or removed"
    for name in golden:
        assert live[name] == golden[name], name


def _help_text(path: list[str], width: int) -> str:
    from typer.testing import CliRunner

    from host.cli import app

    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width), "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    return result.output


BOX = str.maketrans("", "", "│╭╮╰╯─┃━┏┓┗┛")


@pytest.mark.parametrize("width", [80, 100])
def test_help_is_readable(width):
    """No line overflows; wrapped help keeps a column of at least 40 characters (not squeezed beside a wide
    option column); every option's name and the first words of its help are shown."""
    for path, command in _commands():
        text = _help_text(path, width)
        lines = text.splitlines()
        for line in lines:
            assert len(line) <= width, f"agoc {' '.join(path)} at {width}: {line!r}"
            content = line.translate(BOX).rstrip()
            if content.strip():
                indent = len(content) - len(content.lstrip())
                assert indent <= width - 40, f"agoc {' '.join(path)} at {width}, squeezed: {line!r}"
        flat = "".join(text.translate(BOX).split())
        for param in command.params:
            for opt in param.opts:
                assert opt in text, f"agoc {' '.join(path)}: {opt} missing from --help"
            words = (getattr(param, "help", None) or "").split()[:4]
            assert "".join(words) in flat, f"agoc {' '.join(path)} at {width}: help of {param.name} not shown"
