"""How agoc reaches a device's files and processes (host.devices.RunnerDevice runs the runner over one): this
machine, a qemu sandbox, an adb phone; and a long-running program started on one (the runner's RPC server).
Every device command is built with shlex quoting: docs/devices.md."""

from __future__ import annotations

import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from toolchain.errors import DeviceError


class Spawned:
    """A long-running program started on a device (the runner's RPC server): its first stdout
    line, whether it still runs, and stopping it. Subclasses say how the bytes arrive."""

    pid: int | None = None

    def first_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeviceError(f"no output from the program within {timeout:.0f} s")
            chunk = self._read(min(left, 0.5))
            if chunk == b"":
                raise DeviceError("the program exited before it printed its first line")
            data += chunk or b""
        return data.decode(errors="replace").strip()

    def _read(self, timeout: float) -> bytes | None:
        """Up to 4 KiB of stdout; None when nothing came within ``timeout``; b"" at its end."""
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class PopenSpawned(Spawned):
    """A program run as a child process of this one (host, or qemu-user)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def _read(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        if ready:
            return os.read(self.popen.stdout.fileno(), 4096)
        return b"" if self.popen.poll() is not None else None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        if self.popen.stdout:
            self.popen.stdout.close()


class HostTransport:
    """This machine as a device for the runner's RPC mode (``--device local``)."""

    kind = "local"

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> Spawned:
        with open(Path(cwd) / "rpc.stderr", "ab") as err:
            popen = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        return PopenSpawned(popen)

    def forward(self, device_port: int) -> int:
        return device_port  # same machine: the port is reachable as it is

    def unforward(self, host_port: int) -> None:
        pass

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)


class QemuTransport:
    """A sandbox directory standing in for a device filesystem; aarch64 programs run under qemu."""

    kind = "qemu"

    def __init__(self, sandbox: Path):
        self.sandbox = sandbox
        self.qemu = shutil.which("qemu-aarch64")
        if not self.qemu:
            raise DeviceError("the qemu device needs qemu-aarch64: run `make setup` or `apt-get install qemu-user`")
        self.sysroot = os.environ.get("AGOC_QEMU_SYSROOT")  # none: the bundle brings its loader, as on a phone

    def _local(self, remote: str) -> Path:
        return self.sandbox / remote.lstrip("/")

    def mkdir(self, remote: str) -> None:
        self._local(remote).mkdir(parents=True, exist_ok=True)

    def put(self, local: Path, remote: str) -> None:
        dst = self._local(remote)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local, dst)

    def get(self, remote: str, local: Path) -> None:
        shutil.copy2(self._local(remote), local)

    def exists(self, remote: str) -> bool:
        return self._local(remote).exists()

    def _command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """(qemu command line, environment). ``LD_*`` go to the guest only (``-E``); the rest go
        through qemu's own environment, which the guest inherits — so a secret (the RPC key) never
        shows in a command line."""
        program = str(self._local(argv[0]))
        args = [self._local(a).as_posix() if a.startswith("/") and self.exists(a) else a for a in argv[1:]]
        qemu_env, inherited = [], dict(os.environ)
        for key, value in env.items():
            if key == "LD_LIBRARY_PATH":
                value = ":".join(str(self._local(p)) for p in value.split(":"))
            if key.startswith("LD_"):
                qemu_env += ["-E", f"{key}={value}"]
            else:
                inherited[key] = value
        return [self.qemu, *(["-L", self.sysroot] if self.sysroot else []), *qemu_env, program, *args], inherited

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> Spawned:
        """Start a long-running program (the RPC server) under qemu; its stderr goes to cwd/rpc.stderr."""
        local_cwd = self._local(cwd)
        cmd, environment = self._command(argv, env)
        with open(local_cwd / "rpc.stderr", "ab") as err:
            popen = subprocess.Popen(cmd, cwd=local_cwd, env=environment, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        return PopenSpawned(popen)

    def forward(self, device_port: int) -> int:
        return device_port  # qemu-user shares this machine's network

    def unforward(self, host_port: int) -> None:
        pass

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def execute(self, argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> tuple[int, str, str]:
        cmd, environment = self._command(argv, env)
        try:
            done = subprocess.run(cmd, cwd=self._local(cwd), env=environment, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DeviceError(f"runner under qemu timed out after {timeout:.0f} s") from None
        return done.returncode, done.stdout, done.stderr

    def describe(self) -> dict:
        return {"abi": "arm64-v8a (qemu-user, glibc)", "cores": os.cpu_count(), "model": "qemu-aarch64"}


class AdbTransport:
    """A device reached through the adb server protocol (adbutils)."""

    kind = "adb"

    def __init__(self, device):
        self.device = device

    def mkdir(self, remote: str) -> None:
        self._check(["mkdir", "-p", remote])

    def put(self, local: Path, remote: str) -> None:
        self.device.sync.push(str(local), remote, mode=0o755 if os.access(local, os.X_OK) else 0o644)

    def get(self, remote: str, local: Path) -> None:
        self.device.sync.pull(remote, str(local))

    def exists(self, remote: str) -> bool:
        return self.device.sync.exists(remote)

    def _check(self, argv: list[str]) -> str:
        result = self.device.shell2(shlex.join(argv), timeout=120)
        if result.returncode != 0:
            raise DeviceError(f"`{shlex.join(argv)}` failed on {self.device.serial}: {result.output.strip()[:200]}")
        return result.output

    def execute(self, argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> tuple[int, str, str]:
        assignments = [f"{k}={v}" for k, v in env.items()]
        # stderr goes to a file so stdout stays one clean JSON line
        command = f"cd {shlex.quote(cwd)} && env {shlex.join(assignments + argv)} 2> runner.stderr"
        result = self.device.shell2(command, timeout=timeout)
        stderr = self.device.shell2(f"cat {shlex.quote(cwd + '/runner.stderr')}", timeout=30).output
        return result.returncode, result.output, stderr

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> Spawned:
        """Start a long-running program over a streaming ``adb shell``; ``exec`` replaces the shell
        (whose command line shows the environment assignments only until then)."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
        command = f"cd {shlex.quote(cwd)} && {' '.join(assignments)} exec {shlex.join(argv)} 2> rpc.stderr"
        return AdbSpawned(self, self.device.shell(command, stream=True, timeout=None))

    def forward(self, device_port: int) -> int:
        """A free host port relayed by the adb server to ``device_port`` on the phone."""
        return self.device.forward_port(device_port)

    def unforward(self, host_port: int) -> None:
        try:
            self.device.forward_remove(f"tcp:{host_port}", raise_non_found=False)
        except Exception:  # the device may be gone already
            pass

    def kill(self, pid: int) -> None:
        self.device.shell2(shlex.join(["kill", "-9", str(int(pid))]), timeout=30)

    def describe(self) -> dict:
        prop = self.device.getprop
        info = {
            "abi": prop("ro.product.cpu.abi"),
            "model": prop("ro.product.model"),
            "sdk": prop("ro.build.version.sdk"),
            "soc": prop("ro.soc.model"),
        }
        try:
            info["cores"] = int(self._check(["nproc"]).strip())
        except (DeviceError, ValueError):
            info["cores"] = None
        return info


class AdbSpawned(Spawned):
    """A program running behind a streaming adb shell connection."""

    def __init__(self, transport: AdbTransport, connection):
        self.transport = transport
        self.connection = connection
        self.sock = connection.conn

    def _read(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        try:
            return self.sock.recv(4096)
        except OSError:
            return b""

    def alive(self) -> bool:
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
            if not ready:
                return True
            return bool(self.sock.recv(4096, socket.MSG_PEEK))
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.pid and self.alive():
            try:
                self.transport.kill(self.pid)
            except Exception:
                pass
        try:
            self.connection.close()
        except OSError:
            pass
