"""The C++ runner (android_runner/): bench JSON, outputs vs onnxruntime, exit codes, RPC server.

The runner is built through android_runner/runner.mk (a no-op when it is up to date). The host
build links the venv's TVM runtime; the linux-arm64 build runs under qemu-aarch64, the CI stand-in
for a phone: its outputs are real, its times are not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import models
from tests.conftest import require_tool
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target

ROOT = Path(__file__).resolve().parents[2]
RUNNER_MK = ROOT / "android_runner" / "runner.mk"
ARM64_LIBS = ROOT / "build" / "runtime-arm64" / "lib"
QEMU_SYSROOT = "/usr/aarch64-linux-gnu"
MAX_REL = 1e-4  # max |runner - onnxruntime| / max |onnxruntime|, as `agoc verify` reports it

BENCH_KEYS = {
    "load_ms", "samples_ms", "mean_ms", "median_ms", "min_ms", "max_ms", "std_ms",
    "threads", "cores", "cpu_freq_khz", "thermal_c", "outputs",
}  # fmt: skip


def build_runner(target: str) -> Path:
    """`make runner TARGET=target` through the fragment; the path of the binary."""
    require_tool("make")
    require_tool("cmake")
    require_tool("g++" if target == "host" else "aarch64-linux-gnu-g++")
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".runners.lock", "w") as lock:  # parallel workers (pytest -n): one make at a time
        __import__("fcntl").flock(lock, __import__("fcntl").LOCK_EX)
        result = subprocess.run(
            ["make", "--no-print-directory", "-f", str(RUNNER_MK), "runner", f"TARGET={target}",
             f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    assert result.returncode == 0, f"runner build failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    binary = ROOT / "build" / "runner" / target / "agoc-runner"
    assert binary.is_file()
    return binary


def compile_zoo(name: str, out: Path, target: str = "host", shape=None, **kw):
    spec = resolve_target(target)
    return compile_model(CompileRequest(models.build(name, shape), name, spec, **kw), find_compiler(spec), out)


@pytest.fixture(scope="session")
def host_runner() -> Path:
    return build_runner("host")


@pytest.fixture(scope="session")
def arm64_runner() -> list[str]:
    """The command prefix that runs the aarch64 runner under qemu."""
    qemu = require_tool("qemu-aarch64")
    binary = build_runner("linux-arm64")
    return [qemu, "-L", QEMU_SYSROOT, str(binary)]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Artifacts compiled once per module: artifacts("tiny-cnn", "linux-arm64") -> Artifact."""
    root = tmp_path_factory.mktemp("artifacts")
    cache = {}

    def get(name: str, target: str = "host", partition: str = "ago", shape=None):
        key = (name, target, partition, shape)
        if key not in cache:
            out = root / f"{name}-{target}-{partition}-{len(cache)}"
            cache[key] = compile_zoo(name, out, target, shape, partition=PartitionSettings(partition))
        return cache[key]

    return get


def run(command: list, *args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*map(str, command), *map(str, args)], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def bench(command: list, *args, env=None) -> dict:
    result = run(command, "bench", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # exactly one JSON document on stdout


def max_rel(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = float(np.abs(expected).max())
    diff = float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max())
    return diff / scale if scale > 0 else diff


def check_outputs_match_expected(doc: dict, artifact) -> None:
    expected = artifact.read_expected()
    assert [o["name"] for o in doc["outputs"]] == list(expected)
    for out in doc["outputs"]:
        ref = expected[out["name"]]
        assert out["shape"] == list(ref.shape) and out["dtype"] == str(ref.dtype)
        got = np.fromfile(out["file"], dtype=np.dtype(out["dtype"]).newbyteorder("<")).reshape(out["shape"])
        assert max_rel(got, ref) < MAX_REL, f"{out['name']}: max rel error {max_rel(got, ref)}"
        assert out["checksum"]["sum"] == pytest.approx(float(got.astype(np.float64).sum()), rel=1e-9, abs=1e-9)
        assert out["checksum"]["sum_abs"] == pytest.approx(float(np.abs(got.astype(np.float64)).sum()), rel=1e-9)


# ---------------------------------------------------------------- the make fragment


def make_runner(*args: str) -> subprocess.CompletedProcess:
    require_tool("make")
    return subprocess.run(["make", "--no-print-directory", "-f", str(RUNNER_MK), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_make_runner_rejects_an_unknown_target():
    result = make_runner("runner", "TARGET=ios")
    assert result.returncode != 0 and "unknown runner TARGET 'ios'" in result.stderr


def test_make_runner_android_says_what_is_missing(tmp_path):
    result = make_runner("runner", "TARGET=android-arm64-ndk", "ANDROID_NDK_HOME=", "ANDROID_NDK_ROOT=", "ANDROID_NDK=")
    assert result.returncode != 0 and "set ANDROID_NDK_HOME" in result.stderr
    fake_ndk = tmp_path / "ndk"
    (fake_ndk / "build" / "cmake").mkdir(parents=True)
    (fake_ndk / "build" / "cmake" / "android.toolchain.cmake").write_text("")
    result = make_runner("runner", "TARGET=android-arm64-ndk", f"ANDROID_NDK_HOME={fake_ndk}", "TVM_HOME=")
    assert result.returncode != 0 and "needs a TVM v0.27 source checkout as TVM_HOME" in result.stderr


# ---------------------------------------------------------------- bench on the host


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-transformer"])
def test_host_bench_json_and_outputs_match_onnxruntime(host_runner, artifacts, name, tmp_path):
    artifact = artifacts(name)
    doc = bench([host_runner], "--artifact", artifact.root, "--warmup", 1, "--repeat", 4, "--outputs-dir", tmp_path)
    assert BENCH_KEYS <= set(doc) and doc["schema"] == "agoc.runner.bench/1"
    assert doc["library"] == "relax.VirtualMachine" and doc["warmup"] == 1 and doc["inputs"] == "files"
    samples = doc["samples_ms"]
    assert len(samples) == 4 and all(s > 0 for s in samples)
    assert doc["min_ms"] == min(samples) and doc["max_ms"] == max(samples)
    assert doc["min_ms"] <= doc["median_ms"] <= doc["max_ms"]
    assert doc["mean_ms"] == pytest.approx(np.mean(samples), rel=1e-6)
    assert doc["std_ms"] == pytest.approx(np.std(samples, ddof=1), rel=1e-4, abs=1e-9)
    assert doc["threads"] >= 1 and doc["cores"] and doc["load_ms"] > 0
    assert isinstance(doc["cpu_freq_khz"], dict) and isinstance(doc["thermal_c"], dict)
    assert "kernels" not in doc
    check_outputs_match_expected(doc, artifact)


def test_per_kernel_times_every_fused_kernel_in_execution_order(host_runner, artifacts):
    artifact = artifacts("tiny-dwsep", partition="stock")  # three fused kernels
    doc = bench([host_runner], "--artifact", artifact.root, "--warmup", 1, "--repeat", 3, "--per-kernel")
    kernels = doc["kernels"]
    assert [k["name"] for k in kernels] == [k["name"] for k in artifact.manifest.kernels]
    assert [k["calls_per_run"] for k in kernels] == [k["calls"] for k in artifact.manifest.kernels]
    assert all(0 < k["min_ms"] <= k["median_ms"] for k in kernels)
    # the FMA peak of as many threads, what each kernel's GFLOP/s is a fraction of
    assert doc["peak"]["gflops"] > 0 and doc["peak"]["threads"] == doc["threads"]
    assert doc["peak"]["isa"] in ("avx512", "avx2", "neon", "scalar")


def test_random_inputs_are_seeded_and_threads_and_cores_are_reported(host_runner, artifacts):
    root = artifacts("tiny-cnn").root
    args = ["--artifact", root, "--warmup", 0, "--repeat", 1, "--random-inputs"]
    first, again = bench([host_runner], *args, "--seed", 7), bench([host_runner], *args, "--seed", 7)
    other = bench([host_runner], *args, "--seed", 8, "--threads", 1, "--cores", 0)
    assert first["inputs"] == "random" and first["seed"] == 7
    assert first["outputs"][0]["checksum"] == again["outputs"][0]["checksum"]
    assert other["outputs"][0]["checksum"] != first["outputs"][0]["checksum"]
    assert other["threads"] == 1 and other["cores"] == [0]


def test_min_time_keeps_sampling_past_repeat(host_runner, artifacts):
    doc = bench([host_runner], "--artifact", artifacts("tiny-cnn").root, "--warmup", 0, "--repeat", 1,
                "--min-time-ms", 3)  # fmt: skip
    samples = doc["samples_ms"]
    assert sum(samples) >= 3 and sum(samples[:-1]) < 3  # stops at the first sample that reaches it


# ---------------------------------------------------------------- exit codes


def copy_artifact(artifact, dest: Path) -> Path:
    shutil.copytree(artifact.root, dest)
    return dest


def test_help_lists_modes_and_exit_codes(host_runner):
    result = run([host_runner], "--help")
    assert result.returncode == 0
    assert "bench" in result.stdout and "rpc" in result.stdout and "7  RPC socket error" in result.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["bench", "--artifact", "x", "--bogus"], "unknown flag for bench: '--bogus'"),
        (["bench"], "bench needs --artifact"),
        (["bench", "--artifact", "x", "--repeat", "0"], "--repeat expects an integer"),
        (["frobnicate"], "unknown mode 'frobnicate'"),
        ([], "missing mode"),
        (["rpc", "--port", "http"], "--port expects an integer"),
    ],
)
def test_bad_flags_exit_2(host_runner, args, needle):
    result = run([host_runner], *args)
    assert result.returncode == 2 and needle in result.stderr and result.stdout == ""


def test_missing_artifact_and_missing_files_exit_3(host_runner, artifacts, tmp_path):
    result = run([host_runner], "bench", "--artifact", tmp_path / "nowhere")
    assert result.returncode == 3 and "no artifact directory" in result.stderr
    root = copy_artifact(artifacts("tiny-cnn"), tmp_path / "art")
    (root / "data" / "input_0.bin").unlink()
    result = run([host_runner], "bench", "--artifact", root)
    assert result.returncode == 3 and "input_0.bin not found" in result.stderr and result.stdout == ""


def test_truncated_input_exits_5(host_runner, artifacts, tmp_path):
    root = copy_artifact(artifacts("tiny-cnn"), tmp_path / "art")
    data = root / "data" / "input_0.bin"
    data.write_bytes(data.read_bytes()[:100])
    result = run([host_runner], "bench", "--artifact", root)
    assert result.returncode == 5 and "has 100 bytes, but float32 1x3x16x16 needs 3072" in result.stderr


def test_input_that_does_not_fit_the_model_exits_5(host_runner, artifacts, tmp_path):
    root = copy_artifact(artifacts("tiny-cnn"), tmp_path / "art")
    io = root / "io.txt"
    io.write_text(io.read_text().replace("1,3,16,16", "3,16,16"))  # same bytes, wrong rank
    result = run([host_runner], "bench", "--artifact", root)
    assert result.returncode == 5 and "do not fit the model" in result.stderr


def test_library_for_another_cpu_or_not_a_library_exits_4(host_runner, artifacts, tmp_path):
    result = run([host_runner], "bench", "--artifact", artifacts("tiny-cnn", "linux-arm64").root)
    assert result.returncode == 4 and "built for aarch64" in result.stderr
    root = copy_artifact(artifacts("tiny-cnn"), tmp_path / "art")
    (root / "model.so").write_bytes(b"not a library")
    result = run([host_runner], "bench", "--artifact", root)
    assert result.returncode == 4 and "cannot load" in result.stderr


# ---------------------------------------------------------------- linux-arm64 under qemu


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-transformer"])
def test_qemu_arm64_bench_matches_onnxruntime(arm64_runner, artifacts, name, tmp_path):
    artifact = artifacts(name, "linux-arm64")
    doc = bench(arm64_runner, "--artifact", artifact.root, "--warmup", 1, "--repeat", 2, "--per-kernel",
                "--outputs-dir", tmp_path, env={"LD_LIBRARY_PATH": str(ARM64_LIBS)})  # fmt: skip
    assert doc["library"] == "relax.VirtualMachine" and len(doc["samples_ms"]) == 2
    assert [k["name"] for k in doc["kernels"]] == [k["name"] for k in artifact.manifest.kernels]
    check_outputs_match_expected(doc, artifact)


def test_a_float16_build_runs_under_qemu_within_its_tolerance(arm64_runner, tmp_path):
    """--precision fp16: the ARM build computes in float16 (ARMv8.2-A arithmetic, on 8-lane vectors), its weights
    are stored in half the bytes, and the outputs the arm64 runner gives stay within the fp16 tolerance of
    onnxruntime's float32 ones — and outside float32's: it really computes in float16."""
    from toolchain.verify import TOLERANCES

    art = {}
    for precision in ("fp32", "fp16"):
        spec = resolve_target("linux-arm64", precision=precision)
        art[precision] = compile_model(CompileRequest(models.build("tiny-cnn"), "tiny-cnn", spec, check=False),
                                       find_compiler(spec), tmp_path / precision)
    assert art["fp16"].manifest.target["precision"] == "fp16" and "precision" not in art["fp32"].manifest.target
    assert "+fullfp16" in art["fp16"].manifest.target["tvm_target"]["mattr"]
    weights = {p: sum(k["weight_bytes"] for k in a.manifest.kernels) for p, a in art.items()}
    assert weights["fp16"] * 2 == pytest.approx(weights["fp32"], rel=0.05), weights
    doc = bench(arm64_runner, "--artifact", art["fp16"].root, "--warmup", 0, "--repeat", 1, "--outputs-dir", tmp_path)
    expected = art["fp16"].read_expected()
    (out,) = doc["outputs"]
    got = np.fromfile(out["file"], dtype=np.float32).reshape(out["shape"])
    error = max_rel(got, expected[out["name"]])
    atol, rtol = TOLERANCES["fp16"]
    assert TOLERANCES["fp32"][1] < error < rtol, error


@pytest.mark.slow
@pytest.mark.parametrize("name, shape", [("mobilenet-v2", (1, 3, 56, 56)), ("bert-tiny", (1, 16))])
def test_qemu_arm64_bench_matches_onnxruntime_zoo_models(arm64_runner, artifacts, name, shape, tmp_path):
    artifact = artifacts(name, "linux-arm64", shape=shape)  # ~10 s to compile each
    doc = bench(arm64_runner, "--artifact", artifact.root, "--warmup", 0, "--repeat", 1, "--outputs-dir", tmp_path)
    check_outputs_match_expected(doc, artifact)


# ---------------------------------------------------------------- RPC server


class RpcServer:
    """`agoc-runner rpc --port 0 --once` as a context manager; .port from its first stdout line."""

    def __init__(self, command: list, *args: str):
        self.proc = subprocess.Popen(
            [*map(str, command), "rpc", "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        assert line, f"rpc server did not start: {self.proc.stderr.read()}"
        self.port = json.loads(line)["listening"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()


def axpy_library(path: Path, target) -> Path:
    """A one-kernel library: C = 2 A + B over 1024 floats, exported as a shared object."""
    import tvm
    from tvm import te
    from tvm.support import cc

    a, b = te.placeholder((1024,), name="A"), te.placeholder((1024,), name="B")
    c = te.compute((1024,), lambda i: a[i] * 2.0 + b[i], name="C")
    func = te.create_prim_func([a, b, c]).with_attr("global_symbol", "axpy")
    lib = tvm.compile(tvm.IRModule({"axpy": func}), target=target)
    cross = target.get("mtriple", "").startswith("aarch64")
    lib.export_library(str(path), **({"fcompile": cc.cross_compiler("aarch64-linux-gnu-g++")} if cross else {}))
    return path


def rpc_round_trip(port: int, library: Path, key: str = "agoc") -> None:
    import tvm
    from tvm import rpc

    remote = rpc.connect("127.0.0.1", port, key=key)
    remote.upload(str(library))
    kernel = remote.load_module(library.name)
    dev = remote.cpu()
    rng = np.random.default_rng(0)
    a, b = rng.random(1024, dtype=np.float32), rng.random(1024, dtype=np.float32)
    ta, tb = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)
    tc = tvm.runtime.tensor(np.zeros(1024, np.float32), dev)
    kernel["axpy"](ta, tb, tc)
    np.testing.assert_allclose(tc.numpy(), 2 * a + b, rtol=1e-6)
    timing = kernel.time_evaluator("axpy", dev, number=3, repeat=2)(ta, tb, tc)
    assert len(timing.results) == 2 and timing.mean > 0
    # what MetaSchedule's RPC runner calls to fill its argument buffers on the device
    remote.get_function("tvm.contrib.random.random_fill_for_measure")(tc)
    assert np.abs(tc.numpy() - (2 * a + b)).max() > 0


def test_rpc_round_trip_on_host(host_runner, tmp_path):
    library = axpy_library(tmp_path / "axpy.so", {"kind": "llvm"})
    with RpcServer([host_runner], "--once", "--key", "agoc", "--work-dir", str(tmp_path)) as server:
        rpc_round_trip(server.port, library)
        assert server.proc.wait(timeout=30) == 0  # --once: exits after the session
    assert not list(tmp_path.glob("agoc-rpc-*")), "the session work dir was left behind"


def test_rpc_rejects_a_wrong_key_and_keeps_serving(host_runner):
    from tvm import rpc

    with RpcServer([host_runner], "--key", "phone-1") as server:
        with pytest.raises(Exception, match="cannot find server that matches key"):
            rpc.connect("127.0.0.1", server.port, key="phone-2")
        remote = rpc.connect("127.0.0.1", server.port, key="phone-1")
        assert remote.get_function("runtime.NumThreads")() >= 1
        del remote
    assert server.proc.returncode == 0  # SIGTERM stops it cleanly


def test_rpc_round_trip_under_qemu_arm64(arm64_runner, tmp_path):
    library = axpy_library(tmp_path / "axpy.so", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
    with RpcServer(arm64_runner, "--once", "--key", "agoc") as server:
        rpc_round_trip(server.port, library)
        assert server.proc.wait(timeout=60) == 0


def test_rpc_port_in_use_exits_7(host_runner):
    with RpcServer([host_runner], "--key", "x") as server:
        result = run([host_runner], "rpc", "--port", server.port, "--port-end", server.port)
    assert result.returncode == 7 and "cannot bind" in result.stderr


def test_an_onnx_shape_output_comes_back_from_the_arm_runner(arm64_runner, tmp_path, monkeypatch):
    """The VM returns an ONNX Shape output as a shape tuple, not a tensor: the runner writes it as int64."""
    from onnx import TensorProto, helper

    from host.devices import qemu_device
    from models.registry import IR_VERSION, OPSET

    monkeypatch.setenv("AGOC_QEMU_SANDBOX", str(tmp_path / "qemu"))
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    spec = resolve_target("linux-arm64")
    artifact = compile_model(CompileRequest(model, "shape", spec), find_compiler(spec), tmp_path / "a",
                             device=qemu_device())
    assert artifact.manifest.check["status"] == "passed" and artifact.manifest.check["device"] == "qemu"
