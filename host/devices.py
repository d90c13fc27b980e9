"""Devices that run artifacts behind one interface (local, qemu, adb phones; qemu and adb share
:class:`RunnerDevice` over a transport). Every device command is built with shlex quoting: docs/devices.md."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from host import bundle
from host.transports import AdbTransport, HostTransport, QemuTransport
from toolchain.artifact import Artifact, read_tensor, write_tensor
from toolchain.errors import DeviceError
from toolchain.onnx_import import TensorInfo
from toolchain.runtime import VMSession
from toolchain.targets import PRESETS_BY_NAME

REPO = Path(__file__).resolve().parent.parent
RUNNER_EXIT_CODES = {
    2: "bad flags (runner usage error)",
    3: "a file is missing",
    4: "the library or the Relax VM failed to load",
    5: "an input has the wrong shape, dtype or size",
    6: "runtime error during a run",
    7: "RPC socket error",
}


@dataclass(frozen=True)
class BenchOptions:
    warmup: int = 5
    repeat: int = 20
    min_time_ms: float = 0.0
    threads: int | None = None
    cores: tuple[int, ...] | None = None
    per_kernel: bool = False
    random_inputs: bool = False
    seed: int = 0

    def runner_flags(self) -> list[str]:
        flags = ["--warmup", str(self.warmup), "--repeat", str(self.repeat)]
        if self.min_time_ms:
            flags += ["--min-time-ms", f"{self.min_time_ms:g}"]
        if self.threads:
            flags += ["--threads", str(self.threads)]
        if self.cores:
            flags += ["--cores", ",".join(map(str, self.cores))]
        if self.per_kernel:
            flags.append("--per-kernel")
        if self.random_inputs:
            flags += ["--random-inputs", "--seed", str(self.seed)]
        return flags


# ----------------------------------------------------------------------------- runner builds


def runner_build(target: str, kernels: list[Path] | None = None) -> tuple[Path, list[Path]]:
    """(runner binary, libraries shipped beside it) of ``make runner TARGET=target``: the TVM runtime's and, for a
    glibc target (linux-arm64), every system library it, the runner and ``kernels`` need, the loader among them
    (host/bundle.py: a device needs nothing of its own)."""
    base = Path(os.environ.get("AGOC_BUILD_DIR", REPO / "build"))
    runner = base / "runner" / RUNNER_OF.get(target, target) / "agoc-runner"
    if not runner.exists():
        raise DeviceError(f"the {target} runner is not built ({runner}); run `make runner TARGET={target}`")
    libs = [] if target == "host" else sorted(runner.parent.glob("*.so*"))
    if target != "host" and not libs:
        raise DeviceError(f"no TVM runtime libraries beside {runner}; run `make runner TARGET={target}`")
    if target in BUNDLED:
        try:
            libs += bundle.system_libraries([runner, *libs, *(kernels or [])], bundle.cross_libdir())
        except bundle.BundleError as exc:
            raise DeviceError(str(exc)) from None
    return runner, libs


#: runner targets shipped as a self-contained bundle, started through its own glibc loader (host/bundle.py)
BUNDLED = ("linux-arm64", "android-arm64")
#: a target whose runner is another's build (a phone without an NDK runs the linux-arm64 runner in its bundle)
RUNNER_OF = {"android-arm64": "linux-arm64"}


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _artifact_files(artifact: Artifact) -> list[Path]:
    files = [artifact.library_path, artifact.root / "io.txt"]
    files += [artifact.root / t.file for t in (*artifact.manifest.inputs, *artifact.manifest.outputs)]
    return files


def _parse_runner_json(stdout: str, stderr: str, rc: int, where: str) -> dict:
    if rc != 0:
        reason = RUNNER_EXIT_CODES.get(rc, f"exit code {rc}")
        detail = (stderr.strip().splitlines() or [""])[-1][:300]
        raise DeviceError(f"runner on {where} failed: {reason}: {detail}")
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise DeviceError(f"runner on {where} printed no JSON result (stderr: {stderr.strip()[-300:]})")


# ----------------------------------------------------------------------------- devices


class LocalDevice:
    name = "local"
    kind = "local"
    runner_target = "host"
    transport = HostTransport()
    description = f"this machine ({platform.machine()}), in-process Relax VM"

    def _check(self, artifact: Artifact) -> None:
        preset = PRESETS_BY_NAME.get(artifact.target_preset)
        if preset is None or not preset.runs_on_host:
            raise DeviceError(
                f"{artifact.root} was built for {artifact.target_preset} and cannot run on this "
                f"{platform.machine()} machine; use --device qemu, or recompile with --target host"
            )

    def run(self, artifact: Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check(artifact)
        session = VMSession(
            artifact.library_path,
            [t.info for t in artifact.manifest.inputs],
            [t.info.name for t in artifact.manifest.outputs],
        )
        return session.run(inputs)

    def deploy(self, artifact: Artifact) -> str:
        self._check(artifact)
        return str(artifact.root)

    def bench(self, artifact: Artifact, options: BenchOptions) -> dict:
        self._check(artifact)
        runner, _ = runner_build("host")
        env = dict(os.environ)
        if options.threads:
            env["TVM_NUM_THREADS"] = str(options.threads)
        cmd = [str(runner), "bench", "--artifact", str(artifact.root), *options.runner_flags()]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        return _parse_runner_json(done.stdout, done.stderr, done.returncode, "local")

    def describe(self) -> dict:
        return {"abi": platform.machine(), "cores": os.cpu_count(), "model": platform.node() or "host"}


def _outputs(artifact: Artifact, result: dict, fetch) -> dict[str, np.ndarray]:
    """The outputs the runner wrote (``result``'s records) as the manifest names them; ``fetch(file name)``: a
    local path to that file."""
    return {tf.info.name: read_tensor(fetch(Path(rec["file"]).name),
                                      TensorInfo(tf.info.name, tuple(rec["shape"]), rec["dtype"]))
            for tf, rec in zip(artifact.manifest.outputs, result.get("outputs", []))}


class LocalRunner(LocalDevice):
    """This machine's C++ runner in a process of its own, as `agoc bench` runs it: compile's self-check of a host
    artifact (in the compiling process a schedule's data race passed by luck: docs/tuning-internals.md)."""

    name = "this machine (agoc-runner)"

    def run(self, artifact: Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check(artifact)
        stored = artifact.read_inputs()
        if any(not np.array_equal(stored[name], inputs[name]) for name in stored):  # it reads the stored samples
            return super().run(artifact, inputs)
        runner, _ = runner_build("host")
        with tempfile.TemporaryDirectory(prefix="agoc-check.") as out:
            cmd = [str(runner), "bench", "--artifact", str(artifact.root), "--warmup", "1", "--repeat", "2",
                   "--outputs-dir", out]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            result = _parse_runner_json(done.stdout, done.stderr, done.returncode, "local")
            return _outputs(artifact, result, lambda name: Path(out) / name)


class RunnerDevice:
    """An ARM64 device reached through a transport; runs artifacts with the C++ runner."""

    base = "/data/local/tmp/agoc"

    def __init__(self, name: str, transport, runner_target: str):
        self.name = name
        self.kind = transport.kind
        self.transport = transport
        self.runner_target = runner_target

    def _check(self, artifact: Artifact) -> None:
        if artifact.manifest.target["tvm_target"].get("mtriple", "").split("-")[0] != "aarch64":
            raise DeviceError(
                f"{artifact.root} was built for {artifact.target_preset}; device '{self.name}' needs an ARM64 "
                "artifact: recompile with --target linux-arm64 (qemu) or android-arm64 (phones)"
            )

    def deploy_runner(self) -> str:
        """Push the runner and its runtime libraries (once per content) and return their directory."""
        runner, libs = runner_build(self.runner_target)
        remote = f"{self.base}/runner-{_digest([runner, *libs])}"
        if self.transport.exists(f"{remote}/.complete"):
            return remote
        self.transport.mkdir(f"{remote}/lib")
        self.transport.put(runner, f"{remote}/agoc-runner")
        for lib in libs:
            self.transport.put(lib, f"{remote}/lib/{lib.name}")
        self._mark_complete(remote)
        return remote

    def _mark_complete(self, remote: str) -> None:
        with tempfile.NamedTemporaryFile("w", delete=False) as marker:
            marker.write("ok\n")
        self.transport.put(Path(marker.name), f"{remote}/.complete")
        os.unlink(marker.name)

    def deploy(self, artifact: Artifact) -> str:
        """Push runner, runtime libraries and artifact into a fresh content-addressed directory."""
        self._check(artifact)
        runner, libs = runner_build(self.runner_target, [artifact.library_path])
        files = _artifact_files(artifact)
        remote = f"{self.base}/{_digest([runner, *libs, *files])}"
        if self.transport.exists(f"{remote}/.complete"):
            return remote  # identical deployment already there
        self.transport.mkdir(f"{remote}/lib")
        self.transport.put(runner, f"{remote}/agoc-runner")
        for lib in libs:
            self.transport.put(lib, f"{remote}/lib/{lib.name}")
        for f in files:
            rel = f.relative_to(artifact.root).as_posix()
            self.transport.put(f, f"{remote}/artifact/{rel}")
        self._mark_complete(remote)
        return remote

    def command(self, remote: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that start the runner deployed in ``remote``: through the bundle's own loader
        (glibc targets), else with its libraries on the loader's path (an NDK build for bionic)."""
        if self.runner_target in BUNDLED:
            return bundle.command(remote, "agoc-runner", args), {}
        return [f"{remote}/agoc-runner", *args], {"LD_LIBRARY_PATH": f"{remote}/lib"}

    def _runner(self, remote: str, args: list[str], timeout: float) -> dict:
        argv, env = self.command(remote, args)
        rc, out, err = self.transport.execute(argv, env, remote, timeout)
        return _parse_runner_json(out, err, rc, self.name)

    def bench(self, artifact: Artifact, options: BenchOptions) -> dict:
        remote = self.deploy(artifact)
        return self._runner(remote, ["bench", "--artifact", f"{remote}/artifact", *options.runner_flags()], 3600)

    def run(self, artifact: Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        remote = self.deploy(artifact)
        stored = artifact.read_inputs()
        for tf in artifact.manifest.inputs:  # inputs other than the stored samples are pushed first
            if not np.array_equal(stored[tf.info.name], inputs[tf.info.name]):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "input.bin"
                    write_tensor(path, inputs[tf.info.name])
                    self.transport.put(path, f"{remote}/artifact/{tf.file}")
        out_dir = f"{remote}/outputs"
        self.transport.mkdir(out_dir)
        result = self._runner(
            remote,
            ["bench", "--artifact", f"{remote}/artifact", "--warmup", "0", "--repeat", "1", "--outputs-dir", out_dir],
            1800,
        )
        with tempfile.TemporaryDirectory() as tmp:
            def fetch(name: str) -> Path:  # the runner names the file; it lives in out_dir on the device
                self.transport.get(f"{out_dir}/{name}", Path(tmp) / name)
                return Path(tmp) / name

            return _outputs(artifact, result, fetch)

    def describe(self) -> dict:
        return self.transport.describe()


# ----------------------------------------------------------------------------- selection


def adb_client():
    import adbutils

    host = os.environ.get("ANDROID_ADB_SERVER_HOST", "127.0.0.1")
    text = os.environ.get("ANDROID_ADB_SERVER_PORT", "5037")
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise DeviceError(f"ANDROID_ADB_SERVER_PORT is '{text}', not a port number; set it to the adb server's "
                          "port (5037 by default) or unset it")
    port = int(text)
    return adbutils.AdbClient(host=host, port=port, socket_timeout=30)


def adb_serials() -> list[str]:
    """Serials of attached devices in the 'device' state; [] when no adb server answers."""
    import adbutils

    try:
        return [d.serial for d in adb_client().device_list()]
    except (adbutils.AdbError, OSError):
        return []


def qemu_device(sandbox: Path | None = None) -> RunnerDevice:
    sandbox = sandbox or Path(os.environ.get("AGOC_QEMU_SANDBOX", REPO / "build" / "devices" / "qemu"))
    return RunnerDevice("qemu", QemuTransport(sandbox), "linux-arm64")


def adb_device(serial: str) -> RunnerDevice:
    import adbutils

    try:
        device = adb_client().device(serial)
        device.get_state()
    except (adbutils.AdbError, OSError) as exc:
        raise DeviceError(f"no adb device '{serial}' ({exc}); check `adb devices`, or use --device qemu") from None
    bionic = REPO / "build" / "runner" / "android-arm64-ndk" / "agoc-runner"  # built with the NDK, if anyone did
    target = "android-arm64-ndk" if bionic.exists() else "linux-arm64"  # android-arm64's code: one target with qemu
    return RunnerDevice(serial, AdbTransport(device), target)


def get_device(name: str | None, default: str | None = "local"):
    """Resolve --device: local, qemu or an adb serial; unset: ANDROID_SERIAL, then ``default``;
    with no default (deploy, bench), the only attached phone.

    adb is only asked (which starts its server) when a phone may be meant.
    """
    name = name or os.environ.get("ANDROID_SERIAL") or default
    if name is None:
        serials = adb_serials()
        if len(serials) > 1:
            raise DeviceError(f"{len(serials)} phones attached ({', '.join(serials)}): choose one with --device SERIAL")
        if not serials:
            raise DeviceError("no device: connect a phone (see `adb devices`), or use --device qemu or --device local")
        name = serials[0]
    if name == "local":
        return LocalDevice()
    if name == "qemu":
        return qemu_device()
    if name in adb_serials():
        return adb_device(name)
    raise DeviceError(
        f"unknown device '{name}': use local, qemu, or the serial of an attached phone (`agoc devices` lists them)"
    )
