"""What several commands share: loading a model source (zoo references need the zoo, so this stays in host/),
checking output paths and the search knobs."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Optional

from host.source import load_source  # noqa: F401  (the commands' loader)
from toolchain.errors import UnsupportedModelError


def load_supported(model: str, shapes: list[str]):
    """:func:`load_source`, its opset and ops checked: (ModelProto, name, resolved inputs, overrides)."""
    from toolchain import frontend

    proto, label, overrides = load_source(model, shapes)
    return proto, label, frontend.checked_inputs(proto, overrides), overrides


def partition_settings(method: str, threshold: Optional[float], keep_inside_kib: Optional[int],
                       target: Optional[str] = None, mcpu: Optional[str] = None, geometry: Optional[str] = None):
    """The partition flags as their record, validated, the tile cache cap ``--keep-inside`` sets too, and where that
    size came from: (PartitionSettings, tile_cache bytes, why; "" when off). Without ``--keep-inside`` the size
    follows the cache geometry — ``--geometry``, else an ARM target's (by ``--mcpu``): half its L2; none on host."""
    from toolchain import geometry as geometries
    from toolchain import settings

    checked = settings.PartitionSettings(method, threshold).validate()  # the flags in the order of --help
    if keep_inside_kib is not None:
        kib, why = keep_inside_kib, "--keep-inside"
    else:
        geo, reason = geometries.of_preset(target, mcpu, geometry)
        kib = geometries.locality_kib(geo)
        why = f"half the {geo.name} cache geometry's {geo.l2.label} L2: {reason}" if geo else ""
    unit, tile_cache = settings.keep_inside(kib)
    return replace(checked, locality_unit=unit), tile_cache, why if kib else ""


def check_search(scheduler: str, transfer: int, population: int, per_iter: Optional[int] = None) -> None:
    """The search knobs `tune` and `bench-suite` share, checked before any work (``per_iter``: the batch,
    by default the settings' own)."""
    from toolchain.tune import SCHEDULERS, TuneSettings

    if scheduler not in SCHEDULERS:
        raise UnsupportedModelError(f"unknown scheduler '{scheduler}'; choose "
                                    + " or ".join(f"{k} ({v})" for k, v in SCHEDULERS.items()))
    if transfer < 0:
        raise UnsupportedModelError("--transfer must be 0 (off) or more")
    if per_iter is None and population < TuneSettings().per_iter:
        raise UnsupportedModelError(f"--population must be at least {TuneSettings().per_iter} (a search batch)")
    if per_iter is not None and population < per_iter:
        raise UnsupportedModelError(f"--population ({population}) must be at least --per-iter ({per_iter}): "
                                    "each batch is picked from it")


def check_output_file(path: Optional[Path], flag: str) -> None:
    """Refuse now, before long work, an output file path that cannot be written (a directory, a missing or
    read-only parent, one where no file can be made, such as /proc)."""
    import tempfile

    if path is None:
        return
    if path.is_dir():
        raise UnsupportedModelError(f"{flag} {path} is a directory; give a file name, e.g. {flag} "
                                    f"{path / 'graph'}{path.suffix or ''}")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if not parent.is_dir():
            raise NotADirectoryError(20, "missing, or not a directory")
        fd, probe = tempfile.mkstemp(prefix=".agoc-probe.", dir=parent)  # root passes os.access everywhere
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UnsupportedModelError(f"{flag} {path}: cannot write in {parent} ({exc.strerror or exc}); give a path "
                                    "in a directory you can write") from None


def write_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: into a temporary file beside it, renamed over it when complete (a full
    disk or an interrupt leaves no half-written file, and an existing one as it was)."""
    import tempfile

    parent = path.parent if str(path.parent) else "."
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def interruptible(func, *args, **kwargs):
    """``func(*args, **kwargs)`` in a worker thread, this thread waiting: a long TVM call (which does not
    return to Python for tens of seconds) then cannot delay Ctrl-C or SIGTERM beyond a fraction of a second."""
    import threading

    result: dict = {}

    def work():
        try:
            result["value"] = func(*args, **kwargs)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            result["error"] = exc

    worker = threading.Thread(target=work, name="agoc-work", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "error" in result:
        raise result["error"]
    return result.get("value")
