"""On-device RPC: the runner's ``rpc`` mode on a device, the agent that joins one device to TVM's RPC
tracker and relays its sessions, and :class:`RpcSession`, everything one RPC tuning run needs (the
topology and why an agent: docs/devices.md)."""

from __future__ import annotations

import json
import secrets
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from host.tracker import (  # the tracker's API stays importable from host.rpc
    DEFAULT_TRACKER_PORT,
    RPC_CODE_MISMATCH,
    RPC_CODE_SUCCESS,
    RPC_MAGIC,
    RPC_TRACKER_MAGIC,
    TRACKER_GET_PENDING,
    TRACKER_PUT,
    TRACKER_SUCCESS,
    TRACKER_UPDATE_INFO,
    client_handshake,
    parse_address,  # noqa: F401
    recv_exact,
    recv_int,
    recv_json,
    send_int,
    send_json,
    servers_for,
    start_tracker,
    state_file,  # noqa: F401
    stop_process,
    tracker_from_state,  # noqa: F401
    tracker_summary,
    wait_for_tracker,  # noqa: F401
)
from toolchain.errors import DeviceError

START_TIMEOUT_S = 120  # the runner under qemu takes a few seconds to print its port


# ----------------------------------------------------------------------------- a runner on a device


@dataclass
class Endpoint:
    """Where this host reaches a running RPC server."""

    host: str
    port: int
    key: str


class DeviceServer:
    """The runner's RPC mode on one device (local, qemu or adb), reachable from this host.

    ``start`` deploys the runner, starts it with a fresh secret key (in its environment) on a free
    device port, and forwards a host port to it (adb); ``alive`` and ``stop`` do what they say.
    """

    def __init__(self, device, name: str | None = None):
        self.device = device
        self.name = name or device.name
        self.process = None
        self.endpoint: Endpoint | None = None
        self.starts = 0

    def start(self) -> Endpoint:
        from host.devices import REPO, runner_build

        self.stop()
        key = "agoc-" + secrets.token_hex(16)
        env = {"AGOC_RPC_KEY": key, "AGOC_DEVICE_NAME": self.name}
        transport = self.device.transport
        if self.device.kind == "local":
            runner, _ = runner_build("host")
            work = REPO / "build" / "devices" / "local-rpc"
            work.mkdir(parents=True, exist_ok=True)
            argv, cwd = [str(runner), "rpc", "--port", "0", "--work-dir", str(work)], str(work)
        else:
            remote = self.device.deploy_runner()
            transport.mkdir(f"{remote}/rpc")
            argv, runner_env = self.device.command(remote, ["rpc", "--port", "0", "--work-dir", f"{remote}/rpc"])
            env.update(runner_env)
            cwd = remote
        process = transport.spawn(argv, env, cwd)
        try:
            line = json.loads(process.first_line(START_TIMEOUT_S))
        except (DeviceError, ValueError) as exc:
            process.stop()
            raise DeviceError(f"the runner's RPC server did not start on {self.name}: {exc}") from None
        process.pid = int(line.get("pid") or 0) or process.pid
        self.process = process
        self.endpoint = Endpoint("127.0.0.1", transport.forward(int(line["listening"])), key)
        self.starts += 1
        return self.endpoint

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill(self) -> None:
        """SIGKILL the server on the device (what a crash looks like); for tests and drills."""
        if self.process is not None and self.process.pid:
            self.device.transport.kill(self.process.pid)

    def stop(self) -> None:
        if self.endpoint is not None:
            self.device.transport.unforward(self.endpoint.port)
        if self.process is not None:
            self.process.stop()
        self.process, self.endpoint = None, None

    def connect(self, timeout: float = 60):
        """A direct ``tvm.rpc`` session (no tracker)."""
        from tvm import rpc

        ep = self.endpoint or self.start()
        return rpc.connect(ep.host, ep.port, key=ep.key, session_timeout=timeout)


# ----------------------------------------------------------------------------- the agent


@dataclass
class AgentStats:
    sessions: int = 0  # finished sessions relayed to the device
    failed: int = 0  # sessions that ended because the device side broke
    restarts: int = 0  # runner (re)starts after the first
    state: str = "starting"
    last_error: str = ""
    events: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("sessions", "failed", "restarts", "state", "last_error")}


class Agent(threading.Thread):
    """Offers one device to a TVM RPC tracker under ``key`` and relays each session to the runner.

    The tracker hands clients a one-time match key; the agent accepts only that, opens a session on
    the device's runner with the runner's secret key (passing the client's ``-timeout`` on, so a
    hanging kernel is killed on the device), relays bytes until either side closes, then offers the
    device again under a fresh match key. A runner found dead is restarted before the device is
    offered again; while it cannot be started (phone unplugged, rebooting) the device is withdrawn
    from the tracker and retried every ``retry_s`` seconds.
    """

    def __init__(self, server: DeviceServer, tracker: tuple[str, int], key: str, bind: str = "127.0.0.1",
                 retry_s: float = 2.0, on_event: Callable[..., None] = lambda kind, **info: None,
                 status_file: Path | None = None):
        super().__init__(name=f"agoc-agent-{server.name}", daemon=True)
        self.server = server
        self.tracker = tracker
        self.key = key
        self.retry_s = retry_s
        self.on_event = on_event
        self.status_file = status_file
        self.stats = AgentStats()
        self._halt = threading.Event()
        self._listen = socket.create_server((bind, 0))
        self.port = self._listen.getsockname()[1]
        self._tracker_conn: socket.socket | None = None
        self._matchkey = ""

    # -- lifecycle
    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)
        self._drop_tracker()
        self._listen.close()
        self.server.stop()

    def _event(self, kind: str, **info) -> None:
        self.stats.events = [*self.stats.events[-99:], {"t": time.time(), "kind": kind, **info}]  # the last 100
        self.on_event(kind, device=self.server.name, **info)
        self.write_status()

    def write_status(self) -> None:
        """The agent's state as JSON (atomically replaced): what `agoc tune` reports per device."""
        if self.status_file is None:
            return
        process = self.server.process
        data = {"device": self.server.name, "key": self.key, "port": self.port,
                "runner_pid": process.pid if process is not None else None,
                "runner_port": self.server.endpoint.port if self.server.endpoint else None, **self.stats.to_json()}
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.status_file)

    # -- tracker
    def _drop_tracker(self) -> None:
        if self._tracker_conn is not None:
            try:
                self._tracker_conn.close()
            except OSError:
                pass
        self._tracker_conn = None

    def _register(self) -> None:
        conn = socket.create_connection(self.tracker, timeout=10)
        send_int(conn, RPC_TRACKER_MAGIC)
        if recv_int(conn) != RPC_TRACKER_MAGIC:
            conn.close()
            raise ConnectionError(f"{self.tracker[0]}:{self.tracker[1]} is not a TVM RPC tracker")
        send_json(conn, [TRACKER_UPDATE_INFO, {"key": "server:" + self.key, "addr": [None, self.port]}])
        if recv_json(conn) != TRACKER_SUCCESS:
            raise ConnectionError("the tracker refused the registration")
        self._tracker_conn = conn
        self._offer()

    def _offer(self) -> None:
        self._matchkey = f"{self.key}:{secrets.token_hex(8)}"
        send_json(self._tracker_conn, [TRACKER_PUT, self.key, [self.port, self._matchkey], None])
        if recv_json(self._tracker_conn) != TRACKER_SUCCESS:
            raise ConnectionError("the tracker refused the offer")

    def _pending(self) -> list:
        send_json(self._tracker_conn, [TRACKER_GET_PENDING])
        return recv_json(self._tracker_conn)

    # -- main loop
    def run(self) -> None:
        unclaimed = 0.0
        while not self._halt.is_set():
            try:
                if not self.server.alive():
                    self._drop_tracker()  # not offered while it has no runner
                    if self.server.starts:
                        self.stats.restarts += 1
                        self._event("restart", reason=self.stats.last_error or "runner not running")
                    self.stats.state = "starting runner"
                    self.server.start()
                    self._event("attached", port=self.server.endpoint.port)
                if self._tracker_conn is None:
                    self._register()
                    self.stats.state = "offered"
                    self.write_status()
                ready, _, _ = select.select([self._listen], [], [], 1.0)
                if not ready:
                    # a match key handed to a client that never came is replaced (as TVM's server does)
                    unclaimed = unclaimed + 1.0 if self._matchkey not in self._pending() else 0.0
                    if unclaimed > 6:
                        self._offer()
                        unclaimed = 0.0
                    continue
                conn, _ = self._listen.accept()
                self._serve(conn)
                if self._tracker_conn is not None:
                    self._offer()
            except Exception as exc:  # noqa: BLE001 — whatever the device or adb raised, the agent waits and retries
                self.stats.last_error = f"{type(exc).__name__}: {exc}"[:300]
                self.stats.state = "waiting: " + self.stats.last_error
                self._event("error", error=self.stats.last_error)
                self._drop_tracker()
                self._halt.wait(self.retry_s)
        self.stats.state = "stopped"
        self.write_status()

    def _serve(self, client: socket.socket) -> None:
        """One session: check the client's match key, open the runner, relay until done."""
        with client:
            client.settimeout(30)
            if recv_int(client) != RPC_MAGIC:
                return
            length = recv_int(client)
            if not 0 <= length <= 4096:
                return
            words = recv_exact(client, length).decode(errors="replace").split()
            if not words or words[0] != "client:" + self._matchkey:
                send_int(client, RPC_CODE_MISMATCH)
                self._event("mismatch")
                return
            self._matchkey = ""  # one use
            ep = self.server.endpoint
            try:
                device = socket.create_connection((ep.host, ep.port), timeout=30)
                client_handshake(device, ep.key, " ".join(words[1:]))
            except (OSError, ConnectionError) as exc:
                self.stats.failed += 1
                self.stats.last_error = f"cannot open a session on the runner: {exc}"
                self._event("session_failed", error=self.stats.last_error)
                self.server.stop()  # restarted by the main loop before the device is offered again
                return  # the client sees the connection close: its candidate is retried or failed
            send_int(client, RPC_CODE_SUCCESS)
            server_key = ("server:" + self.key).encode()
            send_int(client, len(server_key))
            client.sendall(server_key)
            self.stats.state = "measuring"
            broken = _relay(client, device)
            device.close()
            if broken and not self.server.alive():
                self.stats.failed += 1
                self.stats.last_error = "the runner died during a session"
                self._event("session_failed", error=self.stats.last_error)
            else:
                self.stats.sessions += 1
            self.stats.state = "offered"
            self.write_status()


def _relay(client: socket.socket, device: socket.socket) -> bool:
    """Copy bytes both ways until one side closes. True when the device side closed first."""
    client.settimeout(None)
    device.settimeout(None)
    sockets = [client, device]
    while True:
        ready, _, _ = select.select(sockets, [], [], 5.0)
        for src in ready:
            dst = device if src is client else client
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                return src is device
            try:
                dst.sendall(data)
            except OSError:
                return src is client


# ----------------------------------------------------------------------------- a tuning session


def device_target(device) -> str:
    """The target preset whose code the device runs (the tracker key defaults to it, too)."""
    return getattr(device, "runner_target", "host")


class RpcSession:
    """Everything one RPC tuning run needs, as a context manager.

    With ``devices``: a private tracker on loopback (unless ``tracker`` is given) and one agent per
    device, each an ``agoc tracker serve`` process (agents are processes, not threads: a blocking
    TVM call holds the interpreter lock, so an in-process relay could stall its own caller). With
    only ``tracker`` and ``key``: the farm someone else runs (``agoc tracker start`` + ``agoc
    tracker serve`` per device). ``measure()`` gives the :class:`toolchain.tune.adapter.Measure` to tune
    with; ``report()`` says what each device did.
    """

    def __init__(self, spec, devices: list | None = None, tracker: tuple[str, int] | None = None,
                 key: str | None = None, hygiene=None, log: Path | None = None, retries: int = 1,
                 wait_s: float = 180, work_dir: Path | None = None):
        import tempfile

        from host.measure import Hygiene

        self.spec = spec
        self.devices = devices or []
        self.tracker = tracker
        self.key = key or (device_target(self.devices[0]) if self.devices else None)
        self.hygiene = hygiene or Hygiene()
        self.log = log
        self.retries = retries
        self.wait_s = wait_s
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="agoc-rpc-"))
        self.names = _unique_names([d.name for d in self.devices])
        self.agents: dict[str, subprocess.Popen] = {}
        self.servers = 0
        self._tracker_proc = None
        if self.key is None:
            raise DeviceError("an RPC session needs a device (--device) or a tracker key (--key)")
        if not self.devices and self.tracker is None:
            raise DeviceError("no tracker: start one with `agoc tracker start`, or pass --tracker HOST:PORT")

    def status_path(self, name: str) -> Path:
        return self.work_dir / f"agent-{name}.json"

    def agent_status(self, name: str) -> dict:
        try:
            return json.loads(self.status_path(name).read_text())
        except (OSError, ValueError):
            return {}

    def __enter__(self) -> Self:
        try:
            if self.tracker is None:
                info = start_tracker(port=DEFAULT_TRACKER_PORT + 1000, detach=False)
                self._tracker_proc = info["process"]
                self.tracker = (info["host"], info["port"])
            self.work_dir.mkdir(parents=True, exist_ok=True)
            for device, name in zip(self.devices, self.names):
                argv = [sys.executable, "-m", "host.cli", "tracker", "serve", "--device", device.name,
                        "--key", self.key, "--tracker", f"{self.tracker[0]}:{self.tracker[1]}", "--name", name,
                        "--status-file", str(self.status_path(name))]
                self.agents[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            self._wait_for_servers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_for_servers(self) -> None:
        want = max(1, len(self.agents))
        deadline = time.monotonic() + self.wait_s
        while True:
            have = servers_for(tracker_summary(*self.tracker), self.key)
            # the tracker learns of a device a moment before its agent's status file says so
            if have >= want and all(self.agent_status(n).get("state") in ("offered", "measuring") for n in self.agents):
                self.servers = have
                return
            dead = [n for n, p in self.agents.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = "; ".join(f"{n}: {self.agent_status(n).get('state', 'exited' if n in dead else 'starting')}"
                                for n in self.agents) or "none registered"
                raise DeviceError(f"no device serves key '{self.key}' on the tracker "
                                  f"{self.tracker[0]}:{self.tracker[1]} ({why})")
            time.sleep(0.3)

    def measure(self):
        import functools

        from host.measure import export_so, make_rpc_runner, time_in_one_session
        from toolchain.targets import find_compiler
        from toolchain.tune.adapter import Measure

        compiler = None if self.spec.runs_on_host else find_compiler(self.spec).path
        runner = make_rpc_runner(self.tracker, self.key, self.servers, self.hygiene, self.log, self.retries)
        together = functools.partial(time_in_one_session, self.tracker, self.key, self.hygiene,
                                     str(self.log) if self.log else None)
        return Measure(runner=runner, export=functools.partial(export_so, compiler=compiler),
                       where=f"rpc:{self.key}@{self.tracker[0]}:{self.tracker[1]}", together=together)

    def report(self) -> dict:
        """Per device: sessions served, sessions lost, runner restarts, state; from the log: measurements."""
        from host.measure import read_log

        lines = read_log(self.log) if self.log else []
        devices = {name: {k: v for k, v in self.agent_status(name).items() if k not in ("device", "port")}
                   for name in self.agents}
        for line in lines:
            if line.get("status") == "ok":  # a candidate measured, or a kernel timed for a pairing
                entry = devices.setdefault(line.get("device") or "?", {})
                what = "paired" if line.get("purpose") == "pairing" else "measured"
                entry[what] = entry.get(what, 0) + 1
        return {
            "tracker": f"{self.tracker[0]}:{self.tracker[1]}" if self.tracker else None,
            "key": self.key,
            "devices": devices,
            "retried": sum(1 for ln in lines if ln.get("status") == "retry"),
            "failed": sum(1 for ln in lines if ln.get("status") == "failed"),
        }

    def __exit__(self, *exc) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.terminate()  # the agent stops its runner on the device, then exits
        for proc in self.agents.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for device, name in zip(self.devices, self.names):
            if name in self.agents and self.agents[name].returncode != 0:
                self._reap_runner(device, name)  # an agent that died (SIGKILL, crash) left its runner behind
        if self._tracker_proc is not None:
            stop_process(self._tracker_proc.pid)
            self._tracker_proc.wait(timeout=10)
            self._tracker_proc = None


    def _reap_runner(self, device, name: str) -> None:
        pid = self.agent_status(name).get("runner_pid")
        if not pid:
            return
        if device.kind in ("local", "qemu"):  # a process of this machine: make sure the pid is still the runner
            import psutil

            try:
                if not any("agoc-runner" in part for part in psutil.Process(int(pid)).cmdline()):
                    return
            except psutil.Error:
                return
        try:
            device.transport.kill(int(pid))
        except (OSError, DeviceError):
            pass  # already gone (or the phone with it)


def _unique_names(names: list[str]) -> list[str]:
    out = []
    for i, name in enumerate(names):
        out.append(name if names.count(name) == 1 else f"{name}-{names[:i + 1].count(name)}")
    return out
