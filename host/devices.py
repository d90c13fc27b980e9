"""Devices that run artifacts, behind one interface (:class:`toolchain.verify.Device`).

``local`` runs host-target artifacts in this process with TVM's Relax VM.
ARM64 devices (qemu, phones over adb) plug in here through the C++ runner.
"""

from __future__ import annotations

import platform

import numpy as np

from toolchain.artifact import Artifact
from toolchain.errors import DeviceError
from toolchain.runtime import VMSession
from toolchain.targets import PRESETS_BY_NAME


class LocalDevice:
    name = "local"
    description = f"this machine ({platform.machine()}), in-process Relax VM"

    def run(self, artifact: Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        preset = PRESETS_BY_NAME.get(artifact.target_preset)
        if preset is None or not preset.runs_on_host:
            raise DeviceError(
                f"{artifact.root} was built for {artifact.target_preset} and cannot run on this "
                f"{platform.machine()} machine; recompile with --target host to verify here"
            )
        session = VMSession(
            artifact.library_path,
            [t.info for t in artifact.manifest.inputs],
            [t.info.name for t in artifact.manifest.outputs],
        )
        return session.run(inputs)


DEVICES = {"local": LocalDevice}


def get_device(name: str):
    try:
        return DEVICES[name]()
    except KeyError:
        raise DeviceError(f"unknown device '{name}'; available: {', '.join(DEVICES)}") from None
