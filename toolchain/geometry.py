"""Phone cache geometries (a table with their sources): what the phone-cache proxy simulates and what AGO's
locality defaults follow on an ARM target (half the core's L2); a host target's from this machine's own caches.
Why: docs/partitioning.md (Kept inside)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from toolchain.errors import TargetError

KIB, MIB = 1024, 1024 * 1024
#: a cache line's bytes (every geometry's: Arm's cores and x86 alike)
LINE = 64


@dataclass(frozen=True)
class Cache:
    size: int  # bytes
    assoc: int
    line: int = LINE

    @property
    def label(self) -> str:
        return f"{self.size // MIB}MiB" if self.size % MIB == 0 else f"{self.size // KIB}KiB"

    def flag(self) -> str:
        """valgrind's ``size,associativity,line`` form."""
        return f"{self.size},{self.assoc},{self.line}"


@dataclass(frozen=True)
class Geometry:
    name: str
    description: str
    l1i: Cache
    l1d: Cache
    l2: Cache  # the core's private L2: "L2 traffic" = LL misses with LL = this
    llc: tuple[Cache, ...]  # shared L3 / system-level cache sizes: "DRAM bytes" with LL = each
    source: str

    def to_json(self) -> dict:
        return {**asdict(self), "llc": [asdict(c) for c in self.llc]}


#: Cache geometries, selectable by name (``agoc bench OUT --proxy a76``).
GEOMETRIES: tuple[Geometry, ...] = (
    Geometry(
        "a76",
        "Cortex-A76-class big core (Snapdragon 855, Kirin 980, Dimensity 1000): 64 KiB L1D, 512 KiB L2, "
        "2–4 MiB shared L3",
        l1i=Cache(64 * KIB, 4),
        l1d=Cache(64 * KIB, 4),
        l2=Cache(512 * KIB, 8),
        llc=(Cache(2 * MIB, 16), Cache(4 * MIB, 16)),
        source="Arm Cortex-A76 Core TRM (DDI 100798): L1 I and D 64 KiB 4-way, 64 B lines; private L2 "
        "128/256/512 KiB 8-way. Arm DynamIQ Shared Unit TRM (100453): L3 up to 4 MiB, 16-way. "
        "Snapdragon 855: 512 KiB L2 on the prime core, 2 MiB L3; Kirin 980: 4 MiB L3 (vendor specs, WikiChip)",
    ),
    Geometry(
        "a55",
        "Cortex-A55-class little core (the efficiency cluster of the same phones): 32 KiB L1D, 128 KiB L2, "
        "1–2 MiB shared L3",
        l1i=Cache(32 * KIB, 4),
        l1d=Cache(32 * KIB, 4),
        l2=Cache(128 * KIB, 4),
        llc=(Cache(1 * MIB, 16), Cache(2 * MIB, 16)),
        source="Arm Cortex-A55 Core TRM (DDI 100442): L1 I and D 16–64 KiB 4-way, 64 B lines; optional "
        "private L2 64/128/256 KiB 4-way. Phone parts pair 32 KiB L1 with 128 KiB L2 (Snapdragon 855 "
        "silver cores); DSU L3 1–2 MiB on mid-range SoCs (WikiChip)",
    ),
    Geometry(
        "small-slc",
        "A76-class core in a mid-range phone with a small shared cache (Snapdragon 730/730G, Helio G90): "
        "64 KiB L1D, 256 KiB L2, 1 MiB L3",
        l1i=Cache(64 * KIB, 4),
        l1d=Cache(64 * KIB, 4),
        l2=Cache(256 * KIB, 8),
        llc=(Cache(1 * MIB, 16),),
        source="Arm Cortex-A76 Core TRM (DDI 100798) for L1 and the 8-way L2; Snapdragon 730: Kryo 470 Gold "
        "(Cortex-A76) cores with 256 KiB L2 and a 1 MiB shared L3 (Qualcomm specs, WikiChip)",
    ),
    Geometry(
        "a78",
        "Cortex-A78-class big core (Snapdragon 888's, Exynos 2100's, Dimensity 1200's): 64 KiB L1D, 512 KiB L2, "
        "4 MiB shared L3",
        l1i=Cache(64 * KIB, 4),
        l1d=Cache(64 * KIB, 4),
        l2=Cache(512 * KIB, 8),
        llc=(Cache(4 * MIB, 16),),
        source="Arm Cortex-A78 Core TRM (101430): L1 I and D 32 or 64 KiB 4-way, 64 B lines; private L2 256 or "
        "512 KiB 8-way. Snapdragon 888: Kryo 680 Gold (Cortex-A78) with 512 KiB L2, 4 MiB L3 (Qualcomm specs, "
        "WikiChip)",
    ),
    Geometry(
        "x1",
        "Cortex-X1-class prime core (Snapdragon 888, Exynos 2100): 64 KiB L1D, 1 MiB L2, 4 MiB shared L3",
        l1i=Cache(64 * KIB, 4),
        l1d=Cache(64 * KIB, 4),
        l2=Cache(1 * MIB, 8),
        llc=(Cache(4 * MIB, 16),),
        source="Arm Cortex-X1 Core TRM (101433): L1 I and D 64 KiB 4-way, 64 B lines; private L2 512 KiB or 1 MiB "
        "8-way. Snapdragon 888: Kryo 680 Prime (Cortex-X1) with 1 MiB L2, 4 MiB L3 (Qualcomm specs, WikiChip)",
    ),
)

GEOMETRIES_BY_NAME = {g.name: g for g in GEOMETRIES}

#: an ARM target's geometry by its LLVM CPU name (``--mcpu``); a CPU not here takes its preset's
CPU_GEOMETRIES = {"cortex-a76": "a76", "cortex-a77": "a76", "cortex-a78": "a78", "cortex-a78c": "a78",
                  "cortex-x1": "x1", "cortex-x1c": "x1", "cortex-a55": "a55"}
#: of the core's private L2, the tensor size AGO keeps inside one kernel (``--keep-inside``) and the intensive tiles'
#: cap: half, the other half for the weights and the tile's own input and output streaming through
LOCALITY_SHARE = 0.5
#: ``--geometry`` that turns the geometry off (no locality rule)
NONE = "none"
#: a preset's geometry meaning this machine's own caches (the host presets: their builds run here)
HOST = "host"
#: where Linux describes a core's caches, one ``indexN`` directory per cache; the environment variable points
#: elsewhere (a copy of such a directory, or ``none``: unknown)
SYSFS_CACHES = "/sys/devices/system/cpu/cpu0/cache"
HOST_CACHES_ENV = "AGOC_HOST_CACHES"
_UNITS = {"K": KIB, "M": MIB, "G": 1024 * MIB}


def find(name: str) -> Geometry:
    """The geometry called ``name``; :class:`TargetError` naming the choices."""
    try:
        return GEOMETRIES_BY_NAME[name]
    except KeyError:
        raise TargetError(f"unknown cache geometry '{name}'; choose one of: {', '.join(GEOMETRIES_BY_NAME)}, or "
                          f"{NONE}") from None


def of_target(default: str | None, mcpu: str | None, given: str | None) -> tuple[Geometry | None, str]:
    """(the geometry a build follows, why): ``given`` (``--geometry``; ``none``: none), else for a preset with a
    ``default`` geometry (the ARM ones) its CPU's (``--mcpu``, :data:`CPU_GEOMETRIES`) or that default; a host preset
    none."""
    if given is not None:
        return (None, "--geometry none") if given == NONE else (find(given), f"--geometry {given}")
    if default == HOST:
        geo = of_host()
        return (geo, "this machine's caches") if geo else (None, "a host target whose caches are not known")
    if default is None:
        return None, "a target without a cache geometry"
    if mcpu in CPU_GEOMETRIES:
        return find(CPU_GEOMETRIES[mcpu]), f"--mcpu {mcpu}"
    return find(default), "the target preset's" + (f" (no geometry known for --mcpu {mcpu})" if mcpu else "")


def _size(text: str) -> int:
    text = text.strip()
    return int(text[:-1]) * _UNITS[text[-1]] if text[-1:] in _UNITS else int(text)


def of_host(root: str | None = None) -> Geometry | None:
    """This machine's caches as a geometry, read from ``root`` (Linux sysfs, or :data:`HOST_CACHES_ENV`); None
    where they are not described (no L2 among them, another system, or ``none``)."""
    root = root or os.environ.get(HOST_CACHES_ENV) or SYSFS_CACHES
    caches: dict[tuple[int, str], Cache] = {}
    try:
        for index in sorted(Path(root).glob("index*")) if root != NONE else ():
            read = {name: (index / name).read_text().strip()
                    for name in ("level", "type", "size", "ways_of_associativity", "coherency_line_size")}
            cache = Cache(_size(read["size"]), int(read["ways_of_associativity"] or 0),
                          int(read["coherency_line_size"] or LINE))
            caches[int(read["level"]), read["type"]] = cache
    except (OSError, ValueError, KeyError):
        return None
    l2 = caches.get((2, "Unified")) or caches.get((2, "Data"))
    if l2 is None:
        return None
    l1d = caches.get((1, "Data")) or caches.get((1, "Unified")) or l2
    llc = tuple(c for (level, _), c in sorted(caches.items()) if level >= 3)
    return Geometry(HOST, f"this machine: {l1d.label} L1D, {l2.label} L2"
                    + "".join(f", {c.label} shared" for c in llc), l1i=caches.get((1, "Instruction"), l1d),
                    l1d=l1d, l2=l2, llc=llc, source=f"{root} (Linux sysfs)")


def of_preset(target: str | None, mcpu: str | None, given: str | None) -> tuple[Geometry | None, str]:
    """:func:`of_target` for a target preset's name (None: host; a name no preset has: no default)."""
    from toolchain.targets import PRESETS_BY_NAME

    preset = PRESETS_BY_NAME.get(target or "host")
    return of_target(preset.geometry if preset else None, mcpu, given)


def locality_kib(geo: Geometry | None) -> int:
    """``--keep-inside`` by default: :data:`LOCALITY_SHARE` of ``geo``'s L2 in KiB (0, off, without a geometry)."""
    return 0 if geo is None else int(geo.l2.size * LOCALITY_SHARE) // KIB
