"""A tuning context loads only its target's tensor intrinsics (the others stay importable by name)."""

import subprocess
import sys

from toolchain.tune.intrinsics import modules_for


def test_each_target_kind_gets_its_own_intrinsics():
    assert modules_for("llvm", "x86_64-linux-gnu") == ("x86",)
    assert modules_for("llvm", "") == ("x86",)
    assert modules_for("llvm", "aarch64-linux-android") == ("arm_cpu",)
    assert modules_for("llvm", "armv7a-linux-gnueabihf") == ("arm_cpu",)
    assert modules_for("cuda", "") == ("cuda",)
    assert modules_for("opencl", "") == ()


PROBE = """
import sys
import tvm
from tvm.s_tir import TensorIntrin
from toolchain.targets import resolve_target
from toolchain.tune.intrinsics import tune_context
from tvm import te
a = te.placeholder((16, 16), name="a")
b = te.compute((16, 16), lambda i, j: a[i, j] * 2.0, name="b")
target = resolve_target(sys.argv[1]).tvm()
tune_context(mod=tvm.IRModule({"main": te.create_prim_func([a, b])}), target=target,
             space_generator="post-order-apply")
loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("tvm.s_tir.tensor_intrin."))
TensorIntrin.get(sys.argv[2])  # registered
import tvm.s_tir.tensor_intrin.rocm  # the others still import by name
print(" ".join(loaded))
"""


def _loaded(target: str, intrinsic: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, target, intrinsic], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stdout.split())


def test_a_host_tuning_context_registers_x86_intrinsics_only():
    loaded = _loaded("host", "dot_16x4_vnni")
    assert "x86" in loaded and not loaded & {"cuda", "hexagon", "arm_cpu"}


def test_an_arm64_tuning_context_registers_arm_intrinsics_only():
    loaded = _loaded("linux-arm64", "dot_4x4_i8i8s32_neon")
    assert "arm_cpu" in loaded and not loaded & {"cuda", "hexagon", "x86"}
