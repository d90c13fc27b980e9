"""Fixtures shared by the toolchain tests."""

import pytest

import models
from toolchain import build, onnx_import, partition, reform
from toolchain.fusion import fuse_groups
from toolchain.opgraph import op_graph
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune.plan import group_kernels


@pytest.fixture(scope="module")
def dwsep_split():
    """tiny-dwsep (pw → dw → pw) as one AGO subgraph: (legalized module, op graph, partition plan,
    reformer split, the joined kernel, its three minis), kernels as (name, PrimFunc). In ONNX's NCHW:
    in NHWC the input's transpose (8 channels) is a kernel of its own, a second subgraph."""
    spec = resolve_target("host", layout="NCHW")
    model = models.build("tiny-dwsep")
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
    graph = op_graph(mod)
    plan = partition.plan(PartitionSettings(threshold=1e9), mod, spec, graph=graph)
    split = reform.split_plan(graph, plan)
    (joined,) = group_kernels(fuse_groups(mod, plan.groups, spec))
    minis = group_kernels(fuse_groups(mod, split.plan.groups, spec))
    return mod, graph, plan, split, joined, minis


@pytest.fixture(scope="module")
def layer_norm_take():
    """LayerNorm over (1, 16, 32) then Gather of row 0 (a constant 0-d int64 index), as BERT's pooler
    reads its [CLS] token: the one kernel, fused, and its call's constant arguments."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from models.registry import IR_VERSION, OPSET

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(32).astype("float32"), "gamma"),
             numpy_helper.from_array(rng.standard_normal(32).astype("float32"), "beta"),
             numpy_helper.from_array(np.array(0, dtype="int64"), "cls")]
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
         helper.make_node("Gather", ["n", "cls"], ["y"], axis=1)],
        "ln_take", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    spec = resolve_target("host")
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
    plan = partition.plan(PartitionSettings(threshold=1e9), mod, spec, graph=op_graph(mod))
    fused = fuse_groups(mod, plan.groups, spec)
    calls = [(n, a) for n, a in build.kernel_calls(fused["main"]) if "take" in n]
    assert len(calls) == 1 and "layer_norm" in calls[0][0]  # one kernel: the gather reads the norm's output
    return fused, calls[0]
