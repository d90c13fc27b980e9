"""Layout ops on constants folded with numpy before legalizing (toolchain/constfold.py): the same kernels, found
without building a PrimFunc per weight; databases that named them otherwise still resume."""

import numpy as np

import models
from toolchain import build, constfold, onnx_import
from toolchain.opgraph import op_graph
from toolchain.targets import resolve_target
from toolchain.tune.db import TuneDB
from toolchain.tune.plan import plan_tasks, task_hash
from toolchain.tune.settings import TuneSettings


def test_transposes_and_reshapes_of_constants_become_their_values():
    from tvm import relax

    w = np.arange(24, dtype="float32").reshape(2, 3, 4)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(relax.const(w), [1, 0, 2]))
            r = bb.emit(relax.op.reshape(relax.op.permute_dims(relax.const(w), [2, 1, 0]), (4, 6)))
            out = bb.emit_output(relax.op.add(x, t))
        bb.emit_func_output(relax.Tuple([out, r]))
    folded = constfold.fold_layout_constants(bb.get())
    consts = [c.value.numpy() for c in _constants(folded["main"]) if hasattr(c.value, "numpy")]
    assert any(np.array_equal(c, w.transpose(1, 0, 2)) for c in consts)
    assert any(np.array_equal(c, w.transpose(2, 1, 0).reshape(4, 6)) for c in consts)
    assert "permute_dims" not in folded["main"].script() and "reshape" not in folded["main"].script()


def _constants(func):
    import tvm
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(e, tvm.ir.Constant) else None)
    return found


def test_a_legalized_cnn_has_the_same_kernels_either_way(monkeypatch):
    spec = resolve_target("host")  # NHWC: every weight transposed
    model = models.build("tiny-cnn")
    imported = onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {}))
    fast = build.legalize(imported, spec)
    monkeypatch.setattr(constfold, "fold_layout_constants", lambda mod: mod)
    slow = build.legalize(imported, spec)

    def kernels(mod):
        return {task_hash(name) for name in plan_tasks(mod, op_graph(mod), spec, TuneSettings(trials=64))[1].funcs}

    assert kernels(fast) == kernels(slow) and kernels(fast)


def test_a_database_that_named_a_kernel_otherwise_resumes_under_the_name_it_has_now(tmp_path):
    db = TuneDB(tmp_path)
    db.save_verified({"fused_conv_transpose3-0123456789ab": {"status": "verified"}, "gone-ffffffffffff": {}})
    db.save_progress({"fused_join_transpose3-aaaaaaaaaaaa": {"handed_back": {"fused_conv_transpose3-0123456789ab": 8}}})
    db.follow_renames(["fused_conv_transpose1-0123456789ab", "fused_join_transpose1-aaaaaaaaaaaa"])
    assert set(db.verified) == {"fused_conv_transpose1-0123456789ab", "gone-ffffffffffff"}
    assert db.progress == {"fused_join_transpose1-aaaaaaaaaaaa": {"handed_back": {
        "fused_conv_transpose1-0123456789ab": 8}}}
