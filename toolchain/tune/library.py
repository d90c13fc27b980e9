"""A record library: the verified schedules of many tuning databases for one target, packaged in a directory,
from which a new kernel's search starts (re-fitted to its loops). Format and lookup: docs/tuning-internals.md
(Record library)."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from toolchain.errors import AgocError
from toolchain.tune import transfer
from toolchain.tune.adapter import commit_seed, latency, open_database, postprocess, scheduled, workload_module
from toolchain.tune.db import TuneDB
from toolchain.tune.traces import plain, rename_blocks

log = logging.getLogger("agoc.tuning")

FORMAT = "agoc-record-library"
VERSION = 1
LIBRARY_JSON = "library.json"
#: measured records kept per kernel beside its verified one, best first: what a cost model learns from
SAMPLES_PER_KERNEL = 4
#: the libraries shipped with agoc, one directory per target key (:func:`target_key`)
PACKAGED = Path(__file__).resolve().parents[2] / "library"


class LibraryError(AgocError):
    """A record library cannot be read, written or used for this target."""


# ----------------------------------------------------------------------------- the target a library serves


def target_key(tvm_target: dict) -> str:
    """The name of what a library's schedules are for: kind, triple, CPU (``llvm-x86_64-linux-gnu-znver4``).

    Only schedules of the same kind, triple and CPU carry over: a trace names the intrinsics it
    tensorizes with and splits its loops to the vector width of the CPU it was tuned on (AVX-512's 16
    lanes, NEON's 4); on another CPU it may not build, or run at a fraction of what that CPU's own
    search would reach. The core count is not part of it: a seed is measured before it counts."""
    from toolchain.targets import _host_triple  # a host target names no triple: this machine's

    triple = tvm_target.get("mtriple") or _host_triple()
    words = [str(tvm_target.get("kind", "llvm")), str(triple), str(tvm_target.get("mcpu") or "generic")]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(words))


def default_for(spec) -> Path | None:
    """The packaged library for ``spec``'s target, layout and precision (``library/<target key>/``, one that
    :meth:`Library.serves` it), None if there is none."""
    path = PACKAGED / target_key(spec.tvm_target)
    if not (path / LIBRARY_JSON).is_file():
        return None
    try:
        meta = json.loads((path / LIBRARY_JSON).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return path if isinstance(meta, dict) and "target_key" in meta and Library(path, meta).serves(spec) else None


# ----------------------------------------------------------------------------- one kernel's record


def _as_json_key(value) -> str:
    """A signature as a JSON string: what two kernels' are compared by without loading either."""
    return json.dumps(value, separators=(",", ":"))


def _trace_key(trace) -> str:
    """A trace JSON as compared with another: a record read back from the database has 1 where the
    session that verified it had true."""
    def ints(x):
        if isinstance(x, bool):
            return int(x)
        return [ints(y) for y in x] if isinstance(x, list) else x

    return _as_json_key(ints(trace))


def op_kind(func) -> str:
    """What a kernel computes, for counting: its first reducing block's name (else its first block's),
    without a numbering suffix (``conv2d_nhwc``, ``depthwise_conv2d_nhwc``, ``T_add``)."""
    nests = transfer.block_nests(func)
    block = next((b for b in nests if b.reduce_extents), nests[0] if nests else None)
    return re.sub(r"_?\d+$", "", block.block) if block is not None else "empty"


@dataclass(frozen=True)
class Entry:
    """One kernel's best verified schedule and a few of its measured records."""

    workload_hash: str  # adapter.workload_hash: identical kernels share it
    name: str  # "<model sha256[:8]>/<task name>"
    op: str
    workload: str  # tvm.ir.save_json of the one-function workload module
    signature: str  # JSON of transfer.signature
    core_signature: str | None  # JSON of transfer.core_signature (None: nothing reduces)
    extents: tuple[int, ...]
    trace: list  # the verified trace JSON, postprocessing included
    latency_ms: float
    source: str  # the model sha256 of the database it came from
    samples: tuple = ()  # (trace JSON, run_secs), best first

    def to_json(self) -> dict:
        return {"workload_hash": self.workload_hash, "name": self.name, "op": self.op, "signature": self.signature,
                "core_signature": self.core_signature, "extents": list(self.extents), "latency_ms": self.latency_ms,
                "source": self.source, "trace": self.trace,
                "samples": [{"trace": t, "run_secs": s} for t, s in self.samples], "workload": self.workload}

    @staticmethod
    def from_json(d: dict) -> "Entry":
        return Entry(d["workload_hash"], d["name"], d["op"], d["workload"], d["signature"], d["core_signature"],
                     tuple(d["extents"]), d["trace"], float(d["latency_ms"]), d["source"],
                     tuple((s["trace"], list(s["run_secs"])) for s in d.get("samples", [])))


def entry_of(func, name: str, trace, latency_ms: float, source: str, samples: tuple = ()) -> Entry:
    """The library's record of kernel ``func`` (a PrimFunc) with its verified ``trace``."""
    import tvm

    from toolchain.tune.adapter import workload_hash

    core = transfer.core_signature(func)
    return Entry(workload_hash(func), name, op_kind(func), tvm.ir.save_json(workload_module(func)),
                 _as_json_key(transfer.signature(func)), None if core is None else _as_json_key(core),
                 transfer.extents(func), trace, float(latency_ms), source, tuple(samples))


def _better(old: Entry | None, new: Entry) -> Entry:
    """The two records of one kernel as one: the faster verified schedule, both's best samples."""
    if old is None:
        return new
    best = new if new.latency_ms < old.latency_ms else old
    seen, samples = set(), []
    for trace, secs in sorted([*old.samples, *new.samples], key=lambda s: sorted(s[1])[len(s[1]) // 2]):
        key = _trace_key(trace)
        if key not in seen:
            seen.add(key)
            samples.append((trace, secs))
    return replace(best, samples=tuple(samples[:SAMPLES_PER_KERNEL]))


# ----------------------------------------------------------------------------- reading a tuning database


def read_database(db_dir: Path) -> tuple[dict, list[Entry]]:
    """A tuning database's source record (model, settings, target, layout) and the library records of
    its verified kernels, each with the best of its measured records as samples."""
    import tvm_ffi

    db = TuneDB(db_dir)
    if db.session is None:
        raise LibraryError(f"{db_dir} is not a tuning database (no session.json); give a directory `agoc tune` made")
    session, verified = db.session, db.verified
    sha = str(session.get("model_sha256", ""))
    by_trace: dict[str, list] = {}  # the verified trace -> its record(s)
    per_workload: dict[int, list] = {}  # structural hash of the workload -> its records
    for record in open_database(db.ms_dir).get_all_tuning_records() if db.ms_dir.is_dir() else []:
        per_workload.setdefault(tvm_ffi.structural_hash(record.workload.mod), []).append(record)
        by_trace.setdefault(_trace_key(plain(record.trace.as_json())), []).append(record)
    entries = []
    for task, v in verified.items():
        if v.get("status") != "verified" or not v.get("trace"):
            continue
        found = by_trace.get(_trace_key(v["trace"]))
        if not found:
            log.info("%s: the verified schedule of %s is not among its records; left out", db_dir, task)
            continue
        record = min(found, key=lambda r: abs(latency(r) * 1e3 - float(v.get("latency_ms") or 0)))
        mine = per_workload[tvm_ffi.structural_hash(record.workload.mod)]
        measured = sorted((r for r in mine if math.isfinite(latency(r))), key=latency)[:SAMPLES_PER_KERNEL]
        samples = tuple((plain(r.trace.as_json()), [float(s) for s in r.run_secs]) for r in measured)
        entries.append(entry_of(record.workload.mod["main"], f"{sha[:8]}/{task}", v["trace"], v["latency_ms"], sha,
                                samples))
    source = {"model_sha256": sha, "database": str(db_dir), "settings": db.settings.to_json(),
              "layout": db.activation_layout, "pad_channels": db.channel_padding, "fast_math": db.fast_math,
              "precision": db.precision, "num_cores": session.get("target", {}).get("num-cores"),
              "kernels": len(entries)}
    return ({"source": source, "target": session.get("target", {}), "layout": db.activation_layout,
             "precision": db.precision}, entries)


# ----------------------------------------------------------------------------- the library


class Library:
    """A record library directory (``library.json`` + a gzip JSONL records file); :meth:`load` one,
    :func:`build` one."""

    def __init__(self, path: Path, meta: dict, entries: dict[str, Entry] | None = None):
        self.path, self.meta = Path(path), meta
        self._entries = entries
        self._funcs: dict[str, object] = {}  # workload hash -> its PrimFunc, loaded when first compared

    @classmethod
    def load(cls, path: Path) -> "Library":
        path = Path(path)
        meta = _read_meta(path)
        if meta is None:
            raise LibraryError(f"{path} is not a record library (no {LIBRARY_JSON}); make one with "
                               "`agoc library build DB... --out DIR`")
        return cls(path, meta)

    # what it serves
    @property
    def target(self) -> dict:
        return self.meta["target"]

    @property
    def key(self) -> str:
        return self.meta["target_key"]

    @property
    def layout(self) -> str:
        return self.meta["layout"]

    @property
    def precision(self) -> str:
        """What its kernels compute in (``--precision``; a library made before the setting: fp32)."""
        return self.meta.get("precision", "fp32")

    @property
    def device(self) -> str:
        return self.meta.get("device", "local")

    @property
    def sources(self) -> list[dict]:
        return self.meta.get("sources", [])

    @property
    def cost_model(self) -> Path | None:
        """A cost model trained on :meth:`samples` and saved beside them (``cost_model.*``), None if none."""
        found = sorted(self.path.glob("cost_model.*"))
        return found[0] if found else None

    def serves(self, spec) -> bool:
        """Whether its schedules are for ``spec``'s target (:func:`target_key`), activation layout and precision."""
        return (self.key, self.layout, self.precision) == (target_key(spec.tvm_target), spec.layout, spec.precision)

    def check(self, spec) -> None:
        """Raise :class:`LibraryError` unless the library :meth:`serves` ``spec``."""
        if not self.serves(spec):
            raise LibraryError(
                f"the record library {self.path} holds schedules for {self.key} ({self.layout}, {self.precision}), "
                f"not for {target_key(spec.tvm_target)} ({spec.layout}, {spec.precision}): give --library one made "
                "for this target and precision, or use none (tune --no-library, compile --untuned sampled)")

    # its records
    @property
    def entries(self) -> dict[str, Entry]:
        """{workload hash: record}."""
        if self._entries is None:
            self._entries = _read_records(self.path / self.meta["records"])
        return self._entries

    def counts(self) -> dict[str, int]:
        """Records per op kind."""
        out: dict[str, int] = {}
        for e in self.entries.values():
            out[e.op] = out.get(e.op, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def samples(self):
        """(workload IRModule, trace JSON, run_secs) of every measured record it keeps: a cost model's
        training set."""
        import tvm

        for e in self.entries.values():
            for trace, secs in e.samples:
                yield tvm.ir.load_json(e.workload), trace, list(secs)

    def _func(self, workload_hash: str):
        import tvm

        if workload_hash not in self._funcs:
            self._funcs[workload_hash] = tvm.ir.load_json(self.entries[workload_hash].workload)["main"]
        return self._funcs[workload_hash]

    def own(self, func) -> Entry | None:
        """The library's record of this very kernel (the same workload), or None."""
        from toolchain.tune.adapter import workload_hash

        return self.entries.get(workload_hash(func))

    def nearest(self, func, k: int) -> list[Entry]:
        """Up to ``k`` records to start ``func``'s search from: its own (the same workload) first, then
        the kernels :func:`transfer.siblings` picks among those of its signature or core signature."""
        own = self.own(func)
        sig = _as_json_key(transfer.signature(func))
        core = transfer.core_signature(func)
        core = None if core is None else _as_json_key(core)
        alike = {e.name: e for e in self.entries.values() if e is not own
                 and (e.signature == sig or (core is not None and e.core_signature == core))}
        names = transfer.siblings(func, {n: self._func(e.workload_hash) for n, e in alike.items()},
                                  k - (own is not None))
        return [*([own] if own is not None else []), *(alike[n] for n in names)][:k]

    def fit(self, entry: Entry, func, spec):
        """``entry``'s schedule on ``func``, postprocessed: replayed as it is on the same workload, re-fitted
        to ``func``'s loops otherwise (:func:`transfer.transfer_schedule`); None if it does not carry over."""
        import tvm

        from toolchain.tune.adapter import workload_hash

        if entry.workload_hash == workload_hash(func):
            try:
                return scheduled(func, entry.trace)
            except Exception:  # noqa: BLE001 - replayed from its search part below
                pass
        sch = transfer.transfer_schedule(tvm.ir.load_json(entry.workload), rename_blocks(entry.trace, {}),
                                         workload_module(func))
        return postprocess(sch, spec) if sch is not None else None

    def seed(self, task, func, database, spec, settings, measure=None) -> list[str]:
        """Start ``task`` (kernel ``func``) from up to ``settings.transfer`` of the library's schedules of
        kernels like it, each measured and committed as one of its records (a trial of its budget: the
        session passes the seeds its budget allows there; 0, as ``--transfer 0``: none); the library's
        names of those committed. Nothing for another target or layout."""
        import tvm_ffi

        if not self.serves(spec) or settings.transfer <= 0:
            return []
        seeded, seen = [], set()
        for entry in self.nearest(func, settings.transfer):
            sch = self.fit(entry, func, spec)
            if sch is None:
                continue
            key = tvm_ffi.structural_hash(sch.mod)
            if key in seen:
                continue
            seen.add(key)
            if commit_seed(sch, func, database, spec, settings, measure):
                seeded.append(entry.name)
        return seeded


def _read_meta(path: Path) -> dict | None:
    """A library's ``library.json``; None when there is none; :class:`LibraryError` when unreadable or newer."""
    file = Path(path) / LIBRARY_JSON
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LibraryError(f"{file} is unreadable ({exc}); rebuild the library with `agoc library build`") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise LibraryError(f"{file} is not a record library's; give another directory")
    if int(meta.get("version", 0)) > VERSION:
        raise LibraryError(f"{path} was made by a newer agoc (library version {meta['version']}); upgrade agoc")
    return meta


def _read_records(file: Path) -> dict[str, Entry]:
    try:
        with gzip.open(file, "rt") as f:
            entries = [Entry.from_json(json.loads(line)) for line in f if line.strip()]
    except (OSError, EOFError, json.JSONDecodeError, KeyError) as exc:
        raise LibraryError(f"{file} is unreadable ({exc}); rebuild the library with `agoc library build`") from None
    return {e.workload_hash: e for e in entries}


# ----------------------------------------------------------------------------- building one


def build(databases: list[Path], out: Path, device: str = "local", command: str = "", script: str = "",
          tuned_by: dict | None = None) -> Library:
    """Package the verified schedules of ``databases`` (one target and layout) into the library ``out``, or
    add them to the library already there: one record per kernel, the fastest verified schedule kept.
    ``command``: the command line that builds it (kept in ``library.json``, as ``script``, the script that ran
    it, and ``tuned_by``: {database: the command line that tuned it}).
    Refused for a directory that is neither a library nor empty, and for databases of another target or
    layout than the library's. Written atomically: a reader sees the old library or the new one."""
    out = Path(out)
    meta = _existing(out)
    entries = dict(Library(out, meta).entries) if meta is not None else {}
    meta = dict(meta or {"format": FORMAT, "version": VERSION, "device": device, "commands": [], "sources": []})
    for db_dir in databases:
        found, new = read_database(Path(db_dir))
        if tuned_by and str(db_dir) in tuned_by:
            found["source"]["command"] = tuned_by[str(db_dir)]
        _check_same(meta, found, Path(db_dir), out)
        meta.setdefault("target", found["target"])
        meta.setdefault("target_key", target_key(found["target"]))
        meta.setdefault("layout", found["layout"])
        meta.setdefault("precision", found["precision"])
        meta["sources"] = [s for s in meta["sources"] if (s["model_sha256"], s["database"]) !=
                           (found["source"]["model_sha256"], found["source"]["database"])] + [found["source"]]
        for e in new:
            entries[e.workload_hash] = _better(entries.get(e.workload_hash), e)
    if "target" not in meta:
        raise LibraryError("no tuning database given: name at least one (`agoc library build DB... --out DIR`)")
    if device != meta["device"]:
        raise LibraryError(f"{out} holds schedules measured on {meta['device']}, not {device}: give --device "
                           f"{meta['device']}, or another --out")
    meta["commands"] = [*meta["commands"], *([command] if command else [])]
    if script:
        meta["script"] = script
    _write(out, meta, entries)
    library = Library.load(out)
    train_cost_model(library)
    return library


def subset(library: Library, out: Path, keep) -> Library | None:
    """A new library at ``out`` (absent or empty) of ``library``'s records whose source database passes ``keep``
    (a predicate on a ``sources`` entry), its cost model trained on those alone: a library that never saw a
    model, for leave-one-out. None, nothing written, when no record is kept."""
    kept = [s for s in library.sources if keep(s)]
    shas = {s["model_sha256"] for s in kept}
    entries = {h: e for h, e in library.entries.items() if e.source in shas}
    if not entries:
        return None
    if Path(out).exists() and any(Path(out).iterdir()):
        raise LibraryError(f"{out} is not empty: give a new directory for the library's subset")
    meta = {**library.meta, "sources": kept,
            "commands": [*library.meta.get("commands", []), f"(subset of {library.path}: {len(kept)} of "
                                                            f"{len(library.sources)} sources)"]}
    _write(Path(out), meta, entries)
    found = Library.load(out)
    train_cost_model(found)
    return found


#: the file of a library's pre-trained cost model (toolchain/tune/costmodel.py), and the fewest measured
#: samples it is trained from (fewer: the library has none, and sessions start from MetaSchedule's own)
COST_MODEL, MIN_SAMPLES = "cost_model.ubj", 16


def train_cost_model(library: Library) -> Path | None:
    """Train the library's cost model on its samples and save it beside them (replacing the one there, made
    from fewer); None, and the old one removed, when there are too few samples or none replays."""
    from toolchain.targets import TargetSpec
    from toolchain.tune import costmodel

    path = library.path / COST_MODEL
    samples = list(library.samples())
    spec = TargetSpec(preset="library", tvm_target=dict(library.target), linker="", runs_on_host=False,
                      layout=library.layout)
    try:
        model = costmodel.train(samples, spec) if len(samples) >= MIN_SAMPLES else None
    except ValueError:  # nothing replays on its workload
        model = None
    if model is None:
        for stale in (path, costmodel.info_path(path)):
            stale.unlink(missing_ok=True)  # its own: a model of the records it held before
        return None
    return costmodel.save(model, path)


def _existing(out: Path) -> dict | None:
    """The library at ``out`` (its meta), None where there is nothing yet; refused for anything else."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise LibraryError(f"{out} is a file, not a record library; give --out a new or empty directory")
    meta = _read_meta(out)
    held = sorted(p.name for p in out.iterdir())
    if meta is None and held:
        raise LibraryError(f"{out} exists and is not a record library (it holds {', '.join(held[:5])}); give --out "
                           "a new or empty directory (nothing was written)")
    return meta


def _check_same(meta: dict, found: dict, db_dir: Path, out: Path) -> None:
    if "target" not in meta:
        return
    theirs = target_key(found["target"])
    if theirs != meta["target_key"]:
        raise LibraryError(f"{db_dir} was tuned for {theirs}, the library {out} holds {meta['target_key']}: "
                           "schedules of one target only; give it another --out")
    if found["layout"] != meta["layout"]:
        raise LibraryError(f"{db_dir} was tuned in layout {found['layout']}, the library {out} holds "
                           f"{meta['layout']}: one layout per library; give it another --out")
    if found["precision"] != meta.get("precision", "fp32"):
        raise LibraryError(f"{db_dir} was tuned in {found['precision']}, the library {out} holds "
                           f"{meta.get('precision', 'fp32')} kernels: one precision per library; give it another --out")


def _write(out: Path, meta: dict, entries: dict[str, Entry]) -> None:
    """The records file (named by its content) then ``library.json``, each through a temporary file
    replaced into place; a new library through a temporary directory renamed into place."""
    ordered = sorted(entries.values(), key=lambda e: (e.op, e.name))
    data = gzip.compress("".join(json.dumps(e.to_json(), separators=(",", ":")) + "\n" for e in ordered).encode(),
                         mtime=0)
    records = f"records-{hashlib.sha256(data).hexdigest()[:12]}.jsonl.gz"
    by_op: dict[str, int] = {}
    for e in ordered:
        by_op[e.op] = by_op.get(e.op, 0) + 1
    old = meta.get("records")
    meta = {**meta, "records": records, "counts": {"kernels": len(ordered), "samples": sum(len(e.samples)
                                                                                         for e in ordered),
                                                   "by_op": dict(sorted(by_op.items()))}}
    text = json.dumps(meta, indent=1) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or not any(out.iterdir()):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        tmp.chmod(0o777 & ~_umask())  # (mkdtemp's is private; a library is read by whoever tunes)
        try:
            (tmp / records).write_bytes(data)
            (tmp / LIBRARY_JSON).write_text(text)
            if out.exists():
                out.rmdir()  # empty: nothing of anyone's is lost
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return
    _replace(out / records, data)
    _replace(out / LIBRARY_JSON, text.encode())
    if old and old != records and (out / old).is_file():
        (out / old).unlink()  # the records file the old library.json named: its own


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
