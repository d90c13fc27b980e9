"""Target presets (a table) and cross-toolchain detection.

A preset names where kernels run; resolving it gives a :class:`TargetSpec`:
the TVM target as a dict (TVM 0.27 targets are dicts, and MetaSchedule needs
``num-cores``) plus which C/C++ compiler links the kernel library.

Facts behind the defaults (see design §3):

* A bare ``{"kind": "llvm"}`` on x86 emits SSE2-only code and ``mcpu=native``
  is rejected, so the host preset asks LLVM for the host CPU's name and sets
  ``mcpu`` explicitly.
* Activations are laid out NHWC (:data:`LAYOUTS`): a conv's output channels are the innermost,
  vectorised loop, as in XNNPACK / TFLite. ONNX's NCHW leaves only W to vectorise, and W is 4-56
  wide in a mobile CNN at 112×112: measured on this host (MobileNet-V2 @112, seven of its conv
  kernels, MetaSchedule at 48 trials each), the NHWC kernels were 1.3-2.3× faster, 1.7× summed.
* A phone runs Linux: an aarch64 glibc program runs under ``adb shell`` when its
  own loader and libraries come with it (host/bundle.py), so ``android-arm64``
  builds exactly what ``linux-arm64`` does (Debian's cross g++, no NDK) for that
  bundle. A library linked with glibc does not load in a bionic process, so
  ``android-arm64-ndk`` (bionic, for an NDK-built runner) needs the NDK's clang
  and never falls back to g++.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field

from toolchain.errors import TargetError


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    mtriple: str | None  # None: the host's own triple
    mcpu: str | None  # None: detect (host only)
    mattr: tuple[str, ...]
    linker: str  # "host" | "gnu-cross" | "ndk"
    runs_on_host: bool
    geometry: str | None = None  # the cache geometry AGO's locality defaults follow (toolchain/geometry.py; host: this
    # machine's own)


#: what every ARM preset assumes of the phone: a Cortex-A76 big core, NEON, its cache geometry (``--mcpu`` changes both)
_A76 = {"mcpu": "cortex-a76", "mattr": ("+neon",), "geometry": "a76"}

PRESETS: tuple[Preset, ...] = (
    Preset(
        name="host",
        description="this machine (x86-64 or aarch64), CPU detected, for verification and host benchmarks",
        mtriple=None,
        mcpu=None,
        mattr=(),
        linker="host",
        runs_on_host=True,
        geometry="host",
    ),
    Preset(
        name="host-avx2",
        description="this x86-64 machine at AVX2 (haswell): kernels valgrind can run, for the phone-cache proxy",
        mtriple=None,
        mcpu="haswell",  # valgrind 3.19 rejects AVX-512 (design §5)
        mattr=(),
        linker="host",
        runs_on_host=True,
        geometry="host",
    ),
    Preset(
        name="linux-arm64",
        description="aarch64 Linux (glibc): Debian cross g++; runs under qemu-aarch64, on ARM64 boards and on Android "
        "phones through adb (the runner bundle brings its glibc)",
        mtriple="aarch64-linux-gnu",
        linker="gnu-cross",
        runs_on_host=platform.machine() in ("aarch64", "arm64"),
        **_A76,
    ),
    Preset(
        name="android-arm64",
        description="ARM64 Android phones through adb, no NDK: Debian cross g++ (glibc), run by the runner bundle "
        "(its own loader and libraries pushed with it); the same code as linux-arm64",
        mtriple="aarch64-linux-gnu",
        linker="gnu-cross",
        runs_on_host=False,
        **_A76,
    ),
    Preset(
        name="android-arm64-ndk",
        description="ARM64 Android phones, bionic builds for an NDK-built runner (optional): Android NDK clang from "
        "ANDROID_NDK_HOME",
        mtriple="aarch64-linux-android",
        linker="ndk",
        runs_on_host=False,
        **_A76,
    ),
)

PRESETS_BY_NAME = {p.name: p for p in PRESETS}

#: --layout: the activation layout kernels compute in (the model's inputs and outputs keep ONNX's
#: NCHW; the transposes at the edges are kernels of their own).
LAYOUTS = {
    "NHWC": "channels innermost: convs vectorise over output channels (the default)",
    "NCHW": "ONNX's own layout: convs vectorise over W",
}
DEFAULT_LAYOUT = "NHWC"

#: --precision: what convs, matmuls and the ops between them compute in (the model's inputs and outputs stay
#: float32; casts at the edges). Tolerances: toolchain/verify.py TOLERANCES.
PRECISIONS = {
    "fp32": "float32 throughout (the default)",
    "fp16": "float16 weights, activations and accumulators (ARMv8.2-A FP16 arithmetic: the ARM presets only); "
            "half the weight bytes, twice the lanes per NEON register, outputs within 2 % of their largest value",
}
#: what a precision's convs and matmuls compute in (a PrimFunc's dtype)
DTYPES = {"fp32": "float32", "fp16": "float16"}
#: the LLVM feature an fp16 build turns on (every ARMv8.2-A core: Cortex-A55, A75 and later)
FP16_MATTR = "+fullfp16"

#: Android API level used for the NDK compiler name (aarch64-linux-android<API>-clang++).
DEFAULT_ANDROID_API = 28

_GNU_CROSS_CXX = "aarch64-linux-gnu-g++"


@dataclass(frozen=True)
class Compiler:
    """The compiler that links the kernel library."""

    kind: str  # "host" | "gnu-cross" | "ndk"
    path: str
    version: str
    options: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "version": self.version, "options": list(self.options)}


@dataclass(frozen=True)
class TargetSpec:
    preset: str
    tvm_target: dict = field(hash=False)
    linker: str
    runs_on_host: bool
    layout: str = DEFAULT_LAYOUT  # activation layout (LAYOUTS)
    pad_channels: bool = True  # convs / matmuls compute padded output channels (toolchain/padding.py)
    fast_math: bool = True  # exp / erf / tanh / sigmoid / softmax as polynomials (toolchain/fastmath.py)
    precision: str = "fp32"  # PRECISIONS
    weight_prefetch: bool = True  # prefetch the next task's weight panel where toolchain/prefetch.py's rules say
    winograd: bool = True  # 3×3 stride-1 convs as Winograd's (toolchain/winograd.py; NHWC, float32)

    @property
    def num_cores(self) -> int:
        return int(self.tvm_target["num-cores"])

    def to_json(self) -> dict:
        return {"preset": self.preset, "tvm_target": self.tvm_target, "layout": self.layout,
                "pad_channels": self.pad_channels, "fast_math": self.fast_math,
                **({"precision": self.precision} if self.precision != "fp32" else {}),
                **({} if self.weight_prefetch else {"weight_prefetch": False}),
                **({} if self.winograd else {"winograd": False})}

    def tvm(self):
        import tvm

        return tvm.target.Target(self.tvm_target)


def host_cpu() -> str:
    """LLVM's name for this machine's CPU (e.g. ``znver5``, ``skylake-avx512``)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def _host_triple() -> str:
    machine = platform.machine()
    return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}.get(
        machine, f"{machine}-linux-gnu"
    )


def _check_cpu(mcpu: str, triple: str) -> None:
    from tvm.target import codegen

    if not codegen.llvm_is_valid_cpu(mcpu, triple):
        raise TargetError(
            f"LLVM does not know CPU '{mcpu}' for {triple}; pass a valid --mcpu "
            f"(e.g. cortex-a76, cortex-a55 for ARM64; haswell, skylake-avx512, znver4 for x86-64)"
        )


def check_layout(layout: str) -> str:
    """``layout`` as a :data:`LAYOUTS` key (any case); raises :class:`TargetError` naming the choices."""
    if layout.upper() not in LAYOUTS:
        raise TargetError(f"unknown layout '{layout}'; choose one of: {', '.join(LAYOUTS)}")
    return layout.upper()


def check_precision(precision: str, preset: Preset) -> str:
    """``precision`` as a :data:`PRECISIONS` key (any case) that ``preset`` computes in; raises :class:`TargetError`
    naming the fix."""
    precision = precision.lower()
    if precision not in PRECISIONS:
        raise TargetError(f"unknown precision '{precision}'; choose one of: {', '.join(PRECISIONS)}")
    if precision == "fp16" and not (preset.mtriple or _host_triple()).startswith("aarch64"):
        arm = ", ".join(p.name for p in PRESETS if (p.mtriple or "").startswith("aarch64"))
        raise TargetError(f"--precision fp16 needs FP16 arithmetic, which target '{preset.name}' does not have on "
                          f"this machine (x86 would convert every element to float32 and back); build for an ARM "
                          f"target ({arm}) or drop --precision")
    return precision


def resolve_target(name: str, mcpu: str | None = None, num_cores: int | None = None,
                   layout: str | None = None, pad_channels: bool = True, fast_math: bool = True,
                   precision: str = "fp32", weight_prefetch: bool = True, winograd: bool = True) -> TargetSpec:
    """Preset name + options → :class:`TargetSpec`. Raises :class:`TargetError`."""
    preset = PRESETS_BY_NAME.get(name)
    if preset is None:
        raise TargetError(f"unknown target '{name}'; choose one of: {', '.join(PRESETS_BY_NAME)}")
    layout = check_layout(layout or DEFAULT_LAYOUT)
    precision = check_precision(precision, preset)
    if num_cores is not None and num_cores < 1:
        raise TargetError(f"--num-cores must be at least 1 (got {num_cores})")
    triple = preset.mtriple or _host_triple()
    cpu = mcpu or preset.mcpu or host_cpu()
    _check_cpu(cpu, triple)
    target: dict = {"kind": "llvm", "mcpu": cpu}
    if preset.mtriple:
        target["mtriple"] = preset.mtriple
    if preset.mattr or precision == "fp16":
        target["mattr"] = list(preset.mattr) + ([FP16_MATTR] if precision == "fp16" else [])
    default_cores = (os.cpu_count() or 1) if preset.runs_on_host else 4  # 4: a phone's big+mid cluster
    target["num-cores"] = int(num_cores or default_cores)
    return TargetSpec(preset=preset.name, tvm_target=target, linker=preset.linker, runs_on_host=preset.runs_on_host,
                      layout=layout, pad_channels=pad_channels, fast_math=fast_math, precision=precision,
                      weight_prefetch=weight_prefetch, winograd=winograd)


def preset_of(tvm_target: dict) -> str:
    """The preset whose triple a recorded TVM target (a tuning database's) names: host when it has none
    or this machine's own."""
    triple = tvm_target.get("mtriple")
    if triple in (None, _host_triple()):
        return "host"
    for preset in PRESETS:
        if preset.mtriple == triple:
            return preset.name
    raise TargetError(f"no target preset builds for {triple}; choose one with --target")


def _version_line(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except OSError:
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def _ndk_compiler(api: int) -> Compiler:
    home = os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not home:
        raise TargetError(
            "android-arm64-ndk needs the Android NDK: install it (r26 or newer, developer.android.com/ndk) and "
            "set ANDROID_NDK_HOME=/path/to/android-ndk — or use --target android-arm64: its builds run on a phone "
            "through adb with the runner bundle, no NDK needed (docs/devices.md#setting-up-a-real-phone)"
        )
    pattern = os.path.join(home, "toolchains", "llvm", "prebuilt", "*", "bin", f"aarch64-linux-android{api}-clang++")
    found = sorted(glob.glob(pattern))
    if not found:
        raise TargetError(
            f"ANDROID_NDK_HOME={home} has no aarch64-linux-android{api}-clang++ under toolchains/llvm/prebuilt/*/bin; "
            "point ANDROID_NDK_HOME at an NDK r26+ root"
        )
    # Static libc++ so the library needs nothing from the phone but bionic.
    return Compiler("ndk", found[0], _version_line(found[0]), ("-static-libstdc++",))


def find_compiler(spec: TargetSpec, android_api: int = DEFAULT_ANDROID_API) -> Compiler:
    """The compiler that links kernels for ``spec``; raises :class:`TargetError` naming what to install."""
    if spec.linker == "host":
        cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if not cxx:
            raise TargetError("no C++ compiler on PATH for the host target; install g++ (apt-get install g++)")
        return Compiler("host", cxx, _version_line(cxx))
    if spec.linker == "gnu-cross":
        cxx = shutil.which(_GNU_CROSS_CXX)
        if not cxx:
            raise TargetError(
                f"linux-arm64 needs {_GNU_CROSS_CXX}: run `make setup` or `apt-get install g++-aarch64-linux-gnu`"
            )
        return Compiler("gnu-cross", cxx, _version_line(cxx))
    if spec.linker == "ndk":
        return _ndk_compiler(android_api)
    raise TargetError(f"target '{spec.preset}' has unknown linker kind '{spec.linker}'")
