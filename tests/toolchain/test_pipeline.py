"""compile → artifact → verify, on the host and cross-compiled for ARM64."""

import json
import platform

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import models
from host.devices import LocalDevice
from tests.conftest import require_tool
from tests.toolchain.test_targets import make_fake_ndk
from toolchain.artifact import load_artifact
from toolchain.errors import ArtifactError, DeviceError
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.targets import find_compiler, resolve_target
from toolchain.verify import verify_artifact

EM_AARCH64 = 183
EM_X86_64 = 62


def elf_machine(path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    assert header[4] == 2, "not a 64-bit ELF"
    return int.from_bytes(header[18:20], "little")


def compile_zoo(name, out, target="host", model=None, **kw):
    spec = resolve_target(target)
    request = CompileRequest(model or models.build(name), name, spec, **kw)
    return compile_model(request, find_compiler(spec), out)


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-transformer", "tiny-dwsep"])
def test_host_compile_matches_onnxruntime(name, tmp_path):
    artifact = compile_zoo(name, tmp_path / name)
    report = verify_artifact(artifact, LocalDevice())
    assert report.reference == "onnxruntime"
    assert report.passed, report.to_json()
    assert all(o.max_rel < 1e-4 for o in report.outputs)


def test_manifest_records_model_io_target_compiler_versions_kernels(tmp_path):
    artifact = compile_zoo("tiny-cnn", tmp_path / "a")
    data = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert data["schema"] == "agoc.artifact/1"
    assert data["model"]["name"] == "tiny-cnn" and len(data["model"]["sha256"]) == 64
    assert data["model"]["op_counts"] == {"Add": 1, "Conv": 1, "Flatten": 1, "Gemm": 1, "Relu": 1}
    assert data["inputs"] == [
        {"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32", "file": "data/input_0.bin"}]
    assert data["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32", "file": "data/expected_0.bin"}]
    assert data["target"]["preset"] == "host" and data["target"]["tvm_target"]["mcpu"]
    assert data["compiler"]["kind"] == "host" and data["compiler"]["version"]
    assert data["versions"]["apache-tvm"] == "0.27.0.post1" and data["versions"]["agoc"]
    names = [k["name"] for k in data["kernels"]]
    assert any("conv2d" in n for n in names) and any("matmul" in n for n in names)
    assert (tmp_path / "a" / "model.so").stat().st_size > 0
    # sample files hold exactly what the manifest says
    inputs = artifact.read_inputs()
    assert inputs["input"].shape == (1, 3, 16, 16) and inputs["input"].std() > 0.5
    assert load_artifact(tmp_path / "a").manifest == artifact.manifest


def test_linux_arm64_library_is_an_aarch64_elf(tmp_path):
    require_tool("aarch64-linux-gnu-g++")
    # (plain: what is tested is the library's machine and linker, not its schedules)
    host = compile_zoo("tiny-dwsep", tmp_path / "host", untuned="plain")
    assert elf_machine(host.library_path) == {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}[platform.machine()]
    arm = compile_zoo("tiny-dwsep", tmp_path / "arm64", target="linux-arm64", untuned="plain")
    assert elf_machine(arm.library_path) == EM_AARCH64
    assert arm.manifest.compiler["kind"] == "gnu-cross"
    assert arm.manifest.target["tvm_target"]["mtriple"] == "aarch64-linux-gnu"
    with pytest.raises(DeviceError, match="built for linux-arm64 and cannot run on this"):
        LocalDevice().run(arm, arm.read_inputs())


def test_android_arm64_ndk_links_with_the_ndk_from_android_ndk_home(tmp_path, monkeypatch):
    cxx = require_tool("aarch64-linux-gnu-g++")
    make_fake_ndk(tmp_path / "ndk", cxx)
    monkeypatch.setenv("ANDROID_NDK_HOME", str(tmp_path / "ndk"))
    art = compile_zoo("tiny-cnn", tmp_path / "android", target="android-arm64-ndk")
    assert elf_machine(art.library_path) == EM_AARCH64
    assert art.manifest.compiler["kind"] == "ndk"
    assert art.manifest.target["tvm_target"]["mtriple"] == "aarch64-linux-android"


def test_existing_non_artifact_directory_is_left_alone(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    with pytest.raises(ArtifactError, match="exists and is not an agoc artifact"):
        compile_zoo("tiny-cnn", out)
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_recompiling_replaces_an_artifact_and_leaves_no_staging_dirs(tmp_path):
    compile_zoo("tiny-cnn", tmp_path / "a")
    compile_zoo("tiny-cnn", tmp_path / "a", seed=7)
    assert load_artifact(tmp_path / "a").manifest.sample_seed == 7
    assert [p.name for p in tmp_path.iterdir()] == ["a"]


def test_verify_fails_when_the_library_computes_something_else(tmp_path):
    good = compile_zoo("tiny-dwsep", tmp_path / "good")
    other = models.build("tiny-dwsep")
    for init in other.graph.initializer:
        if init.name == "pw2_w":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, "pw2_w"))
    wrong = compile_zoo("tiny-dwsep", tmp_path / "wrong", model=other)
    good.library_path.write_bytes(wrong.library_path.read_bytes())
    with pytest.raises(ArtifactError, match="not the library this artifact was built with"):
        load_artifact(tmp_path / "good")  # the manifest records the library's hash
    manifest = json.loads((tmp_path / "good" / "manifest.json").read_text())
    manifest["library_sha256"] = wrong.manifest.library_sha256  # a consistent artifact that computes something else
    (tmp_path / "good" / "manifest.json").write_text(json.dumps(manifest))
    report = verify_artifact(load_artifact(tmp_path / "good"), LocalDevice())
    assert not report.passed
    assert report.outputs[0].max_abs > 0.1


def test_dump_dir_has_the_ir_after_each_stage(tmp_path):
    compile_zoo("tiny-cnn", tmp_path / "a", dump_dir=tmp_path / "dump")
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == [
        "01_imported.py", "02_legalized.py", "03_fused.py", "04_scheduled.py"]
    assert "call_tir" in (tmp_path / "dump" / "02_legalized.py").read_text()
    assert "parallel" in (tmp_path / "dump" / "04_scheduled.py").read_text()  # the untuned kernels scheduled


def test_load_artifact_errors(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact directory"):
        load_artifact(tmp_path / "none")
    with pytest.raises(ArtifactError, match="not an agoc artifact"):
        load_artifact(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "other/9"}))
    with pytest.raises(ArtifactError, match="this agoc reads 'agoc.artifact/1'"):
        load_artifact(tmp_path)


def test_stored_reference_is_used_when_the_model_copy_is_gone(tmp_path):
    artifact = compile_zoo("tiny-cnn", tmp_path / "a")
    artifact.model_path.unlink()
    report = verify_artifact(artifact, LocalDevice())
    assert report.reference == "stored" and report.passed


def test_integer_token_inputs_index_inside_the_embedding_table():
    from toolchain.onnx_import import TensorInfo
    from toolchain.samples import sample_inputs

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "ids"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 64])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, 4])],
        [numpy_helper.from_array(np.zeros((10, 4), np.float32), "table")],
    )
    ids = sample_inputs(onnx.helper.make_model(graph), [TensorInfo("ids", (1, 64), "int64")])["ids"]
    assert ids.min() >= 0 and ids.max() < 10 and len(np.unique(ids)) > 1
