"""Transcendental ops as fast polynomials (toolchain/fastmath.py): which ops, how close, and the
databases that record it."""

import pytest

import models
from host.devices import LocalDevice
from models.builder import GraphBuilder
from toolchain import build, fastmath, onnx_import
from toolchain.errors import UnsupportedModelError
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.tune.db import TuneDB
from toolchain.tune.settings import SCHEMA, TuneSettings, TuningError
from toolchain.verify import verify_artifact


def every_op_model():
    """x → matmul → GELU (erf form), SiLU (sigmoid), Tanh, Exp, Softmax: every op the rules cover;
    values wide enough (×4 before the exp) to reach well into the polynomials' ranges."""
    g = GraphBuilder("fast", seed=0)
    x = g.input("x", (1, 8, 64))
    h = g.op("MatMul", [x, g.weight("w", (64, 64), std=0.5)], "h")
    gelu = g.act(h, "gelu", "g")
    silu = g.act(gelu, "silu", "s")
    t = g.op("Tanh", [silu], "t")
    e = g.op("Exp", [g.op("Mul", [t, g.const("four", 4.0)], "t4")], "e")
    y = g.op("Softmax", [g.op("Add", [e, h], "eh")], "y", axis=-1)
    return g.finish(y, (1, 8, 64))


def _legalized(model, **kw):
    spec = resolve_target("host", **kw)
    return build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)


def _kernel_names(mod) -> str:
    return " ".join(gv.name_hint for gv in mod.functions)


def test_every_rule_replaces_its_op_and_exact_math_keeps_them():
    model = every_op_model()
    fast, exact = _legalized(model), _legalized(model, fast_math=False)
    assert fastmath.applied(fast) and not fastmath.applied(exact)
    for name in ("fast_erf", "fast_tanh", "fast_exp", "fast_softmax", "fast_sigmoid"):
        assert name in _kernel_names(fast), name
        assert name not in _kernel_names(exact)


def test_a_model_without_such_ops_is_the_same_either_way():
    plain = models.build("tiny-cnn")
    fast, exact = _legalized(plain), _legalized(plain, fast_math=False)
    assert not fastmath.applied(fast)
    assert _kernel_names(fast) == _kernel_names(exact)


@pytest.mark.parametrize("partition", ["ago", "stock"])
def test_a_model_computed_with_fast_math_matches_onnxruntime(partition, tmp_path):
    spec = resolve_target("host")
    # plain: the fast-math polynomials as TVM lowers them (MetaSchedule's space of the ago kernel does not come back:
    # an untuned schedule would cost its 20 s timeout, tests/toolchain/test_untuned.py covers those)
    request = CompileRequest(every_op_model(), "fast", spec, partition=PartitionSettings(partition), untuned="plain")
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    assert artifact.manifest.target["fast_math"] is True
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()


def test_a_database_keeps_the_math_it_was_tuned_with(tmp_path):
    """Fast and exact kernels are different kernels: a database made before the setting (exact) resumes
    only with exact math, and compiles only with it, where the model has such an op."""
    old = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"}, "layout": "NHWC",
           "settings": TuneSettings(trials=8).to_json()}
    db = TuneDB(tmp_path)
    db.open_session(old)
    assert db.fast_math is False
    with pytest.raises(TuningError, match="different fast math.*--exact-math"):
        db.open_session({**old, "fast_math": True})
    db.open_session({**old, "fast_math": False})
    spec = resolve_target("host")
    with pytest.raises(UnsupportedModelError, match="exact transcendental functions; compile with --exact-math"):
        compile_model(CompileRequest(every_op_model(), "fast", spec, db=tmp_path), find_compiler(spec), tmp_path / "a")



@pytest.mark.e2e
def test_the_space_of_a_kernel_that_never_generates_is_bounded_and_its_minis_spaces_generate():
    """MetaSchedule's space of this model's AGO join (matmul, fast-math GELU, SiLU, tanh, exp, softmax) does not
    come back: a tuning session gives up on it after the bound (tune.adapter.check_space; the join is then built
    from its minis). Its minis' spaces come back, the polynomials that inlined would grow to millions of nodes kept
    as buffers (tune.inlining)."""
    from toolchain.opgraph import op_graph
    from toolchain.tune import adapter
    from toolchain.tune.plan import plan_tasks

    spec = resolve_target("host")
    mod = _legalized(every_op_model())
    _, plan = plan_tasks(mod, op_graph(mod), spec, TuneSettings(trials=64))
    for task in plan.tasks:
        func = plan.funcs[task.name]
        if task.phase == "joined":
            with pytest.raises(adapter.SpaceTimeout):
                adapter.check_space(func, spec, True, timeout=20)
        else:  # ~17 s alone for the matmul-GELU mini on 2 idle cores: a generous bound under a loaded CI
            adapter.check_space(func, spec, True, timeout=180)
