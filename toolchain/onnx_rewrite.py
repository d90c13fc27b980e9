"""ONNX nodes rewritten before TVM's importer sees them, where it would compute something else.

Each rule (:data:`RULES`) takes a node and what is known at compile time (constant values, static
shapes) and returns the nodes that compute the same in ops the importer gets right, or None to leave
the node alone. A node a rule cannot express raises :class:`UnsupportedModelError` naming it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from toolchain.errors import UnsupportedModelError


@dataclass
class Context:
    """What a rule may read: the default-domain opset, constant values and static shapes by value name."""

    opset: int
    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    initializers: list = field(default_factory=list)  # new initializers the rewrites add
    _names: itertools.count = field(default_factory=itertools.count)

    def fresh(self, base: str) -> str:
        return f"{base}__agoc{next(self._names)}"

    def constant(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def shape(self, name: str, node) -> tuple[int, ...]:
        if name not in self.shapes:
            raise UnsupportedModelError(f"{node.op_type} node '{_name(node)}': the shape of '{name}' is not known at "
                                        "compile time; give every input a static shape (--input-shape)")
        return self.shapes[name]


def _name(node) -> str:
    return node.name or node.output[0]


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reduce_mean(ctx: Context, x: str, axes: list[int], out: str):
    """ReduceMean over ``axes`` keeping dims, in the model's opset (axes an attribute before 18)."""
    if ctx.opset >= 18:
        return helper.make_node("ReduceMean", [x, ctx.constant("axes", np.array(axes, np.int64))], [out], keepdims=1)
    return helper.make_node("ReduceMean", [x], [out], axes=axes, keepdims=1)


def layer_norm_statistics(node, ctx: Context):
    """LayerNormalization with its optional Mean / InvStdDev outputs: TVM's converter returns a 0-d
    placeholder for both. The normalisation stays one op; the statistics are computed beside it."""
    outputs = list(node.output) + [""] * (3 - len(node.output))
    if not any(outputs[1:]):
        return None
    attrs = _attrs(node)
    x = node.input[0]
    rank = len(ctx.shape(x, node))
    axes = list(range(int(attrs.get("axis", -1)) % rank, rank))
    y = outputs[0] or ctx.fresh("layer_norm")
    norm = helper.make_node("LayerNormalization", list(node.input), [y], name=node.name,
                            **{k: v for k, v in attrs.items() if k != "stash_type"})
    mean = outputs[1] or ctx.fresh("mean")
    centred, square, var, shifted, std = (ctx.fresh(n) for n in ("centred", "square", "var", "shifted", "std"))
    epsilon = ctx.constant("epsilon", np.array(attrs.get("epsilon", 1e-5), np.float32))
    nodes = [
        norm,
        _reduce_mean(ctx, x, axes, mean),
        helper.make_node("Sub", [x, mean], [centred]),
        helper.make_node("Mul", [centred, centred], [square]),
        _reduce_mean(ctx, square, axes, var),
    ]
    if outputs[2]:
        nodes += [helper.make_node("Add", [var, epsilon], [shifted]),
                  helper.make_node("Sqrt", [shifted], [std]),
                  helper.make_node("Reciprocal", [std], [outputs[2]])]
    return nodes


def conv_transpose_output_shape(node, ctx: Context):
    """ConvTranspose with ``output_shape`` (TVM's converter ignores it): the pads and output padding the
    ONNX spec derives from it (``total = stride·(in−1) + output_padding + (k−1)·dilation + 1 − out``,
    begin ``total − total//2``, end ``total//2``; a negative end grows the output padding)."""
    attrs = _attrs(node)
    if "output_shape" not in attrs or "pads" in attrs:  # with explicit pads ONNX's reference ignores it
        return None
    x_shape, w_shape = ctx.shape(node.input[0], node), ctx.shape(node.input[1], node)
    n = len(x_shape) - 2
    out = list(attrs["output_shape"])[-n:]
    strides = list(attrs.get("strides", [1] * n))
    dilations = list(attrs.get("dilations", [1] * n))
    kernel = list(attrs.get("kernel_shape", w_shape[2:]))
    out_pad = list(attrs.get("output_padding", [0] * n))
    upper = _text(attrs.get("auto_pad", "NOTSET")) == "SAME_UPPER"
    begin, end = [], []
    for i in range(n):
        total = strides[i] * (x_shape[i + 2] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 - out[i]
        b, e = (total // 2, total - total // 2) if upper else (total - total // 2, total // 2)
        if e < 0:
            out_pad[i], e = out_pad[i] - e, 0
        if b < 0 or out_pad[i] >= max(strides[i], dilations[i]):
            raise UnsupportedModelError(
                f"ConvTranspose node '{_name(node)}': output_shape {list(attrs['output_shape'])} needs padding TVM "
                "cannot express (more than a stride of extra output); export it with pads instead")
        begin.append(b)
        end.append(e)
    keep = {k: v for k, v in attrs.items() if k not in ("output_shape", "auto_pad", "output_padding")}
    return [helper.make_node("ConvTranspose", list(node.input), list(node.output), name=node.name,
                             pads=begin + end, output_padding=out_pad, **keep)]


#: coordinate modes whose source position is computed from the scale (not from the two lengths)
_SCALE_MODES = frozenset({"half_pixel", "pytorch_half_pixel", "asymmetric", "half_pixel_symmetric"})


def _resize_plan(node, ctx: Context):
    """(input shape, {axis: (scale or None, output length)}) of a Resize whose roi, scales and sizes are
    constant, or None."""
    inputs = list(node.input) + [""] * (4 - len(node.input))
    if any(name and name not in ctx.constants for name in inputs[1:]):
        return None
    shape = ctx.shape(inputs[0], node)
    rank = len(shape)
    attrs = _attrs(node)
    axes = [a % rank for a in attrs.get("axes", range(rank))]
    scales = ctx.constants[inputs[2]].tolist() if inputs[2] and ctx.constants[inputs[2]].size else None
    sizes = ctx.constants[inputs[3]].tolist() if inputs[3] and ctx.constants[inputs[3]].size else None
    if scales is not None:
        return shape, {a: (float(s), int(np.floor(shape[a] * s))) for a, s in zip(axes, scales)}
    if sizes is not None:
        return shape, {a: (None, int(s)) for a, s in zip(axes, sizes)}
    return None


def _tvm_resize_wrong(node, attrs: dict, shape, plan: dict) -> bool:
    """Would TVM's resize compute something else than ONNX's for this node?"""
    coord = _text(attrs.get("coordinate_transformation_mode", "half_pixel"))
    changed = {a: v for a, v in plan.items() if (v[1], v[0]) != (shape[a], 1.0)}
    return (
        "axes" in attrs  # the converter reads scales / sizes as every axis
        or coord == "half_pixel_symmetric"  # not implemented
        or (attrs.get("antialias", 0) and any(out < shape[a] for a, (_, out) in changed.items()))  # ignored
        # TVM maps positions with in/out, ONNX with the given scale: different where in·scale is no integer
        or (coord in _SCALE_MODES and any(s is not None and out != shape[a] * s for a, (s, out) in changed.items()))
        or (coord == "align_corners" and any(out == 1 for _, out in changed.values()))  # divides by out − 1
    )


def _axis_matrix(node, attrs: dict, length: int, scale: float | None, out: int) -> np.ndarray:
    """The (length × out) matrix of one axis's resize: row i is what ONNX's reference makes of the unit
    vector e_i (resize is linear and separable across axes)."""
    from onnx.reference import ReferenceEvaluator

    keep = {k: v for k, v in attrs.items() if k in ("mode", "coordinate_transformation_mode", "cubic_coeff_a",
                                                     "exclude_outside", "nearest_mode", "antialias")}
    given = np.array([scale], np.float32) if scale is not None else np.array([out], np.int64)
    names = ["x", "", "scales", ""] if scale is not None else ["x", "", "", "sizes"]
    graph = helper.make_graph(
        [helper.make_node("Resize", names, ["y"], axes=[1], **keep)], "axis",
        [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [length, length])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [length, out])],
        [numpy_helper.from_array(given, names[2] or names[3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    (matrix,) = ReferenceEvaluator(model).run(None, {"x": np.eye(length)})
    return matrix


def resize_exact(node, ctx: Context):
    """Resize where TVM's op computes something else (:func:`_tvm_resize_wrong`: antialiasing, a scale
    that is not out/in, ``axes``, half_pixel_symmetric): each resized axis as a product with its
    interpolation matrix (linear, cubic), or a gather of the source positions (nearest)."""
    attrs = _attrs(node)
    mode = _text(attrs.get("mode", "nearest"))
    coord = _text(attrs.get("coordinate_transformation_mode", "half_pixel"))
    policy = _text(attrs.get("keep_aspect_ratio_policy", "stretch"))
    if mode not in ("nearest", "linear", "cubic") or coord == "tf_crop_and_resize" or policy != "stretch":
        return None
    found = _resize_plan(node, ctx)
    if found is None:
        return None
    shape, plan = found
    if not _tvm_resize_wrong(node, attrs, shape, plan):
        return None
    rank, nodes, current = len(shape), [], node.input[0]
    todo = [a for a, (s, out) in plan.items() if (out, s) != (shape[a], 1.0) and (out, s) != (shape[a], None)]
    for i, axis in enumerate(todo):
        scale, out = plan[axis]
        # align_corners maps positions with the lengths (onnxruntime's reading; the reference uses in·scale)
        matrix = _axis_matrix(node, attrs, shape[axis], None if coord == "align_corners" else scale, out)
        result = node.output[0] if i == len(todo) - 1 else ctx.fresh("resized")
        if mode == "nearest":
            index = ctx.constant("source", matrix.argmax(axis=0).astype(np.int64))
            nodes.append(helper.make_node("Gather", [current, index], [result], axis=axis))
        elif axis == rank - 1:
            weights = ctx.constant("weights", matrix.astype(np.float32))
            nodes.append(helper.make_node("MatMul", [current, weights], [result]))
        elif axis == rank - 2:
            weights = ctx.constant("weights", np.ascontiguousarray(matrix.T).astype(np.float32))
            nodes.append(helper.make_node("MatMul", [weights, current], [result]))
        else:  # move the axis last, multiply, move it back
            perm = [d for d in range(rank) if d != axis] + [axis]
            back = list(np.argsort(perm))
            moved, product = ctx.fresh("moved"), ctx.fresh("product")
            weights = ctx.constant("weights", matrix.astype(np.float32))
            nodes += [helper.make_node("Transpose", [current], [moved], perm=perm),
                      helper.make_node("MatMul", [moved, weights], [product]),
                      helper.make_node("Transpose", [product], [result], perm=[int(p) for p in back])]
        current = result
    if not todo:
        nodes.append(helper.make_node("Identity", [current], [node.output[0]]))
    return nodes


def tile_as_expand(node, ctx: Context):
    """Tile with constant repeats as ``Reshape`` (1, d0, 1, d1, …) → ``Expand`` (r0, d0, r1, d1, …) →
    ``Reshape`` (r0·d0, …). TVM's converter emits topi's tile, which reads ``x[i % d]``; unscheduled, LLVM's
    loop vectorizer at AVX-512 widths turns the tiled axis into one contiguous load of the whole tiled
    row from the source (reading past its end), and the runtime guard it adds always takes that path:
    garbage or NaN at the host's default -mcpu, exact at haswell. The broadcast indexes without a modulo."""
    if len(node.input) < 2 or node.input[1] not in ctx.constants:
        return None
    shape = ctx.shape(node.input[0], node)
    reps = [int(r) for r in ctx.constants[node.input[1]].reshape(-1)]
    if len(reps) != len(shape) or all(r == 1 for r in reps):
        return None
    spread, expanded = ctx.fresh("spread"), ctx.fresh("expanded")
    ints = lambda base, values: ctx.constant(base, np.array(values, np.int64))  # noqa: E731
    return [
        helper.make_node("Reshape", [node.input[0], ints("spread_shape", [v for d in shape for v in (1, d)])],
                         [spread]),
        helper.make_node("Expand", [spread, ints("expand_shape", [v for d, r in zip(shape, reps) for v in (r, d)])],
                         [expanded]),
        helper.make_node("Reshape", [expanded, ints("tiled_shape", [d * r for d, r in zip(shape, reps)])],
                         [node.output[0]]),
    ]


def concat_without_empty(node, ctx: Context):
    """Concat with a zero-size input (an exporter's empty initializer): the same Concat without it (a
    zero-size constant makes a library TVM cannot load)."""
    empty = [name for name in node.input if name and 0 in ctx.shapes.get(name, (1,))]
    if not empty or len(empty) == len(node.input):
        return None
    rest = [name for name in node.input if name not in empty]
    if len(rest) == 1:
        return [helper.make_node("Identity", rest, list(node.output), name=node.name)]
    return [helper.make_node("Concat", rest, list(node.output), name=node.name, **_attrs(node))]


#: Constant's scalar and list attributes, as the ``value`` tensor they stand for
CONSTANT_FORMS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}


def constant_as_value(node, ctx: Context):
    """A Constant given as ``value_float(s)`` / ``value_int(s)`` (opset 12+ exporters write them) as the same
    Constant with a ``value`` tensor, the only form TVM's importer reads."""
    attr = next((a for a in node.attribute if a.name in CONSTANT_FORMS), None)
    if attr is None:
        return None
    value = np.asarray(helper.get_attribute_value(attr), dtype=CONSTANT_FORMS[attr.name])
    return [helper.make_node("Constant", [], list(node.output), name=node.name,
                             value=numpy_helper.from_array(value, node.output[0]))]


@dataclass(frozen=True)
class Rule:
    op: str
    rewrite: Callable  # (node, Context) -> list of nodes, or None to keep the node
    why: str


RULES: tuple[Rule, ...] = (
    Rule("LayerNormalization", layer_norm_statistics, "TVM returns 0-d placeholders for Mean and InvStdDev"),
    Rule("ConvTranspose", conv_transpose_output_shape, "TVM ignores output_shape"),
    Rule("Resize", resize_exact, "TVM's resize ignores antialias, axes and scales that are not out/in"),
    Rule("Tile", tile_as_expand, "topi's tile miscompiles at AVX-512 (LLVM's loop vectorizer)"),
    Rule("Concat", concat_without_empty, "a zero-size constant makes a library TVM cannot load"),
    Rule("Constant", constant_as_value, "TVM's importer reads only a Constant's `value` tensor"),
)


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = next((a for a in node.attribute if a.name == "value" or a.name in CONSTANT_FORMS), None)
            if attr is not None and attr.name == "value":
                values[node.output[0]] = numpy_helper.to_array(attr.t)
            elif attr is not None:
                values[node.output[0]] = np.asarray(helper.get_attribute_value(attr), dtype=CONSTANT_FORMS[attr.name])
    return values


def _static_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Every value's static shape, by ONNX shape inference from the given input shapes."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[vi.name]:
                dims.dim.add().dim_value = int(d)
    inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True)
    known = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            known[vi.name] = tuple(int(d.dim_value) for d in dims)
    return known


def opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def unique_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` listing each graph output once (a tensor listed twice is one output of the artifact, as
    onnxruntime's outputs by name are)."""
    names = [o.name for o in model.graph.output]
    if len(set(names)) == len(names):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    seen: set[str] = set()
    for o in model.graph.output:
        if o.name not in seen:
            seen.add(o.name)
            out.graph.output.append(o)
    return out


def rewrite(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], rules: tuple[Rule, ...] = RULES):
    """``model`` with :data:`RULES` applied (the same model when no rule changes anything)."""
    model = unique_outputs(model)
    ops = {r.op for r in rules}
    if not any(n.op_type in ops and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    ctx = Context(opset(model), _constants(model), _static_shapes(model, shapes))
    nodes, changed = [], False
    for node in model.graph.node:
        rule = next((r for r in rules if r.op == node.op_type and node.domain in ("", "ai.onnx")), None)
        new = rule.rewrite(node, ctx) if rule is not None else None
        nodes.extend(new if new is not None else [node])
        changed |= new is not None
    if not changed:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(ctx.initializers)
    return out
