"""Seeded sample inputs for verification and benchmarking.

Rules (first match wins), per input dtype:

* floating point: standard normal, seed ``seed + position``;
* integer used as ``Gather`` indices into a weight table: uniform in
  ``[0, rows)`` so every id is valid (token ids for BERT-like models);
* integer used as an ``Expand`` shape or ``Tile`` repeats: all ones (valid whatever the input's shape);
* integer whose name contains ``mask``: all ones (attend everywhere);
* any other integer: zeros (segment / token-type ids);
* bool: uniform random.
"""

from __future__ import annotations

import numpy as np
import onnx

from toolchain.onnx_import import TensorInfo


def _gather_bound(model: onnx.ModelProto, name: str) -> int | None:
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    bounds = []
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in shapes:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            bounds.append(shapes[node.input[0]][axis])
    return min(bounds) if bounds else None


#: (op, input position) of integer operands for which all ones is always a valid value
ONES_OPERANDS = frozenset({("Expand", 1), ("Tile", 1)})


def _ones_operand(model: onnx.ModelProto, name: str) -> bool:
    return any((node.op_type, i) in ONES_OPERANDS for node in model.graph.node for i, x in enumerate(node.input)
               if x == name)


def sample_inputs(model: onnx.ModelProto, inputs: list[TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    result: dict[str, np.ndarray] = {}
    for pos, info in enumerate(inputs):
        rng = np.random.default_rng(seed + pos)
        dtype = np.dtype(info.dtype)
        if dtype.kind == "f":
            data = rng.standard_normal(info.shape).astype(dtype)
        elif dtype.kind in "iu":
            bound = _gather_bound(model, info.name)
            if bound is not None:
                data = rng.integers(0, bound, size=info.shape).astype(dtype)
            elif _ones_operand(model, info.name) or "mask" in info.name.lower():
                data = np.ones(info.shape, dtype)
            else:
                data = np.zeros(info.shape, dtype)
        elif dtype.kind == "b":
            data = rng.integers(0, 2, size=info.shape).astype(bool)
        else:
            data = np.zeros(info.shape, dtype)
        result[info.name] = data
    return result
