"""A kernel's innermost loops read from the assembly LLVM emits for it: vector FMAs and stack traffic (register
spills) per iteration, so that an inner block's quality on ARM is checked here without a phone."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Loop:
    """One innermost loop: the instructions between its label and its backward branch."""

    label: str
    instructions: int
    fmas: int  # vector fused multiply-adds
    loads: int
    stores: int
    spills: int  # loads and stores addressing the stack frame
    prefetches: int = 0  # software prefetches (toolchain/prefetch.py)


@dataclass(frozen=True)
class Isa:
    label: re.Pattern
    branch: re.Pattern  # a conditional or unconditional branch to a label (group 1: the label)
    fma: re.Pattern
    load: re.Pattern
    store: re.Pattern
    stack: re.Pattern
    prefetch: re.Pattern


#: per architecture (the target triple's first part): what its assembly calls each of these
ISAS = {
    "aarch64": Isa(
        label=re.compile(r"^(\.?L\w+):"),
        branch=re.compile(r"^\s*(?:b(?:\.\w+)?|cbn?z\s+\w+,|tbn?z\s+\w+,\s*#\d+,)\s*(\.?L\w+)\s*$"),
        fma=re.compile(r"^\s*fml[as]\s+v\d+\.(?:4s|8h|2d)"),
        load=re.compile(r"^\s*ld(?:r|p|1|ur)\w*\s"),
        store=re.compile(r"^\s*st(?:r|p|1|ur)\w*\s"),
        stack=re.compile(r"\[(?:sp|x29)\b"),
        prefetch=re.compile(r"^\s*prfm\s"),
    ),
    "x86_64": Isa(
        label=re.compile(r"^(\.?L\w+):"),
        branch=re.compile(r"^\s*j\w+\s+(\.?L\w+)\s*$"),
        fma=re.compile(r"^\s*vf[n]?m(?:add|sub)\w*p[sh]\s"),
        load=re.compile(r"^\s*v?mov\w*\s+[^,]*\(.*,"),
        store=re.compile(r"^\s*v?mov\w*\s+[^(]*,\s*[^,]*\("),
        stack=re.compile(r"\((?:%rsp|%rbp)\)|\(%rsp,|\(%rbp,"),
        prefetch=re.compile(r"^\s*prefetch\w*\s"),
    ),
}


def innermost_loops(assembly: str, arch: str) -> list[Loop]:
    """The loops of ``assembly`` (one label to a later backward branch to it) that hold no other loop."""
    isa = ISAS[arch]
    lines = [line.split("//")[0].split("#")[0] if arch == "aarch64" else line for line in assembly.splitlines()]
    labels: dict[str, int] = {}
    spans: list[tuple[str, int, int]] = []
    for index, line in enumerate(lines):
        found = isa.label.match(line)
        if found:
            labels[found.group(1)] = index
            continue
        branch = isa.branch.match(line)
        if branch and branch.group(1) in labels:
            spans.append((branch.group(1), labels[branch.group(1)], index))
    inner = [s for s in spans if not any(o is not s and s[1] <= o[1] and o[2] <= s[2] for o in spans)]
    return [_loop(label, lines[start + 1:end + 1], isa) for label, start, end in inner]


def _loop(label: str, body: list[str], isa: Isa) -> Loop:
    code = [line for line in body if line.strip() and not line.strip().startswith(".") and not isa.label.match(line)]
    loads = [line for line in code if isa.load.match(line)]
    stores = [line for line in code if isa.store.match(line)]
    return Loop(label, len(code), sum(1 for line in code if isa.fma.match(line)), len(loads), len(stores),
                sum(1 for line in loads + stores if isa.stack.search(line)),
                sum(1 for line in code if isa.prefetch.match(line)))


def hottest(loops: list[Loop]) -> Loop | None:
    """The loop with the most vector FMAs (the inner block of a conv or matmul), None without any."""
    return max((loop for loop in loops if loop.fmas), key=lambda loop: loop.fmas, default=None)


def assembly(func, target, name: str = "kernel", pipeline: str = "default") -> str:
    """The assembly LLVM emits for the PrimFunc ``func`` built alone for ``target`` with the TIR ``pipeline``."""
    import tvm

    mod = tvm.IRModule({name: func.with_attr("global_symbol", name)})
    return tvm.tirx.build(mod, target=target, pipeline=pipeline).inspect_source("asm")
