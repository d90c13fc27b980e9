"""Fixtures shared by the toolchain tests."""

import pytest

import models
from toolchain import build, onnx_import, partition, reform, tuning
from toolchain.fusion import fuse_groups
from toolchain.opgraph import op_graph
from toolchain.targets import resolve_target


@pytest.fixture(scope="module")
def dwsep_split():
    """tiny-dwsep (pw → dw → pw) as one AGO subgraph: (legalized module, op graph, partition plan,
    reformer split, the joined kernel, its three minis), kernels as (name, PrimFunc). In ONNX's NCHW:
    in NHWC the input's transpose is a kernel of its own (partition.KEEP_APART), a second subgraph."""
    spec = resolve_target("host", layout="NCHW")
    model = models.build("tiny-dwsep")
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)
    graph = op_graph(mod)
    plan = partition.plan("ago", mod, spec, threshold=1e9, graph=graph)
    split = reform.split_plan(graph, plan)
    (joined,) = tuning.group_kernels(fuse_groups(mod, plan.groups, spec))
    minis = tuning.group_kernels(fuse_groups(mod, split.plan.groups, spec))
    return mod, graph, plan, split, joined, minis
