"""A small adb server stand-in: the adb *host protocol* on 127.0.0.1, serving one emulated device.

There is no phone and no adbd on these machines, so tests stand this server up and point the real
client at it (``adbutils.AdbClient(host="127.0.0.1", port=server.port)``): every byte adbutils sends
goes through the same wire protocol it speaks to a real ``adb`` server (Android's
``docs/dev/services.md`` / ``SERVICES.TXT``, ``SYNC.TXT``, ``shell_protocol.h``).

Host protocol
    Requests are ``XXXX<service>`` (4 lower-case hex digits of length). Replies are ``OKAY`` or
    ``FAIL`` + 4-hex length + message. Services (unknown ones get ``FAIL``):

    host:version                      -> OKAY "0029" (adb 1.0.41, so adbutils uses host:tport)
    host:devices / host:devices-l     -> OKAY + list block
    host:features, host-serial:S:features -> OKAY + "shell_v2,stat_v2,fixed_push_mkdir"
    host:transport:S, host:transport-any, host:transport-id:1 -> OKAY, then one device service
    host:tport:serial:S / tport:any / tport:id:1 -> OKAY + 8-byte little-endian transport id (1)
    host-serial:S:get-state|get-serialno|get-devpath -> OKAY + block
    host-serial:S:forward:[norebind:]tcp:A;tcp:B   -> OKAY OKAY (+ port block when A is 0)
    host-serial:S:list-forward, host:list-forward  -> OKAY + "S tcp:A tcp:B" lines
    host-serial:S:killforward:tcp:A, killforward-all -> OKAY OKAY
    host[-serial:S]:wait-for-<any|usb|local>-device -> OKAY OKAY
    host-transport-id:1:<cmd> is the same as host-serial:S:<cmd>; host:kill answers OKAY, stays up.

    Device services (after a transport request; a ``host:X`` request there means host-serial:S:X):
    shell:CMD          raw stream, stdout and stderr merged, connection closed at exit (shell v1)
    shell,v2[,...]:CMD shell protocol v2 packets [id u8][len u32 le][data]: 1 stdout, 2 stderr,
                       3 exit code (one byte). Client packets (stdin, window size) are read, ignored.
    exec:CMD           like shell: (raw bytes)
    sync:              STAT, STA2, LST2, LIST, SEND, RECV, QUIT (SEND creates parent directories)
    reverse:forward:[norebind:]tcp:A;tcp:B, reverse:list-forward, reverse:killforward:tcp:A,
    reverse:killforward-all
    tcp:PORT           a stream to 127.0.0.1:PORT

    Forwards: the emulated device's localhost *is* this machine's localhost. ``forward tcp:A tcp:B``
    with A != B opens a real listener on 127.0.0.1:A relaying each connection to 127.0.0.1:B; with
    A == B the port is already reachable, so it is only recorded (a listener would collide with the
    device-side server bound to that very port). ``reverse`` is the same mapping seen from the
    other side: recorded, and relayed A -> B when the ports differ, a no-op when they are equal.

Emulated device filesystem
    ``sandbox`` is the device's root directory, holding only: ``/data/local/tmp`` and ``/sdcard``
    (writable), ``/proc/cpuinfo`` and ``/sys/devices/system/cpu/...`` (read-only, a small *fixed
    fake* set written at start: an aarch64 cpuinfo and cpufreq/topology files for ``cpus``,
    default 4x Cortex-A55 + 3x Cortex-A78 + 1x Cortex-X1), their parent directories (read-only)
    and ``/dev/null``. Any other path -- including ``..`` that leaves these, or a symlink pointing out
    of the sandbox -- is refused with "outside the emulated device's sandbox" and exit code 1.
    Writes outside the writable roots fail with "Read-only file system".

Shell (a mini ``sh``: input is tokenised with ``shlex``; nothing ever reaches a host shell)
    ``a && b``, ``a || b``, ``a ; b``, newlines; ``prog &`` (background: detached, output to /dev/null
    unless redirected -- real adb would hold the connection open instead; ``$!`` is its host pid,
    ``kill`` accepts only pids this device started; builtins ignore ``&``);
    ``VAR=VAL cmd``, ``VAR=VAL``, ``export VAR=VAL``, ``unset VAR``; ``$VAR ${VAR} $? $! $$ $# $@ $1..``
    (single quotes suppress them); ``>``, ``>>``, ``<``, ``2>``, ``2>&1``, ``&>``; ``*``/``?`` globs.
    Builtins: cd pwd echo [-n] cat ls [-l -a -1] mkdir [-p] [-m MODE] rm [-r -f] rmdir chmod [-R]
    touch cp [-r] mv md5sum sha256sum getprop [NAME [DEFAULT]] nproc uname [-a -m -s -r] df [-k PATH]
    test / [ (-e -f -d -x -s -r -w -z -n = != !) true false sleep kill [-SIG] exit env [-i]
    nohup exec sh [-c STRING | FILE] [ARGS] (redirections on ``sh`` itself are ignored);
    /system/bin/<builtin> works too. Anything else without a ``/`` is "not found" (127).
    Not supported (clear error, exit 2): pipes, subshells, $(...), control flow (if/for/while).

    Running a program: a file in the sandbox with the execute bit (``chmod 755``) that is an
    aarch64 ELF runs as ``qemu-aarch64 -0 <argv0> <host path> args`` (no sysroot: as on a phone, a program
    with glibc brings its own loader and libraries, host/bundle.py) with
    the sandbox-translated cwd; ``#!...sh`` scripts run through this same mini shell. Arguments and
    environment values (also ``X=path`` and ``a:b`` lists) that are absolute device paths under
    /data/local/tmp or /sdcard are translated to host paths. The environment is the device's (not
    the host's); ``LD_*`` variables go to the guest only (``qemu -E``), never to qemu itself.
    Exit codes propagate (a signal N gives 128+N). A program whose client disconnects gets SIGHUP,
    as adbd does. stdin is always empty.

Limitations (honest ones)
    One device. Programs under qemu see the *host's* /proc and /sys, not the fake set (only shell
    reads and sync see those). Timings under qemu mean nothing. Only tcp: forwards/reverses (no
    localabstract:, jdwp:); no install (no pm), no logcat, no root/remount, no push of symlinks.
    A program sees (and may print) host paths where device paths were translated. A lone digit
    before ``>`` is always a file descriptor (``echo 2 > f`` writes an empty f). Only a word that
    is exactly one unquoted ``$VAR`` is split into several words.
"""

from __future__ import annotations

import glob
import hashlib
import os
import posixpath
import re
import shlex
import shutil
import signal
import socket
import socketserver
import stat as st
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

QEMU = "qemu-aarch64"
ADB_VERSION = 41
TRANSPORT_ID = 1
FEATURES = "shell_v2,stat_v2,fixed_push_mkdir"
WRITABLE = ("/data/local/tmp", "/sdcard")
READ_ONLY = ("/proc/cpuinfo", "/sys/devices/system/cpu")
SYNC_DATA_MAX = 64 * 1024

DEFAULT_PROPS = {
    "ro.product.cpu.abi": "arm64-v8a",
    "ro.product.cpu.abilist": "arm64-v8a",
    "ro.product.model": "agoc-emulator",
    "ro.product.name": "agoc_emulator",
    "ro.product.device": "agoc_emulator",
    "ro.product.manufacturer": "agoc",
    "ro.build.version.sdk": "33",
    "ro.build.version.release": "13",
    "ro.soc.model": "qemu-aarch64",
}


@dataclass(frozen=True)
class FakeCpu:
    part: int  # MIDR part number, as /proc/cpuinfo's "CPU part"
    max_khz: int
    cluster: int


DEFAULT_CPUS = (
    *[FakeCpu(0xD05, 1_800_000, 0)] * 4,  # Cortex-A55
    *[FakeCpu(0xD41, 2_400_000, 1)] * 3,  # Cortex-A78
    FakeCpu(0xD44, 2_840_000, 2),  # Cortex-X1
)


class SandboxError(Exception):
    """A path the emulated device does not have or will not write."""


class ShellError(Exception):
    """Syntax the mini shell does not support (exit code 2)."""


class _Exit(Exception):
    def __init__(self, code: int):
        self.code = code


class _Disconnected(Exception):
    pass


# ---------------------------------------------------------------- wire helpers


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _block(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return b"%04x" % len(data) + data


def _okay(sock: socket.socket, text: str | None = None) -> None:
    sock.sendall(b"OKAY" + (_block(text) if text is not None else b""))


def _fail(sock: socket.socket, message: str) -> None:
    sock.sendall(b"FAIL" + _block(message))


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done; then close both."""

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    t = threading.Thread(target=pump, args=(b, a), daemon=True)
    t.start()
    pump(a, b)
    t.join()
    a.close()
    b.close()


class _Listener:
    """127.0.0.1:port -> 127.0.0.1:target, one relay per accepted connection."""

    def __init__(self, port: int, target: int):
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.target = target
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                remote = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                remote.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=_relay, args=(client, remote), daemon=True).start()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in the other thread
        except OSError:
            pass
        self.sock.close()


# ---------------------------------------------------------------- shell tokenising

_OPS = "();<>|&"
_QUOTED_OP = {c: chr(0xE100 + i) for i, c in enumerate(_OPS)}  # operator chars inside quotes
_UNQUOTE_OP = str.maketrans({v: k for k, v in _QUOTED_OP.items()})
_VAR_Q, _VAR_U, _VAR_END = "\ue001", "\ue002", "\ue003"  # "$X" and $X
_STAR, _QMARK = "\ue004", "\ue005"  # unquoted glob characters
_SUBST = "\ue006"  # $(...) or `...`: unsupported, fails the command it is in
_VAR_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*|[0-9?!$#@])\}|([A-Za-z_][A-Za-z0-9_]*|[0-9?!$#@])")
_EXPANSION_RE = re.compile(f"[{_VAR_Q}{_VAR_U}]([^{_VAR_END}]*){_VAR_END}")
_REDIRECTS = {">", ">>", "<", ">&", "&>", ">|"}
_SEPARATORS = {";", "&&", "||", "&"}
_UNQUOTED = {"*": _STAR, "?": _QMARK, "\n": " ; "}  # unquoted chars _mark rewrites (a newline separates commands)


def _mark(text: str) -> str:
    """Make quoting survive shlex: mark $expansions, unquoted globs and quoted operator chars."""
    out: list[str] = []
    quote = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = None
            out.append(_QUOTED_OP.get(c, c))
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            nxt = text[i + 1]
            if quote == '"' and nxt in "$`":
                out.append(nxt)
            else:
                out += [c, _QUOTED_OP.get(nxt, nxt)]
            i += 2
            continue
        if c == "$":
            if text.startswith("$(", i):
                out.append(_SUBST)
                i += 2
                continue
            m = _VAR_RE.match(text, i + 1)
            if m:
                out.append((_VAR_Q if quote else _VAR_U) + (m.group(1) or m.group(2)) + _VAR_END)
                i = m.end()
                continue
            out.append(c)
        elif c == "`":
            out.append(_SUBST)
        elif quote == '"':
            if c == '"':
                quote = None
            out.append(_QUOTED_OP.get(c, c) if c != '"' else c)
        elif c in "'\"":
            quote = c
            out.append(c)
        else:
            out.append(_UNQUOTED.get(c, c))
        i += 1
    return "".join(out)


def _parse(text: str) -> list[tuple[list[tuple[bool, str]], str]]:
    """Script -> [(tokens, separator after)], each token (is_operator, text).

    A command using something unsupported (pipe, subshell, command substitution) becomes a single
    (True, "error message") token, so only that command fails (exit 2) and the rest still run.
    """
    lex = shlex.shlex(_mark(text), posix=True, punctuation_chars=_OPS)
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        raw = list(lex)
    except ValueError as e:
        raise ShellError(f"syntax error: {e}") from None
    commands: list[tuple[list[tuple[bool, str]], str]] = []
    current: list[tuple[bool, str]] = []
    for tok in raw:
        is_op = bool(tok) and all(c in _OPS for c in tok)
        if is_op and tok in _SEPARATORS:
            if not current:
                raise ShellError(f"syntax error near unexpected '{tok}'")
            commands.append((current, tok))
            current = []
        elif is_op and tok in _REDIRECTS:
            current.append((True, tok))
        elif is_op:
            what = {"|": "pipes are", "(": "subshells are", ")": "subshells are"}.get(tok)
            current.append((True, f"{what} not supported by fakeadb" if what else f"syntax error near '{tok}'"))
        elif _SUBST in tok:
            current.append((True, "command substitution is not supported by fakeadb"))
        else:
            current.append((False, tok))
    if current:
        commands.append((current, ";"))
    return commands


def _mode_string(mode: int) -> str:
    kind = "d" if st.S_ISDIR(mode) else "l" if st.S_ISLNK(mode) else "-"
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return kind + bits


def _chmod_value(spec: str, old: int) -> int:
    if re.fullmatch(r"[0-7]{1,4}", spec):
        return int(spec, 8)
    mode = old & 0o7777
    for part in spec.split(","):
        m = re.fullmatch(r"([ugoa]*)([-+=])([rwx]*)", part)
        if not m:
            raise ValueError(f"invalid mode '{spec}'")
        who = m.group(1) or "a"
        perm = sum({"r": 4, "w": 2, "x": 1}[p] for p in m.group(3))
        mask = 0
        for w in who:
            for shift in {"u": [6], "g": [3], "o": [0], "a": [6, 3, 0]}[w]:
                mask |= perm << shift
                if m.group(2) == "=":
                    mode &= ~(7 << shift)
        mode = mode & ~mask if m.group(2) == "-" else mode | mask
    return mode


class _IO:
    """Where one command's stdout/stderr go: the client stream (None) or an open file."""

    def __init__(self, session: "_Session", stdout=None, stderr=None, stderr_to_stdout=False):
        self.session, self.stdout, self.stderr = session, stdout, stderr
        self.stderr_to_stdout = stderr_to_stdout

    def out(self, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        if self.stdout is None:
            self.session.write(1, data)
        else:
            self.stdout.write(data)

    def err(self, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        if self.stderr_to_stdout:
            self.out(data)
        elif self.stderr is None:
            self.session.write(2, data)
        else:
            self.stderr.write(data)


class _Session:
    """The client end of one shell: raw (v1, stderr merged) or shell-protocol v2 packets."""

    def __init__(self, sock: socket.socket | None, v2: bool):
        self.sock, self.v2 = sock, v2
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.procs: set[subprocess.Popen] = set()

    def write(self, fd: int, data: bytes) -> None:
        if not data or self.sock is None:
            return
        try:
            with self.lock:
                self.sock.sendall(struct.pack("<BI", fd, len(data)) + data if self.v2 else data)
        except OSError:
            self.closed.set()
            raise _Disconnected() from None

    def watch(self) -> None:
        """Drain what the client sends (stdin, window size: ignored); on disconnect SIGHUP our programs."""
        try:
            while self.sock.recv(65536):
                pass
        except OSError:
            pass
        self.closed.set()
        for proc in list(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGHUP)


# ---------------------------------------------------------------- the server


class FakeAdbServer:
    """An adb server on 127.0.0.1:<free port> with one emulated device rooted at ``sandbox``.

    ``props`` override/extend DEFAULT_PROPS (what ``getprop`` answers); ``cpus`` is the fake CPU set
    behind /proc/cpuinfo, /sys/devices/system/cpu and ``nproc``. Use as a context manager (or
    start()/stop()); ``port`` is set once started, ``host_path(device_path)`` maps a device path.
    stop() kills every program the device started and closes forwards and open connections;
    unplug() does the same but keeps the server up, answering "device not found" until plug().
    """

    def __init__(
        self,
        sandbox: Path,
        serial: str = "emulator-5554",
        props: dict | None = None,
        *,
        cpus: tuple[FakeCpu, ...] = DEFAULT_CPUS,
    ):
        self.root = Path(sandbox).resolve()
        self.serial = serial
        self.props = {**DEFAULT_PROPS, **(props or {})}
        self.cpus = tuple(cpus)
        self.port = 0
        self.unplugged = False  # unplug() / plug(): the phone leaves and comes back (a reboot)
        self._lock = threading.Lock()
        self._forwards: dict[str, tuple[str, _Listener | None]] = {}  # local -> (remote, relay)
        self._reverses: dict[str, tuple[str, _Listener | None]] = {}  # device -> (host, relay)
        self._jobs: dict[int, subprocess.Popen] = {}  # background programs, by host pid
        self._procs: set[subprocess.Popen] = set()
        self._conns: set[socket.socket] = set()
        self._tcp: socketserver.ThreadingTCPServer | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "FakeAdbServer":
        self._make_device_tree()
        fake = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                fake._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._tcp = Server(("127.0.0.1", 0), Handler)
        self.port = self._tcp.server_address[1]
        threading.Thread(target=self._tcp.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._tcp is not None:
            self._tcp.shutdown()
            self._tcp.server_close()
            self._tcp = None
        self._drop_device_state()

    def unplug(self) -> None:
        """The phone leaves (cable pulled, reboot): its programs die, its forwards and open
        connections close, and the server no longer lists it until :meth:`plug`."""
        self.unplugged = True
        self._drop_device_state()

    def plug(self) -> None:
        self.unplugged = False

    def _drop_device_state(self) -> None:
        with self._lock:
            relays = [r for _, r in [*self._forwards.values(), *self._reverses.values()] if r]
            self._forwards.clear()
            self._reverses.clear()
            procs = [*self._jobs.values(), *self._procs]
            self._jobs.clear()
            conns = list(self._conns)
        for relay in relays:
            relay.close()
        for conn in conns:  # clients still connected (a streaming shell, say) see the end
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def __enter__(self) -> "FakeAdbServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _make_device_tree(self) -> None:
        for d in WRITABLE:
            (self.root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (self.root / "proc").mkdir(exist_ok=True)
        blocks = []
        for i, cpu in enumerate(self.cpus):
            blocks.append(
                f"processor\t: {i}\nBogoMIPS\t: 38.40\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 "
                f"crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\n"
                f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0x{cpu.part:03x}\nCPU revision\t: 0\n"
            )
        (self.root / "proc/cpuinfo").write_text("\n".join(blocks) + f"\nHardware\t: {self.props['ro.soc.model']}\n")
        base = self.root / "sys/devices/system/cpu"
        base.mkdir(parents=True, exist_ok=True)
        span = f"0-{len(self.cpus) - 1}\n"
        for name in ("possible", "present", "online"):
            (base / name).write_text(span)
        for i, cpu in enumerate(self.cpus):
            files = {
                "online": "1",
                "cpufreq/cpuinfo_max_freq": cpu.max_khz,
                "cpufreq/scaling_max_freq": cpu.max_khz,
                "cpufreq/scaling_cur_freq": cpu.max_khz,
                "cpufreq/cpuinfo_min_freq": 300_000,
                "cpufreq/scaling_min_freq": 300_000,
                "cpufreq/scaling_governor": "schedutil",
                "topology/cluster_id": cpu.cluster,
                "topology/physical_package_id": 0,
                "topology/core_id": i,
            }
            for rel, value in files.items():
                path = base / f"cpu{i}" / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"{value}\n")

    # ------------------------------------------------------------ device paths

    def host_path(self, device_path: str) -> Path:
        """Where a device path lives on this machine (raises SandboxError for paths the device lacks)."""
        return self._resolve(device_path, "/")[1]

    def _resolve(self, path: str, cwd: str, *, write: bool = False, follow: bool = True) -> tuple[str, Path]:
        dev = posixpath.normpath(posixpath.join(cwd, path))
        dev = "/" + dev.lstrip("/")
        if dev == "/dev/null":
            if follow:
                return dev, Path(os.devnull)
            raise SandboxError(f"{path}: Permission denied")
        mapped = WRITABLE + READ_ONLY
        under = any(dev == r or dev.startswith(r + "/") for r in mapped)
        ancestor = any(r.startswith(dev.rstrip("/") + "/") for r in mapped)
        if not (under or ancestor):
            raise SandboxError(
                f"{path}: outside the emulated device's sandbox (only {', '.join(mapped)} exist)"
            )
        if write and not any(dev == r or dev.startswith(r + "/") for r in WRITABLE):
            raise SandboxError(f"{path}: Read-only file system")
        host = self.root / dev.lstrip("/")
        if follow or dev == "/":
            check = os.path.realpath(host)
        else:  # the last component itself may be a symlink (rm, mv act on the link)
            check = os.path.join(os.path.realpath(host.parent), host.name)
        root = str(self.root)
        if check != root and not check.startswith(root + os.sep):
            raise SandboxError(f"{path}: resolves outside the emulated device's sandbox")
        return dev, host

    def _translate(self, value: str) -> str:
        """Device paths under the writable roots -> host paths (also in X=path and a:b lists)."""

        def one(item: str) -> str:
            if any(item == r or item.startswith(r + "/") for r in WRITABLE):
                try:
                    return str(self._resolve(item, "/")[1])
                except SandboxError:
                    return item
            return item

        m = re.fullmatch(r"([^=/]*=)?(.*)", value, re.S)
        return (m.group(1) or "") + ":".join(one(p) for p in m.group(2).split(":"))

    # ------------------------------------------------------------ host protocol

    def _serve(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.add(sock)
        try:
            size = int(_recv_exact(sock, 4), 16)
            self._host_request(sock, _recv_exact(sock, size).decode())
        except (OSError, EOFError, ValueError, UnicodeDecodeError):
            pass
        finally:
            with self._lock:
                self._conns.discard(sock)
            try:
                sock.close()
            except OSError:
                pass

    def _host_request(self, sock: socket.socket, req: str) -> None:
        """Answer one host request (a transport request hands the connection to a device service)."""
        if self.unplugged and req not in ("host:version", "host:devices", "host:devices-l", "host:kill"):
            _fail(sock, f"device '{self.serial}' not found")
            return
        if self._transport(sock, req):
            return
        for prefix in (f"host-serial:{self.serial}:", f"host-transport-id:{TRANSPORT_ID}:", "host:"):
            if req.startswith(prefix):
                self._host_command(sock, req[len(prefix):], req)
                return
        if req.startswith(("host-serial:", "host-transport-id:")):
            _fail(sock, f"device '{req.split(':')[1]}' not found")
        else:
            _fail(sock, f"unknown host service '{req}'")

    def _transport(self, sock: socket.socket, req: str) -> bool:
        """Answer a transport request (True), then serve the device service it asks for; False: not one."""
        transports = {
            f"host:transport:{self.serial}": b"",
            "host:transport-any": b"",
            f"host:transport-id:{TRANSPORT_ID}": b"",
            f"host:tport:serial:{self.serial}": struct.pack("<Q", TRANSPORT_ID),
            "host:tport:any": struct.pack("<Q", TRANSPORT_ID),
            f"host:tport:id:{TRANSPORT_ID}": struct.pack("<Q", TRANSPORT_ID),
        }
        if req in transports:
            sock.sendall(b"OKAY" + transports[req])
            size = int(_recv_exact(sock, 4), 16)
            self._device_service(sock, _recv_exact(sock, size).decode())
            return True
        if req.startswith(("host:transport", "host:tport:")):
            _fail(sock, f"device '{req.rsplit(':', 1)[-1]}' not found")
            return True
        return False

    def _host_command(self, sock: socket.socket, cmd: str, req: str) -> None:
        """One host service for this device (``cmd``: ``req`` less its host[-serial:S]: prefix)."""
        answers = {  # the ones that answer OKAY + one fixed block
            "version": f"{ADB_VERSION:04x}",
            "features": FEATURES,
            "get-state": "device",
            "get-serialno": self.serial,
            "get-devpath": "fakeadb",
        }
        handlers = {
            "devices": self._devices,
            "devices-l": self._devices_long,
            "kill": _okay,
            "list-forward": self._list_forward,
            "killforward-all": self._killforward_all,
        }
        if cmd in answers:
            _okay(sock, answers[cmd])
        elif cmd in handlers:
            handlers[cmd](sock)
        elif re.fullmatch(r"wait-for-(any|usb|local)-(device|any)", cmd):
            sock.sendall(b"OKAY" + b"OKAY")
        elif cmd.startswith("forward:"):
            self._forward(sock, cmd[len("forward:"):])
        elif cmd.startswith("killforward:"):
            self._killforward(sock, cmd[len("killforward:"):])
        else:
            _fail(sock, f"unknown host service '{req}'")

    def _devices(self, sock: socket.socket) -> None:
        _okay(sock, "" if self.unplugged else f"{self.serial}\tdevice\n")

    def _devices_long(self, sock: socket.socket) -> None:
        p = {k: re.sub(r"[^A-Za-z0-9._-]", "_", v) for k, v in self.props.items()}  # as adb does
        _okay(
            sock,
            "" if self.unplugged else
            f"{self.serial:<22} device product:{p['ro.product.name']} model:{p['ro.product.model']} "
            f"device:{p['ro.product.device']} transport_id:{TRANSPORT_ID}\n",
        )

    def _list_forward(self, sock: socket.socket) -> None:
        with self._lock:
            lines = "".join(f"{self.serial} {loc} {rem}\n" for loc, (rem, _) in self._forwards.items())
        _okay(sock, lines)

    def _killforward_all(self, sock: socket.socket) -> None:
        with self._lock:
            relays = [r for _, r in self._forwards.values() if r]
            self._forwards.clear()
        for relay in relays:
            relay.close()
        sock.sendall(b"OKAY" + b"OKAY")

    def _killforward(self, sock: socket.socket, local: str) -> None:
        with self._lock:
            entry = self._forwards.pop(local, None)
        if entry is None:
            _fail(sock, f"listener '{local}' not found")
        else:
            if entry[1]:
                entry[1].close()
            sock.sendall(b"OKAY" + b"OKAY")

    def _map_ports(self, spec: str, table: dict, sock: socket.socket) -> None:
        """[norebind:]tcp:A;tcp:B -> table[tcp:A] = tcp:B with a relay A -> B when A != B."""
        norebind = spec.startswith("norebind:")
        spec = spec.removeprefix("norebind:")
        m = re.fullmatch(r"tcp:(\d+);tcp:(\d+)", spec)
        if not m:
            _fail(sock, f"fakeadb supports only tcp:PORT;tcp:PORT, not '{spec}'")
            return
        a, b = int(m.group(1)), int(m.group(2))
        with self._lock:
            key = f"tcp:{a}"
            if a and key in table and norebind:
                _fail(sock, "cannot rebind existing socket")
                return
            old = table.pop(key, None) if a else None
            if old and old[1]:
                old[1].close()
            relay = None
            if a != b:
                try:
                    relay = _Listener(a, b)
                except OSError as e:
                    _fail(sock, f"cannot bind listener: {e.strerror}")
                    return
            table[f"tcp:{relay.port if relay else a}"] = (f"tcp:{b}", relay)
        sock.sendall(b"OKAY" + b"OKAY" + (_block(str(relay.port)) if a == 0 else b""))

    def _forward(self, sock: socket.socket, spec: str) -> None:
        self._map_ports(spec, self._forwards, sock)

    # ------------------------------------------------------------ device services

    def _device_service(self, sock: socket.socket, service: str) -> None:
        if service.startswith("host:"):  # a host request on the chosen transport (adb forward does this)
            self._host_request(sock, f"host-serial:{self.serial}:{service[len('host:'):]}")
            return
        m = re.match(r"(shell|exec)((?:,[^:]*)?):(.*)\Z", service, re.S)
        if m:
            v2 = m.group(1) == "shell" and "v2" in m.group(2).split(",")
            sock.sendall(b"OKAY")
            session = _Session(sock, v2)
            threading.Thread(target=session.watch, daemon=True).start()
            code = _Shell(self, session).run(m.group(3))
            if v2 and not session.closed.is_set():
                try:
                    sock.sendall(struct.pack("<BIB", 3, 1, code & 0xFF))
                except OSError:
                    pass
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        elif service == "sync:":
            sock.sendall(b"OKAY")
            self._sync(sock)
        elif service.startswith("reverse:"):
            self._reverse(sock, service[len("reverse:"):])
        elif re.fullmatch(r"tcp:\d+", service):
            try:
                remote = socket.create_connection(("127.0.0.1", int(service[4:])), timeout=5)
                remote.settimeout(None)
            except OSError as e:
                _fail(sock, f"connect to {service} failed: {e.strerror}")
                return
            sock.sendall(b"OKAY")
            _relay(sock, remote)
        else:
            _fail(sock, f"fakeadb: unsupported device service '{service}'")

    def _reverse(self, sock: socket.socket, cmd: str) -> None:
        if cmd.startswith("forward:"):
            sock.sendall(b"OKAY")  # the stream to the device opened; the device answers next
            self._map_ports(cmd[len("forward:"):], self._reverses, sock)
            return
        if cmd == "list-forward":
            with self._lock:
                lines = "".join(f"host {dev} {host}\n" for dev, (host, _) in self._reverses.items())
            sock.sendall(b"OKAY" + _block(lines))
        elif cmd == "killforward-all" or cmd.startswith("killforward:"):
            with self._lock:
                keys = list(self._reverses) if cmd == "killforward-all" else [cmd[len("killforward:"):]]
                if not all(k in self._reverses for k in keys):
                    _fail(sock, f"listener '{keys[0]}' not found")
                    return
                relays = [self._reverses.pop(k)[1] for k in keys]
            for relay in relays:
                if relay:
                    relay.close()
            sock.sendall(b"OKAY" + b"OKAY")
        else:
            _fail(sock, f"fakeadb: unsupported reverse service '{cmd}'")

    # ------------------------------------------------------------ sync

    def _sync(self, sock: socket.socket) -> None:
        def fail(message: str) -> None:
            sock.sendall(b"FAIL" + struct.pack("<I", len(message.encode())) + message.encode())

        while True:
            try:
                ident, size = struct.unpack("<4sI", _recv_exact(sock, 8))
                path = _recv_exact(sock, size).decode() if ident != b"QUIT" else ""
            except (EOFError, OSError):
                return
            if ident == b"QUIT":
                return
            if ident in (b"STAT", b"STA2", b"LST2"):
                self._sync_stat(sock, ident, path)
            elif ident == b"LIST":
                self._sync_list(sock, path)
            elif ident == b"RECV":
                self._sync_recv(sock, path, fail)
            elif ident == b"SEND":
                self._sync_send(sock, path, fail)
            else:
                fail(f"unknown sync command {ident!r}")
                return

    def _sync_stat(self, sock: socket.socket, ident: bytes, path: str) -> None:
        """STAT (v1: mode, size, mtime; zeros when missing), STA2 / LST2 (v2; error 2 when missing)."""
        try:
            host = self._resolve(path, "/", follow=ident != b"LST2")[1]
            s = os.stat(host) if ident != b"LST2" else os.lstat(host)
        except (SandboxError, OSError):
            s = None
        if ident == b"STAT":
            vals = (s.st_mode, s.st_size, int(s.st_mtime)) if s else (0, 0, 0)
            sock.sendall(b"STAT" + struct.pack("<III", *(v & 0xFFFFFFFF for v in vals)))
        elif s is None:
            sock.sendall(ident + struct.pack("<IQQIIIIQqqq", 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        else:
            sock.sendall(ident + struct.pack(
                "<IQQIIIIQqqq", 0, s.st_dev, s.st_ino, s.st_mode, s.st_nlink, 2000, 2000,
                s.st_size, int(s.st_atime), int(s.st_mtime), int(s.st_ctime)))

    def _sync_list(self, sock: socket.socket, path: str) -> None:
        """LIST: a DENT per entry (. and .. included; none for a missing directory), then DONE."""
        try:
            host = self._resolve(path, "/")[1]
            names = [".", ".."] + sorted(os.listdir(host))
        except (SandboxError, OSError):
            names = []
        for name in names:
            try:
                s = os.lstat(host / name)
            except OSError:
                continue
            raw = name.encode()
            sock.sendall(b"DENT" + struct.pack("<IIII", s.st_mode, s.st_size & 0xFFFFFFFF,
                                               int(s.st_mtime), len(raw)) + raw)
        sock.sendall(b"DONE" + bytes(16))

    def _sync_recv(self, sock: socket.socket, path: str, fail) -> None:
        """RECV: the file in DATA chunks, then DONE; FAIL when it cannot be read."""
        try:
            host = self._resolve(path, "/")[1]
            with open(host, "rb") as f:
                while chunk := f.read(SYNC_DATA_MAX):
                    sock.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
            sock.sendall(b"DONE" + bytes(4))
        except SandboxError as e:
            fail(str(e))
        except OSError as e:
            fail(f"{path}: {e.strerror}")

    def _sync_send(self, sock: socket.socket, spec: str, fail) -> None:
        path, _, mode_text = spec.rpartition(",")
        error = None
        f = None
        try:
            mode = int(mode_text)
            if not st.S_ISREG(mode):
                raise SandboxError(f"{path}: fakeadb pushes regular files only")
            host = self._resolve(path, "/", write=True)[1]
            host.parent.mkdir(parents=True, exist_ok=True)
            if host.is_dir():
                raise SandboxError(f"{path}: Is a directory")
            f = open(host, "wb")
        except (SandboxError, ValueError) as e:
            error = str(e)
        except OSError as e:
            error = f"{path}: {e.strerror}"
        mtime = None
        try:
            while True:  # read every DATA/DONE the client sends, even after a failure
                ident, size = struct.unpack("<4sI", _recv_exact(sock, 8))
                if ident == b"DATA":
                    if size > SYNC_DATA_MAX:
                        error = error or "DATA chunk too large"
                    data = _recv_exact(sock, size)
                    if f and not error:
                        f.write(data)
                elif ident == b"DONE":
                    mtime = size
                    break
                else:
                    error = error or f"unexpected {ident!r} during SEND"
                    break
        finally:
            if f:
                f.close()
        if error:
            if f:
                host.unlink(missing_ok=True)
            fail(error)
            return
        os.chmod(host, mode & 0o7777)
        os.utime(host, (mtime, mtime))
        sock.sendall(b"OKAY" + bytes(4))


# ---------------------------------------------------------------- the shell


def _program_streams(io: _IO, background: bool) -> tuple:
    """A program's (stdout, stderr) for Popen: its redirections, else pipes (pumped to the client), or
    /dev/null for a background program."""
    stdout = io.stdout if io.stdout is not None else subprocess.PIPE
    if io.stderr_to_stdout:
        stderr = subprocess.STDOUT
    else:
        stderr = io.stderr if io.stderr is not None else subprocess.PIPE
    if background:
        stdout = subprocess.DEVNULL if stdout is subprocess.PIPE else stdout
        stderr = subprocess.DEVNULL if stderr is subprocess.PIPE else stderr
    return stdout, stderr


class _Shell:
    BUILTIN_DIRS = ("/system/bin", "/system/xbin", "/bin", "/vendor/bin")

    def __init__(self, server: FakeAdbServer, session: _Session, args: list[str] | None = None):
        self.server, self.session = server, session
        self.cwd = "/"
        self.vars = {
            "PATH": "/product/bin:/apex/com.android.runtime/bin:/system/bin:/system/xbin:/vendor/bin",
            "HOME": "/",
            "TMPDIR": "/data/local/tmp",
            "ANDROID_DATA": "/data",
            "ANDROID_ROOT": "/system",
            "SHELL": "/system/bin/sh",
            "USER": "shell",
        }
        self.exported = set(self.vars)
        self.args = args or ["sh"]
        self.status = 0
        self.last_bg = ""

    # ------------------------------------------------------------ running scripts

    def run(self, script: str) -> int:
        try:
            try:
                commands = _parse(script)
            except ShellError as e:
                self.session.write(2, f"sh: {e}\n".encode())
                return 2
            prev = ";"
            for tokens, sep in commands:
                if not ((prev == "&&" and self.status != 0) or (prev == "||" and self.status == 0)):
                    self.status = self._simple(tokens, background=sep == "&")
                prev = sep
            return self.status
        except _Exit as e:
            return e.code
        except _Disconnected:
            return 255

    def _value(self, name: str) -> str:
        special = {"?": str(self.status), "!": self.last_bg, "$": str(os.getpid()),
                   "#": str(len(self.args) - 1), "@": " ".join(self.args[1:])}
        if name in special:
            return special[name]
        if name.isdigit():
            return self.args[int(name)] if int(name) < len(self.args) else ""
        return self.vars.get(name, "")

    def _expand(self, token: str) -> list[str]:
        whole = _EXPANSION_RE.fullmatch(token)
        if whole and token[0] == _VAR_U:  # unquoted $X alone: split into words, vanish when empty
            return self._value(whole.group(1)).split()
        text = _EXPANSION_RE.sub(lambda m: self._value(m.group(1)), token).translate(_UNQUOTE_OP)
        if _STAR not in text and _QMARK not in text:
            return [text]
        literal = text.replace(_STAR, "*").replace(_QMARK, "?")
        pattern = "".join(glob.escape(c) if c not in (_STAR, _QMARK) else c for c in text)
        pattern = pattern.replace(_STAR, "*").replace(_QMARK, "?")
        absolute = posixpath.normpath(posixpath.join(self.cwd, pattern))
        matches = sorted(glob.glob(glob.escape(str(self.server.root)) + absolute))
        out = []
        root = str(self.server.root)
        for m in matches:
            if not os.path.realpath(m).startswith(root + os.sep):
                continue  # through a symlink that leaves the sandbox
            dev = "/" + os.path.relpath(m, root)
            out.append(dev if literal.startswith("/") else posixpath.relpath(dev, self.cwd))
        return out or [literal]

    def _simple(self, tokens: list[tuple[bool, str]], background: bool) -> int:
        unsupported = [tok for is_op, tok in tokens if is_op and tok not in _REDIRECTS]
        if unsupported:
            self.session.write(2, f"sh: {unsupported[0]}\n".encode())
            return 2
        words: list[str] = []
        redirects: list[tuple[str, str, str]] = []  # (fd, op, target)
        i = 0
        while i < len(tokens):
            is_op, tok = tokens[i]
            if is_op:
                if i + 1 >= len(tokens) or tokens[i + 1][0]:
                    self.session.write(2, f"sh: syntax error near '{tok}'\n".encode())
                    return 2
                fd = "0" if tok == "<" else "1"
                if words and re.fullmatch(r"[0-9]", words[-1]) and tok != "&>":
                    fd = words.pop()  # "2>" arrives as "2", ">"
                target = self._expand(tokens[i + 1][1])
                redirects.append((fd, tok, target[0] if target else ""))
                i += 2
            else:
                words.append(tok)
                i += 1
        argv = [w for tok in words for w in self._expand(tok)]
        assigns = {}
        while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0], re.S):
            name, _, value = argv.pop(0).partition("=")
            assigns[name] = value
        if not argv:
            self.vars.update(assigns)
            return 0
        try:
            io = self._open_redirects(redirects)
        except SandboxError as e:
            self.session.write(2, f"sh: {e}\n".encode())
            return 1
        except OSError as e:
            self.session.write(2, f"sh: {e.filename}: {e.strerror}\n".encode())
            return 1
        try:
            return self._command(argv, assigns, io, background)
        finally:
            for f in {io.stdout, io.stderr} - {None}:
                f.close()

    def _open_redirects(self, redirects) -> _IO:
        io = _IO(self.session)
        for fd, op, target in redirects:
            if op == ">&" and target in ("1", "2"):
                if fd == "2" and target == "1":
                    io.stderr_to_stdout = True
                elif fd == "1" and target == "2":
                    io.stdout = io.stderr
                continue
            if op == "<":
                self.server._resolve(target, self.cwd)  # must exist in the sandbox; stdin stays empty
                continue
            host = self.server._resolve(target, self.cwd, write=target != "/dev/null")[1]
            f = open(host, "ab" if op == ">>" else "wb")
            if op in ("&>", ">&"):
                io.stdout, io.stderr_to_stdout = f, True
            elif fd == "2":
                io.stderr = f
            else:
                io.stdout = f
        return io

    # ------------------------------------------------------------ dispatch

    def _command(self, argv: list[str], assigns: dict, io: _IO, background: bool, clear=False) -> int:
        name = argv[0]
        if posixpath.dirname(name) in self.BUILTIN_DIRS:
            name = posixpath.basename(name)
        if name in ("nohup", "exec") and len(argv) > 1:
            return self._command(argv[1:], assigns, io, background, clear)
        if name == "env":
            rest = argv[1:]
            env = dict(assigns)
            clear = bool(rest) and rest[0] == "-i"
            if clear:
                rest = rest[1:]
            while rest and "=" in rest[0] and not rest[0].startswith("="):
                k, _, v = rest.pop(0).partition("=")
                env[k] = v
            if not rest:
                base = {} if clear else {k: self.vars[k] for k in sorted(self.exported)}
                io.out("".join(f"{k}={v}\n" for k, v in {**base, **env}.items()))
                return 0
            return self._command(rest, env, io, background, clear)
        if name in ("if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
                    "esac", "function", "{", "}"):
            io.err(f"sh: '{name}': control flow is not supported by fakeadb\n")
            return 2
        builtin = getattr(self, "b_" + name.replace("[", "bracket"), None)
        if (builtin is not None and "/" not in argv[0]) or posixpath.dirname(argv[0]) in self.BUILTIN_DIRS:
            if builtin is None:
                io.err(f"sh: {argv[0]}: inaccessible or not found\n")
                return 127
            try:
                return builtin(argv[1:], io)
            except SandboxError as e:
                io.err(f"{name}: {e}\n")
                return 1
            except OSError as e:
                io.err(f"{name}: {e.filename or ''}: {e.strerror}\n")
                return 1
            except (ValueError, KeyError, IndexError) as e:
                io.err(f"{name}: bad arguments: {e}\n")
                return 1
        if "/" not in argv[0]:
            io.err(f"sh: {argv[0]}: inaccessible or not found\n")
            return 127
        return self._program(argv, assigns, io, background, clear)

    def _program(self, argv: list[str], assigns: dict, io: _IO, background: bool, clear: bool) -> int:
        host, code = self._executable(argv[0], io)
        if host is None:
            return code
        with open(host, "rb") as f:
            head = f.read(64)
        env = {} if clear else {k: self.vars[k] for k in self.exported if k in self.vars}
        env.update(assigns)
        if head.startswith(b"#!"):
            return self._script(argv, host, head, env, io)
        if head[:4] != b"\x7fELF" or struct.unpack_from("<H", head, 18)[0] != 183:
            io.err(f"sh: {argv[0]}: not an aarch64 executable: exec format error\n")
            return 126
        qemu = shutil.which(QEMU)
        if qemu is None:
            io.err(f"sh: {argv[0]}: {QEMU} is not installed on the host\n")
            return 126
        cmd, host_env = self._qemu_command(qemu, argv, host, env)
        cwd = self.server._resolve(self.cwd, "/")[1]
        stdout, stderr = _program_streams(io, background)
        proc = subprocess.Popen(cmd, cwd=cwd, env=host_env, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr, start_new_session=True)
        if background:
            return self._detach(proc)
        return self._wait(proc, io)

    def _executable(self, arg0: str, io: _IO) -> tuple[Path | None, int]:
        """(host path, 0) of a program the shell may run, or (None, the shell's exit code) with its message."""
        try:
            _, host = self.server._resolve(arg0, self.cwd)
        except SandboxError as e:
            io.err(f"sh: {e}\n")
            return None, 127 if "outside" in str(e) else 126
        if not host.is_file():
            io.err(f"sh: {arg0}: {'Is a directory' if host.is_dir() else 'inaccessible or not found'}\n")
            return None, 126 if host.is_dir() else 127
        if not os.access(host, os.X_OK):
            io.err(f"sh: {arg0}: can't execute: Permission denied\n")
            return None, 126
        return host, 0

    def _script(self, argv: list[str], host: Path, head: bytes, env: dict, io: _IO) -> int:
        """A ``#!...sh`` script, run by this mini shell with ``env`` added."""
        interp = head[2:].split(b"\n")[0].split()
        if not interp or posixpath.basename(interp[0].decode()) != "sh":
            io.err(f"sh: {argv[0]}: fakeadb runs only sh scripts\n")
            return 126
        sub = _Shell(self.server, self.session, [argv[0], *argv[1:]])
        sub.cwd, sub.vars = self.cwd, {**self.vars, **env}
        sub.exported = self.exported | set(env)
        return sub.run(host.read_text())

    def _qemu_command(self, qemu: str, argv: list[str], host: Path, env: dict) -> tuple[list[str], dict]:
        """qemu's command line and environment: LD_* variables go to the guest (-E), device paths translated."""
        cmd = [qemu, "-0", argv[0]]
        host_env = {}
        for k, v in env.items():
            v = self.server._translate(v)
            if k.startswith("LD_") and "," not in v:
                cmd += ["-E", f"{k}={v}"]  # for the guest's loader, not for qemu's own
            else:
                host_env[k] = v
        cmd += [str(host), *(self.server._translate(a) for a in argv[1:])]
        return cmd, host_env

    def _detach(self, proc: subprocess.Popen) -> int:
        """A background program: a job of the device (``$!``, ``kill``), its finished jobs reaped."""
        with self.server._lock:
            jobs = self.server._jobs
            for pid in [pid for pid, job in jobs.items() if job.poll() is not None]:
                del jobs[pid]  # reaped
            jobs[proc.pid] = proc
        self.last_bg = str(proc.pid)
        return 0

    def _wait(self, proc: subprocess.Popen, io: _IO) -> int:
        """A foreground program: its output pumped to ``io`` until it exits (SIGHUP when the client goes)."""
        with self.server._lock:
            self.server._procs.add(proc)
        self.session.procs.add(proc)
        if self.session.closed.is_set():
            proc.send_signal(signal.SIGHUP)

        def pump(pipe, write) -> None:
            try:
                while data := os.read(pipe.fileno(), 65536):
                    try:
                        write(data)
                    except _Disconnected:
                        proc.send_signal(signal.SIGHUP)
                        break
            finally:
                pipe.close()

        pumps = [threading.Thread(target=pump, args=(p, w), daemon=True)
                 for p, w in ((proc.stdout, io.out), (proc.stderr, io.err)) if p is not None]
        for t in pumps:
            t.start()
        code = proc.wait()
        for t in pumps:
            t.join()
        self.session.procs.discard(proc)
        with self.server._lock:
            self.server._procs.discard(proc)
        if self.session.closed.is_set():
            raise _Disconnected()
        return 128 - code if code < 0 else code

    # ------------------------------------------------------------ builtins (b_<name>)

    def _path(self, p: str, **kw) -> Path:
        return self.server._resolve(p, self.cwd, **kw)[1]

    @staticmethod
    def _flags(args: list[str], allowed: str) -> tuple[set[str], list[str]]:
        flags, rest = set(), []
        for i, a in enumerate(args):
            if a == "--":
                return flags, rest + args[i + 1:]
            if a.startswith("-") and len(a) > 1 and all(c in allowed for c in a[1:]):
                flags |= set(a[1:])
            else:
                rest.append(a)
        return flags, rest

    def b_cd(self, args, io):
        target = args[0] if args else "/"
        dev, host = self.server._resolve(target, self.cwd)
        if not host.is_dir():
            io.err(f"cd: {target}: No such file or directory\n")
            return 2
        self.cwd = dev
        return 0

    def b_pwd(self, args, io):
        io.out(self.cwd + "\n")
        return 0

    def b_echo(self, args, io):
        newline = not (args and args[0] == "-n")
        io.out(" ".join(args[0 if newline else 1:]) + ("\n" if newline else ""))
        return 0

    def b_true(self, args, io):
        return 0

    def b_false(self, args, io):
        return 1

    def b_exit(self, args, io):
        raise _Exit(int(args[0]) & 0xFF if args else self.status)

    def b_export(self, args, io):
        for a in args:
            name, eq, value = a.partition("=")
            if eq:
                self.vars[name] = value
            self.exported.add(name)
        return 0

    def b_unset(self, args, io):
        for a in args:
            self.vars.pop(a, None)
            self.exported.discard(a)
        return 0

    def b_sleep(self, args, io):
        deadline = time.monotonic() + float(args[0] if args else 0)
        while time.monotonic() < deadline:  # returns early when the client goes away
            if self.session.closed.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
                raise _Disconnected()
        return 0

    def b_cat(self, args, io):
        code = 0
        for a in args:
            host = self._path(a)
            if host.is_dir():
                io.err(f"cat: {a}: Is a directory\n")
                code = 1
            elif not host.exists():
                io.err(f"cat: {a}: No such file or directory\n")
                code = 1
            else:
                io.out(host.read_bytes())
        return code

    def b_ls(self, args, io):
        flags, paths = self._flags(args, "la1")
        code, outputs = 0, []
        for p in paths or ["."]:
            host = self._path(p)
            if not os.path.lexists(host):
                io.err(f"ls: {p}: No such file or directory\n")
                code = 1
                continue
            if host.is_dir():
                names = sorted(os.listdir(host))
                if "a" in flags:
                    names = [".", ".."] + names
                else:
                    names = [n for n in names if not n.startswith(".")]
                entries = [(n, host / n) for n in names]
            else:
                entries = [(p, host)]
            lines = []
            for n, h in entries:
                if "l" in flags:
                    s = os.lstat(h)
                    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.st_mtime))
                    lines.append(f"{_mode_string(s.st_mode)} 1 shell shell {s.st_size:>8} {when} {n}\n")
                else:
                    lines.append(n + "\n")
            outputs.append((p, host.is_dir(), "".join(lines)))
        for i, (p, is_dir, text) in enumerate(outputs):
            if len(outputs) > 1 and is_dir:
                io.out(("\n" if i else "") + f"{p}:\n")
            io.out(text)
        return code

    def b_mkdir(self, args, io):
        mode = None
        if "-m" in args:
            i = args.index("-m")
            mode, args = args[i + 1], args[:i] + args[i + 2:]
        flags, paths = self._flags(args, "p")
        code = 0
        for p in paths:
            if "p" in flags and self._path(p).is_dir():
                continue
            host = self._path(p, write=True)
            try:
                host.mkdir(parents="p" in flags, exist_ok="p" in flags)
                if mode:
                    os.chmod(host, _chmod_value(mode, 0o777))
            except FileExistsError:
                io.err(f"mkdir: {p}: File exists\n")
                code = 1
            except FileNotFoundError:
                io.err(f"mkdir: {p}: No such file or directory\n")
                code = 1
        return code

    def b_rm(self, args, io):
        flags, paths = self._flags(args, "rRf")
        code = 0
        for p in paths:
            dev, host = self.server._resolve(p, self.cwd, write=True, follow=False)
            if dev in WRITABLE:
                io.err(f"rm: {p}: Permission denied\n")
                code = 1
            elif host.is_dir() and not host.is_symlink():
                if flags & {"r", "R"}:
                    shutil.rmtree(host)
                else:
                    io.err(f"rm: {p}: Is a directory\n")
                    code = 1
            elif os.path.lexists(host):
                host.unlink()
            elif "f" not in flags:
                io.err(f"rm: {p}: No such file or directory\n")
                code = 1
        return code

    def b_rmdir(self, args, io):
        for p in args:
            self._path(p, write=True).rmdir()
        return 0

    def b_chmod(self, args, io):
        flags, rest = self._flags(args, "R")
        if len(rest) < 2:
            io.err("chmod: needs MODE FILE...\n")
            return 1
        spec, paths = rest[0], rest[1:]
        code = 0
        for p in paths:
            host = self._path(p, write=True)
            if not host.exists():
                io.err(f"chmod: {p}: No such file or directory\n")
                code = 1
                continue
            targets = [host]
            if "R" in flags and host.is_dir():
                targets += [Path(d) / n for d, ds, fs in os.walk(host) for n in ds + fs]
            for t in targets:
                try:
                    os.chmod(t, _chmod_value(spec, os.stat(t).st_mode))
                except ValueError as e:
                    io.err(f"chmod: {e}\n")
                    return 1
        return code

    def b_touch(self, args, io):
        for p in args:
            self._path(p, write=True).touch()
        return 0

    def b_cp(self, args, io):
        flags, rest = self._flags(args, "rRfp")
        if len(rest) != 2:
            io.err("cp: fakeadb supports cp [-r] SRC DST\n")
            return 1
        src, dst = self._path(rest[0]), self._path(rest[1], write=True)
        if dst.is_dir():
            dst = dst / src.name
        if src.is_dir():
            if not flags & {"r", "R"}:
                io.err(f"cp: {rest[0]}: Is a directory (use -r)\n")
                return 1
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
        return 0

    def b_mv(self, args, io):
        if len(args) != 2:
            io.err("mv: fakeadb supports mv SRC DST\n")
            return 1
        src = self._path(args[0], write=True, follow=False)
        dst = self._path(args[1], write=True)
        os.replace(src, dst / src.name if dst.is_dir() else dst)
        return 0

    def _digest(self, algorithm, args, io):
        for p in args:
            io.out(f"{hashlib.new(algorithm, self._path(p).read_bytes()).hexdigest()}  {p}\n")
        return 0

    def b_md5sum(self, args, io):
        return self._digest("md5", args, io)

    def b_sha256sum(self, args, io):
        return self._digest("sha256", args, io)

    def b_getprop(self, args, io):
        props = self.server.props
        if not args:
            io.out("".join(f"[{k}]: [{v}]\n" for k, v in sorted(props.items())))
        else:
            io.out(props.get(args[0], args[1] if len(args) > 1 else "") + "\n")
        return 0

    def b_df(self, args, io):
        """``df [-k] [PATH...]``: toybox's columns, in 1K blocks, of the host filesystem under the sandbox."""
        paths = [a for a in args if not a.startswith("-")] or ["/data/local/tmp"]
        io.out("Filesystem     1K-blocks    Used Available Use% Mounted on\n")
        for p in paths:
            fs = os.statvfs(self._path(p))
            total, avail = fs.f_blocks * fs.f_frsize // 1024, fs.f_bavail * fs.f_frsize // 1024
            used = total - fs.f_bfree * fs.f_frsize // 1024
            io.out(f"/dev/block/fake {total} {used} {avail} {100 * used // max(total, 1)}% {p}\n")
        return 0

    def b_nproc(self, args, io):
        io.out(f"{len(self.server.cpus)}\n")
        return 0

    def b_uname(self, args, io):
        fields = {"s": "Linux", "n": "localhost", "r": "5.15.0-fakeadb", "m": "aarch64"}
        flags, _ = self._flags(args, "asnrm")
        picked = "snrm" if "a" in flags else "".join(c for c in "snrm" if c in flags) or "s"
        io.out(" ".join(fields[c] for c in picked) + "\n")
        return 0

    def b_test(self, args, io):
        negate = bool(args) and args[0] == "!"
        if negate:
            args = args[1:]
        if len(args) == 2 and args[0] in ("-e", "-f", "-d", "-x", "-s", "-r", "-w", "-L"):
            try:
                host = self._path(args[1], follow=args[0] != "-L")
            except SandboxError:
                result = False
            else:
                result = {
                    "-e": host.exists, "-f": host.is_file, "-d": host.is_dir, "-L": host.is_symlink,
                    "-x": lambda: os.access(host, os.X_OK),
                    "-r": host.exists, "-w": host.exists,
                    "-s": lambda: host.is_file() and host.stat().st_size > 0,
                }[args[0]]()
        elif len(args) == 2 and args[0] in ("-z", "-n"):
            result = (args[1] == "") == (args[0] == "-z")
        elif len(args) == 3 and args[1] in ("=", "==", "!="):
            result = (args[0] == args[2]) == (args[1] != "!=")
        elif len(args) == 1:
            result = args[0] != ""
        elif not args:
            result = False
        else:
            io.err(f"test: unsupported expression: {' '.join(args)}\n")
            return 2
        return int(result == negate)

    def b_bracket(self, args, io):
        if not args or args[-1] != "]":
            io.err("[: missing ]\n")
            return 2
        return self.b_test(args[:-1], io)

    def b_kill(self, args, io):
        sig = signal.SIGTERM
        if args and args[0] == "-s" and len(args) > 1:
            args = ["-" + args[1], *args[2:]]
        if args and args[0].startswith("-"):
            name = args.pop(0)[1:]
            sig = int(name) if name.isdigit() else signal.Signals["SIG" + name.upper().removeprefix("SIG")]
        code = 0
        for pid in args:
            with self.server._lock:
                proc = self.server._jobs.get(int(pid)) if pid.isdigit() else None
                if proc is None:
                    proc = next((p for p in self.server._procs if str(p.pid) == pid), None)
            if proc is None or proc.poll() is not None:
                io.err(f"kill: {pid}: No such process\n")
                code = 1
            else:
                proc.send_signal(sig)
        return code

    def b_sh(self, args, io):
        if args[:1] == ["-c"] and len(args) > 1:
            sub = _Shell(self.server, self.session, args[2:] or ["sh"])
            script = args[1]
        elif args:
            sub = _Shell(self.server, self.session, args)
            script = self._path(args[0]).read_text()
        else:
            return 0
        sub.cwd, sub.vars, sub.exported = self.cwd, dict(self.vars), set(self.exported)
        return sub.run(script)
