"""Run a kernel library in this process with TVM's Relax VM (host-target artifacts)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from toolchain.errors import DeviceError, first_line
from toolchain.onnx_import import TensorInfo


def _flatten(result) -> list[np.ndarray]:
    """The VM's result as a flat list of arrays: tensors, and shapes (an ONNX ``Shape`` output the VM
    returns as a shape tuple of ints) as int64 vectors."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    items = list(result)
    if all(isinstance(i, int) for i in items) and type(result).__name__ == "Shape":
        return [np.array(items, dtype=np.int64)]
    return [a for item in items for a in _flatten(item)]


def _contiguous(array) -> np.ndarray:
    """``array`` C-contiguous, keeping its rank (``np.ascontiguousarray`` makes a 0-d scalar 1-d)."""
    return np.asarray(array, order="C")


class VMSession:
    """A loaded library; call :meth:`run` as often as needed."""

    def __init__(self, library: Path, inputs: list[TensorInfo], outputs: list[str]):
        import tvm
        from tvm import relax

        # loaded from a private copy: the dynamic loader hands out an already loaded library again by path and
        # file, and a library rewritten while mapped (a recompile into the same directory) crashes the process
        with tempfile.TemporaryDirectory(prefix="agoc-lib.") as tmp:
            copy = Path(tmp) / Path(library).name
            try:
                shutil.copyfile(library, copy)
                module = tvm.runtime.load_module(str(copy))
            except Exception as exc:
                last = str(exc).strip().splitlines()[-1]
                raise DeviceError(f"cannot load {library} on this machine: {last}") from exc
        self._tvm = tvm
        self._device = tvm.cpu()
        try:
            self._vm = relax.VirtualMachine(module, self._device)
        except Exception as exc:  # noqa: BLE001 - a shared library, but not a Relax VM executable
            raise DeviceError(f"{library} is not a model library agoc built ({first_line(exc)}); recompile with "
                              "`agoc compile`") from exc
        self._inputs = inputs
        self._outputs = outputs

    def bind(self, feeds: dict[str, np.ndarray]):
        """Copy ``feeds`` to the device once; returns a no-argument call of the model (for timing)."""
        args = []
        for info in self._inputs:
            if info.name not in feeds:
                raise DeviceError(f"missing input '{info.name}'")
            args.append(self._tvm.runtime.tensor(_contiguous(feeds[info.name]), self._device))
        main = self._vm["main"]
        return lambda: main(*args)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = _flatten(self.bind(feeds)())
        if len(values) != len(self._outputs):
            raise DeviceError(f"the library returned {len(values)} outputs, the manifest lists {len(self._outputs)}")
        return dict(zip(self._outputs, values))
