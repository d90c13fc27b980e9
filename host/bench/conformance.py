"""ONNX's backend node tests, generated from the onnx wheel's own generators, run through the default pipeline.

``python -m host.bench.conformance [--families a,b] [--quick] [--json PATH]``: a per-family table and a JSON record."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from toolchain import op_support

#: onnx test-case modules not named ``op.lower()`` (onnx/backend/test/case/node/<module>.py)
CASE_MODULES = {
    "BatchNormalization": "batch_normalization",
    "InstanceNormalization": "instance_normalization",
    "Range": "rangeop",
}

#: op → positions of the inputs exporters write as initializers (weights, shapes, axes, pads, scales …)
FROZEN_INPUTS = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (1, 2),
    "MatMul": (1,),
    "BatchNormalization": (1, 2, 3, 4),
    "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "PRelu": (1,),
    "Clip": (1, 2),
    "Add": (1,),
    "Sub": (1,),
    "Mul": (1,),
    "Div": (1,),
    "Pow": (1,),
    "Reshape": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Split": (1,),
    "Slice": (1, 2, 3, 4),
    "Gather": (1,),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Tile": (1,),
    "Expand": (1,),
    "ReduceMean": (1,),
    "ReduceSum": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
}

#: element types a case may use; the others (float16, double, small ints, float8 …) are skipped
TENSOR_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}

#: op → input positions that must be float32 for a case to run (integer Pow, boolean ReduceMax: not float models)
FLOAT_INPUTS = {"Pow": (0, 1), "ReduceMax": (0,), "ReduceMin": (0,)}

#: --quick: this many cases per op (the first ones onnx generates, not expanded)
QUICK_PER_OP = 2

CASE_TIMEOUT_S = 300

#: outcome statuses, in table order; "passed" and "refused" are what a supported case may end as
STATUSES = ("passed", "mismatch", "refused", "rejected", "error", "crash", "timeout")


@dataclass(frozen=True)
class Case:
    """One node test: a model, its inputs by name and its expected outputs by name."""

    name: str
    op: str  # the op the onnx module tests (an expanded case holds other ops)
    model: onnx.ModelProto = field(repr=False)
    inputs: dict = field(repr=False)
    outputs: dict = field(repr=False)
    rtol: float = 1e-3
    atol: float = 1e-7
    form: str = "shipped"  # or "frozen"


@dataclass(frozen=True)
class Outcome:
    case: str
    op: str
    form: str
    status: str  # one of STATUSES
    message: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# ---- generation and selection -------------------------------------------------------------------------------

_GENERATED: dict[str, list] = {}


def _module_cases(module: str) -> list:
    """onnx's TestCase records that importing one generator module appends (each module runs once a process)."""
    if module not in _GENERATED:
        from onnx.backend.test.case import node

        before = len(node._NodeTestCases)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
        _GENERATED[module] = node._NodeTestCases[before:]
    return _GENERATED[module]


def _to_case(test, op: str) -> Case:
    (inputs, outputs), = test.data_sets
    graph = test.model.graph
    return Case(
        test.name,
        op,
        test.model,
        {vi.name: np.asarray(x) for vi, x in zip(graph.input, inputs)},
        {vi.name: np.asarray(y) for vi, y in zip(graph.output, outputs)},
        test.rtol,
        test.atol,
    )


def generate(op: str) -> list[Case]:
    """Every node test onnx ships for ``op``, expanded function bodies included."""
    module = CASE_MODULES.get(op, op.lower())
    try:
        tests = _module_cases(module)
    except ModuleNotFoundError:
        return []
    return [_to_case(t, op) for t in tests]


def select(families: list[str] | None = None, quick: bool = False) -> list[Case]:
    """The cases of the supported ops in ``families`` (all when None); ``quick``: a few per op."""
    unknown = sorted(set(families or ()) - set(op_support.FAMILIES))
    if unknown:
        raise SystemExit(f"unknown famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                         f"choose from: {', '.join(op_support.FAMILIES)}")
    cases = []
    for op, family in op_support.OPS.items():
        if families and family not in families:
            continue
        found = generate(op)
        cases += [c for c in found if "_expanded" not in c.name][:QUICK_PER_OP] if quick else found
    return cases


def _value_type_problem(vi: onnx.ValueInfoProto) -> str | None:
    if not vi.type.HasField("tensor_type"):
        return f"'{vi.name}' is a {vi.type.WhichOneof('value')}, not a tensor"
    tensor = vi.type.tensor_type
    if tensor.elem_type not in TENSOR_TYPES:
        return f"'{vi.name}' is {helper.tensor_dtype_to_string(tensor.elem_type).removeprefix('TensorProto.').lower()}"
    if tensor.elem_type != onnx.TensorProto.INT64 and any(d.HasField("dim_value") and d.dim_value == 0
                                                          for d in tensor.shape.dim):
        return f"'{vi.name}' has a zero-size dimension"  # (an empty int64 list of axes is a valid case)
    return None


def _float_input_problem(case: Case) -> str | None:
    node = _base_node(case)
    if node is None:
        return None
    for i in FLOAT_INPUTS.get(case.op, ()):
        value = case.inputs.get(node.input[i]) if i < len(node.input) else None
        if value is not None and value.dtype != np.float32:
            return f"{value.dtype} {case.op}: not a float model's"
    return None


def _reference_problem(case: Case) -> str | None:
    """agoc compiles against onnxruntime's outputs: a model onnxruntime cannot load cannot be compiled."""
    import onnxruntime

    try:
        onnxruntime.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any load failure
        opset = max(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
        return f"onnxruntime {onnxruntime.__version__} cannot load it (opset {opset}): {type(exc).__name__}"
    return None


def skip_reason(case: Case) -> str | None:
    """Why a case is not run (a type float models do not use, or no reference), or None."""
    graph = case.model.graph
    for vi in list(graph.input) + list(graph.output):
        problem = _value_type_problem(vi)
        if problem:
            return problem
    return _float_input_problem(case) or _reference_problem(case)


# ---- the frozen form ------------------------------------------------------------------------------------------


def _base_node(case: Case) -> onnx.NodeProto | None:
    """The node under test: the one node of a plain case; for an expanded case, the plain case's node."""
    if "_expanded" not in case.name:
        nodes = case.model.graph.node
        return nodes[0] if len(nodes) == 1 else None
    base = case.name.split("_expanded")[0]
    return next((c.model.graph.node[0] for c in generate(case.op) if c.name == base), None)


def frozen_names(case: Case) -> list[str]:
    """The graph inputs an exporter would have written as initializers."""
    node = _base_node(case)
    if node is None:
        return []
    positions = FROZEN_INPUTS.get(case.op, ())
    return [node.input[i] for i in positions if i < len(node.input) and node.input[i] in case.inputs]


def freeze(case: Case) -> Case | None:
    """``case`` with its constant-like inputs turned into initializers; None when there is nothing to freeze."""
    names = frozen_names(case)
    if not names:
        return None
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    kept = [vi for vi in model.graph.input if vi.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(case.inputs[n], n) for n in names)
    inputs = {k: v for k, v in case.inputs.items() if k not in names}
    return dataclasses.replace(case, model=model, inputs=inputs, form="frozen")


# ---- running one case (in a worker process) -------------------------------------------------------------------


def _mismatch(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> str | None:
    """onnx's backend-runner rule (shape, dtype, then assert_allclose); None when they agree."""
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return f"output '{name}': shape {actual.shape}, expected {expected.shape}"
    if actual.dtype != expected.dtype:
        return f"output '{name}': dtype {actual.dtype}, expected {expected.dtype}"
    if expected.dtype.kind in "iub":
        bad = int(np.count_nonzero(actual != expected))
        return f"output '{name}': {bad} of {expected.size} values differ" if bad else None
    close = np.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    worst = float(np.nanmax(err)) if np.isfinite(err).any() else float("nan")
    return (f"output '{name}': {int((~close).sum())} of {expected.size} values off "
            f"(max abs error {worst:.3g}, rtol {rtol:g}, atol {atol:g})")


def _compare(case: Case, actual: dict[str, np.ndarray]) -> str | None:
    for name, expected in case.outputs.items():
        problem = _mismatch(name, actual[name], expected, case.rtol, case.atol) if name in actual else \
            f"the library returned no output '{name}'"
        if problem:
            return problem
    return None


def _ended(case: Case, started: float, status: str, message: str = "") -> Outcome:
    return Outcome(case.name, case.op, case.form, status, message, round(time.perf_counter() - started, 2))


def run_case(case: Case, work: Path) -> Outcome:
    """Check, compile (host target, default settings), run on the case's inputs, compare."""
    from host.devices import LocalDevice
    from toolchain.errors import AgocError, UnsupportedModelError, first_line
    from toolchain.onnx_import import check_supported
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target

    started = time.perf_counter()
    try:
        check_supported(case.model)
    except UnsupportedModelError as exc:
        return _ended(case, started, "refused", first_line(exc))
    stage = ["compiling"]
    try:
        spec = resolve_target("host")
        request = CompileRequest(case.model, case.name, spec, samples=case.inputs)  # the check runs them
        artifact = compile_model(request, find_compiler(spec), work / case.form, on_stage=stage.append)
        stage.append("running the library")
        actual = LocalDevice().run(artifact, case.inputs)
    except AgocError as exc:
        status = "rejected" if isinstance(exc, UnsupportedModelError) else "error"
        return _ended(case, started, status, f"{stage[-1]}: {type(exc).__name__}: {first_line(exc)}")
    except Exception as exc:  # noqa: BLE001 - an internal crash: agoc's bug, recorded
        return _ended(case, started, "crash", f"{stage[-1]}: {type(exc).__name__}: {first_line(exc)}")
    problem = _compare(case, actual)
    return _ended(case, started, "mismatch" if problem else "passed", problem or "")


def _serve(conn, log_path: str) -> None:
    """Worker loop: receive (case, work dir), send back an Outcome; stdout/stderr go to ``log_path``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    while True:
        try:
            case, work = conn.recv()
        except EOFError:
            return
        try:
            outcome = run_case(case, Path(work))
        except BaseException as exc:  # noqa: BLE001 - report, keep serving
            outcome = Outcome(case.name, case.op, case.form, "crash", f"{type(exc).__name__}: {exc}")
            traceback.print_exc()
        conn.send(outcome)


class Worker:
    """One process that runs cases; a crash or a timeout costs that case only (the worker is replaced)."""

    def __init__(self, log_path: Path, timeout_s: float = CASE_TIMEOUT_S):
        self._ctx = multiprocessing.get_context("spawn")
        self._log = log_path
        self._timeout = timeout_s
        self._proc = None

    def _start(self) -> None:
        self._conn, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, str(self._log)), daemon=True)
        self._proc.start()
        child.close()

    def _last_log_line(self) -> str:
        lines = [ln for ln in self._log.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""

    def run(self, case: Case, work: Path) -> Outcome:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send((case, str(work)))
        if self._conn.poll(self._timeout):
            try:
                return self._conn.recv()
            except EOFError:
                self._proc.join(5)
                return Outcome(case.name, case.op, case.form, "crash",
                               f"worker died (exit {self._proc.exitcode}): {self._last_log_line()}")
        self.close()
        return Outcome(case.name, case.op, case.form, "timeout", f"no result in {self._timeout:.0f} s",
                       self._timeout)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._proc = None


def run_all(cases: list[Case], on_outcome=lambda outcome: None, timeout_s: float = CASE_TIMEOUT_S):
    """Every case in its shipped and (where something is constant-like) frozen form; skipped ones apart."""
    outcomes, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="agoc-conformance-") as tmp:
        worker = Worker(Path(tmp) / "worker.log", timeout_s)
        try:
            for i, case in enumerate(cases):
                reason = skip_reason(case)
                if reason:
                    skipped.append({"case": case.name, "op": case.op, "reason": reason})
                    continue
                for form in (case, freeze(case)):
                    if form is None:
                        continue
                    work = Path(tmp) / f"case{i}"
                    outcome = worker.run(form, work)
                    shutil.rmtree(work, ignore_errors=True)
                    outcomes.append(outcome)
                    on_outcome(outcome)
        finally:
            worker.close()
    return outcomes, skipped


# ---- summary -------------------------------------------------------------------------------------------------


#: summary columns per family; "refused" and "run" are per form (a form refused up front is not run)
COLUMNS = ("cases", "skipped", "refused_shipped", "run_shipped", "passed_shipped",
           "refused_frozen", "run_frozen", "passed_frozen")


def summarize(outcomes: list[Outcome], skipped: list[dict]) -> dict[str, dict]:
    """family → counts per form. A case with nothing to freeze counts its shipped outcome for the frozen form."""
    by_case: dict[str, dict[str, Outcome]] = {}
    for o in outcomes:
        by_case.setdefault(o.case, {})[o.form] = o
    table = {f: dict.fromkeys(COLUMNS, 0) for f in op_support.FAMILIES}
    for s in skipped:
        row = table[op_support.OPS[s["op"]]]
        row["cases"] += 1
        row["skipped"] += 1
    for forms in by_case.values():
        row = table[op_support.OPS[forms["shipped"].op]]
        row["cases"] += 1
        for form in ("shipped", "frozen"):
            status = forms.get(form, forms["shipped"]).status
            row[f"refused_{form}"] += status == "refused"
            row[f"run_{form}"] += status != "refused"
            row[f"passed_{form}"] += status == "passed"
    return {f: row for f, row in table.items() if row["cases"]}


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status not in ("passed", "refused")]


def _total(table: dict[str, dict]) -> dict:
    return {k: sum(row[k] for row in table.values()) for k in COLUMNS}


def _rate(passed: int, run: int) -> str:
    return f"{passed}/{run} ({100 * passed / run:.1f}%)" if run else "—"


def render(table: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Table(title="ONNX backend node tests through agoc (host, default settings)")
    for col in ("family", "cases", "skipped", "refused as shipped", "passed as shipped", "refused frozen",
                "passed frozen"):
        out.add_column(col, justify="left" if col == "family" else "right")
    for family, r in list(table.items()) + [("total", _total(table))]:
        out.add_row(family, str(r["cases"]), str(r["skipped"]), str(r["refused_shipped"]),
                    _rate(r["passed_shipped"], r["run_shipped"]), str(r["refused_frozen"]),
                    _rate(r["passed_frozen"], r["run_frozen"]))
    Console(width=120).print(out)


def record(outcomes: list[Outcome], skipped: list[dict], table: dict, args: dict, seconds: float) -> dict:
    from toolchain.pipeline import package_versions

    return {
        "schema": "agoc.conformance/1",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": {"target": "host", "pipeline": "default", **args},
        "versions": package_versions(),
        "seconds": round(seconds, 1),
        "families": table,
        "total": _total(table),
        "skipped": skipped,
        "outcomes": [o.to_json() for o in outcomes],
    }


def default_json_path() -> Path:
    return Path("bench/results") / f"conformance-{datetime.date.today().isoformat()}.json"


def _print_outcome(outcome: Outcome) -> None:
    if outcome.status != "passed":
        print(f"  {outcome.status:8} {outcome.case} [{outcome.form}]: {outcome.message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.bench.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--families", help=f"comma-separated, of: {', '.join(op_support.FAMILIES)}")
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_PER_OP} cases of each op")
    parser.add_argument("--match", help="only cases whose name contains this")
    parser.add_argument("--json", type=Path, default=None, help="where to write the record "
                        "(default bench/results/conformance-DATE.json)")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case and form")
    args = parser.parse_args(argv)
    families = [f.strip() for f in args.families.split(",")] if args.families else None
    started = time.perf_counter()
    cases = [c for c in select(families, args.quick) if not args.match or args.match in c.name]
    print(f"{len(cases)} ONNX node tests selected; each runs as shipped and frozen", flush=True)
    outcomes, skipped = run_all(cases, _print_outcome, args.timeout)
    table = summarize(outcomes, skipped)
    render(table)
    path = args.json or default_json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {"families": families, "quick": args.quick, "match": args.match}
    path.write_text(json.dumps(record(outcomes, skipped, table, settings, time.perf_counter() - started), indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
