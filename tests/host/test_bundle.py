"""The runner bundle (host/bundle.py): what a linux-arm64 device is given, and the runner started through the
bundle's own glibc loader under qemu with no sysroot — the command line a phone runs."""

from pathlib import Path

import pytest

from host import bundle, devices, doctor

ROOT = Path(__file__).resolve().parents[2]


def test_the_dynamic_section_names_what_a_file_needs(runners, tmp_path):
    runner, _ = devices.runner_build("linux-arm64")
    assert {"libtvm_runtime.so", "libtvm_ffi.so", "libc.so.6"} <= set(bundle.needed(runner))
    assert bundle.needed(Path(bundle.cross_libdir()) / bundle.LOADER) == []  # the loader is static
    (tmp_path / "x").write_text("#!/bin/sh\n")
    with pytest.raises(bundle.BundleError, match="not a 64-bit"):
        bundle.needed(tmp_path / "x")


def test_the_bundle_holds_the_loader_and_everything_its_files_need_once(runners):
    runner, libs = devices.runner_build("linux-arm64")
    names = [p.name for p in libs]
    assert len(names) == len(set(names))
    assert {bundle.LOADER, "libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1"} <= set(names)
    for path in [runner, *libs]:  # closed: every file's needs are in it
        assert set(bundle.needed(path.resolve())) <= set(names), path


def test_a_library_the_cross_toolchain_lacks_is_named_with_the_fix(runners, tmp_path, monkeypatch):
    (tmp_path / bundle.LOADER).write_bytes((bundle.cross_libdir() / bundle.LOADER).read_bytes())
    monkeypatch.setenv("AGOC_CROSS_LIBDIR", str(tmp_path))
    with pytest.raises(devices.DeviceError, match=r"libc\.so\.6 .* is not in .*make setup"):
        devices.runner_build("linux-arm64")


def test_qemu_runs_the_bundle_through_its_loader_with_no_sysroot(runners, tmp_path, monkeypatch):
    monkeypatch.delenv("AGOC_QEMU_SYSROOT", raising=False)
    device = devices.qemu_device(tmp_path / "qemu")
    remote = device.deploy_runner()
    argv, env = device.command(remote, ["--help"])
    assert argv[:3] == [f"{remote}/lib/{bundle.LOADER}", "--library-path", f"{remote}/lib"] and env == {}
    command, _ = device.transport._command(argv, env)
    assert "-L" not in command and command[1].endswith(bundle.LOADER)
    rc, out, err = device.transport.execute(argv, env, remote, 120)
    assert rc == 0 and "agoc-runner" in out + err, err


def test_doctor_lists_the_bundles_files_sizes_and_packages(runners):
    (finding,) = doctor.bundle(ROOT)
    assert finding.status == "ok" and bundle.LOADER in finding.detail and "libc.so.6" in finding.detail
    assert "MB" in finding.detail and "agoc-runner" in finding.detail
