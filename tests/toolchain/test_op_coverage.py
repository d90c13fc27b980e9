"""Ops and graph shapes that once failed or miscompiled: each compiles and matches onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from host.devices import LocalDevice
from models.registry import IR_VERSION, OPSET
from toolchain import build, fusion, onnx_import, partition
from toolchain.errors import ModelLoadError, UnsupportedModelError
from toolchain.opgraph import op_graph
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.reference import run_onnxruntime
from toolchain.runtime import VMSession
from toolchain.samples import sample_inputs
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.verify import compare, verify_artifact

#: the default settings (NHWC, AGO partition) and the two others a user can pick
SETTINGS = {"default": {}, "nchw": {"layout": "NCHW"}, "stock": {"partition": "stock"}}
F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs, inits=(), opset=OPSET):
    graph = helper.make_graph(nodes, "case", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k)
                                                               for k, v in dict(inits).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR_VERSION
    return m


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def weights(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def compiled(m, tmp_path, setting="default"):
    """Compile ``m`` in one of :data:`SETTINGS` and verify the artifact against onnxruntime."""
    options = SETTINGS[setting]
    spec = resolve_target("host", **({"layout": options["layout"]} if "layout" in options else {}))
    request = CompileRequest(m, "case", spec, partition=PartitionSettings(options.get("partition", "ago")))
    artifact = compile_model(request, find_compiler(spec), tmp_path / setting)
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()
    return artifact


def built_by_stages(m, tmp_path, layout="NHWC"):
    """The pipeline's stages without its up-front op list (for ops only the list refuses): outputs vs onnxruntime."""
    spec = resolve_target("host", layout=layout)
    inputs = onnx_import.resolve_inputs(m, {})
    mod = build.legalize(onnx_import.to_relax(m, inputs), spec)
    graph = op_graph(mod)
    plan = partition.plan(PartitionSettings("ago"), mod, spec, graph=graph)
    partition.check(graph, plan)
    lib = build.build_library(fusion.fuse_groups(mod, plan.groups, spec), spec, find_compiler(spec),
                              tmp_path / "model.so")
    feeds = sample_inputs(m, inputs)
    expected = run_onnxruntime(m, feeds)
    actual = VMSession(lib, inputs, list(expected)).run(feeds)
    return [compare(name, actual[name], ref, 1e-5, 1e-4) for name, ref in expected.items()]


# 1. scalars


def test_a_rank_0_input_runs_as_a_scalar(tmp_path):
    m = model([helper.make_node("Mul", ["x", "s"], ["y"])], [tensor("x", [2, 3]), tensor("s", [])],
              [tensor("y", [2, 3])])
    artifact = compiled(m, tmp_path)
    assert artifact.read_inputs()["s"].shape == ()


# 2. extern kernels (packed calls, opaque kernels, shapes known at run time) in the partitioner


@pytest.mark.parametrize("setting", SETTINGS)
def test_slice_with_runtime_starts_stays_an_extern_kernel(tmp_path, setting):
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Slice", ["r", "s", "e"], ["y"])],
              [tensor("x", [2, 8]), tensor("s", [1], I64)], [tensor("y", [2, None])], {"e": np.array([6], np.int64)})
    compiled(m, tmp_path, setting)


def test_topk_and_cumsum_are_kernels_of_their_own(tmp_path):
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1),
               helper.make_node("CumSum", ["r", "a"], ["c"]),
               helper.make_node("Add", ["c", "c"], ["y"])],
              [tensor("x", [2, 8])], [tensor("v", [2, 3]), tensor("i", [2, 3], I64), tensor("y", [2, 8])],
              {"k": np.array([3], np.int64), "a": np.array(1, np.int64)})
    artifact = compiled(m, tmp_path)
    assert [t.info.name for t in artifact.manifest.outputs] == ["v", "i", "y"]


def test_slice_with_every_operand_at_run_time(tmp_path):
    """No conv, nothing fused: the importer's own repeated binding names must not reach the partitioner."""
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
              [tensor("x", [20, 10, 5]), *(tensor(n, [2], I64) for n in ("s", "e", "a", "st"))],
              [tensor("y", [None, None, None])])
    samples = {"x": weights(20, 10, 5), "s": np.array([0, 0], np.int64), "e": np.array([3, 10], np.int64),
               "a": np.array([0, 1], np.int64), "st": np.array([1, 2], np.int64)}
    spec = resolve_target("host")
    artifact = compile_model(CompileRequest(m, "case", spec, samples=samples), find_compiler(spec), tmp_path / "a")
    assert artifact.manifest.check["status"] == "passed"
    assert artifact.read_expected()["y"].shape == (3, 5, 5)


@pytest.mark.parametrize("setting", SETTINGS)
def test_shape_outputs_are_int64_vectors(tmp_path, setting):
    m = model([helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Shape", ["x"], ["none"], start=1, end=0),
               helper.make_node("Relu", ["x"], ["y"])],
              [tensor("x", [2, 3])], [tensor("shape", [2], I64), tensor("none", [0], I64), tensor("y", [2, 3])])
    artifact = compiled(m, tmp_path, setting)
    assert artifact.read_expected()["shape"].tolist() == [2, 3]


def test_extern_ops_are_singletons_in_the_ago_plan():
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1),
               helper.make_node("Relu", ["v"], ["y"])],
              [tensor("x", [2, 8])], [tensor("y", [2, 3])], {"k": np.array([3], np.int64)})
    spec = resolve_target("host")
    mod = build.legalize(onnx_import.to_relax(m, onnx_import.resolve_inputs(m, {})), spec)
    graph = op_graph(mod)
    (topk,) = graph.extern_ids
    plan = partition.plan(PartitionSettings(threshold=1e9), mod, spec, graph=graph)
    assert (topk,) in plan.groups and len(plan.groups) == 3


# 3. NHWC without convolutions


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_graph_without_convs_compiles_in_every_layout(tmp_path, setting):
    m = model([helper.make_node("Squeeze", ["x", "a"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)],
              [tensor("x", [1, 3, 1, 5])], [tensor("y", [1, 3, 5])], {"a": np.array([-2], np.int64)})
    compiled(m, tmp_path, setting)


def test_squeeze_with_a_negative_axis_after_a_conv_in_nhwc(tmp_path):
    m = model([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Squeeze", ["c", "a"], ["y"])],
              [tensor("x", [1, 3, 1, 5])], [tensor("y", [1, 4, 5])],
              {"a": np.array([-2], np.int64), "w": weights(4, 3, 1, 1)})
    compiled(m, tmp_path)


# 4. outputs that are inputs or constants


@pytest.mark.parametrize("setting", SETTINGS)
def test_outputs_that_are_an_input_and_a_constant(tmp_path, setting):
    m = model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["x"], ["same"]),
               helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(3, dtype=np.float32)))],
              [tensor("x", [2, 3])], [tensor("y", [2, 3]), tensor("same", [2, 3]), tensor("c", [3])])
    compiled(m, tmp_path, setting)


def test_a_model_that_computes_nothing(tmp_path):
    m = model([helper.make_node("Identity", ["x"], ["y"])], [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    compiled(m, tmp_path)


# 5. ConvTranspose


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_unet_block_with_conv_transpose(tmp_path, setting):
    m = model([helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
               helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
               helper.make_node("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1]),
               helper.make_node("ConvTranspose", ["c2", "wt", "bt"], ["u"], strides=[2, 2], kernel_shape=[2, 2]),
               helper.make_node("Concat", ["u", "c1"], ["cat"], axis=1),
               helper.make_node("Conv", ["cat", "w3"], ["y"], pads=[1, 1, 1, 1])],
              [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 2, 8, 8])],
              {"w1": weights(4, 3, 3, 3), "w2": weights(8, 4, 3, 3), "wt": weights(8, 4, 2, 2), "bt": weights(4),
               "w3": weights(2, 8, 3, 3)})
    compiled(m, tmp_path, setting)


@pytest.mark.parametrize("extra", [{}, {"kernel_shape": [3, 3], "output_padding": [1, 1]}])
def test_conv_transpose_output_shape_sets_the_output_size(tmp_path, extra):
    m = model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2], output_shape=[10, 8], **extra)],
              [tensor("x", [1, 1, 3, 3])], [tensor("y", [1, 2, 10, 8])], {"w": weights(1, 2, 3, 3)})
    assert compiled(m, tmp_path).manifest.outputs[0].info.shape == (1, 2, 10, 8)


# 6. Resize


@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
def test_resize_downsampling_by_a_scale_that_is_not_out_over_in(tmp_path, mode):
    m = model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode)], [tensor("x", [1, 2, 5, 7])],
              [tensor("y", [1, 2, 3, 4])], {"s": np.array([1, 1, 0.6, 0.6], np.float32)}, opset=19)
    compiled(m, tmp_path)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialiased_downsampling(tmp_path, mode):
    m = model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, antialias=1)], [tensor("x", [1, 2, 8, 8])],
              [tensor("y", [1, 2, 4, 4])], {"s": np.array([1, 1, 0.5, 0.5], np.float32)}, opset=19)
    checks = built_by_stages(m, tmp_path)
    assert all(c.passed for c in checks), checks


def test_resize_align_corners_down_to_one_row(tmp_path):
    m = model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear",
                                coordinate_transformation_mode="align_corners")],
              [tensor("x", [1, 1, 2, 4])], [tensor("y", [1, 1, 1, 2])], {"s": np.array([1, 1, 0.6, 0.6], np.float32)},
              opset=19)
    compiled(m, tmp_path)


# 7. LayerNormalization's statistics


@pytest.mark.parametrize("setting", SETTINGS)
def test_layer_norm_mean_and_inv_std_dev_outputs(tmp_path, setting):
    m = model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "isd"], axis=1, epsilon=1e-3)],
              [tensor("x", [2, 3, 8])], [tensor("y", [2, 3, 8]), tensor("mean", [2, 1, 1]), tensor("isd", [2, 1, 1])],
              {"g": weights(3, 8), "b": weights(3, 8)})
    shapes = [t.info.shape for t in compiled(m, tmp_path, setting).manifest.outputs]
    assert shapes == [(2, 3, 8), (2, 1, 1), (2, 1, 1)]


# 8. Tile at the host's default -mcpu (AVX-512): LLVM's loop vectorizer miscompiled topi's tile


@pytest.mark.parametrize("shape,repeats", [((2, 3, 4, 5), (7, 6, 4, 2)), ((3, 4, 5), (6, 4, 1))])
def test_tile_with_constant_repeats_at_the_default_mcpu(tmp_path, shape, repeats):
    out = [d * r for d, r in zip(shape, repeats)]
    m = model([helper.make_node("Tile", ["x", "r"], ["y"])], [tensor("x", list(shape))], [tensor("y", out)],
              {"r": np.array(repeats, np.int64)})
    compiled(m, tmp_path)


# 9. zero-size constants, outputs listed twice


def test_concat_with_a_zero_size_initializer(tmp_path):
    m = model([helper.make_node("Concat", ["x", "z"], ["y"], axis=1)], [tensor("x", [2, 3])], [tensor("y", [2, 3])],
              {"z": np.zeros((2, 0), np.float32)})
    compiled(m, tmp_path)


def test_an_output_listed_twice_is_one_output(tmp_path):
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 3])],
              [tensor("y", [2, 3]), tensor("y", [2, 3])])
    assert [t.info.name for t in compiled(m, tmp_path).manifest.outputs] == ["y"]


# 10. dynamic batch, zero-size dims


def test_a_dynamic_batch_dimension_defaults_to_one_with_a_notice():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["N", 3, 4])], [tensor("y", ["N", 3, 4])])
    assert [i.shape for i in onnx_import.resolve_inputs(m, {})] == [(1, 3, 4)]
    (notice,) = onnx_import.defaulted_batch(m, {})
    assert "'x'" in notice and "batch 1" in notice and "--input-shape x=4x3x4" in notice
    assert onnx_import.defaulted_batch(m, {"x": (2, 3, 4)}) == []


def test_other_dynamic_dims_still_need_input_shape():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["N", "C", 4])], [tensor("y", ["N", "C", 4])])
    with pytest.raises(UnsupportedModelError, match="--input-shape x=1x1x4"):
        onnx_import.resolve_inputs(m, {})


def test_a_zero_size_dimension_is_not_called_dynamic():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 0, 4])], [tensor("y", [2, 0, 4])])
    with pytest.raises(UnsupportedModelError, match=r"zero-size dimension \[2, 0, 4\]") as err:
        onnx_import.resolve_inputs(m, {})
    assert "dynamic" not in str(err.value)


# 11. refused up front


def test_an_opset_newer_than_the_reference_is_refused_on_load(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])], opset=99), path)
    with pytest.raises(UnsupportedModelError, match=r"opset 99; agoc takes opset \d+ at most.*opset_version="):
        onnx_import.load_model(path)


def test_a_bfloat16_input_is_refused_naming_it():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 4], TensorProto.BFLOAT16)],
              [tensor("y", [2, 4], TensorProto.BFLOAT16)])
    with pytest.raises(UnsupportedModelError, match="input 'x' is bfloat16"):
        onnx_import.resolve_inputs(m, {})


def test_a_missing_external_data_file_is_named(tmp_path):
    path = tmp_path / "m.onnx"
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [tensor("x", [2, 4])], [tensor("y", [2, 4])],
              {"w": np.ones((2, 4), np.float32)})
    onnx.save(m, path, save_as_external_data=True, location="m.data", size_threshold=0)
    assert len(onnx_import.load_model(path).graph.initializer) == 1
    (tmp_path / "m.data").unlink()
    with pytest.raises(ModelLoadError, match=f"'w'.*'m.data', which is missing \\(looked for {tmp_path / 'm.data'}\\)"):
        onnx_import.load_model(path)


@pytest.mark.parametrize("attr, value", [("value_float", 0.5), ("value_floats", [0.5, 2.0, -1.0]),
                                         ("value_int", 3), ("value_ints", [1, 2, 3])])
def test_a_constant_given_as_a_scalar_or_list_attribute(tmp_path, attr, value):
    integer = attr.startswith("value_int")
    nodes = [helper.make_node("Constant", [], ["c"], **{attr: value})]
    if integer:
        nodes += [helper.make_node("Cast", ["c"], ["cf"], to=F), helper.make_node("Mul", ["x", "cf"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "c"], ["y"])]
    m = model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    compiled(m, tmp_path)
