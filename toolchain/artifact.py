"""The artifact directory: what ``agoc compile`` writes and every later stage reads.

Layout::

    OUT/
      manifest.json        this module's Manifest, as JSON (schema agoc.artifact/1)
      model.so             the kernel library (a Relax VM executable)
      model.onnx           the source model, so verification can re-run onnxruntime
      data/input_<i>.bin   sample inputs (raw little-endian, shape/dtype in the manifest)
      data/expected_<i>.bin  onnxruntime's outputs on those inputs
      io.txt               the same tensors for the C++ runner, one per line:
                           ``input|output <name> <dtype> <d0,d1,...> <file>``
                           (name percent-encoded, so fields never contain spaces)

Tensors are raw bytes rather than .npy so the C++ runner can read them with
one ``fread``; their shape and dtype live in the manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np

from toolchain.errors import ArtifactError
from toolchain.onnx_import import TensorInfo

SCHEMA = "agoc.artifact/1"
MANIFEST = "manifest.json"
LIBRARY = "model.so"
MODEL_COPY = "model.onnx"
IO_SPEC = "io.txt"


@dataclass(frozen=True)
class TensorFile:
    info: TensorInfo
    file: str  # relative to the artifact root

    def to_json(self) -> dict:
        return {**self.info.to_json(), "file": self.file}

    @staticmethod
    def from_json(d: dict) -> "TensorFile":
        return TensorFile(TensorInfo.from_json(d), d["file"])


@dataclass(frozen=True)
class Manifest:
    model_name: str
    model_sha256: str
    op_counts: dict = field(hash=False)
    inputs: tuple[TensorFile, ...]
    outputs: tuple[TensorFile, ...]  # files hold onnxruntime's outputs for the sample inputs
    target: dict = field(hash=False)  # TargetSpec.to_json()
    compiler: dict = field(hash=False)  # Compiler.to_json()
    partition: str
    partition_info: dict = field(hash=False)  # method, threshold, stats, groups of op-graph node ids
    kernels: tuple[dict, ...]  # KernelInfo.to_json() each
    versions: dict = field(hash=False)
    sample_seed: int
    compile_seconds: float
    created: str
    library: str = LIBRARY
    model_file: str = MODEL_COPY
    tuning: dict | None = field(default=None, hash=False)  # {db, applied, kernels} when built with --db
    check: dict | None = field(default=None, hash=False)  # the self-check before writing: {status, device, ...}
    library_sha256: str | None = None  # of the library as built (None in artifacts made before it was recorded)
    untuned: dict | None = field(default=None, hash=False)  # kernels without a tuned schedule: {rule, library, counts}

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "model": {
                "name": self.model_name,
                "sha256": self.model_sha256,
                "file": self.model_file,
                "op_counts": self.op_counts,
            },
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "target": self.target,
            "compiler": self.compiler,
            "library": self.library,
            "library_sha256": self.library_sha256,
            "partition": self.partition,
            "partition_info": self.partition_info,
            "kernels": list(self.kernels),
            "tuning": self.tuning,
            "untuned": self.untuned,
            "check": self.check,
            "versions": self.versions,
            "sample_seed": self.sample_seed,
            "compile_seconds": self.compile_seconds,
            "created": self.created,
        }

    @staticmethod
    def from_json(d: dict) -> "Manifest":
        return Manifest(
            model_name=d["model"]["name"],
            model_sha256=d["model"]["sha256"],
            op_counts=d["model"]["op_counts"],
            model_file=d["model"]["file"],
            inputs=tuple(TensorFile.from_json(t) for t in d["inputs"]),
            outputs=tuple(TensorFile.from_json(t) for t in d["outputs"]),
            target=d["target"],
            compiler=d["compiler"],
            library=d["library"],
            library_sha256=d.get("library_sha256"),
            partition=d["partition"],
            partition_info=d["partition_info"],
            kernels=tuple(d["kernels"]),
            tuning=d.get("tuning"),
            untuned=d.get("untuned"),
            check=d.get("check"),
            versions=d["versions"],
            sample_seed=d["sample_seed"],
            compile_seconds=d["compile_seconds"],
            created=d["created"],
        )


@dataclass(frozen=True)
class Artifact:
    root: Path
    manifest: Manifest

    @property
    def library_path(self) -> Path:
        return self.root / self.manifest.library

    @property
    def model_path(self) -> Path:
        return self.root / self.manifest.model_file

    @property
    def target_preset(self) -> str:
        return self.manifest.target["preset"]

    def read_inputs(self) -> dict[str, np.ndarray]:
        return {t.info.name: read_tensor(self.root / t.file, t.info) for t in self.manifest.inputs}

    def read_expected(self) -> dict[str, np.ndarray]:
        return {t.info.name: read_tensor(self.root / t.file, t.info) for t in self.manifest.outputs}


def write_tensor(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tofile(path)


def read_tensor(path: Path, info: TensorInfo) -> np.ndarray:
    if not path.exists():
        raise ArtifactError(f"artifact is incomplete: {path} is missing; recompile with `agoc compile`")
    data = np.fromfile(path, dtype=np.dtype(info.dtype).newbyteorder("<"))
    expected = int(np.prod(info.shape, dtype=np.int64))
    if data.size != expected:
        raise ArtifactError(
            f"{path} holds {data.size} elements but the manifest says {info.shape} ({expected}); recompile"
        )
    return data.reshape(info.shape).astype(np.dtype(info.dtype), copy=False)


def write_manifest(root: Path, manifest: Manifest) -> Path:
    path = root / MANIFEST
    path.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    lines = [
        f"{kind} {quote(t.info.name, safe='')} {t.info.dtype} {','.join(map(str, t.info.shape)) or 'scalar'} {t.file}"
        for kind, tensors in (("input", manifest.inputs), ("output", manifest.outputs))
        for t in tensors
    ]
    (root / IO_SPEC).write_text("\n".join(lines) + "\n")
    return path


def load_artifact(root: str | Path) -> Artifact:
    """Open an artifact directory; :class:`ArtifactError` naming what is wrong."""
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"no artifact directory at {root}; create one with `agoc compile MODEL -o {root}`")
    path = root / MANIFEST
    if not path.exists():
        raise ArtifactError(f"{root} has no {MANIFEST}: not an agoc artifact (create one with `agoc compile`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); recompile with `agoc compile`") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} holds a JSON {type(data).__name__}, not an agoc manifest (an object); recompile "
                            "with `agoc compile`")
    if data.get("schema") != SCHEMA:
        raise ArtifactError(
            f"{path} has schema {data.get('schema')!r}, this agoc reads {SCHEMA!r}; recompile with this agoc"
        )
    try:
        manifest = Manifest.from_json(data)
    except KeyError as exc:
        raise ArtifactError(f"{path} is missing field {exc}; recompile with `agoc compile`") from exc
    except (TypeError, AttributeError, ValueError) as exc:
        raise ArtifactError(f"{path} has a field of the wrong type ({exc}); recompile with `agoc compile`") from exc
    _check_manifest(root, path, manifest)
    if not (root / manifest.library).exists():
        raise ArtifactError(f"artifact is incomplete: {root / manifest.library} is missing; recompile")
    damage = elf_damage(root / manifest.library)
    if damage:
        raise ArtifactError(f"{root / manifest.library} is damaged ({damage}); recompile with `agoc compile`")
    if manifest.library_sha256 is not None and file_sha256(root / manifest.library) != manifest.library_sha256:
        raise ArtifactError(f"{root / manifest.library} is not the library this artifact was built with (replaced "
                            "or copied from another artifact?); recompile with `agoc compile`")
    return Artifact(root, manifest)


def _check_manifest(root: Path, path: Path, manifest: Manifest) -> None:
    """What :meth:`Manifest.from_json` does not check: every file it names is a relative path inside ``root``
    (an edited manifest never makes agoc load or read a file elsewhere), every tensor has a known dtype and a
    shape of sizes >= 0. :class:`ArtifactError` naming the field."""
    files = [("library", manifest.library), ("model.file", manifest.model_file),
             *((f"tensor '{t.info.name}' file", t.file) for t in (*manifest.inputs, *manifest.outputs))]
    inside = Path(os.path.realpath(root))
    for field_name, name in files:
        if not isinstance(name, str) or not name:
            raise ArtifactError(f"{path}: {field_name} is {name!r}, not a file name; recompile with `agoc compile`")
        if Path(name).is_absolute() or inside not in Path(os.path.realpath(root / name)).parents:
            raise ArtifactError(f"{path}: {field_name} {name!r} is outside the artifact directory; agoc reads only "
                                "files inside it: recompile with `agoc compile`")
    for t in (*manifest.inputs, *manifest.outputs):
        if not isinstance(t.info.name, str) or not all(isinstance(d, int) and d >= 0 for d in t.info.shape):
            raise ArtifactError(f"{path}: tensor {t.info.name!r} has shape {list(t.info.shape)}, not sizes of 0 or "
                                "more; recompile with `agoc compile`")
        try:
            known = isinstance(t.info.dtype, str) and np.dtype(t.info.dtype).kind in "biuf"
        except TypeError:
            known = False
        if not known:
            raise ArtifactError(f"{path}: tensor {t.info.name!r} has an unknown dtype {t.info.dtype!r}; recompile "
                                "with `agoc compile`")


def file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def elf_damage(path: Path) -> str | None:
    """Why the 64-bit little-endian ELF file at ``path`` cannot be loaded safely (not ELF, or cut short: a
    truncated library is mapped past its end and the loader dies of SIGBUS), or None if it looks whole."""
    import struct

    if not path.is_file():
        return "not a file"
    data = path.read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return "not a 64-bit little-endian ELF library"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return f"cut short at {len(data)} bytes"
    for i in range(phnum):
        offset, _, _, filesz = struct.unpack_from("<QQQQ", data, phoff + i * phentsize + 8)
        if offset + filesz > len(data):
            return f"cut short at {len(data)} bytes"
    return None


#: what else an artifact of a schema may hold beside the files its manifest names (``owned_files``)
SCHEMA_FILES = {
    SCHEMA: (MANIFEST, IO_SPEC),
    "agoc.cuda/1": (MANIFEST, "kernels.cu", "fused.py", "stock.cu", "kernels.ptx"),
}


def owned_files(root: Path) -> set[str] | None:
    """The files an agoc artifact at ``root`` consists of (relative POSIX paths), from its manifest's schema
    marker and the files the manifest names; None when ``root`` holds no agoc manifest."""
    try:
        data = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") not in SCHEMA_FILES:
        return None
    files = set(SCHEMA_FILES[data["schema"]])
    if data["schema"] == SCHEMA:
        try:
            files |= {data["library"], data["model"]["file"]}
            files |= {t["file"] for t in [*data["inputs"], *data["outputs"]]}
        except (KeyError, TypeError):
            return None
    return {str(f) for f in files if isinstance(f, str)}


def foreign_entries(root: Path, limit: int = 6) -> list[str]:
    """Up to ``limit`` entries of the directory ``root`` that are not positively part of the agoc artifact
    there (any entry, if it is not one); a symbolic link is never agoc's."""
    own = owned_files(root) or set()
    own_dirs = {str(Path(f).parent) for f in own} - {"."}
    foreign: list[str] = []
    for here, dirs, files in os.walk(root):
        for name in sorted(dirs) + sorted(files):
            path = Path(here) / name
            rel = path.relative_to(root).as_posix()
            ok = not path.is_symlink() and (rel in own_dirs if name in dirs else rel in own)
            if not ok:
                foreign.append(rel)
                if len(foreign) >= limit:
                    return foreign
        dirs[:] = [d for d in dirs if (Path(here) / d).relative_to(root).as_posix() in own_dirs]
    return foreign


def check_replaceable(out_dir: Path, what: str = "an agoc artifact") -> None:
    """Raise :class:`ArtifactError` unless ``out_dir`` may be (re)written: it does not exist, is an empty
    directory, or is positively an agoc artifact holding nothing else; never the working directory or one
    above it. Called before any long work, so a refusal costs nothing."""
    out_dir = Path(os.path.abspath(out_dir))
    cwd = Path.cwd()
    if out_dir == cwd or out_dir in cwd.parents:
        raise ArtifactError(f"-o {out_dir} is the directory you are in (or above it); agoc never replaces it — "
                            "give a new directory, e.g. -o out")
    if out_dir.is_symlink():
        raise ArtifactError(f"-o {out_dir} is a symbolic link; give a plain directory (nothing was written)")
    if out_dir.exists() and not out_dir.is_dir():
        raise ArtifactError(f"-o {out_dir} is a file; give a directory for the artifact (nothing was written)")
    if out_dir.is_dir():
        foreign = foreign_entries(out_dir)
        if foreign:
            shown = ", ".join(foreign[:5]) + (" and more" if len(foreign) > 5 else "")
            raise ArtifactError(
                f"-o {out_dir} exists and is not {what} (it holds {shown}); agoc replaces only what it wrote: "
                "choose a new or empty directory (nothing was written)")


#: staging directories of this process not yet moved into place (removed by :func:`discard_staging`)
_STAGING: set[Path] = set()


def discard_staging() -> None:
    """Remove every staging directory this process has open (on Ctrl-C / SIGTERM, before a hard exit)."""
    for path in list(_STAGING):
        shutil.rmtree(path, ignore_errors=True)
        _STAGING.discard(path)


def _writable_parent(out_dir: Path) -> Path:
    """The parent of ``out_dir``, created if missing; :class:`ArtifactError` naming why it cannot be written."""
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:64]}.probe.", dir=parent))
        probe.rmdir()
    except OSError as exc:
        raise ArtifactError(f"cannot write -o {out_dir}: {exc.strerror or exc} at {parent}; choose a directory "
                            "you can write (nothing was written)") from None
    return parent


def check_writable(out_dir: Path) -> None:
    """Raise :class:`ArtifactError` now if the artifact could not be written at ``out_dir``: its parent, or
    the nearest directory above it that exists (missing ones are made only when the artifact is written, so a
    refusal later leaves nothing behind), must take a new entry."""
    out_dir = Path(os.path.abspath(out_dir))
    parent = out_dir.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        probe = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:64]}.probe.", dir=parent))
        probe.rmdir()
    except OSError as exc:
        raise ArtifactError(f"cannot write -o {out_dir}: {exc.strerror or exc} at {parent}; choose a directory "
                            "you can write (nothing was written)") from None


@contextlib.contextmanager
def staged_directory(out_dir: Path, what: str = "an agoc artifact"):
    """Assemble an output directory aside (a sibling, never inside it) and move it into place only when
    the body completes. The previous one is replaced only if :func:`check_replaceable` allows it, and is
    kept until the new one is in place; a failed or interrupted build leaves OUT as it was."""
    out_dir = Path(os.path.abspath(out_dir))
    check_replaceable(out_dir, what)
    parent = _writable_parent(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:64]}.staging.", dir=parent))
    _STAGING.add(staging)
    try:
        yield staging
        check_replaceable(out_dir, what)  # again: something may have appeared there during the build
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name[:64]}.old.", dir=parent))
            out_dir.rename(old / "artifact")
        try:
            staging.rename(out_dir)
        except OSError:
            if old is not None:
                (old / "artifact").rename(out_dir)
                old.rmdir()
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        _STAGING.discard(staging)
    finally:
        if staging in _STAGING:
            shutil.rmtree(staging, ignore_errors=True)
            _STAGING.discard(staging)


#: the file that marks a scratch directory as agoc's (``fresh_work_dir``)
WORK_MARKER = ".agoc-work"


def fresh_work_dir(path: Path) -> Path:
    """``path`` as an empty scratch directory: one agoc made before (it holds :data:`WORK_MARKER`) is
    emptied, a missing or empty one made; anything else is refused (:class:`ArtifactError`), never removed."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ArtifactError(f"{path} is not a directory; give a new or empty directory for agoc's work files")
    if path.is_dir() and any(path.iterdir()):
        if not (path / WORK_MARKER).is_file():
            raise ArtifactError(f"{path} exists and is not a work directory of agoc's; give a new or empty one "
                                "(nothing was removed)")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / WORK_MARKER).write_text("made by agoc; emptied when agoc reuses it\n")
    return path
