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
    from host.bench import cuda as bench_cuda

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


def test_bench_cuda_bundle_holds_what_a_gpu_machine_needs(cli, tmp_path, monkeypatch):
    import numpy as np

    from host.bench import cuda as bench_cuda
    from toolchain.cuda import training

    bundle = tmp_path / "bundle"
    result = cli("bench-cuda", "--graphs", "layernorm", "--bundle", bundle)
    assert result.exit_code == 0, result.output
    doc = json.loads((bundle / "bundle.json").read_text())
    (entry,) = doc["graphs"]
    assert {p.name for p in (bundle / "layernorm").iterdir()} == {"fused.so", "stock.so", "expected.npz"}
    g = training.builtin("layernorm")
    for got, want in zip(bench_cuda._bundle_args(entry), g.sample_args(0)):  # drawn again, not carried
        np.testing.assert_array_equal(got, want)
    expected = bench_cuda._arrays(bundle / "layernorm" / "expected.npz")
    assert [list(e.shape) for e in expected] == [[int(np.prod(s))] for s in entry["outputs"]]

    monkeypatch.setattr(bench_cuda, "gpu_status", lambda: (False, "no NVIDIA GPU: test"))
    result = cli("bench-cuda", "--time-bundle", bundle, "--out", tmp_path)
    assert result.exit_code == 1 and "no NVIDIA GPU: test" in result.output
    result = cli("bench-cuda", "--time-bundle", tmp_path / "nothing", "--out", tmp_path)
    assert result.exit_code == 1 and "not a CUDA benchmark bundle" in result.output
    assert not list(tmp_path.glob("cuda-*.json"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = cli("bench-cuda", "--graphs", "layernorm", "--bundle", tmp_path / "mine")
    assert result.exit_code == 1 and "not a CUDA benchmark bundle" in result.output
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_bundle_timing_imports_with_tvm_runtime_alone(tmp_path):
    """``python -m host.bench.cuda time`` is what a GPU machine with only TVM's runtime runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bundle.json").write_text("{}")
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "PATH": "/usr/bin:/bin"}  # no nvidia-smi on this PATH
    proc = subprocess.run([sys.executable, "-c", "import tvm, sys; assert tvm.base._RUNTIME_ONLY; "
                           "from host.bench.cuda import main; sys.exit(main(['time', sys.argv[1]]))",
                           str(tmp_path / "b")],
                          capture_output=True, text=True, env=env, cwd=Path(__file__).parents[3], timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "cannot time" in proc.stderr and "no NVIDIA GPU" in proc.stderr


def test_verdict_trusts_the_reference_or_two_agreeing_pipelines():
    from host.bench.cuda import verdict
    from toolchain.cuda.numerics import Comparison

    close, off, far = Comparison(1, 1e-7, 1e-7), Comparison(1, 3e-3, 3e-3), Comparison(1, 0.5, 0.5)
    assert verdict({"fused": close, "stock": close}, close) == "match"
    assert verdict({"fused": off, "stock": off}, Comparison(1, 0.0, 0.0)) == "match-stock"
    assert verdict({"fused": far, "stock": close}, far) == "wrong"
