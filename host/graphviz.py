"""The partitioned op graph as Graphviz DOT (and PNG through the `dot` program).

Each subgraph is a cluster box labelled with its index and weight; complex ops
are drawn as bold boxes, simple ops as ellipses. Node labels come from the
graph (PrimFunc names) and are quoted, so nothing from a model reaches a shell:
``dot`` is run with an argument list and the DOT text on stdin.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from toolchain.errors import AgocError

PALETTE = ("#e8f0fe", "#fce8e6", "#e6f4ea", "#fef7e0", "#f3e8fd", "#e0f7fa")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def partition_dot(graph, plan, title: str) -> str:
    nodes = graph.by_id
    lines = [f"digraph {_quote(title)} {{", "  rankdir=TB; node [fontsize=10]; compound=true;"]
    lines.append(f"  label={_quote(f'{title}: {plan.method} partition, {len(plan.groups)} subgraphs')};")
    for i, group in enumerate(plan.groups):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(
            f"    style=filled; color=\"#9aa0a6\"; fillcolor=\"{PALETTE[i % len(PALETTE)]}\"; "
            f"label={_quote(f'S{i}  w={plan.group_weight(group):.0f}')};"
        )
        for node_id in group:
            node = nodes[node_id]
            shape = "box, style=\"bold,filled\", fillcolor=white" if node.is_complex else "ellipse"
            lines.append(f"    {_quote(node_id)} [label={_quote(node.func)}, shape={shape}];")
        lines.append("  }")
    for src, dst in graph.edges:
        lines.append(f"  {_quote(src)} -> {_quote(dst)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_png(dot_text: str, path: Path) -> Path:
    exe = shutil.which("dot")
    if not exe:
        raise AgocError("--png needs Graphviz's `dot`: run `make setup` or `apt-get install graphviz` "
                        "(--dot works without it)")
    result = subprocess.run([exe, "-Tpng", "-o", str(path)], input=dot_text, text=True, capture_output=True,
                            timeout=300)
    if result.returncode != 0:
        raise AgocError(f"dot failed: {result.stderr.strip()[:300]}")
    return path
