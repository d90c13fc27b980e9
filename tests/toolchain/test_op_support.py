"""The supported-op list: what check_supported refuses up front, and docs/ops.md made from the table."""

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import models
import models.registry
from models.registry import IR_VERSION, OPSET
from toolchain import op_support
from toolchain.errors import UnsupportedModelError
from toolchain.onnx_import import check_supported

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def chain(*nodes: tuple[str, str, str]) -> onnx.ModelProto:
    """x → node → node … → y; each node given as (op, name, domain)."""
    names = ["x"] + [f"t{i}" for i in range(len(nodes) - 1)] + ["y"]
    graph = helper.make_graph(
        [helper.make_node(op, [names[i]], [names[i + 1]], name=name, domain=domain)
         for i, (op, name, domain) in enumerate(nodes)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for _, _, d in nodes if d]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def test_every_offending_node_is_named_at_once():
    model = chain(("Relu", "ok", ""), ("Det", "d1", ""), ("Relu", "custom", "com.example"), ("Det", "d2", ""))
    with pytest.raises(UnsupportedModelError) as info:
        check_supported(model)
    message = str(info.value)
    assert message.startswith(
        "unsupported ONNX ops: Det (node 'd1'), com.example.Relu (node 'custom'), Det (node 'd2') — "
        "see the supported-op list in docs/ops.md")
    assert "'ok'" not in message


def test_a_standard_name_in_another_domain_is_refused():
    with pytest.raises(UnsupportedModelError, match=r"op: com\.example\.Relu \(node 'r'\)"):
        check_supported(chain(("Relu", "r", "com.example")))


def test_the_ai_onnx_domain_is_the_default_one():
    check_supported(chain(("Relu", "r", "ai.onnx")))


def test_an_op_tvm_converts_but_off_the_list_is_refused():
    assert "Hardmax" not in op_support.OPS
    with pytest.raises(UnsupportedModelError, match=r"op: Hardmax \(node 'h'\)"):
        check_supported(chain(("Hardmax", "h", "")))


def test_the_zoo_models_use_only_listed_ops():
    for name in models.registry.names():
        check_supported(models.build(name))


ATTR_LIMITS = [lim for lim in op_support.LIMITS if isinstance(lim, op_support.AttrLimit)]


def model_of(nodes, inputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


@pytest.mark.parametrize("limit", ATTR_LIMITS, ids=lambda lim: f"{lim.op}.{lim.attribute}")
def test_an_attribute_over_a_limit_is_refused_with_the_limit(limit):
    value = "__refused__" if limit.allowed is None else "__not_allowed__"
    node = helper.make_node(limit.op, ["x"], ["y"], name="n", **{limit.attribute: value})
    assert op_support.violated_limit(node, set()) == limit
    with pytest.raises(UnsupportedModelError, match=rf"{limit.op} \(node 'n': `{limit.attribute}`"):
        check_supported(model_of([node], [("x", [1, 1, 4, 4])]))


def test_an_allowed_attribute_value_passes():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], coordinate_transformation_mode="asymmetric")
    assert op_support.violated_limit(node, set()) is None


def test_an_unused_optional_output_is_not_over_the_output_limit():
    pool = {"kernel_shape": [2, 2]}
    check_supported(model_of([helper.make_node("MaxPool", ["x"], ["y", ""], **pool)], [("x", [1, 1, 4, 4])]))
    with pytest.raises(UnsupportedModelError, match=r"MaxPool \(node 'p': only the first output"):
        check_supported(model_of([helper.make_node("MaxPool", ["x"], ["y", "idx"], name="p", **pool)],
                                 [("x", [1, 1, 4, 4])]))


SHAPE = helper.make_tensor("shape", TensorProto.INT64, [2], [4, 4])


@pytest.mark.parametrize("nodes,inputs,inits,refused", [
    ([("Reshape", ["x", "shape"])], [("x", [16])], [SHAPE], False),
    ([("Shape", ["z"], "s"), ("Reshape", ["x", "s"])], [("x", [16]), ("z", [4, 4])], [], False),
    ([("Reshape", ["x", "shape"])], [("x", [16]), ("shape", [2])], [], True),
    ([("Abs", ["shape"], "s"), ("Reshape", ["x", "s"])], [("x", [16]), ("shape", [2])], [], True),
], ids=["initializer", "from-a-shape", "graph-input", "from-a-graph-input"])
def test_a_shape_input_must_be_known_at_compile_time(nodes, inputs, inits, refused):
    made = [helper.make_node(op, ins, [out[0] if out else "y"], name=(out[0] if out else "r"))
            for op, ins, *out in nodes]
    model = model_of(made, inputs, inits)
    if not refused:
        check_supported(model)
        return
    with pytest.raises(UnsupportedModelError, match=r"Reshape \(node 'r': input 1 must be constant"):
        check_supported(model)


def test_every_listed_op_has_a_tvm_converter_and_a_family():
    from tvm.relax.frontend.onnx import onnx_frontend

    converters = onnx_frontend._get_convert_map()
    assert sorted(op for op in op_support.OPS if op not in converters) == []
    assert set(op_support.OPS.values()) <= set(op_support.FAMILIES)
    assert {lim.op for lim in op_support.LIMITS} <= set(op_support.OPS)


def test_docs_ops_md_is_generated_from_the_table():
    assert DOCS.read_text() == op_support.markdown(), (
        "docs/ops.md is stale; regenerate it: "
        ".venv/bin/python -c 'from toolchain.op_support import markdown; print(markdown(), end=\"\")' > docs/ops.md")
