"""`agoc tracker start|status|stop|serve`: TVM's RPC tracker, and devices serving it (a farm for tuning)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from host import render
from host.console import console, err_console
from host.options import TrackerOpt
from toolchain.errors import AgocError


def _tracker_address(tracker: Optional[str]) -> tuple[str, int]:
    from host import rpc as rpc_mod
    from toolchain.errors import DeviceError

    text = tracker or os.environ.get("AGOC_TRACKER")
    if text:
        return rpc_mod.parse_address(text)
    found = rpc_mod.tracker_from_state()
    if found is None:
        raise DeviceError("no tracker: start one with `agoc tracker start`, or pass --tracker HOST:PORT")
    return found


def start(
    host: Annotated[str, typer.Option(
        help="Address to bind (loopback by default; 0.0.0.0 serves a network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="First port to try (the next free one up to PORT+100 is taken).")] = 9190,
):
    """Start TVM's RPC tracker in the background and remember where it is."""
    from host import rpc as rpc_mod

    known = rpc_mod.tracker_from_state()
    if known is not None:
        try:
            rpc_mod.tracker_summary(*known, timeout=3)
            console.print(f"a tracker already runs at {known[0]}:{known[1]} (`agoc tracker stop` first)")
            return
        except (OSError, AgocError):
            pass  # a stale state file
    info = rpc_mod.start_tracker(host, port, detach=True)
    state = rpc_mod.state_file()
    state.write_text(json.dumps({k: info[k] for k in ("pid", "host", "port")}))
    console.print(f"[green]✓[/green] RPC tracker at {info['host']}:{info['port']} (pid {info['pid']}); "
                  f"devices join with `agoc tracker serve --device D`")


def status(
    tracker: TrackerOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the tracker's summary as JSON.")] = False,
):
    """Devices registered with the tracker, per key, and queued requests."""
    from host import rpc as rpc_mod

    host, port = _tracker_address(tracker)
    summary = rpc_mod.tracker_summary(host, port)
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(render.tracker_table(summary, f"{host}:{port}"))


def stop():
    """Stop the tracker `agoc tracker start` started."""
    from host import rpc as rpc_mod

    state = rpc_mod.state_file()
    if not state.exists():
        console.print("no tracker was started here")
        return
    info = json.loads(state.read_text())
    rpc_mod.stop_process(int(info["pid"]))
    state.unlink()
    console.print(f"stopped the tracker at {info['host']}:{info['port']}")


def _agent_event(kind: str, **info) -> None:
    """An agent's report (host/rpc.py Agent), one dim line; sessions are counted, not shown."""
    detail = info.get("error") or info.get("reason") or (f"port {info['port']}" if "port" in info else "")
    if kind != "session":
        err_console.print(f"[dim]{escape(info['device'])}: {kind} {escape(str(detail))}[/dim]")


def serve(
    device: Annotated[str, typer.Option(help="The device to offer: local, qemu, or a phone's serial.")],
    key: Annotated[Optional[str], typer.Option(
        help="Tracker key (default: the device's target, e.g. linux-arm64).")] = None,
    tracker: TrackerOpt = None,
    name: Annotated[Optional[str], typer.Option(help="Name in logs and reports (default: the device's).")] = None,
    bind: Annotated[str, typer.Option(
        help="Address the agent listens on for sessions (loopback by default).")] = "127.0.0.1",
    status_file: Annotated[Optional[Path], typer.Option(help="Keep the agent's state (JSON) in this file.")] = None,
):
    """Offer one device to the tracker until interrupted.

    Starts the device's runner in RPC mode, relays the sessions the tracker sends it, restarts the
    runner when it dies and re-attaches the device when it returns."""
    import signal
    import threading

    from host import rpc as rpc_mod
    from host.devices import get_device

    address = _tracker_address(tracker)
    dev = get_device(device)
    key = key or rpc_mod.device_target(dev)

    def on_term(*_):
        raise KeyboardInterrupt

    # stop cleanly, the runner on the device too, however long that takes (the CLI's own handler allows STOP_GRACE_S)
    signal.signal(signal.SIGTERM, on_term)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_term)
    agent = rpc_mod.Agent(rpc_mod.DeviceServer(dev, name), address, key, bind=bind, on_event=_agent_event,
                          status_file=status_file)
    agent.start()
    console.print(f"serving {escape(agent.server.name)} to the tracker {address[0]}:{address[1]} under key "
                  f"'{escape(key)}' (Ctrl-C to stop)")
    stopped = threading.Event()
    try:
        while not stopped.wait(30):
            err_console.print(f"[dim]{escape(agent.server.name)}: {agent.stats.sessions} sessions, "
                              f"{agent.stats.failed} lost, {agent.stats.restarts} restarts; {agent.stats.state}[/dim]")
    except KeyboardInterrupt:
        pass  # Ctrl-C or SIGTERM: the normal way to stop serving
    finally:
        agent.stop()
        console.print(f"{escape(agent.server.name)}: served {agent.stats.sessions} sessions, "
                      f"lost {agent.stats.failed}, restarted the runner {agent.stats.restarts} times")
