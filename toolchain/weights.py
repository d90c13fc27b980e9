"""Op weights, AGO Eq. 1: ``w_v = c · Π_{l ∈ loops(v)} log(extent_l) + b``.

The weight predicts how many tuning trials an op adds to a subgraph, so a
subgraph's weight (the sum over its ops) is its predicted tuning budget, and
the clustering threshold ``Td`` caps it.

Choices the paper leaves open (AGO §IV-A), stated here:

* loops are the iter vars of every block of the op's legalized PrimFunc
  (spatial and reduction); an op with several blocks (a conv's padding block,
  layer norm's mean / variance / normalise blocks) sums its blocks' products;
* loops of extent 1 are skipped (log 1 = 0 would zero the product of a loop
  that is not really there, e.g. batch 1 or a 1×1 window);
* ``log`` is the natural logarithm.

``c`` and ``b`` are fitted by least squares to measured tuning budgets (trials
until the best latency stabilises) with ``python -m host.bench.fit_weights``; the
result ships as ``toolchain/data/weight_fit.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from toolchain.opgraph import OpGraph, OpNode

FIT_FILE = Path(__file__).parent / "data" / "weight_fit.json"


@dataclass(frozen=True)
class WeightModel:
    c: float
    b: float
    source: str  # where the constants come from

    def weight(self, node: OpNode) -> float:
        return self.c * loop_term(node) + self.b


def loop_term(node: OpNode) -> float:
    """Σ over the op's blocks of Π log(extent) over its loops of extent > 1."""
    return sum(math.prod(math.log(e) for _, e, _ in block.iters if e > 1) for block in node.blocks)


def load_model(path: Path = FIT_FILE) -> WeightModel:
    """The shipped fit; an explicit error if it is missing (re-create it with host.bench.fit_weights)."""
    data = json.loads(path.read_text())
    return WeightModel(float(data["c"]), float(data["b"]), data.get("source", str(path)))


def op_weights(graph: OpGraph, model: WeightModel | None = None) -> dict[str, float]:
    model = model or load_model()
    return {n.id: model.weight(n) for n in graph.nodes}


def default_threshold(fallback: float, path: Path = FIT_FILE) -> float:
    """The clustering threshold Td: the fit file's ``default_threshold`` if it names one, else ``fallback``."""
    value = json.loads(path.read_text()).get("default_threshold")
    return float(value) if value is not None else fallback
