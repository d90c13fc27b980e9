"""Every zoo network at every listed shape compiles (AGO and stock partitions) and matches onnxruntime.

The fast suite compiles one whole network (MobileNet-V2, the demo's, at its smallest shape, AGO
partition); the rest of the sweep (the stock partition, the other networks, larger shapes) takes about a
minute a case and is marked slow (`make test-slow`). The fast suite still compiles their op types in small
graphs (the test below, test_op_coverage, test_pipeline's tiny models) and the stock partition
(test_op_coverage's "stock" setting, test_cli).
"""

import pytest

import models
from host.devices import LocalDevice
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.verify import verify_artifact

FAST = "mobilenet-v2"  # the one whole network of the fast suite


def cases():
    for spec in models.registry.MODELS:
        if spec.family not in ("cnn", "transformer"):
            continue
        shapes = sorted(spec.shapes, key=lambda s: s[-1])
        for i, shape in enumerate(shapes):
            for partition in ("ago", "stock"):
                marks = [pytest.mark.slow] if i or spec.name != FAST or partition != "ago" else [pytest.mark.e2e]
                yield pytest.param(spec.name, shape, partition, id=f"{partition}-{spec.name}@{shape[-1]}", marks=marks)


@pytest.mark.parametrize("name, shape, partition", list(cases()))
def test_zoo_model_compiles_for_host_and_matches_onnxruntime(name, shape, partition, tmp_path):
    spec = resolve_target("host")
    # joined: AGO's kernels as partitioned (untuned, a compile builds a join of several reducing ops as its minis)
    request = CompileRequest(models.build(name, shape), name, spec, partition=PartitionSettings(partition),
                             joins="joined")
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    assert artifact.manifest.partition_info["acyclic"]
    if partition == "ago":
        assert artifact.manifest.partition_info["max_complex_ops"] > 1  # several convs/matmuls in one kernel
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()
    # measured max rel error is ~1e-6 for every model (see README); 1e-5 leaves room, still catches real bugs
    assert max(o.max_rel for o in report.outputs) < 1e-5


@pytest.mark.parametrize("kind", ["pw-dw", "dw-pw", "dw-dw", "pw-pw"])
def test_ago_pair_fuses_into_one_kernel_and_matches_onnxruntime(kind, tmp_path):
    spec = resolve_target("host")
    name = f"pair-{kind}"
    request = CompileRequest(models.build(name, models.get(name).shapes[-1]), name, spec,
                             partition=PartitionSettings(threshold=1e9), joins="joined")  # (untuned: minis else)
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    convs = [k for k in artifact.manifest.kernels if "conv2d" in k["name"]]
    assert len(convs) == 1  # the pair is one kernel; in NHWC the input and output get a transpose each
    assert all("transpose" in k["name"] for k in artifact.manifest.kernels if k not in convs)
    assert artifact.manifest.partition_info["max_complex_ops"] == 2
    assert verify_artifact(artifact, LocalDevice()).passed


def test_the_op_types_of_the_slow_networks_compile_and_match_onnxruntime(tmp_path):
    """Split, HardSwish, HardSigmoid (MobileNet-V3, ShuffleNet, MobileViT), Sigmoid, Erf, Tanh (BERT-tiny):
    the fast suite's stand-in for those networks' whole-model cases (marked slow above)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from models.registry import IR_VERSION, OPSET

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 1, 1)).astype("float32"), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Split", ["c"], ["a", "b"], axis=1),
             helper.make_node("HardSwish", ["a"], ["ha"]),
             helper.make_node("HardSigmoid", ["b"], ["hb"]),
             helper.make_node("Mul", ["ha", "hb"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Tanh", ["e"], ["t"]),
             helper.make_node("Concat", ["t", "ha"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "zoo_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    spec = resolve_target("host")
    artifact = compile_model(CompileRequest(model, "zoo-ops", spec), find_compiler(spec), tmp_path / "a")
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()
