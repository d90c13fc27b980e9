"""The conformance suite: a few of ONNX's node tests through the default pipeline, and its own rules."""

import numpy as np
import onnx
import pytest

from host.bench import conformance
from host.bench.conformance import Outcome, freeze, frozen_names, run_case, skip_reason
from toolchain import op_support


def case(op: str, name: str):
    return next(c for c in conformance.generate(op) if c.name == name)


# (op, node test): as shipped and frozen, across the families; the status each form must end with
FAST_SUBSET = [
    ("Conv", "test_conv_with_strides_padding", "passed", "passed"),
    ("AveragePool", "test_averagepool_2d_pads", "passed", None),
    ("BatchNormalization", "test_batchnorm_example", "passed", "passed"),
    ("PRelu", "test_prelu_broadcast_expanded", "passed", "passed"),
    ("Softmax", "test_softmax_axis_1", "passed", None),
    ("Add", "test_add_bcast", "passed", "passed"),
    ("Gemm", "test_gemm_all_attributes", "passed", "passed"),
    ("ReduceMean", "test_reduce_mean_keepdims_example", "refused", "passed"),
    ("Reshape", "test_reshape_reordered_all_dims", "refused", "passed"),
]


@pytest.mark.parametrize("op,name,shipped,frozen", FAST_SUBSET, ids=[n for _, n, _, _ in FAST_SUBSET])
def test_node_tests_pass_through_the_default_pipeline(op, name, shipped, frozen, tmp_path):
    found = case(op, name)
    assert skip_reason(found) is None
    forms = {"shipped": found, "frozen": freeze(found)}
    for form, want in (("shipped", shipped), ("frozen", frozen)):
        if want is None:
            assert forms[form] is None, "this case has inputs to freeze; test its frozen form"
            continue
        outcome = run_case(forms[form], tmp_path)
        assert (outcome.form, outcome.status) == (form, want), outcome.message


def test_freezing_writes_weights_and_bias_as_initializers():
    conv = case("Conv", "test_conv_with_strides_padding")
    frozen = freeze(conv)
    assert [vi.name for vi in frozen.model.graph.input] == ["x"]
    assert [t.name for t in frozen.model.graph.initializer] == ["W"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(frozen.model.graph.initializer[0]), conv.inputs["W"])
    assert list(frozen.inputs) == ["x"] and frozen.outputs is conv.outputs
    onnx.checker.check_model(frozen.model)
    assert [vi.name for vi in conv.model.graph.input] == ["x", "W"], "the shipped case is left as it was"


def test_an_expanded_case_freezes_what_its_op_would():
    assert frozen_names(case("PRelu", "test_prelu_broadcast_expanded")) == ["slope"]
    assert frozen_names(case("Slice", "test_slice")) == ["starts", "ends", "axes", "steps"]


def test_a_case_with_nothing_constant_like_has_no_frozen_form():
    assert freeze(case("Relu", "test_relu")) is None


@pytest.mark.parametrize("op,name,reason", [
    ("Add", "test_add_uint8", "'x' is uint8"),
    ("Pow", "test_pow_types_int64_int64", "int64 Pow: not a float model's"),
    ("ReduceSum", "test_reduce_sum_empty_set", "'data' has a zero-size dimension"),
    ("DepthToSpace", "test_depthtospace_example", "cannot load it (opset"),
])
def test_cases_outside_float_models_are_skipped_with_the_reason(op, name, reason):
    assert reason in skip_reason(case(op, name))


def test_an_empty_list_of_axes_is_not_skipped():
    assert skip_reason(case("ReduceSum", "test_reduce_sum_empty_axes_input_noop")) is None


def test_selection_by_family_and_quick():
    cases = conformance.select(["pool"], quick=True)
    ops = [c.op for c in cases]
    assert {op_support.OPS[op] for op in ops} == {"pool"}
    assert set(ops) == {op for op, fam in op_support.OPS.items() if fam == "pool"}
    assert max(ops.count(op) for op in ops) == conformance.QUICK_PER_OP
    with pytest.raises(SystemExit, match="unknown family bogus"):
        conformance.select(["pool", "bogus"])


def test_outputs_compare_element_by_element_as_onnx_does():
    ref = np.array([0.0, 100.0], np.float32)
    assert conformance._mismatch("y", np.array([0.0, 100.05], np.float32), ref, 1e-3, 1e-7) is None
    assert "1 of 2 values off" in conformance._mismatch("y", np.array([1e-6, 100.0], np.float32), ref, 1e-3, 1e-7)
    assert "dtype float64" in conformance._mismatch("y", ref.astype(np.float64), ref, 1e-3, 1e-7)
    assert "shape (1, 2)" in conformance._mismatch("y", ref[None], ref, 1e-3, 1e-7)


def test_summary_counts_each_form_and_reuses_the_shipped_result_without_a_frozen_form():
    outcomes = [
        Outcome("a", "Reshape", "shipped", "refused"), Outcome("a", "Reshape", "frozen", "passed"),
        Outcome("b", "Transpose", "shipped", "passed"),
        Outcome("c", "Relu", "shipped", "crash", "boom"),
    ]
    table = conformance.summarize(outcomes, [{"case": "d", "op": "Relu", "reason": "'x' is uint8"}])
    assert table["shape"] == {"cases": 2, "skipped": 0, "refused_shipped": 1, "run_shipped": 1,
                              "passed_shipped": 1, "refused_frozen": 0, "run_frozen": 2, "passed_frozen": 2}
    assert table["activation"] == {"cases": 2, "skipped": 1, "refused_shipped": 0, "run_shipped": 1,
                                   "passed_shipped": 0, "refused_frozen": 0, "run_frozen": 1, "passed_frozen": 0}
    assert set(table) == {"shape", "activation"}
    assert [o.case for o in conformance.failures(outcomes)] == ["c"]


def test_a_hung_case_times_out_and_the_next_one_gets_a_fresh_worker(tmp_path):
    worker = conformance.Worker(tmp_path / "worker.log", timeout_s=0.01)
    relu = case("Relu", "test_relu")
    try:
        assert worker.run(relu, tmp_path / "a").status == "timeout"
        worker._timeout = 120
        assert worker.run(relu, tmp_path / "b").status == "passed"
    finally:
        worker.close()
