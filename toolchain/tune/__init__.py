"""Auto-tuning on MetaSchedule, AGO style: divide-and-conquer over the partition, every kept schedule
verified. The names below are the package's public API (host/ uses these); docs/tuning-internals.md."""

from __future__ import annotations

import importlib

#: public name -> the module that defines it (imported on first use: importing a submodule stays cheap)
PUBLIC = {
    "TuneSettings": "settings", "TuningError": "settings", "SCHEMA": "settings", "Task": "settings",
    "SCHEDULERS": "budget", "Measure": "adapter",
    "TuneDB": "db", "status": "db", "compare": "db",
    "floor_trials": "plan", "tune_model": "session",
    "apply_verified": "apply", "unfuse_slower": "apply",
    "Library": "library", "LibraryError": "library",  # record libraries (host/commands/library.py)
    # one kernel tuned alone, and joins judged by other rules (host/bench: layout, rpc cost, weight fit, judge)
    **{name: "adapter" for name in ("BUILD_TIMEOUT_S", "FAILED_SECS", "fast_build", "latency", "records_of",
                                    "trial_latencies", "tune_trials")},
    "group_kernels": "plan", "first_pass_trials": "plan",
    **{name: "pairing" for name in ("choose", "current_traffic", "pairing_key", "rule_for")},
    **{name: "events" for name in ("Event", "Events", "Planned", "Imported", "TaskStarted", "Seeded", "Trials",
                                   "Stable", "Exhausted", "SearchFailed", "JoinYields", "Verifying", "TaskDone",
                                   "Round", "OutOfTime", "Pairing", "Paired")},
    "Clock": "clock", "parse_duration": "clock",
}


def __getattr__(name: str):
    if name in PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
