"""Compare a device's outputs with onnxruntime's.

Pass criterion per output (dtype float): shapes equal, no NaN/Inf where the
reference is finite, and ``max|actual - ref| <= atol + rtol * max|ref|``.
The scale is the output's largest magnitude rather than each element's, so a
near-zero reference element cannot make a tiny absolute error fail, while
errors on a few border pixels (the known wrong-schedule symptom, design §3)
are still orders of magnitude over the bar. Integer and bool outputs must
match exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from toolchain.artifact import Artifact
from toolchain.errors import VerifyError
from toolchain.onnx_import import load_model, model_hash
from toolchain.reference import run_onnxruntime

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
#: (atol, rtol) by --precision (toolchain/targets.py PRECISIONS): float16 keeps 11 significant bits, and a deep
#: network's outputs drift by up to about 1 % of their largest value (docs/partitioning.md, Precision)
TOLERANCES = {"fp32": (DEFAULT_ATOL, DEFAULT_RTOL), "fp16": (1e-3, 2e-2)}


def tolerance(target: dict) -> tuple[float, float]:
    """(atol, rtol) an artifact built for ``target`` (``TargetSpec.to_json``, a manifest's) is checked with."""
    return TOLERANCES[target.get("precision", "fp32")]


class Device(Protocol):
    """Anything that can run an artifact on given inputs (local VM, qemu, a phone)."""

    name: str

    def run(self, artifact: Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    ref_shape: tuple[int, ...]
    max_abs: float
    max_ref: float
    nonfinite: int
    passed: bool

    @property
    def max_rel(self) -> float:
        """max abs error relative to the reference's largest magnitude."""
        return self.max_abs / self.max_ref if self.max_ref > 0 else (0.0 if self.max_abs == 0 else float("inf"))

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "ref_shape": list(self.ref_shape),
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "max_ref": self.max_ref,
            "nonfinite": self.nonfinite,
            "passed": self.passed,
        }


@dataclass(frozen=True)
class VerifyReport:
    device: str
    reference: str  # "onnxruntime" (re-run now) or "stored" (outputs saved at compile time)
    atol: float
    rtol: float
    outputs: tuple[OutputCheck, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "reference": self.reference,
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
            "outputs": [o.to_json() for o in self.outputs],
        }


def compare(name: str, actual: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> OutputCheck:
    actual, ref = np.asarray(actual), np.asarray(ref)
    if actual.shape != ref.shape:
        return OutputCheck(name, actual.shape, ref.shape, float("inf"), 0.0, 0, False)
    if ref.dtype.kind in "iub":
        diff = np.abs(actual.astype(np.float64) - ref.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        max_ref = float(np.abs(ref.astype(np.float64)).max()) if ref.size else 0.0
        return OutputCheck(name, actual.shape, ref.shape, max_abs, max_ref, 0, max_abs == 0)
    a64, r64 = actual.astype(np.float64), ref.astype(np.float64)
    finite_ref = np.isfinite(r64)
    nonfinite = int(np.count_nonzero(~np.isfinite(a64) & finite_ref))
    mask = finite_ref & np.isfinite(a64)
    max_abs = float(np.abs(a64 - r64)[mask].max()) if mask.any() else 0.0
    max_ref = float(np.abs(r64[finite_ref]).max()) if finite_ref.any() else 0.0
    passed = nonfinite == 0 and max_abs <= atol + rtol * max_ref
    return OutputCheck(name, actual.shape, ref.shape, max_abs, max_ref, nonfinite, passed)


def reference_outputs(artifact: Artifact, inputs: dict[str, np.ndarray], threads: int = 1):
    """onnxruntime's outputs, re-run on the artifact's model copy; the stored ones if no copy is there."""
    if not artifact.model_path.exists():
        return "stored", artifact.read_expected()
    model = load_model(artifact.model_path)
    if model_hash(model) != artifact.manifest.model_sha256:
        raise VerifyError(
            f"{artifact.model_path} does not match the manifest's model hash (edited after compile?); recompile"
        )
    return "onnxruntime", run_onnxruntime(model, inputs, threads)


def verify_artifact(
    artifact: Artifact, device: Device, atol: float | None = None, rtol: float | None = None
) -> VerifyReport:
    """Run the artifact's sample inputs on ``device`` and compare with onnxruntime, within ``atol`` / ``rtol``
    (default: the :func:`tolerance` of the precision it was built in)."""
    default_atol, default_rtol = tolerance(artifact.manifest.target)
    atol, rtol = default_atol if atol is None else atol, default_rtol if rtol is None else rtol
    inputs = artifact.read_inputs()
    actual = device.run(artifact, inputs)
    source, ref = reference_outputs(artifact, inputs)
    checks = []
    for tf in artifact.manifest.outputs:
        name = tf.info.name
        if name not in actual:
            raise VerifyError(f"device '{device.name}' returned no output '{name}'")
        checks.append(compare(name, actual[name], ref[name], atol, rtol))
    return VerifyReport(device.name, source, atol, rtol, tuple(checks))
