"""TVM's RPC wire protocol (the handshake, the tracker's messages) and TVM's own tracker as a process:
start, ask, stop, and where `agoc tracker start` records it."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from toolchain.errors import DeviceError

RPC_MAGIC = 0xFF271  # python/tvm/rpc/base.py
RPC_TRACKER_MAGIC = 0x2F271
RPC_CODE_SUCCESS = RPC_MAGIC + 0
RPC_CODE_MISMATCH = RPC_MAGIC + 2
TRACKER_SUCCESS, TRACKER_PUT, TRACKER_UPDATE_INFO, TRACKER_SUMMARY, TRACKER_GET_PENDING = 0, 3, 5, 6, 7
DEFAULT_TRACKER_PORT = 9190


# ----------------------------------------------------------------------------- the wire


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def send_int(sock: socket.socket, value: int) -> None:
    sock.sendall(struct.pack("<i", value))


def recv_int(sock: socket.socket) -> int:
    return struct.unpack("<i", recv_exact(sock, 4))[0]


def send_json(sock: socket.socket, value) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("<i", len(data)) + data)


def recv_json(sock: socket.socket):
    return json.loads(recv_exact(sock, recv_int(sock)).decode())


def client_handshake(sock: socket.socket, key: str, options: str = "") -> str:
    """TVM's client side: magic, "client:<key>[ opts]"; returns the server's key or raises."""
    text = f"client:{key}{' ' + options if options else ''}".encode()
    send_int(sock, RPC_MAGIC)
    send_int(sock, len(text))
    sock.sendall(text)
    code = recv_int(sock)
    if code != RPC_CODE_SUCCESS:
        raise ConnectionError(f"the RPC server refused the session (code {code:#x})")
    return recv_exact(sock, recv_int(sock)).decode()


# ----------------------------------------------------------------------------- the tracker


def state_file() -> Path:
    home = Path(os.environ.get("AGOC_HOME", Path.home() / ".cache" / "agoc"))
    return home / "tracker.json"


def tracker_summary(host: str, port: int, timeout: float = 10) -> dict:
    """The tracker's own summary: queue per key and the registered servers."""
    conn = socket.create_connection((host, port), timeout=timeout)
    with conn:
        send_int(conn, RPC_TRACKER_MAGIC)
        if recv_int(conn) != RPC_TRACKER_MAGIC:
            raise DeviceError(f"{host}:{port} is not a TVM RPC tracker")
        send_json(conn, [TRACKER_SUMMARY])
        code, summary = recv_json(conn)
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

    kill_descendants(pid)
    try:
        psutil.Process(pid).kill()
    except psutil.Error:
        pass


def kill_descendants(pid: int) -> None:
    """Kill every process ``pid`` started, and theirs (SIGKILL); one already gone is passed over."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise DeviceError(f"bad tracker address '{text}': expected HOST:PORT, e.g. 127.0.0.1:9190") from None


def tracker_from_state() -> tuple[str, int] | None:
    path = state_file()
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    return state["host"], int(state["port"])
