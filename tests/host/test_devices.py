"""Devices end to end: the qemu stand-in and an adb phone (the fake adb endpoint), through the CLI.

Times under qemu are not asserted on (they are emulated); outputs are real and must match onnxruntime.
"""

import json

import pytest


@pytest.fixture(scope="module")
def arm_artifact(tmp_path_factory, runners):
    from typer.testing import CliRunner

    from host.cli import app

    out = tmp_path_factory.mktemp("arm") / "tiny-dwsep"
    result = CliRunner().invoke(app, ["compile", "zoo:tiny-dwsep", "--target", "linux-arm64", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def test_an_arm_build_keeps_inside_what_half_its_cores_l2_holds(arm_artifact, cli):
    """linux-arm64's Cortex-A76: AGO's locality rule on by default at 256 KiB (half its 512 KiB L2), recorded; `agoc
    targets` lists the geometry with its source."""
    info = json.loads((arm_artifact / "manifest.json").read_text())["partition_info"]
    assert info["keep_inside"] == 256 * 1024
    result = cli("targets")
    text = " ".join(result.stdout.split())
    assert result.exit_code == 0 and "a76: Cortex-A76-class" in text and "Source: Arm Cortex-A76 Core TRM" in text


def test_the_phone_target_needs_no_ndk(tmp_path, monkeypatch, runners):
    """--target android-arm64 builds with Debian's cross g++ (the code linux-arm64 builds, for the runner bundle), no
    NDK in sight; checked under qemu before it is written."""
    from typer.testing import CliRunner

    from host.cli import app

    for name in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "ANDROID_NDK"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "phone"
    result = CliRunner().invoke(app, ["compile", "zoo:tiny-cnn", "--target", "android-arm64", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["compiler"]["kind"] == "gnu-cross" and manifest["target"]["preset"] == "android-arm64"
    assert manifest["check"]["status"] == "passed" and manifest["check"]["device"] == "qemu"


@pytest.fixture
def qemu_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("AGOC_QEMU_SANDBOX", str(tmp_path / "qemu"))
    return tmp_path / "qemu"


def test_verify_on_qemu_matches_onnxruntime(cli, arm_artifact, qemu_sandbox):
    result = cli("verify", arm_artifact, "--device", "qemu", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and report["device"] == "qemu" and report["outputs"][0]["max_rel"] < 1e-5


def test_bench_and_deploy_on_qemu(cli, arm_artifact, qemu_sandbox):
    result = cli("bench", arm_artifact, "--device", "qemu", "--warmup", "1", "--repeat", "3", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["device"] == "qemu" and len(data["samples_ms"]) == 3 and data["median_ms"] > 0
    result = cli("deploy", arm_artifact, "--device", "qemu")
    assert result.exit_code == 0
    deployed = list((qemu_sandbox / "data/local/tmp/agoc").iterdir())
    assert len(deployed) == 1  # content-addressed: bench and deploy share one directory
    assert sorted(p.name for p in deployed[0].iterdir()) == [".complete", "agoc-runner", "artifact", "lib"]


def test_host_artifact_is_refused_by_an_arm_device(cli, tmp_path, qemu_sandbox, runners):
    assert cli("compile", "zoo:tiny-cnn", "-o", tmp_path / "h").exit_code == 0
    result = cli("bench", tmp_path / "h", "--device", "qemu")
    assert result.exit_code == 1 and "needs an ARM64 artifact" in result.stderr


def test_local_bench_uses_the_host_runner(cli, tmp_path, runners, monkeypatch):
    assert cli("compile", "zoo:tiny-cnn", "-o", tmp_path / "h").exit_code == 0
    result = cli("bench", tmp_path / "h", "--device", "local", "--repeat", "3", "--per-kernel", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["device_kind"] == "local" and len(data["samples_ms"]) == 3
    manifest = json.loads((tmp_path / "h" / "manifest.json").read_text())
    assert manifest["check"]["device"] == "this machine (agoc-runner)"  # compile's self-check ran the runner too
    assert {k["name"] for k in data["kernels"]} == {k["name"] for k in manifest["kernels"]}
    # each kernel's work from its PrimFunc, its rate and its share of the peak the runner measured
    convs = [k for k in data["kernels"] if "conv" in k["name"]]
    assert convs and all(k["flops"] > 0 and k["gflops"] > 0 and 0 < k["peak_fraction"] for k in convs)
    assert all(k["peak_fraction"] == pytest.approx(k["gflops"] / data["peak"]["gflops"]) for k in convs)
    shown = cli("bench", tmp_path / "h", "--device", "local", "--repeat", "3", "--per-kernel")
    assert shown.exit_code == 0 and "of peak" in shown.stdout and "GFLOP/s" in shown.stdout
    # a host build runs on this machine: no --device needed, whatever ANDROID_SERIAL names
    monkeypatch.setenv("ANDROID_SERIAL", "a-phone-not-attached")
    plain = cli("bench", tmp_path / "h", "--repeat", "2", "--json")
    assert plain.exit_code == 0, plain.stderr
    assert json.loads(plain.stdout)["device_kind"] == "local"


def test_adb_phone_is_listed_deployed_to_benched_and_verified(cli, arm_artifact, phone):
    result = cli("devices", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["emulator-5554"]["kind"] == "adb" and rows["emulator-5554"]["abi"] == "arm64-v8a"
    assert rows["emulator-5554"]["usable"] and rows["emulator-5554"]["cores"] == 8

    result = cli("deploy", arm_artifact)  # no --device: the only attached phone
    assert result.exit_code == 0, result.stderr
    assert "emulator-5554:/data/local/tmp/agoc/" in result.stdout
    remote = result.stdout.split("emulator-5554:")[1].split()[0]
    assert (phone.host_path(remote) / "artifact" / "model.so").exists()

    result = cli("bench", arm_artifact, "--device", "emulator-5554", "--repeat", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["device_kind"] == "adb"

    result = cli("verify", arm_artifact, "--device", "emulator-5554")
    assert result.exit_code == 0, result.stderr
    assert "PASS" in result.stdout


def test_android_serial_selects_the_phone(cli, arm_artifact, phone, monkeypatch):
    monkeypatch.setenv("ANDROID_SERIAL", "emulator-5554")
    result = cli("bench", arm_artifact, "--repeat", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["device"] == "emulator-5554"
