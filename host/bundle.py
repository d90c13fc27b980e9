"""The self-contained runner bundle for aarch64 glibc devices (a phone through adb, qemu-user with no sysroot): the
runner, the TVM runtime and every library they and the kernels load, the glibc loader among them, started through it.
Why and the file list: docs/devices.md (The runner bundle)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: glibc's dynamic loader for aarch64: the bundle starts every program through it (``LOADER --library-path DIR``)
LOADER = "ld-linux-aarch64.so.1"
#: where Debian's cross packages (libc6-arm64-cross, libstdc++6-arm64-cross, libgcc-s1-arm64-cross) put them
CROSS_LIBDIR = "/usr/aarch64-linux-gnu/lib"

_SHT_DYNAMIC, _DT_NEEDED = 6, 1


class BundleError(Exception):
    """A library the bundle needs is not on this machine."""


def needed(path: Path) -> list[str]:
    """The DT_NEEDED names of the ELF64 little-endian file ``path`` (its dynamic section through the section
    headers); [] for a static one."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BundleError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_DYNAMIC:
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize or 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                end = data.index(b"\0", strtab + value)
                names.append(data[strtab + value:end].decode())
    return names


def system_libraries(programs: list[Path], libdir: Path) -> list[Path]:
    """The libraries of ``libdir`` that ``programs`` need, transitively (those they ship beside themselves left
    out), and the loader: every file a device without them must be given. Raises :class:`BundleError` naming a
    missing one and the package to install."""
    own = {p.name for p in programs}
    found: dict[str, Path] = {}
    todo = [LOADER, *(name for p in programs for name in needed(p))]
    while todo:
        name = todo.pop()
        if name in own or name in found:
            continue
        path = libdir / name
        if not path.exists():
            raise BundleError(f"{name} (needed by the runner, the TVM runtime or the kernels) is not in {libdir}: "
                              "install the aarch64 cross toolchain (`make setup`, or apt-get install "
                              "g++-aarch64-linux-gnu)")
        found[name] = path
        todo += needed(path.resolve())
    return [found[name] for name in sorted(found)]


def cross_libdir() -> Path:
    return Path(os.environ.get("AGOC_CROSS_LIBDIR", CROSS_LIBDIR))


def command(remote: str, program: str, args: list[str]) -> list[str]:
    """The command line that starts ``program`` of the bundle in ``remote`` (its libraries in ``remote``/lib)
    through the bundled loader: no library of the device's own is used."""
    return [f"{remote}/lib/{LOADER}", "--library-path", f"{remote}/lib", f"{remote}/{program}", *args]


@dataclass(frozen=True)
class BundleFile:
    name: str
    bytes: int
    source: str  # where it was copied from: the runner build, the TVM wheel, a Debian package


def describe(runner: Path, libs: list[Path]) -> list[BundleFile]:
    """Each file of the bundle, its size and where it comes from (the Debian package and version of a system
    library, when dpkg knows it)."""
    system = cross_libdir().resolve()
    rows = [BundleFile(runner.name, runner.stat().st_size, "make runner TARGET=linux-arm64")]
    for lib in libs:
        source = _package(lib) if lib.parent.resolve() == system else "the apache-tvm aarch64 wheel's runtime"
        rows.append(BundleFile(lib.name, lib.resolve().stat().st_size, source))
    return rows


def _package(path: Path) -> str:
    """'package version' of the Debian package that installed ``path`` (or its link target), else its directory."""
    if not shutil.which("dpkg-query"):
        return str(path.parent)
    for candidate in (path, path.resolve()):
        owner = subprocess.run(["dpkg-query", "-S", str(candidate)], capture_output=True, text=True)
        if owner.returncode == 0 and ":" in owner.stdout:
            package = owner.stdout.split(":")[0].strip()
            version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True,
                                     text=True).stdout.strip()
            return f"{package} {version}".strip()
    return str(path.parent)
