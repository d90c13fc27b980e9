"""The tuning database directory: its small JSON files read and written as records (session, tasks,
progress, verified, layout, traffic), records imported from another database, its status and comparison.
The directory's layout: docs/tuning-internals.md (The database)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from toolchain.tune.adapter import open_database, record_workload, records_in_order, workload_hash, workload_indices
from toolchain.tune.pairing import choose, minis_ms
from toolchain.tune.plan import TaskPlan, task_hash
from toolchain.tune.settings import Task, TuneSettings, TuningError, known_settings, upgraded

#: settings added since databases were first made, at the value a database made before them implicitly used
BEFORE_SETTING = {"cold_weights": False, "scheduler": "weight", "warmup": 8, "prepack": False, "tile_cache": 0,
                  "search_threads": 0, "roof_share": 0.0}


#: settings a database may be resumed with at another value: the budget, how many sibling seeds a task
#: not yet started gets (a seed is measured like any candidate; the records stay comparable), and the
#: search's population and threads (how candidates are found, not how they are measured), and where a kernel's search
#: stops at the roof (how the budget is spent)
RESUMABLE_SETTINGS = ("trials", "transfer", "population", "search_threads", "roof_share")


def settings_but_trials(settings: dict) -> dict:
    """A session's settings JSON (either form, :func:`upgraded`) as compared with another's: complete, the
    current form, without the resumable ones."""
    return {k: v for k, v in {**TuneSettings().to_json(), **BEFORE_SETTING, **upgraded(settings)}.items()
            if k not in RESUMABLE_SETTINGS}


#: what a tuning database directory holds: its JSON files, MetaSchedule's records and logs, and what an RPC
#: session beside it writes (device agents, the measurement log, the device report)
DB_ENTRIES = frozenset({"session.json", "tasks.json", "verified.json", "progress.json", "layout.json", "imported.json",
                        "traffic.json", "phases.json", "ms", "logs", "agents", "measurements.jsonl", "devices.json"})


class TuneDB:
    """A tuning database directory (docs/tuning-internals.md): each file read and written whole."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.ms_dir = self.root / "ms"

    # session / tasks / verified are small JSON files rewritten atomically
    def _read(self, name: str, default):
        path = self.root / name
        if not path.exists():
            return default
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise TuningError(f"{path} is corrupt ({exc}); move it away to start that part over") from exc

    def _write(self, name: str, data) -> None:
        path = self.root / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)

    @property
    def session(self) -> dict | None:
        session = self._read("session.json", None)
        if session is not None and not (isinstance(session, dict) and isinstance(session.get("settings"), dict)):
            raise TuningError(f"{self.root / 'session.json'} is not a tuning session (edited or from another tool); "
                              "move it away, or give --db a new directory")
        return session

    @property
    def settings(self) -> TuneSettings:
        """The session's settings as the record (a database made before the partition knobs were one record
        included; a setting added since at the value it then had: BEFORE_SETTING); :class:`TuningError`
        without a session."""
        if self.session is None:
            raise TuningError(f"{self.root} is not a tuning database (no session.json); create one with `agoc tune`")
        return TuneSettings.from_json({**BEFORE_SETTING, **upgraded(self.session["settings"])})

    def check_own(self) -> None:
        """Raise :class:`TuningError` if ``root`` holds anything a tuning database does not (:data:`DB_ENTRIES`)
        and no session: a folder of the user's, into which nothing of agoc's may be written."""
        foreign = sorted(p.name for p in self.root.iterdir() if p.name not in DB_ENTRIES) if self.root.is_dir() else []
        if self.session is None and foreign:
            held = ", ".join(foreign[:5])
            raise TuningError(f"{self.root} exists and is not a tuning database (it holds {held}); give --db a new "
                              "or empty directory (nothing was written)")

    def open_session(self, session: dict) -> None:
        self.check_own()
        existing = self.session
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TuningError(f"cannot create the tuning database {self.root}: {exc.strerror or exc}; give --db a "
                              "directory you can write") from None
        if existing is not None:
            existing["layout"] = self.activation_layout
            existing["pad_channels"] = self.channel_padding
            existing["fast_math"] = self.fast_math
            existing["winograd"] = self.winograd
            existing["precision"] = self.precision
            session = {**session, "layout": session.get("layout", "NCHW"),
                       "pad_channels": session.get("pad_channels", False), "fast_math": session.get("fast_math", False),
                       "winograd": session.get("winograd", False), "precision": session.get("precision", "fp32")}
            unknown = sorted(known_settings(existing["settings"]) - known_settings(TuneSettings().to_json()))
            if unknown:  # a newer agoc made or resumed it: this one cannot tell whether its records compare
                raise TuningError(
                    f"{self.root} was tuned by a newer agoc, with settings this one does not know "
                    f"({', '.join(unknown)}); upgrade agoc, or use another --db")
            for key in ("model_sha256", "precision", "target", "layout", "pad_channels", "fast_math", "winograd",
                        "settings"):
                # the budget may change between runs: a larger one continues tuning, every record stays valid
                # (a setting added since a database was made counts at the value it had then: BEFORE_SETTING)
                old, now = ((settings_but_trials(existing[key]), settings_but_trials(session[key]))
                            if key == "settings" else (existing[key], session[key]))
                if old != now:
                    same = {"layout": f" (--layout {existing[key]})",
                            "pad_channels": f" ({'--pad-channels' if existing[key] else '--no-pad-channels'})",
                            "fast_math": f" ({'--fast-math' if existing[key] else '--exact-math'})",
                            "winograd": f" ({'--winograd' if existing[key] else '--direct-conv'})",
                            "precision": f" (--precision {existing[key]})",
                            "settings": _keep_inside_hint(old, now) if key == "settings" else ""}
                    differ = (_setting_changes(old, now) if key == "settings"
                              else f"{_short(existing[key])} vs {_short(session[key])}")
                    raise TuningError(
                        f"{self.root} holds a session for a different {key.replace('_', ' ')} "
                        f"({differ}); use another --db or the same settings{same.get(key, '')}"
                    )
            if existing == session:
                return
        self._write("session.json", session)

    @property
    def imported(self) -> dict[str, int]:
        """Records copied in from other databases (``agoc tune --from``), per task; {} if none."""
        return self._read("imported.json", {})

    def save_imported(self, data: dict) -> None:
        self._write("imported.json", data)

    @property
    def activation_layout(self) -> str:
        """The activation layout the session's kernels were tuned in (a database made before the layout
        was recorded: NCHW, ONNX's own)."""
        return (self.session or {}).get("layout", "NCHW")

    @property
    def channel_padding(self) -> bool:
        """Whether the session's kernels compute padded output channels (``--pad-channels`` on a model
        with something to pad, toolchain/padding.py; a database made before the setting: no)."""
        return bool((self.session or {}).get("pad_channels", False))

    @property
    def fast_math(self) -> bool:
        """Whether the session's kernels compute transcendental ops with fast polynomials (``--fast-math``
        on a model with such ops, toolchain/fastmath.py; a database made before the setting: no)."""
        return bool((self.session or {}).get("fast_math", False))

    @property
    def winograd(self) -> bool:
        """Whether the session's kernels compute 3×3 convs as Winograd's (``--winograd`` on a model with such a conv,
        toolchain/winograd.py; a database made before the setting: no)."""
        return bool((self.session or {}).get("winograd", False))

    @property
    def precision(self) -> str:
        """What the session's kernels compute in (``--precision``: fp32 or fp16, toolchain/targets.py PRECISIONS;
        a database made before the setting: fp32)."""
        return str((self.session or {}).get("precision", "fp32"))

    @property
    def tasks(self) -> list[Task]:
        return [Task.from_json(t) for t in self._read("tasks.json", [])]

    def save_tasks(self, tasks) -> None:
        self._write("tasks.json", [t.to_json() for t in tasks])

    @property
    def layout(self) -> dict:
        """How the session's partition maps onto tasks (see :meth:`save_layout`); {} if not recorded."""
        return self._read("layout.json", {})

    def save_layout(self, plan: "TaskPlan") -> None:
        """The partition's groups, the task of each, the mini-subgraphs of each split group and the mini
        tasks each joined task composes: what ``compile --db`` needs to build minis in place of a join."""
        self._write("layout.json", {
            "groups": [list(g) for g in plan.groups],
            "group_tasks": list(plan.group_tasks),
            "split_of": {str(i): [list(m) for m in minis] for i, minis in plan.split_of.items()},
            "minis": {name: [mini for mini, _ in parts] for name, parts in plan.compositions.items()},
        })

    @property
    def progress(self) -> dict:
        return self._read("progress.json", {})

    def save_progress(self, data: dict) -> None:
        self._write("progress.json", data)

    @property
    def verified(self) -> dict:
        return self._read("verified.json", {})

    def save_verified(self, data: dict) -> None:
        self._write("verified.json", data)

    def follow_renames(self, names) -> None:
        """Entries of verified.json and progress.json under a name this plan's kernel of the same hash no longer
        has (an older agoc named the PrimFuncs in another order) moved to its name now."""
        now = {task_hash(n): n for n in names}

        def renamed(name: str) -> str:
            return name if name in now.values() else now.get(task_hash(name), name)

        verified, progress = self.verified, self.progress
        if all(renamed(n) == n for n in [*verified, *progress]):
            return
        self.save_verified({renamed(n): entry for n, entry in verified.items()})
        self.save_progress({renamed(n): {**entry, **({"handed_back": {renamed(m): k for m, k in
                                                                       entry["handed_back"].items()}}
                                                     if entry.get("handed_back") else {})}
                            for n, entry in progress.items()})

    @property
    def clock(self) -> dict:
        """What the last session measured a trial and a verification to take here (toolchain/tune/clock.py)."""
        return self._read("clock.json", {})

    def save_clock(self, data: dict) -> None:
        self._write("clock.json", data)

    @property
    def traffic(self) -> dict:
        """Joins judged by simulated memory traffic (host/bench/judge.py), per cache geometry: {} if none."""
        return self._read("traffic.json", {})

    def save_traffic(self, geometry: str, record: dict) -> None:
        """Keep one geometry's judgement: the explicit judging step's write (a compile only reads it)."""
        self._write("traffic.json", {**self.traffic, geometry: record})

    @property
    def phases(self) -> list[dict]:
        """Seconds per phase of each session run on this database (toolchain/tune/phases.py), oldest first."""
        return self._read("phases.json", {}).get("runs", [])

    def save_phases(self, record: dict) -> None:
        """Add one session run's phases (``Phases.to_json``)."""
        self._write("phases.json", {"runs": [*self.phases, record]})

    def ms_database(self):
        """MetaSchedule's database of every trial (``ms/``)."""
        return open_database(self.ms_dir)


def _setting_changes(old: dict, now: dict) -> str:
    """The settings two sessions disagree on, as ``name: database's → this run's`` (``partition.X``: the
    partition's)."""
    old, now = _flat(old), _flat(now)
    return ", ".join(f"{k}: {_short(old.get(k))} → {_short(now.get(k))}"
                     for k in sorted(set(old) | set(now)) if old.get(k) != now.get(k))


def _keep_inside_hint(old: dict, now: dict) -> str:
    """`` (--keep-inside KIB)`` when two sessions' settings differ in the locality unit (a host target's default
    follows this machine's caches since it has one), else ""."""
    unit = _flat(old).get("partition.locality_unit", 0) or 0
    return f" (--keep-inside {unit // 1024})" if unit != (_flat(now).get("partition.locality_unit", 0) or 0) else ""


def _flat(settings: dict) -> dict:
    nested = {f"{k}.{n}": x for k, v in settings.items() if isinstance(v, dict) for n, x in v.items()}
    return {**{k: v for k, v in settings.items() if not isinstance(v, dict)}, **nested}


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) < 60 else text[:57] + "..."


def import_records(db_dir: Path, base_dir: Path, funcs: dict) -> dict[str, int]:
    """Start from another database's work: every record ``base_dir`` holds for a kernel of ``funcs``
    ({task: PrimFunc}) — the same PrimFunc by structural hash, whatever the other session's partition
    called it — is copied into ``db_dir``, in the order it was committed there, for each kernel
    ``db_dir`` has no record of yet (so a resumed session copies nothing twice). From then on they are
    that kernel's trials, like its own. Returns {task: records copied}; the database keeps the running
    total per task (:attr:`TuneDB.imported`), so a resumed session still says what it started from.

    The lines are copied as they are (see :func:`trial_latencies` for the format), each record's
    workload index renumbered to ``db_dir``'s. Refused for a database of another target or layout,
    or one that is not a tuning database; call it before a ``JSONDatabase`` is opened on ``db_dir``."""
    base, db = TuneDB(base_dir), TuneDB(db_dir)
    if base.session is None:
        raise TuningError(f"{base_dir} is not a tuning database (no session.json); make one with `agoc tune`")
    if db.session is not None:
        for key, theirs, ours in (("target", base.session.get("target"), db.session.get("target")),
                                  ("layout", base.activation_layout, db.activation_layout)):
            if theirs != ours:
                raise TuningError(f"{base_dir} was tuned for another {key} ({_short(theirs)}): "
                                  "its schedules do not carry over")

    def lines(path: Path) -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    their_workloads = lines(base.ms_dir / "database_workload.json")
    their_index = {h: min(i) for h, i in workload_indices(base.ms_dir).items()}
    our_index = {h: min(i) for h, i in workload_indices(db.ms_dir).items()}
    ours_with_records = {index for index, _ in records_in_order(db.ms_dir)}
    next_index = len(lines(db.ms_dir / "database_workload.json"))
    wanted: dict[int, tuple[int, str]] = {}  # their workload index -> (ours, task)
    added: list[str] = []
    for name, func in funcs.items():
        h = workload_hash(func)
        if h not in their_index or our_index.get(h) in ours_with_records:
            continue
        if h not in our_index:
            our_index[h] = next_index + len(added)
            added.append(their_workloads[their_index[h]])
        wanted[their_index[h]] = (our_index[h], name)
    copied: dict[str, int] = {}
    records: list[str] = []
    for line in lines(base.ms_dir / "database_tuning_record.json"):
        target = wanted.get(record_workload(line)) if line.strip() else None
        if target is not None:
            records.append(f"[{target[0]}{line[line.index(','):]}")
            copied[target[1]] = copied.get(target[1], 0) + 1
    if records:
        db.ms_dir.mkdir(parents=True, exist_ok=True)
        for name, new in (("database_workload.json", added), ("database_tuning_record.json", records)):
            path = db.ms_dir / name
            unterminated = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
            with open(path, "a") as out:
                out.write("\n" if unterminated else "")
                out.writelines(line + "\n" for line in new)
        before = db.imported
        db.save_imported({**before, **{k: before.get(k, 0) + n for k, n in copied.items()}})
    return copied


def status(db_dir: Path) -> dict:
    """Per task: phase, budget, trials, best verified latency, rejected count, what a join is built as;
    and the model estimate."""
    db = TuneDB(db_dir)
    session = db.session
    if session is None:
        raise TuningError(f"{db_dir} is not a tuning database (no session.json); create one with `agoc tune`")
    tasks = db.tasks
    verified = db.verified
    progress = db.progress
    layout = db.layout
    rows = []
    estimate, unscheduled = 0.0, 0
    for t in tasks:
        v = verified.get(t.name, {})
        p = progress.get(t.name, {})
        trials = p.get("trials", v.get("trials", 0))
        rows.append(
            {
                "task": t.name,
                "phase": t.phase,
                "calls": t.calls,
                "budget": t.budget,
                "trials": trials,
                "status": v.get("status", "pending"),
                "best_ms": v.get("latency_ms"),
                "best_measured_ms": p.get("best_ms"),
                "rejected": len(v.get("rejected", [])),
                "search_error": v.get("search_error"),
                "handed_back": p.get("handed_trials", 0),  # trials a join left to its minis
                "seeded_from": len(p.get("siblings", [])),  # kernels whose schedules it started from
                "exhausted": bool(p.get("exhausted")),  # its search space ran out before its budget
                "at_roof": p.get("at_roof"),  # the share of the compute roof at which its search stopped
            }
        )
        if t.phase != "mini":  # what compile --db builds: the join or its minis (see pairing.choose)
            minis = layout.get("minis", {}).get(t.name, [])
            choice = choose(t.name, minis, verified)
            rows[-1]["build"] = choice.build if t.phase == "joined" else None
            rows[-1]["paired"] = v.get("paired") if choice.paired else None
            # (recorded latencies, like every other kernel's: a pairing's were taken in another process)
            chosen = rows[-1]["best_ms"] if choice.build == "joined" else minis_ms(minis, verified)
            if chosen is not None:
                estimate += chosen * t.calls
            else:  # built on an untuned schedule (or partly): its time is not in the estimate
                unscheduled += 1
    return {"session": {**session, "settings": db.settings.to_json()}, "tasks": rows, "estimate_ms": estimate,
            "unscheduled": unscheduled, "phases": db.phases, "trials": sum(r["trials"] for r in rows)}


def compare(db_dir: Path, other: Path) -> dict:
    """The kernels two databases both tuned — the same PrimFunc (structural hash, the end of a task's
    name), whatever their partitions called it — with each one's verified latency, and the geometric
    mean of ``db_dir`` ÷ ``other`` over them: how the two sessions' searches did on the same work, apart
    from how they partitioned the model (compare the estimates for that). Kernels one of them has not
    verified are left out."""
    def verified_by_hash(summary: dict) -> dict[str, dict]:
        return {task_hash(r["task"]): r for r in summary["tasks"] if r["status"] == "verified" and r["best_ms"]}

    a, b = status(db_dir), status(other)
    if a["session"].get("target") != b["session"].get("target"):
        raise TuningError(f"{db_dir} and {other} were tuned for different targets: their kernels do not compare")
    mine, theirs = verified_by_hash(a), verified_by_hash(b)
    rows = [{"task": mine[h]["task"], "other": theirs[h]["task"], "phase": mine[h]["phase"],
             "ms": mine[h]["best_ms"], "other_ms": theirs[h]["best_ms"],
             "trials": mine[h]["trials"], "other_trials": theirs[h]["trials"],
             "ratio": mine[h]["best_ms"] / theirs[h]["best_ms"]}
            for h in mine if h in theirs]
    rows.sort(key=lambda r: -r["ratio"])
    geomean = statistics.geometric_mean(r["ratio"] for r in rows) if rows else None
    return {"kernels": rows, "geomean": geomean, "estimate_ms": a["estimate_ms"], "other_estimate_ms": b["estimate_ms"]}
