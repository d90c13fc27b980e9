"""The calibration subgraphs of the weight fit: consecutive ops of zoo models, extracted and fused into
one PrimFunc each (host/bench/fit_weights.py tunes them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """One calibration subgraph: ``take`` consecutive ops of a zoo model.

    The first op is the ``nth`` (0-based) node of ``op_graph`` that matches
    ``anchor`` — ``"class:<op_class>"`` or ``"func:<PrimFunc name prefix>"`` —
    shifted by ``offset`` nodes.
    """

    name: str
    model: str
    shape: tuple[int, ...]
    anchor: str
    nth: int
    take: int
    offset: int = 0
    note: str = ""


M56, M112 = (1, 3, 56, 56), (1, 3, 112, 112)
BERT = (1, 128)

#: Subgraphs tuned to fit c and b. MobileNet-V2 node runs at 56×56 input
#: (stem output 28×28); block 3 is 24→144→144→24 with a residual add.
CALIBRATION: tuple[Calibration, ...] = (
    Calibration("mbv2-stem-conv3x3@56", "mobilenet-v2", M56, "class:conv", 0, 4,
                note="3x3/2 conv 3→32 + bias + relu6 (max, min)"),
    Calibration("mbv2-stem-conv3x3@112", "mobilenet-v2", M112, "class:conv", 0, 4,
                note="same at 112"),
    Calibration("mbv2-pw-bias@56", "mobilenet-v2", M56, "class:pointwise_conv", 0, 2,
                note="1x1 conv 32→16 + bias"),
    Calibration("mbv2-dw@56", "mobilenet-v2", M56, "class:depthwise_conv", 0, 4,
                note="3x3 depthwise 32 + bias + relu6"),
    Calibration("mbv2-dw@112", "mobilenet-v2", M112, "class:depthwise_conv", 0, 4,
                note="same at 112"),
    Calibration("bert-matmul-add", "bert-tiny", BERT, "class:matmul", 0, 2,
                note="Q projection 128x128x128 + bias"),
    Calibration("bert-softmax", "bert-tiny", BERT, "func:softmax", 0, 2, offset=-1,
                note="attention scale (divide) + softmax"),
    # (bias add + residual add + layer norm, 3 ops, is not tunable: the default space's
    # MultiLevelTiling fails with a reverse-compute-at ScheduleError on it, every seed)
    Calibration("bert-add-layernorm", "bert-tiny", BERT, "func:layer_norm", 1, 2, offset=-1,
                note="residual add + layer norm"),
    Calibration("bert-gelu", "bert-tiny", BERT, "func:erf", 0, 6, offset=-2,
                note="FFN bias add + erf-GELU: elementwise only"),
    Calibration("mbv2-pw-dw@56", "mobilenet-v2", M56, "class:pointwise_conv", 3, 8,
                note="block 3: pw 24→144 + bias + relu6 → dw 144 + bias + relu6"),
    Calibration("mbv2-dw-pw@56", "mobilenet-v2", M56, "class:depthwise_conv", 2, 6,
                note="block 3: dw 144 + bias + relu6 → pw 144→24 + bias"),
    Calibration("mbv2-block@56", "mobilenet-v2", M56, "class:pointwise_conv", 3, 11,
                note="block 3 whole: pw → dw → pw (+ biases, relu6s, residual add)"),
)


def calibration(name: str) -> Calibration:
    for cal in CALIBRATION:
        if cal.name == name:
            return cal
    raise KeyError(f"no calibration subgraph '{name}'; known: {', '.join(c.name for c in CALIBRATION)}")


def pick_group(nodes: Sequence, cal: Calibration) -> list[str]:
    """The node ids ``cal`` selects from an op graph's nodes (in topological order)."""
    kind, _, value = cal.anchor.partition(":")
    if kind == "class":
        hits = [i for i, n in enumerate(nodes) if n.op_class == value]
    elif kind == "func":
        hits = [i for i, n in enumerate(nodes) if n.func.startswith(value)]
    else:
        raise ValueError(f"bad anchor '{cal.anchor}' in {cal.name}: use class:<op_class> or func:<prefix>")
    if len(hits) <= cal.nth:
        raise ValueError(f"{cal.name}: {cal.model} has only {len(hits)} nodes matching {cal.anchor}")
    start = hits[cal.nth] + cal.offset
    if start < 0 or start + cal.take > len(nodes):
        raise ValueError(f"{cal.name}: group [{start}, {start + cal.take}) is outside the graph")
    return [n.id for n in nodes[start:start + cal.take]]


@dataclass(frozen=True)
class Extracted:
    cal: Calibration
    node_ids: tuple[str, ...]
    loop_term_sum: float
    n_ops: int
    n_complex: int
    func: object  # tvm.tirx.PrimFunc: the group fused into one kernel
    func_name: str


_LEGALIZED: dict = {}


def _legalized(model: str, shape: tuple[int, ...], spec):
    key = (model, shape, json.dumps(spec.to_json(), sort_keys=True))
    if key not in _LEGALIZED:
        import models
        from toolchain import build, onnx_import

        onnx_model = models.build(model, shape)
        inputs = onnx_import.resolve_inputs(onnx_model, {})
        _LEGALIZED[key] = build.legalize(onnx_import.to_relax(onnx_model, inputs), spec)
    return _LEGALIZED[key]


def extract(cal: Calibration, spec) -> Extracted:
    """Fuse ``cal``'s group (with everything before / after it as two other groups) and return its PrimFunc."""
    from toolchain.build import kernels
    from toolchain.fusion import fuse_groups
    from toolchain.opgraph import op_graph
    from toolchain.weights import loop_term

    mod = _legalized(cal.model, cal.shape, spec)
    graph = op_graph(mod)
    ids = [n.id for n in graph.nodes]
    group = pick_group(graph.nodes, cal)
    start = ids.index(group[0])
    before, after = ids[:start], ids[start + len(group):]
    groups = [g for g in (before, group, after) if g]
    fused = fuse_groups(mod, groups, spec)
    calls = kernels(fused)
    name = calls[1 if before else 0].name  # groups are emitted (and called) in order
    first_func = graph.node(group[0]).func
    if first_func not in name:
        raise RuntimeError(f"{cal.name}: expected the fused kernel of {first_func}..., found {name}")
    func = fused[name]
    members = [graph.node(i) for i in group]
    return Extracted(
        cal=cal,
        node_ids=tuple(group),
        loop_term_sum=sum(loop_term(n) for n in members),
        n_ops=len(members),
        n_complex=sum(1 for n in members if n.is_complex),
        func=func,
        func_name=name,
    )
