"""The fake adb server, driven by the real client: adbutils talks to it over the adb host protocol."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import adbutils
import pytest

from host.bundle import CROSS_LIBDIR
from tests.conftest import require_tool
from tests.fakeadb import FakeAdbServer

TMP = "/data/local/tmp"


@pytest.fixture
def server(tmp_path):
    with FakeAdbServer(tmp_path / "device", props={"ro.product.model": "Pixel Fake"}) as srv:
        yield srv


@pytest.fixture
def client(server):
    return adbutils.AdbClient(host="127.0.0.1", port=server.port)


@pytest.fixture
def device(client, server):
    return client.device(server.serial)


def test_devices_and_properties(client, server, device):
    assert [d.serial for d in client.device_list()] == ["emulator-5554"]
    (info,) = client.list(extended=True)
    assert (info.state, info.tags["model"], info.tags["transport_id"]) == ("device", "Pixel_Fake", "1")
    assert client.server_version() == 41
    assert device.shell("echo hi") == "hi"
    assert device.getprop("ro.product.cpu.abi") == "arm64-v8a"
    assert device.prop.model == "Pixel Fake"
    assert device.shell(["getprop", "no.such.prop", "fallback"]) == "fallback"
    assert device.shell("uname -m; nproc") == "aarch64\n8"
    assert "CPU part\t: 0xd44" in device.shell("cat /proc/cpuinfo")
    assert device.shell("cat /sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") == "1800000"
    assert "shell_v2" in device.get_features()


def test_unknown_services_fail(client, server, device):
    with pytest.raises(adbutils.AdbError, match="unknown host service"):
        with client.make_connection() as c:
            c.send_command("host:frobnicate")
            c.check_okay()
    with pytest.raises(adbutils.AdbError, match="not found"):
        client.device("no-such-serial").shell("echo hi")
    with pytest.raises(adbutils.AdbError, match="unsupported device service"):
        with device.open_transport() as c:
            c.send_command("framebuffer:")
            c.check_okay()


def test_push_stat_pull_roundtrip(device, server, tmp_path):
    payload = os.urandom(300_000)  # > 64 KiB: several DATA chunks each way
    local = tmp_path / "blob.bin"
    local.write_bytes(payload)
    assert device.sync.push(local, f"{TMP}/agoc/blob.bin", 0o644) == len(payload)  # parents created
    info = device.sync.stat(f"{TMP}/agoc/blob.bin")
    assert info.size == len(payload) and info.mode & 0o777 == 0o644
    assert device.sync.stat(f"{TMP}/missing").mtime is None
    back = tmp_path / "back.bin"
    assert device.sync.pull(f"{TMP}/agoc/blob.bin", back) == len(payload)
    assert back.read_bytes() == payload
    assert server.host_path(f"{TMP}/agoc/blob.bin").read_bytes() == payload
    digest = hashlib.sha256(payload).hexdigest()
    assert device.shell(f"sha256sum {TMP}/agoc/blob.bin") == f"{digest}  {TMP}/agoc/blob.bin"
    with pytest.raises(adbutils.AdbError):
        device.sync.push(b"x", "/system/bin/evil")
    with pytest.raises(adbutils.AdbError, match="No such file"):
        device.sync.read_bytes(f"{TMP}/missing")


def test_shell_files_and_exit_codes(device, server):
    assert device.shell(f"mkdir -p {TMP}/a/b && cd {TMP}/a && touch x y && ls") == "b\nx\ny"
    assert device.shell(f"cd {TMP}/a; echo *; echo '*'; pwd") == "b x y\n*\n/data/local/tmp/a"
    assert device.shell(f"echo one > {TMP}/f; echo two >> {TMP}/f; cat {TMP}/f") == "one\ntwo"
    assert device.shell(f"test -f {TMP}/f && echo file; [ -d {TMP}/f ] || echo notdir") == "file\nnotdir"
    assert device.shell("X=1; export Y=2; echo $X ${Y}z '$X' \"$X\"") == "1 2z $X 1"

    assert device.shell2("false").returncode == 1
    assert device.shell2("sh -c 'exit 3'").returncode == 3  # v1: adbutils appends "; echo X4EXIT:$?"
    assert device.shell2("echo out; exit 4", v2=True).returncode == 4  # v2: the exit packet
    r = device.shell2("echo out; ls /data/local/tmp/nope", v2=True)  # shell protocol v2
    assert (r.returncode, r.stdout, "No such file" in r.stderr) == (1, "out\n", True)
    assert device.shell2("true && false || echo rescued").output == "rescued\n"
    assert device.shell2("ls | wc").returncode == 2  # unsupported: a clear error, not a host shell
    assert device.shell2("nosuchprog").returncode == 127

    for outside in ("/etc", f"{TMP}/../../../etc", "/"):
        r = device.shell2(f"rm -rf {outside}")
        assert r.returncode == 1, outside
        assert "sandbox" in r.output or "Read-only" in r.output
    assert device.shell2(f"rm -rf {TMP}").returncode == 1  # the root itself stays
    assert device.shell2(f"rm -rf {TMP}/a").returncode == 0
    assert not server.host_path(f"{TMP}/a").exists()
    assert server.root.exists() and server.host_path(TMP).is_dir()


def test_forward_and_reverse(device, client):
    echo = socket.create_server(("127.0.0.1", 0))
    port = echo.getsockname()[1]

    def serve():
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    try:
        local = device.forward_port(port)
        assert local != port
        assert [(f.local, f.remote) for f in device.forward_list()] == [(f"tcp:{local}", f"tcp:{port}")]
        with socket.create_connection(("127.0.0.1", local), timeout=5) as s:
            s.sendall(b"ping")
            assert s.recv(16) == b"PING"
        device.forward_remove(f"tcp:{local}")
        assert device.forward_list() == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", local), timeout=5)

        device.reverse(f"tcp:{port}", f"tcp:{port}")  # shared localhost: recorded, nothing to relay
        assert [(r.remote, r.local) for r in device.reverse_list()] == [(f"tcp:{port}", f"tcp:{port}")]
        device.reverse_remove_all()
        assert device.reverse_list() == []
    finally:
        echo.close()


def test_concurrent_connections(device):
    held = device.shell("sleep 5; echo late", stream=True)  # a shell still running...
    try:
        assert device.shell("echo meanwhile") == "meanwhile"  # ...does not block other connections
        assert device.sync.stat(TMP).mode & 0o040000
    finally:
        held.close()  # the client going away ends the command (sleep returns early)


def test_aarch64_program_under_qemu(device, server, tmp_path):
    gcc = require_tool("aarch64-linux-gnu-gcc")
    require_tool("qemu-aarch64")
    (tmp_path / "greet.c").write_text('const char *greet(void) { return "from-lib"; }\n')
    (tmp_path / "probe.c").write_text(
        r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
const char *greet(void);
int main(int argc, char **argv) {
    char cwd[4096];
    printf("argv0=%s args=%d first=%s lib=%s\n", argv[0], argc - 1, argc > 1 ? argv[1] : "", greet());
    printf("GREETING=%s\n", getenv("GREETING") ? getenv("GREETING") : "(unset)");
    printf("cwd_ends=%s\n", getcwd(cwd, sizeof cwd) ? cwd + strlen(cwd) - 4 : "?");
    if (argc > 2) { FILE *f = fopen(argv[2], "w"); if (!f) return 9; fputs("written\n", f); fclose(f); }
    fprintf(stderr, "to stderr\n");
    return argc > 3 ? atoi(argv[3]) : 0;
}
"""
    )
    subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp_path / "libgreet.so", tmp_path / "greet.c"], check=True)
    subprocess.run([gcc, "-o", tmp_path / "probe", tmp_path / "probe.c", f"-L{tmp_path}", "-lgreet"], check=True)
    device.sync.push(tmp_path / "libgreet.so", f"{TMP}/lib/libgreet.so", 0o644)
    device.sync.push(tmp_path / "probe", f"{TMP}/bin/probe", 0o644)

    r = device.shell2(f"{TMP}/bin/probe")
    assert r.returncode == 126 and "Permission denied" in r.output  # not executable yet
    device.shell(f"chmod 755 {TMP}/bin/probe")
    r = device.shell2(f"{TMP}/bin/probe", v2=True)
    assert r.returncode != 0 and "ld-linux-aarch64.so.1" in r.stderr  # as on a phone: no glibc loader of its own
    for name in ("ld-linux-aarch64.so.1", "libc.so.6"):  # a glibc program brings them (host/bundle.py)
        device.sync.push(Path(CROSS_LIBDIR) / name, f"{TMP}/lib/{name}", 0o755)
    loader = f"{TMP}/lib/ld-linux-aarch64.so.1"
    r = device.shell2(f"{loader} {TMP}/bin/probe", v2=True)
    assert r.returncode == 127 and "libgreet.so" in r.stderr  # the loader needs the libraries' directory

    cmd = f"export LD_LIBRARY_PATH={TMP}/lib; cd {TMP}/bin && GREETING=hello {loader} ./probe first {TMP}/out.txt 7"
    r = device.shell2(cmd, v2=True)
    assert r.returncode == 7
    assert r.stdout == "argv0=./probe args=3 first=first lib=from-lib\nGREETING=hello\ncwd_ends=/bin\n"
    assert r.stderr == "to stderr\n"
    assert server.host_path(f"{TMP}/out.txt").read_text() == "written\n"  # device path translated

    out = device.shell(f"env GREETING=env-form {loader} --library-path {TMP}/lib {TMP}/bin/probe 2>/dev/null")
    assert "GREETING=env-form" in out and "to stderr" not in out

    pid = device.shell(f"cd {TMP} && LD_LIBRARY_PATH=lib {loader} bin/probe bg {TMP}/bg.txt > bg.log 2>&1 & echo $!")
    assert pid.isdigit()
    deadline = time.monotonic() + 10
    while "written" not in device.shell(f"cat {TMP}/bg.txt 2>/dev/null") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "first=bg" in device.shell(f"cat {TMP}/bg.log")
    assert device.shell2("kill 1").returncode == 1  # only processes this device started


def test_debian_adb_client_agrees(server, tmp_path):
    """The official adb client (shell v2, host:tport, sync) accepts the same server."""
    adb = require_tool("adb")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([adb, "-P", str(server.port), *args], capture_output=True, text=True, timeout=30)

    assert "emulator-5554" in run("devices").stdout
    r = run("shell", "echo hi; ls /data/local/tmp/nope; exit 5")
    assert (r.returncode, r.stdout, "No such file" in r.stderr) == (5, "hi\n", True)
    (tmp_path / "f.txt").write_text("payload")
    assert run("push", str(tmp_path / "f.txt"), f"{TMP}/f.txt").returncode == 0
    assert run("shell", f"cat {TMP}/f.txt").stdout == "payload"
