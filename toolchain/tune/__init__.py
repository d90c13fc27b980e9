"""Auto-tuning on MetaSchedule, AGO style: divide-and-conquer over the partition, every kept schedule
verified. The names below are the package's public API (host/ uses these); docs/tuning-internals.md."""

from __future__ import annotations

import importlib

#: public name -> the module that defines it (imported on first use: importing a submodule stays cheap)
PUBLIC = {
    "TuneSettings": "settings", "TuningError": "settings", "SCHEMA": "settings", "Task": "settings",
    "SCHEDULERS": "budget", "Measure": "adapter",
    "TuneDB": "db", "status": "db", "compare": "db",
    "planned_trials": "plan", "tune_model": "session",
    "apply_verified": "apply", "unfuse_slower": "apply",
}


def __getattr__(name: str):
    if name in PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
