"""Loading, checking and shape resolution of ONNX models: the error cases read like the messages."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import models
from models.registry import IR_VERSION, OPSET
from toolchain.errors import InputShapeError, ModelLoadError, UnsupportedModelError
from toolchain.onnx_import import (
    check_supported,
    declared_inputs,
    load_model,
    op_counts,
    parse_input_shapes,
    resolve_inputs,
    to_relax,
)


def one_op_model(op_type: str, dims=(2, 2), **attrs) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x"], ["y"], name=f"my_{op_type.lower()}", **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file: .*nope.onnx"):
        load_model(tmp_path / "nope.onnx")


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="is a directory"):
        load_model(tmp_path)


def test_text_file_is_not_onnx(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a protobuf\n" * 10)
    with pytest.raises(ModelLoadError, match="not .*ONNX"):
        load_model(path)


def test_truncated_file(tmp_path, model_file):
    data = model_file("tiny-cnn").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="truncated or not ONNX"):
        load_model(path)


def test_valid_file_loads(model_file):
    model = load_model(model_file("tiny-cnn"))
    assert op_counts(model) == {"Add": 1, "Conv": 1, "Flatten": 1, "Gemm": 1, "Relu": 1}


def test_unsupported_op_is_named_with_its_node():
    model = one_op_model("Det")
    with pytest.raises(UnsupportedModelError, match=r"unsupported ONNX op: Det \(node 'my_det'\)"):
        check_supported(model)


def test_supported_ops_pass_the_check():
    check_supported(models.build("tiny-transformer"))


def dynamic_model():
    return one_op_model("Relu", dims=("N", 3, 8, 8))


def test_dynamic_dimension_needs_input_shape():
    with pytest.raises(UnsupportedModelError, match=r"input 'x' has a dynamic shape \[N, C, 8, 8\]; fix it with "
                       r"--input-shape x=1x1x8x8"):
        resolve_inputs(one_op_model("Relu", dims=("N", "C", 8, 8)), {})


def test_a_dynamic_batch_alone_is_batch_1():
    assert [i.shape for i in resolve_inputs(dynamic_model(), {})] == [(1, 3, 8, 8)]


def test_input_shape_fixes_the_dynamic_dimension():
    model = dynamic_model()
    shapes = parse_input_shapes(["x=2x3x8x8"], declared_inputs(model))
    assert [(i.name, i.shape, i.dtype) for i in resolve_inputs(model, shapes)] == [("x", (2, 3, 8, 8), "float32")]


def test_bare_shape_is_accepted_for_a_one_input_model():
    assert parse_input_shapes(["1x3x8x8"], declared_inputs(dynamic_model())) == {"x": (1, 3, 8, 8)}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("y=1x3x8x8", "names 'y', but the model's inputs are: x"),
        ("x=1x3xAx8", "bad shape '1x3xAx8'"),
        ("x=1x0x8x8", "every dimension must be a positive integer"),
    ],
)
def test_bad_input_shapes(spec, message):
    with pytest.raises(InputShapeError, match=message):
        parse_input_shapes([spec], declared_inputs(dynamic_model()))


def test_input_shape_of_wrong_rank_or_conflicting_fixed_dim():
    model = dynamic_model()
    with pytest.raises(InputShapeError, match="gives 'x' 3 dimensions but the model declares 4"):
        resolve_inputs(model, {"x": (1, 3, 8)})
    with pytest.raises(InputShapeError, match="conflicts with the model's fixed shape"):
        resolve_inputs(model, {"x": (1, 4, 8, 8)})


def test_import_gives_a_relax_module_with_main():
    model = models.build("tiny-cnn")
    mod = to_relax(model, resolve_inputs(model, {}))
    assert "main" in [gv.name_hint for gv in mod.get_global_vars()]


def test_initializers_are_not_inputs():
    model = models.build("tiny-cnn")
    assert [i.name for i in declared_inputs(model)] == ["input"]
    assert np.prod(declared_inputs(model)[0].dims) == 3 * 16 * 16
