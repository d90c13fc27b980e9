"""`agoc doctor`: this machine's tools and a phone through adb (the fake server's emulated one), each finding with
its fix; exit 1 exactly when a check failed."""

import json

from host import doctor
from host.doctor import Finding
from tests.fakeadb import FakeAdbServer
from tests.host.test_cli import assert_clean_error


def test_a_missing_program_fails_only_where_a_run_cannot_do_without_it(tmp_path):
    found = {f.check: f for f in doctor.programs(which=lambda name: None)}
    assert found["g++"].status == "fail" and "apt-get install g++" in found["g++"].fix
    assert all(found[name].status == "warn" and found[name].fix for name in ("aarch64-linux-gnu-g++", "qemu-aarch64",
                                                                          "valgrind", "adb"))
    everything = {f.check: f for f in doctor.programs(which=lambda name: f"/usr/bin/{name}")}
    assert all(f.status == "ok" for f in everything.values()) and everything["adb"].detail == "/usr/bin/adb"
    runners = doctor.runners(tmp_path)  # a checkout with nothing built
    assert [f.status for f in runners] == ["warn", "warn"] and "make runner TARGET=linux-arm64" in runners[1].fix


def test_the_host_report_lists_every_check_and_fails_exactly_when_one_failed(cli):
    result = cli("doctor", "--json")
    findings = [Finding(**f) for f in json.loads(result.stdout)]
    checks = {f.check for f in findings}
    assert {"python: apache-tvm", "python: onnxruntime", "g++", "aarch64-linux-gnu-g++", "qemu-aarch64",
            "runner: host", "runner: linux-arm64"} <= checks
    assert all(f.status in ("ok", "warn", "fail") and (f.status == "ok" or f.fix) for f in findings)
    assert result.exit_code == (1 if any(f.status == "fail" for f in findings) else 0)
    table = cli("doctor")
    assert "aarch64-linux-gnu-g++" in table.stdout and "fix" in table.stdout


def test_a_phone_is_checked_end_to_end_and_its_caveats_are_warnings(cli, phone, runners):
    result = cli("doctor", "--device", phone.serial, "--json")
    found = {f["check"]: f for f in json.loads(result.stdout)}
    assert found["adb connection"]["status"] == "ok" and found["ABI"]["detail"] == "arm64-v8a"
    assert found["push directory"]["status"] == "ok" and found["free space"]["status"] == "ok"
    cores = found["cores"]["detail"]  # the emulated phone: 4 x A55, 3 x A78, 1 x X1
    assert cores.startswith("8: cpu 0-3 at 1.80 GHz; cpu 4-6 at 2.40 GHz; cpu 7 at 2.84 GHz") and "--cores 7" in cores
    assert found["governors"]["status"] == "warn" and "schedutil" in found["governors"]["detail"]
    assert found["thermal zones"]["status"] == "warn"  # the emulated phone has none
    assert found["FP16 arithmetic"]["status"] == "ok"  # its cores list asimdhp
    assert found["runner"]["status"] == "ok", found["runner"]
    assert not phone.host_path("/data/local/tmp/agoc/doctor-exec.sh").exists()  # its probe removed


def test_an_unknown_serial_and_a_phone_of_another_abi_fail_with_the_fix_named(cli, phone, tmp_path, monkeypatch):
    result = cli("doctor", "--device", "no-such-phone")
    assert_clean_error(result, "adb connection")
    assert "emulator-5554 (device)" in result.stdout
    with FakeAdbServer(tmp_path / "x86", serial="x86-phone", props={"ro.product.cpu.abi": "x86_64"}) as other:
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(other.port))
        result = cli("doctor", "--device", "x86-phone", "--json")
        found = {f["check"]: f for f in json.loads(result.stdout)}
    assert result.exit_code == 1 and found["ABI"]["status"] == "fail" and "runner" not in found


def test_a_phone_without_fp16_arithmetic_is_told_to_build_fp32():
    from types import SimpleNamespace

    from host import doctor

    a53 = SimpleNamespace(read=lambda path: "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 cpuid\n")
    found = doctor.fp16(a53)
    assert found.status == "warn" and "--precision fp32" in found.fix
    assert doctor.fp16(SimpleNamespace(read=lambda path: None)).detail == "/proc/cpuinfo not readable"
