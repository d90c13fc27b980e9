"""Every zoo network at every listed shape compiles (AGO and stock partitions) and matches onnxruntime.

Each model's smallest shape runs in the fast suite; the other shapes are marked slow.
"""

import pytest

import models
from host.devices import LocalDevice
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.targets import find_compiler, resolve_target
from toolchain.verify import verify_artifact


def cases():
    for spec in models.registry.MODELS:
        if spec.family not in ("cnn", "transformer"):
            continue
        shapes = sorted(spec.shapes, key=lambda s: s[-1])
        for i, shape in enumerate(shapes):
            marks = [pytest.mark.slow] if i else []
            yield pytest.param(spec.name, shape, id=f"{spec.name}@{shape[-1]}", marks=marks)


@pytest.mark.parametrize("partition", ["ago", "stock"])
@pytest.mark.parametrize("name, shape", list(cases()))
def test_zoo_model_compiles_for_host_and_matches_onnxruntime(name, shape, partition, tmp_path):
    spec = resolve_target("host")
    request = CompileRequest(models.build(name, shape), name, spec, partition=partition)
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
    request = CompileRequest(models.build(name, models.get(name).shapes[-1]), name, spec, threshold=1e9)
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    convs = [k for k in artifact.manifest.kernels if "conv2d" in k["name"]]
    assert len(convs) == 1  # the pair is one kernel; in NHWC the input and output get a transpose each
    assert all("transpose" in k["name"] for k in artifact.manifest.kernels if k not in convs)
    assert artifact.manifest.partition_info["max_complex_ops"] == 2
    assert verify_artifact(artifact, LocalDevice()).passed
