"""On-device RPC: the runner's ``rpc`` mode on a device, TVM's RPC tracker as the farm, and the
agent that joins one device to the farm.

Topology (one host, many devices)::

    agoc tune ──MetaSchedule RPCRunner──▶ TVM RPC tracker (python -m tvm.exec.rpc_tracker, loopback)
                    │  request(key)              ▲ register "server:<key>", PUT (port, match key)
                    ▼                            │
               Agent (this host, loopback port) ─┘   one per device, a thread of `agoc tune` or of
                    │ relays the session bytes        `agoc tracker serve --device D`
                    ▼
          agoc-runner rpc on the device (qemu: same network; phone: `adb forward` to its loopback)

Why an agent rather than registering the runner itself: the runner stays a small C++ program that
only answers TVM's handshake; the agent owns everything that needs the host: it checks the
tracker's one-time match key, knows when a session ends (and offers the device again), notices a
dead runner (restarts it; a phone that went away is re-attached when it returns, meanwhile it is
simply not offered), and counts what each device measured. The runner's own key is a random
secret passed in its environment, so nothing but the agent can open a session on it.

Everything listens on 127.0.0.1 unless told otherwise (``--bind``).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from toolchain.errors import DeviceError

RPC_MAGIC = 0xFF271  # python/tvm/rpc/base.py
RPC_TRACKER_MAGIC = 0x2F271
RPC_CODE_SUCCESS = RPC_MAGIC + 0
RPC_CODE_MISMATCH = RPC_MAGIC + 2
TRACKER_SUCCESS, TRACKER_PUT, TRACKER_UPDATE_INFO, TRACKER_SUMMARY, TRACKER_GET_PENDING = 0, 3, 5, 6, 7
START_TIMEOUT_S = 120  # the runner under qemu takes a few seconds to print its port


# ----------------------------------------------------------------------------- wire helpers


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def _send_int(sock: socket.socket, value: int) -> None:
    sock.sendall(struct.pack("<i", value))


def _recv_int(sock: socket.socket) -> int:
    return struct.unpack("<i", _recv_exact(sock, 4))[0]


def _send_json(sock: socket.socket, value) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("<i", len(data)) + data)


def _recv_json(sock: socket.socket):
    return json.loads(_recv_exact(sock, _recv_int(sock)).decode())


def client_handshake(sock: socket.socket, key: str, options: str = "") -> str:
    """TVM's client side: magic, "client:<key>[ opts]"; returns the server's key or raises."""
    text = f"client:{key}{' ' + options if options else ''}".encode()
    _send_int(sock, RPC_MAGIC)
    _send_int(sock, len(text))
    sock.sendall(text)
    code = _recv_int(sock)
    if code != RPC_CODE_SUCCESS:
        raise ConnectionError(f"the RPC server refused the session (code {code:#x})")
    return _recv_exact(sock, _recv_int(sock)).decode()


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
            env["LD_LIBRARY_PATH"] = f"{remote}/lib"
            argv = [f"{remote}/agoc-runner", "rpc", "--port", "0", "--work-dir", f"{remote}/rpc"]
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
        _send_int(conn, RPC_TRACKER_MAGIC)
        if _recv_int(conn) != RPC_TRACKER_MAGIC:
            conn.close()
            raise ConnectionError(f"{self.tracker[0]}:{self.tracker[1]} is not a TVM RPC tracker")
        _send_json(conn, [TRACKER_UPDATE_INFO, {"key": "server:" + self.key, "addr": [None, self.port]}])
        if _recv_json(conn) != TRACKER_SUCCESS:
            raise ConnectionError("the tracker refused the registration")
        self._tracker_conn = conn
        self._offer()

    def _offer(self) -> None:
        self._matchkey = f"{self.key}:{secrets.token_hex(8)}"
        _send_json(self._tracker_conn, [TRACKER_PUT, self.key, [self.port, self._matchkey], None])
        if _recv_json(self._tracker_conn) != TRACKER_SUCCESS:
            raise ConnectionError("the tracker refused the offer")

    def _pending(self) -> list:
        _send_json(self._tracker_conn, [TRACKER_GET_PENDING])
        return _recv_json(self._tracker_conn)

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
            if _recv_int(client) != RPC_MAGIC:
                return
            length = _recv_int(client)
            if not 0 <= length <= 4096:
                return
            words = _recv_exact(client, length).decode(errors="replace").split()
            if not words or words[0] != "client:" + self._matchkey:
                _send_int(client, RPC_CODE_MISMATCH)
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
            _send_int(client, RPC_CODE_SUCCESS)
            server_key = ("server:" + self.key).encode()
            _send_int(client, len(server_key))
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


# ----------------------------------------------------------------------------- the tracker


DEFAULT_TRACKER_PORT = 9190


def state_file() -> Path:
    home = Path(os.environ.get("AGOC_HOME", Path.home() / ".cache" / "agoc"))
    return home / "tracker.json"


def tracker_summary(host: str, port: int, timeout: float = 10) -> dict:
    """The tracker's own summary: queue per key and the registered servers."""
    conn = socket.create_connection((host, port), timeout=timeout)
    with conn:
        _send_int(conn, RPC_TRACKER_MAGIC)
        if _recv_int(conn) != RPC_TRACKER_MAGIC:
            raise DeviceError(f"{host}:{port} is not a TVM RPC tracker")
        _send_json(conn, [TRACKER_SUMMARY])
        code, summary = _recv_json(conn)
        if code != TRACKER_SUCCESS:
            raise DeviceError(f"the tracker at {host}:{port} did not answer its summary")
        return summary


def servers_for(summary: dict, key: str) -> int:
    return sum(1 for s in summary.get("server_info", []) if s.get("key", "").split(":", 1)[-1] == key)


def wait_for_tracker(host: str, port: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return tracker_summary(host, port, timeout=5)
        except (OSError, ConnectionError, DeviceError):
            if time.monotonic() > deadline:
                raise DeviceError(f"no RPC tracker answers at {host}:{port}") from None
            time.sleep(0.2)


def start_tracker(host: str = "127.0.0.1", port: int = DEFAULT_TRACKER_PORT, port_end: int | None = None,
                  detach: bool = True) -> dict:
    """Start TVM's own tracker (``python -m tvm.exec.rpc_tracker``) and wait until it answers.

    Returns {pid, host, port}. ``detach``: a session of its own, surviving this process
    (``agoc tracker start``); otherwise the caller stops it (a private tracker of one tune run).
    """
    port_end = port_end or port + 100
    log = state_file().parent / "tracker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", host, "--port", str(port),
             "--port-end", str(port_end), "--silent"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=detach,
        )
    # the tracker takes the first free port in [port, port_end): find which by asking
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeviceError(f"the RPC tracker exited at start (see {log})")
        bound = _listening_port(proc.pid, port, port_end)
        if bound:
            wait_for_tracker(host, bound)
            return {"pid": proc.pid, "host": host, "port": bound, "process": proc}
        time.sleep(0.2)
    proc.kill()
    raise DeviceError(f"the RPC tracker did not start listening within 60 s (see {log})")


def _listening_port(pid: int, lo: int, hi: int) -> int | None:
    import psutil

    try:
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            for c in proc.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN and lo <= c.laddr.port < hi:
                    return c.laddr.port
    except psutil.Error:
        return None
    return None


def stop_process(pid: int) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        for child in proc.children(recursive=True):
            child.kill()
        proc.kill()
    except psutil.Error:
        pass


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise DeviceError(f"bad tracker address '{text}': expected HOST:PORT, e.g. 127.0.0.1:9190") from None


# ----------------------------------------------------------------------------- a tuning session


def device_target(device) -> str:
    """The target preset whose code the device runs (the tracker key defaults to it, too)."""
    return getattr(device, "runner_target", "host")


def tracker_from_state() -> tuple[str, int] | None:
    path = state_file()
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    return state["host"], int(state["port"])


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

    def __enter__(self) -> "RpcSession":
        try:
            if self.tracker is None:
                info = start_tracker(port=DEFAULT_TRACKER_PORT + 1000, detach=False)
                self._tracker_proc = info["process"]
                self.tracker = (info["host"], info["port"])
            self.work_dir.mkdir(parents=True, exist_ok=True)
            for device, name in zip(self.devices, self.names):
                argv = [sys.executable, "-m", "host.cli", "tracker", "serve", "--device", device.name, "--key", self.key,
                        "--tracker", f"{self.tracker[0]}:{self.tracker[1]}", "--name", name,
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
                raise DeviceError(f"no device serves key '{self.key}' on the tracker {self.tracker[0]}:{self.tracker[1]} "
                                  f"({why})")
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
