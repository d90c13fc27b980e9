"""`agoc compile --target cuda --training` and `agoc bench-cuda` end to end (no GPU needed)."""

from __future__ import annotations

import json
import shutil


def test_compile_cuda_training_artifact(cli, tmp_path):
    out = tmp_path / "ln"
    result = cli("compile", "zoo:layernorm", "--target", "cuda", "--arch", "sm_90", "--training", "-o", out)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"] == "agoc.cuda/1" and manifest["graph"]["training"]
    counts = manifest["kernel_counts"]
    assert counts["fused"]["launches_per_step"] < counts["stock"]["launches_per_step"]
    assert counts["fused"]["stitched_groups"] >= 1
    stitched = [g for g in manifest["groups"] if g["stitched"]]
    assert all(g["schedule"] == "stitched" and g["cuda_kernels"] == 1 for g in stitched)
    assert "__shared__" in (out / "kernels.cu").read_text()
    if shutil.which("nvcc"):
        assert (out / "kernels.ptx").exists() and manifest["nvcc"]["entries"] == counts["fused"]["kernels"]
    else:
        assert "skipped" in manifest["nvcc"]


def test_compile_cuda_bad_arch_is_a_user_error(cli, tmp_path):
    result = cli("compile", "zoo:layernorm", "--target", "cuda", "--arch", "volta", "--training", "-o", tmp_path / "x")
    assert result.exit_code == 1
    assert "compute capability" in result.output


def test_bench_cuda_without_gpu_writes_counts(cli, tmp_path, monkeypatch):
    from host import bench_cuda

    monkeypatch.setattr(bench_cuda, "gpu_status", lambda: (False, "no NVIDIA GPU: test"))
    result = cli("bench-cuda", "--graphs", "layernorm", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert "no NVIDIA GPU" in result.output
    (path,) = tmp_path.glob("cuda-*.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "agoc.bench-cuda/1" and doc["gpu_present"] is False
    (entry,) = doc["graphs"]
    assert entry["kernel_counts"]["fused"]["launches_per_step"] < entry["kernel_counts"]["stock"]["launches_per_step"]
    assert entry["llvm_numerics_fused_vs_unfused"]["max_rel"] < 1e-5
    assert "gpu" not in entry
