"""Target presets and cross-toolchain detection."""

import os
import stat

import pytest

from tests.conftest import require_tool
from toolchain.errors import TargetError
from toolchain.targets import PRESETS_BY_NAME, find_compiler, resolve_target


def test_presets_table_has_the_targets():
    assert set(PRESETS_BY_NAME) == {"host", "host-avx2", "linux-arm64", "android-arm64", "android-arm64-ndk"}


def test_host_avx2_preset_stays_below_avx512_for_valgrind():
    from tvm.target import codegen

    spec = resolve_target("host-avx2")
    assert spec.tvm_target["mcpu"] == "haswell" and spec.runs_on_host
    assert not codegen.llvm_cpu_has_features("avx512f", spec.tvm())


def test_host_preset_names_the_cpu_and_core_count():
    spec = resolve_target("host")
    assert spec.tvm_target["kind"] == "llvm"
    assert spec.tvm_target["mcpu"]  # never bare llvm: that emits SSE2-only code on x86
    assert spec.num_cores == os.cpu_count()
    assert spec.runs_on_host


def test_arm64_presets_set_triple_neon_and_four_cores():
    for name, triple in [("linux-arm64", "aarch64-linux-gnu"), ("android-arm64", "aarch64-linux-gnu"),
                         ("android-arm64-ndk", "aarch64-linux-android")]:
        spec = resolve_target(name)
        assert spec.tvm_target["mtriple"] == triple
        assert "+neon" in spec.tvm_target["mattr"]
        assert spec.num_cores == 4
    assert resolve_target("linux-arm64", mcpu="cortex-a55", num_cores=2).tvm_target["mcpu"] == "cortex-a55"


def test_float16_turns_on_arm_fp16_arithmetic_and_is_refused_where_there_is_none():
    spec = resolve_target("linux-arm64", precision="FP16")
    assert spec.precision == "fp16" and spec.tvm_target["mattr"] == ["+neon", "+fullfp16"]
    assert spec.to_json()["precision"] == "fp16"
    assert "precision" not in resolve_target("linux-arm64").to_json()  # fp32 artifacts' manifests as before
    if not spec.runs_on_host:
        with pytest.raises(TargetError, match="--precision fp16 needs FP16 arithmetic.*linux-arm64, android-arm64"):
            resolve_target("host", precision="fp16")
    with pytest.raises(TargetError, match="unknown precision 'bf16'; choose one of: fp32, fp16"):
        resolve_target("linux-arm64", precision="bf16")


def test_unknown_target_lists_the_choices():
    with pytest.raises(TargetError,
                       match="unknown target 'x86'; choose one of: host, host-avx2, linux-arm64, android-arm64, "
                             "android-arm64-ndk"):
        resolve_target("x86")


def test_unknown_cpu_and_bad_core_count_are_rejected():
    with pytest.raises(TargetError, match="LLVM does not know CPU 'cortex-z9'"):
        resolve_target("linux-arm64", mcpu="cortex-z9")
    with pytest.raises(TargetError, match="at least 1"):
        resolve_target("host", num_cores=0)


def test_linux_arm64_uses_debian_cross_gxx():
    require_tool("aarch64-linux-gnu-g++")
    compiler = find_compiler(resolve_target("linux-arm64"))
    assert compiler.kind == "gnu-cross"
    assert compiler.path.endswith("aarch64-linux-gnu-g++")
    assert "aarch64-linux-gnu-g++" in compiler.version


def test_linux_arm64_without_cross_gxx_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TargetError, match="apt-get install g\\+\\+-aarch64-linux-gnu"):
        find_compiler(resolve_target("linux-arm64"))


def test_android_without_ndk_says_to_set_android_ndk_home(monkeypatch):
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    with pytest.raises(TargetError, match="set ANDROID_NDK_HOME.*or use --target android-arm64: its builds run on"):
        find_compiler(resolve_target("android-arm64-ndk"))
    # the phone target itself needs no NDK: Debian's cross g++, the code linux-arm64 builds, for the runner bundle
    cxx = require_tool("aarch64-linux-gnu-g++")
    spec = resolve_target("android-arm64")
    assert find_compiler(spec).kind == "gnu-cross" and find_compiler(spec).path.endswith(cxx.split("/")[-1])
    assert spec.tvm_target == resolve_target("linux-arm64").tvm_target


def test_android_with_an_ndk_tree_missing_clang_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("ANDROID_NDK_HOME", str(tmp_path))
    with pytest.raises(TargetError, match="has no aarch64-linux-android28-clang\\+\\+"):
        find_compiler(resolve_target("android-arm64-ndk"))


def make_fake_ndk(root, real_cxx: str):
    """An NDK-shaped tree whose aarch64-linux-android28-clang++ forwards to the Debian cross g++.

    No NDK can be downloaded here; this exercises agoc's NDK discovery and invocation for real
    while the actual code generation is done by an aarch64 compiler we do have.
    """
    bindir = root / "toolchains" / "llvm" / "prebuilt" / "linux-x86_64" / "bin"
    bindir.mkdir(parents=True)
    clang = bindir / "aarch64-linux-android28-clang++"
    clang.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "Android (fake) clang version 17.0.2"; exit 0; fi\n'
        f'exec "{real_cxx}" "$@"\n'
    )
    clang.chmod(clang.stat().st_mode | stat.S_IEXEC)
    return clang


def test_android_finds_ndk_clang_under_android_ndk_home(monkeypatch, tmp_path):
    cxx = require_tool("aarch64-linux-gnu-g++")
    clang = make_fake_ndk(tmp_path, cxx)
    monkeypatch.setenv("ANDROID_NDK_HOME", str(tmp_path))
    compiler = find_compiler(resolve_target("android-arm64-ndk"))
    assert compiler.kind == "ndk"
    assert compiler.path == str(clang)
    assert compiler.version == "Android (fake) clang version 17.0.2"
    assert "-static-libstdc++" in compiler.options


def test_arm_presets_follow_a_cache_geometry_by_their_cpu_and_the_host_its_own():
    """AGO's locality defaults (--keep-inside) follow the phone's cache: an ARM preset's geometry by --mcpu (else
    its own), --geometry over both, on host this machine's caches (none known here: the tests' own setting); half
    the L2 is kept inside."""
    from toolchain import geometry

    a76, why = geometry.of_target(PRESETS_BY_NAME["linux-arm64"].geometry, None, None)
    assert a76.name == "a76" and "preset" in why and geometry.locality_kib(a76) == 256
    assert geometry.of_target("a76", "cortex-a55", None)[0].name == "a55"
    assert geometry.locality_kib(geometry.of_target("a76", "cortex-x1", None)[0]) == 512
    assert "no geometry known for --mcpu neoverse-n1" in geometry.of_target("a76", "neoverse-n1", None)[1]
    assert geometry.of_target(PRESETS_BY_NAME["host"].geometry, None, None) == (
        None, "a host target whose caches are not known")
    assert geometry.of_target(None, None, "small-slc")[0].name == "small-slc"
    assert geometry.of_target("a76", None, "none")[0] is None and geometry.locality_kib(None) == 0
    with pytest.raises(TargetError, match="unknown cache geometry 'a99'; choose one of: a76, a55"):
        geometry.of_target("a76", None, "a99")
    for g in geometry.GEOMETRIES:
        assert "TRM" in g.source and g.l2.size > g.l1d.size


def _cache(root, index, level, kind, size, ways=8):
    d = root / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("ways_of_associativity", ways),
                        ("coherency_line_size", 64)):
        (d / name).write_text(f"{value}\n")


def test_a_host_target_follows_this_machines_caches_as_linux_describes_them(tmp_path, monkeypatch):
    """The host presets' geometry is read from sysfs (here a copy): L1D, L2, the shared levels; half its L2 kept
    inside. Without an L2 (or a tree) none is known, and the locality rule stays off."""
    from toolchain import geometry

    _cache(tmp_path, 0, 1, "Data", "48K", 12)
    _cache(tmp_path, 1, 1, "Instruction", "32K")
    _cache(tmp_path, 2, 2, "Unified", "1024K", 16)
    _cache(tmp_path, 3, 3, "Unified", "32M", 16)
    monkeypatch.setenv(geometry.HOST_CACHES_ENV, str(tmp_path))
    host, why = geometry.of_preset("host-avx2", None, None)
    assert why == "this machine's caches" and host.name == "host"
    assert (host.l1d.size, host.l1d.assoc, host.l1i.size) == (48 * 1024, 12, 32 * 1024)
    assert host.l2.size == 1 << 20 and [c.size for c in host.llc] == [32 << 20]
    assert geometry.locality_kib(host) == 512 and "1MiB L2, 32MiB shared" in host.description
    assert geometry.of_preset("host", None, "a76")[0].name == "a76"  # --geometry still decides
    assert geometry.of_preset("host", None, "none")[0] is None
    (tmp_path / "index2" / "size").write_text("lots\n")
    assert geometry.of_host() is None  # unreadable: none known, not a guess
    assert geometry.of_host(str(tmp_path / "missing")) is None
