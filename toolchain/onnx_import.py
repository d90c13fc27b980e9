"""ONNX → Relax: load and check a model, resolve its input shapes, import it. Every failure a user can
cause (a missing or truncated file, an opset or input dtype the reference cannot take, a dynamic
dimension) becomes one line that names the fix."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from toolchain.errors import (
    InputShapeError,
    ModelLoadError,
    UnsupportedModelError,
    first_line,
)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> TensorInfo:
        return TensorInfo(d["name"], tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class DeclaredInput:
    """A graph input as the file declares it: dims are ints, or strings/None when dynamic."""

    name: str
    dims: tuple[int | str | None, ...]
    dtype: str

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d > 0 for d in self.dims)

    def describe(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"


#: the newest default-domain opset the pinned onnxruntime 1.31 (the reference every compile runs) loads
REFERENCE_MAX_OPSET = 26
#: numpy dtypes a graph input may have: what TVM's runtime and onnxruntime both take from numpy
INPUT_DTYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64",
                          "uint8", "uint16", "uint32", "uint64", "bool"})


def max_opset() -> int:
    return min(onnx.defs.onnx_opset_version(), REFERENCE_MAX_OPSET)


def _missing_external_data(model: onnx.ModelProto, base: Path) -> tuple[str, str, Path] | None:
    """(tensor, location, path looked at) of the first tensor whose external-data file is missing."""
    from onnx.external_data_helper import (
        ExternalDataInfo,
        _get_all_tensors,
        uses_external_data,
    )

    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            if not (base / location).is_file():
                return tensor.name, location, base / location
    return None


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and structurally check an ONNX file; :class:`ModelLoadError` on any problem."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"no such file: {path}; check the path (or use zoo:NAME, see `agoc models list`)")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not an ONNX file; give the .onnx file itself")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, ...
        raise ModelLoadError(
            f"{path} is not a readable ONNX model (truncated or not ONNX: {type(exc).__name__}); "
            "re-export it, e.g. with torch.onnx.export"
        ) from exc
    missing = _missing_external_data(model, path.parent)
    if missing is not None:
        tensor, location, looked = missing
        raise ModelLoadError(
            f"{path} keeps tensor '{tensor}' in the external-data file '{location}', which is missing (looked for "
            f"{looked}); copy that file next to the model")
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:
        raise ModelLoadError(f"{path}: its external data cannot be read ({first_line(exc)}); re-export the model "
                             "with its weights inside (save_as_external_data=False)") from exc
    if not model.graph.node:
        raise ModelLoadError(f"{path} holds no ONNX graph nodes (empty, truncated or not an ONNX model); re-export "
                             "it, e.g. with torch.onnx.export")
    check_opset(model, str(path))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelLoadError(f"{path} is not a valid ONNX model: {first}; re-export it, or fix the graph the "
                             "checker names") from exc
    return model


def check_opset(model: onnx.ModelProto, where: str = "the model") -> None:
    """:class:`UnsupportedModelError` for a default-domain opset newer than the reference and importer take."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is not None and version > max_opset():
        raise UnsupportedModelError(
            f"{where} uses ONNX opset {version}; agoc takes opset {max_opset()} at most (the newest its reference, "
            f"onnxruntime, loads); re-export with opset_version={max_opset()} or lower")


def model_hash(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def _np_dtype(elem_type: int) -> str:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type in onnx.TensorProto.DataType.values() \
            else f"type {elem_type}"


def declared_inputs(model: onnx.ModelProto) -> list[DeclaredInput]:
    """Graph inputs that are real inputs (not initializers), in positional order."""
    inits = {t.name for t in model.graph.initializer}
    result = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedModelError(f"input '{vi.name}' is not a tensor (sequences and maps are not supported)")
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        dtype = _np_dtype(tt.elem_type)
        if dtype not in INPUT_DTYPES:
            raise UnsupportedModelError(
                f"input '{vi.name}' is {dtype}, which TVM's runtime and onnxruntime cannot take as an input; re-export "
                "the model with a float32 (or float16) input and a Cast inside it")
        result.append(DeclaredInput(vi.name, tuple(dims), dtype))
    return result


def declared_outputs(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX op type → count, most frequent first (top-level graph)."""
    counts = collections.Counter(node.op_type for node in model.graph.node)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def check_supported(model: onnx.ModelProto) -> None:
    """Raise :class:`UnsupportedModelError` naming every node whose op is off the supported list
    (``toolchain/op_support.py``), in another domain, over one of its limits, or without a TVM converter."""
    from tvm.relax.frontend.onnx import onnx_frontend

    from toolchain import op_support

    converters = onnx_frontend._get_convert_map()
    offending = []
    runtime = op_support.runtime_values(model.graph)
    for node in model.graph.node:
        where = f"node '{node.name or node.output[0]}'"
        limit = op_support.violated_limit(node, runtime)
        if not op_support.is_listed(node) or node.op_type not in converters:
            offending.append(f"{op_support.qualified_name(node)} ({where})")
        elif limit is not None:
            offending.append(f"{node.op_type} ({where}: {limit.describe()})")
    if offending:
        raise UnsupportedModelError(
            f"unsupported ONNX op{'s' if len(offending) > 1 else ''}: {', '.join(offending)} — "
            f"see the supported-op list in {op_support.DOC}; replace the op in the exporter or decompose it"
        )


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` → ``(1, 3, 224, 224)``."""
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"bad shape '{text}': expected dimensions joined by 'x', e.g. 1x3x224x224") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"bad shape '{text}': every dimension must be a positive integer")
    return dims


def parse_input_shapes(specs: list[str] | None, inputs: list[DeclaredInput]) -> dict[str, tuple[int, ...]]:
    """``["x=1x3x224x224"]`` → ``{"x": (1, 3, 224, 224)}``. A bare shape is allowed for a one-input model."""
    result: dict[str, tuple[int, ...]] = {}
    names = [i.name for i in inputs]
    for spec in specs or []:
        name, sep, shape = spec.rpartition("=")
        if not sep:
            if len(inputs) != 1:
                raise InputShapeError(
                    f"--input-shape '{spec}' has no input name and the model has {len(inputs)} inputs "
                    f"({', '.join(names)}); write NAME=1x3x224x224"
                )
            name = names[0]
        if name not in names:
            raise InputShapeError(f"--input-shape names '{name}', but the model's inputs are: {', '.join(names)}")
        try:
            result[name] = parse_shape(shape)
        except ValueError as exc:
            raise InputShapeError(f"--input-shape {spec}: {exc}") from None
    return result


def _batch_only(inp: DeclaredInput) -> bool:
    """Is the first dim the only dynamic one (a batch dim every mobile user means as 1)?"""
    first, *rest = inp.dims or (0,)
    return bool(rest) and not isinstance(first, int) and all(isinstance(d, int) and d > 0 for d in rest)


def defaulted_batch(model: onnx.ModelProto, overrides: dict[str, tuple[int, ...]]) -> list[str]:
    """One notice line per input whose dynamic batch dimension :func:`resolve_inputs` sets to 1."""
    return [
        f"input '{inp.name}' has a dynamic batch dimension {inp.describe()}: compiling for batch 1 "
        f"(--input-shape {inp.name}={'x'.join(['4', *map(str, inp.dims[1:])])} for batch 4)"
        for inp in declared_inputs(model) if inp.name not in overrides and _batch_only(inp)
    ]


def resolve_inputs(model: onnx.ModelProto, overrides: dict[str, tuple[int, ...]]) -> list[TensorInfo]:
    """Concrete shapes for every input: the override, the file's static shape, batch 1 where only the first
    dim is dynamic (:func:`defaulted_batch` says so); error on any other gap or on a zero-size dim."""
    resolved = []
    for inp in declared_inputs(model):
        shape = overrides.get(inp.name)
        if shape is not None:
            if len(shape) != len(inp.dims):
                raise InputShapeError(
                    f"--input-shape gives '{inp.name}' {len(shape)} dimensions but the model declares "
                    f"{len(inp.dims)}: {inp.describe()}"
                )
            for given, declared in zip(shape, inp.dims):
                if isinstance(declared, int) and declared != given:
                    raise InputShapeError(
                        f"--input-shape {inp.name}={'x'.join(map(str, shape))} conflicts with the model's fixed "
                        f"shape {inp.describe()}"
                    )
        elif 0 in inp.dims:
            raise UnsupportedModelError(
                f"input '{inp.name}' has a zero-size dimension {inp.describe()}: it holds no data, and agoc compiles "
                "inputs of at least one element; re-export the model with that dimension at 1 or more")
        elif inp.is_static:
            shape = tuple(int(d) for d in inp.dims)  # type: ignore[arg-type]
        elif _batch_only(inp):
            shape = (1, *(int(d) for d in inp.dims[1:]))  # type: ignore[arg-type]
        else:
            example = "x".join(str(d) if isinstance(d, int) else "1" for d in inp.dims)
            raise UnsupportedModelError(
                f"input '{inp.name}' has a dynamic shape {inp.describe()}; "
                f"fix it with --input-shape {inp.name}={example}"
            )
        resolved.append(TensorInfo(inp.name, tuple(shape), inp.dtype))
    return resolved


def _constant_bound(expr) -> float | None:
    """A Clip bound that is a scalar constant (not NaN), as a float; else None."""
    import tvm

    if expr is None or not isinstance(expr, tvm.ir.Constant):
        return None
    value = np.asarray(expr.value.numpy() if hasattr(expr.value, "numpy") else expr.value)
    if value.size != 1 or not np.issubdtype(value.dtype, np.floating) or np.isnan(value).any():
        return None
    return float(value.reshape(()))


@contextlib.contextmanager
def _clip_as_relax_ops():
    """While importing: a Clip with constant bounds (ReLU6) becomes ``relax.op.maximum`` / ``minimum``.

    TVM's converter emits it as opaque ``call_tir`` PrimFuncs (``emit_te``), which ``ConvertLayout``
    cannot see through: in NHWC every ReLU6 would sit between two transposes back to NCHW. The Relax
    ops compute the same (they legalize to the same ``topi.maximum`` / ``minimum``)."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend

    original = onnx_frontend.Clip.__dict__["_impl_v13"]

    def impl(cls, bb, inputs, attr, params):
        bounds = inputs[1:3] if len(inputs) >= 3 else []
        if len(bounds) == 2 and all(_constant_bound(b) is not None for b in bounds):
            low = bb.emit(relax.op.maximum(inputs[0], bounds[0]))
            return bb.emit(relax.op.minimum(low, bounds[1]))
        return original.__func__(cls, bb, inputs, attr, params)

    with _IMPORT_LOCK:
        onnx_frontend.Clip._impl_v13 = classmethod(impl)
        try:
            yield
        finally:
            onnx_frontend.Clip._impl_v13 = original


_IMPORT_LOCK = threading.Lock()


def to_relax(model: onnx.ModelProto, inputs: list[TensorInfo]):
    """Import into a Relax IRModule with weights as constants (no params in the inputs)."""
    from tvm.relax.frontend.onnx import from_onnx

    from toolchain import onnx_rewrite

    model = onnx_rewrite.rewrite(model, {i.name: i.shape for i in inputs})  # what the importer gets wrong
    try:
        with _clip_as_relax_ops():
            return from_onnx(
                model,
                shape_dict={i.name: list(i.shape) for i in inputs},
                dtype_dict={i.name: i.dtype for i in inputs},
                keep_params_in_input=False,
            )
    except Exception as exc:
        raise UnsupportedModelError(
            f"TVM's ONNX importer rejected the model: {first_line(exc)} (rerun with --debug for details)"
        ) from exc
