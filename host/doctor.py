"""`agoc doctor`: what a run needs, checked one thing at a time — this machine's tools and, with ``--device``, a
phone through adb — each finding with what to do about it. Checks are rows of a table; nothing here prints."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

#: where agoc puts what it pushes to a phone (host.devices.RunnerDevice.base)
PUSH_DIR = "/data/local/tmp/agoc"
#: free space the push directory should have: the runner and its libraries, an artifact of a zoo model at 224
MIN_FREE_MB = 200
#: governors that keep a benchmark's clocks where they are
STEADY_GOVERNORS = ("performance",)


@dataclass(frozen=True)
class Finding:
    """One check's result: ``status`` ok, warn (works, with a caveat) or fail (a run needing it stops)."""

    check: str
    status: str
    detail: str
    fix: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def ok(check: str, detail: str) -> Finding:
    return Finding(check, "ok", detail)


def warn(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, "warn", detail, fix)


def fail(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, "fail", detail, fix)


# ----------------------------------------------------------------------------- this machine

#: the Python packages a run imports, and what needs each
PACKAGES = (("apache-tvm", "compiling and tuning"), ("onnx", "reading models"),
            ("onnxruntime", "the reference every build is checked against"), ("numpy", "everything"),
            ("adbutils", "phones"), ("xgboost", "the tuner's cost model"))
#: programs on PATH: (name, what needs it, how to get it, whether a run fails without it)
PROGRAMS = (
    ("g++", "building host artifacts and the runner", "apt-get install g++", True),
    ("aarch64-linux-gnu-g++", "building ARM64 artifacts (--target linux-arm64/android-arm64)",
     "apt-get install g++-aarch64-linux-gnu (make setup does)", False),
    ("qemu-aarch64", "running ARM64 builds here (--device qemu, the compile's ARM check)",
     "apt-get install qemu-user (make setup does)", False),
    ("valgrind", "the phone-cache proxy (bench --proxy)", "apt-get install valgrind (make setup does)", False),
    ("adb", "starting the adb server for phones", "apt-get install adb, or the Android platform-tools", False),
)


def packages() -> list[Finding]:
    found = []
    for name, why in PACKAGES:
        try:
            found.append(ok(f"python: {name}", importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            found.append(fail(f"python: {name}", f"not installed (needed for {why})", "make setup"))
    return found


def programs(which=shutil.which) -> list[Finding]:
    found = []
    for name, why, fix, needed in PROGRAMS:
        path = which(name)
        if path:
            found.append(ok(name, path))
        else:
            found.append((fail if needed else warn)(name, f"not on PATH (needed for {why})", fix))
    return found


def runners(repo: Path) -> list[Finding]:
    """The C++ runner for this machine and for ARM64 Linux (with its TVM runtime libraries)."""
    found = []
    for target in ("host", "linux-arm64"):
        runner = repo / "build" / "runner" / target / "agoc-runner"
        if runner.is_file() and os.access(runner, os.X_OK):
            libs = sorted(p.name for p in runner.parent.glob("*.so"))
            found.append(ok(f"runner: {target}", f"{runner}" + (f" with {', '.join(libs)}" if libs else "")))
        else:
            found.append(warn(f"runner: {target}", f"not built ({runner})", f"make runner TARGET={target} "
                              "(make runners builds both)"))
    return found


def bundle(repo: Path) -> list[Finding]:
    """What a linux-arm64 device is given (host/bundle.py): its files, their size and where each comes from."""
    from host import bundle as bundled
    from host import devices

    runner = repo / "build" / "runner" / "linux-arm64" / "agoc-runner"
    if not runner.is_file():
        return []  # the runner finding says how to build it
    try:
        runner, libs = devices.runner_build("linux-arm64")
    except devices.DeviceError as exc:
        return [fail("bundle: linux-arm64", str(exc), "make setup (the aarch64 cross toolchain's libraries)")]
    files = bundled.describe(runner, libs)
    total = sum(f.bytes for f in files) / 2**20
    listed = "; ".join(f"{f.name} {f.bytes / 2**20:.1f} MB ({f.source})" for f in files)
    return [ok("bundle: linux-arm64", f"{len(files)} files, {total:.1f} MB, started through {bundled.LOADER}: "
               f"{listed}")]


def host_findings(repo: Path, which=shutil.which) -> list[Finding]:
    return [*packages(), *programs(which), *runners(repo), *bundle(repo)]


# ----------------------------------------------------------------------------- a phone


class Phone:
    """The shell of one adb device: ``run(command)`` -> (exit code, output)."""

    def __init__(self, device):
        self.device = device

    def run(self, command: str, timeout: float = 30) -> tuple[int, str]:
        result = self.device.shell2(command, timeout=timeout)
        return result.returncode, result.output

    def read(self, path: str) -> str | None:
        rc, out = self.run(f"cat {shlex.quote(path)}")
        return out.strip() if rc == 0 else None


def connection(serial: str, listed: dict[str, str]) -> Finding:
    """``listed``: {serial: adb state} of what the adb server sees."""
    state = listed.get(serial)
    if state is None:
        seen = ", ".join(f"{s} ({st})" for s, st in listed.items()) or "none"
        return fail("adb connection", f"no device '{serial}' (the adb server sees: {seen})",
                    "connect the phone with USB debugging on, check `adb devices`, or give its serial")
    if state == "unauthorized":
        return fail("adb connection", f"{serial} has not authorised this computer",
                    "unlock the phone and accept the USB debugging prompt (or revoke and re-plug)")
    if state != "device":
        return fail("adb connection", f"{serial} is {state}", "re-plug the phone; `adb kill-server` if it stays so")
    return ok("adb connection", f"{serial} authorised")


def abi(phone: Phone) -> Finding:
    _, out = phone.run("getprop ro.product.cpu.abi")
    value = out.strip()
    if value == "arm64-v8a":
        return ok("ABI", value)
    return fail("ABI", f"{value or 'unknown'}: agoc builds for arm64-v8a only", "use a 64-bit ARM phone")


def push_dir(phone: Phone) -> Finding:
    """The push directory is writable and may hold programs that run (not every mount allows exec)."""
    script = f"{PUSH_DIR}/doctor-exec.sh"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "doctor-exec.sh"
        local.write_text("#!/system/bin/sh\necho agoc-exec-ok\n")
        local.chmod(0o755)
        rc, out = phone.run(f"mkdir -p {PUSH_DIR}")
        if rc != 0:
            return fail("push directory", f"cannot create {PUSH_DIR}: {out.strip()[:120]}",
                        "free the path, or check the phone's storage permissions")
        try:
            phone.device.sync.push(str(local), script, mode=0o755)
        except Exception as exc:  # noqa: BLE001 - adbutils raises several kinds; the reason is reported
            return fail("push directory", f"cannot write {script}: {exc}", "check the phone's storage")
    rc, out = phone.run(f"chmod 755 {script} && {script}")
    phone.run(f"rm -f {script}")
    if rc != 0 or "agoc-exec-ok" not in out:
        return fail("push directory", f"a program in {PUSH_DIR} does not run (exit {rc}: {out.strip()[:120]})",
                    f"the phone mounts {PUSH_DIR} without exec: agoc needs a directory that allows it")
    return ok("push directory", f"{PUSH_DIR} writable, programs run there")


def free_space(phone: Phone, minimum_mb: int = MIN_FREE_MB) -> Finding:
    rc, out = phone.run(f"df -k {PUSH_DIR}")
    rows = [line.split() for line in out.strip().splitlines()[1:] if line.strip()]
    try:
        free_mb = int(rows[-1][3]) // 1024
    except (IndexError, ValueError):
        return warn("free space", f"`df -k` did not say (exit {rc}: {out.strip()[:80]})",
                    f"make sure {PUSH_DIR} has {minimum_mb} MB free")
    if free_mb < minimum_mb:
        return fail("free space", f"{free_mb} MB free under {PUSH_DIR}",
                    f"free at least {minimum_mb} MB (old deployments: adb shell rm -r {PUSH_DIR})")
    return ok("free space", f"{free_mb} MB free under {PUSH_DIR}")


def cores(phone: Phone) -> list[Finding]:
    """Clusters by maximum frequency (big.LITTLE) and each cluster's governor."""
    rc, out = phone.run("ls /sys/devices/system/cpu")
    cpus = sorted(int(m.group(1)) for m in re.finditer(r"\bcpu(\d+)\b", out)) if rc == 0 else []
    if not cpus:
        return [warn("cores", "the cpu list is not readable", "pin with bench --cores by hand")]
    clusters: dict[int, list[int]] = {}
    governors: dict[int, set[str]] = {}
    for cpu in cpus:
        freq = phone.read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq")
        khz = int(freq) if freq and freq.isdigit() else 0
        clusters.setdefault(khz, []).append(cpu)
        governors.setdefault(khz, set()).add(phone.read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
                                             or "unknown")
    big = max(clusters)
    detail = "; ".join(f"cpu {_span(c)} at {khz / 1e6:.2f} GHz" if khz else f"cpu {_span(c)} (frequency unknown)"
                       for khz, c in sorted(clusters.items()))
    found = [ok("cores", f"{len(cpus)}: {detail}; the biggest: bench --cores {','.join(map(str, clusters[big]))}")]
    unsteady = {g for gs in governors.values() for g in gs if g not in STEADY_GOVERNORS}
    if unsteady:
        found.append(warn("governors", f"{', '.join(sorted(unsteady))}: clocks follow the load, so timings drift",
                          "compare ratios measured in one run (bench --against does), or set the performance "
                          "governor on a rooted phone"))
    else:
        found.append(ok("governors", "performance"))
    return found


def thermal(phone: Phone) -> Finding:
    rc, out = phone.run("ls /sys/class/thermal")
    zones = re.findall(r"\bthermal_zone\d+\b", out) if rc == 0 else []
    temps = [t for t in (phone.read(f"/sys/class/thermal/{z}/temp") for z in zones) if t and t.lstrip("-").isdigit()]
    if not temps:
        return warn("thermal zones", "not readable", "let the phone cool between long runs: throttling is not "
                    "detected")
    hottest = max(int(t) for t in temps) / (1000 if max(abs(int(t)) for t in temps) > 1000 else 1)
    return ok("thermal zones", f"{len(temps)} readable, hottest {hottest:.0f} °C")


def fp16(phone: Phone) -> Finding:
    """ARMv8.2-A FP16 arithmetic (``asimdhp`` in /proc/cpuinfo), which ``--precision fp16`` builds need."""
    info = phone.read("/proc/cpuinfo") or ""
    features = set(re.findall(r"^Features\s*:\s*(.*)$", info, re.M)[0].split()) if "Features" in info else set()
    if "asimdhp" in features:
        return ok("FP16 arithmetic", "asimdhp: --precision fp16 builds run here")
    return warn("FP16 arithmetic", "no asimdhp in /proc/cpuinfo" if info else "/proc/cpuinfo not readable",
                "compile for this phone with --precision fp32 (the default): an fp16 build would stop on an "
                "illegal instruction")


def runner_starts(device) -> Finding:
    """The runner and its runtime libraries pushed (once per content) and started with ``--help``."""
    from toolchain.errors import AgocError

    try:
        remote = device.deploy_runner()
        argv, env = device.command(remote, ["--help"])  # through the bundle's own loader (glibc builds)
        rc, out, err = device.transport.execute(argv, env, remote, 60)
    except AgocError as exc:
        return fail("runner", str(exc), "make runners")
    if rc != 0 or "agoc-runner" not in out + err:
        return fail("runner", f"did not start (exit {rc}): {(err or out).strip()[:160]}",
                    "rebuild it for the phone (make runner TARGET=android-arm64) and report the line above")
    return ok("runner", f"starts on the phone ({remote})")


def _span(cpus: list[int]) -> str:
    return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 and cpus == list(range(cpus[0], cpus[-1] + 1)) else \
        ",".join(map(str, cpus))


def phone_findings(serial: str, client) -> list[Finding]:
    """Every phone check, in order; after a failed connection or ABI nothing more is asked."""
    from host import devices as dv

    listed = {d.serial: d.state for d in client.list()}
    first = connection(serial, listed)
    if first.status == "fail":
        return [first]
    phone = Phone(client.device(serial))
    found = [first, abi(phone)]
    if found[-1].status == "fail":
        return found
    found += [push_dir(phone), free_space(phone), *cores(phone), fp16(phone), thermal(phone)]
    if all(f.status != "fail" for f in found):
        found.append(runner_starts(dv.adb_device(serial)))
    return found
