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
            "partition": self.partition,
            "partition_info": self.partition_info,
            "kernels": list(self.kernels),
            "tuning": self.tuning,
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
            partition=d["partition"],
            partition_info=d["partition_info"],
            kernels=tuple(d["kernels"]),
            tuning=d.get("tuning"),
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
    if data.get("schema") != SCHEMA:
        raise ArtifactError(
            f"{path} has schema {data.get('schema')!r}, this agoc reads {SCHEMA!r}; recompile with this agoc"
        )
    try:
        manifest = Manifest.from_json(data)
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{path} is missing field {exc}; recompile with `agoc compile`") from exc
    if not (root / manifest.library).exists():
        raise ArtifactError(f"artifact is incomplete: {root / manifest.library} is missing; recompile")
    return Artifact(root, manifest)


@contextlib.contextmanager
def staged_directory(out_dir: Path):
    """Assemble an output directory aside and move it into place only when the body completes: a
    failed or interrupted build never leaves a half-written OUT (and keeps the previous one)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield staging
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
