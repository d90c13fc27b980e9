"""Auto-tuning on MetaSchedule, AGO style: divide-and-conquer over the partition, every kept
schedule verified.

A tuning session works in a database directory that survives interruption::

    DB/
      session.json     model hash, target, settings (partition, Td, keep-inside, ablations, budget): what
                       compile needs
      tasks.json       the tasks: kernel, phase, members, parent, weight, budget
      ms/              MetaSchedule's JSONDatabase (one line per finished trial; appended as it goes)
      progress.json    per task: trials recorded so far and the best measured latency
      verified.json    per task: the kept (verified) record, and every candidate rejected, with the reason;
                       a join's also its timing next to its minis (``paired``)
      imported.json    per task: records copied in from another database (``--from``), if any

Re-running ``tune`` on the same DB resumes: trials already recorded count against each task's
budget and nothing finished is lost. ``compile --db`` applies only verified records.

Phases (AGO §V). For every subgraph S of the AGO partition holding several complex (or other reducing) ops, the
reformer splits S into mini-subgraphs (one complex or other reducing op each); the minis are tuned first with
``split_fraction`` of S's budget, each stopping early once its best latency stabilises (no gain
over ``stable_tolerance`` in the last ``stable_window`` trials). Then the minis' best schedules are
composed onto S's fused kernel (their traces replayed, block names mapped) and that composed
schedule seeds S's own tuning with the rest of the budget (each nest keeping its mini's unroll
depth). S must earn that budget: when its first batch leaves it slower than its minis together (by
more than ``join_margin``) or finds nothing faster than its seed, the rest goes back to the minis and
S is composed once more from their improved schedules. Finally each join's kept schedule is timed
next to its minis' kept schedules (:mod:`toolchain.pairing`): ``compile --db`` builds S as its minis
when they are faster together. ``reformer=False`` (AGO-NR) tunes S
directly; ``intensive=False`` (AGO-NI) leaves the intensive-fusion space out; ``partition="stock"``
tunes TVM's FuseOps kernels with the default space (the Ansor-like baseline).

Budgets: the session budget is divided over the final kernels in proportion to their AGO weight
(Eq. 1 predicts tuning budget), at least one search batch each, and a subgraph the reformer splits
at least one batch per mini (the stock partition gives each of those ops a kernel of its own). The
minis get ``split_fraction`` of their subgraph's budget, more when that is under a batch each; the
joined kernel gets the rest, at a tight budget only its seed (the composed schedule, measured and
verified like any candidate) — or one batch when nothing could be composed.

Search: XGB cost models shared over the session (:func:`session_cost_model`), so a kernel's search
ranks candidates by what the session has measured so far: one for the kernels of a single complex op
(kernels and minis), trained on their records only, and one for joins, trained on every record. A
single model fed the joins' records (several convs, intensive fusion) ranked single-conv candidates
at random or inversely (MobileNet-V2, held out: Spearman −0.4…0.5 against 0.3…0.7 without them).

Correctness: every space carries the static dropped-iteration check; after a task is tuned, its
candidates are checked best-first in a fresh process against the unscheduled kernel
(:mod:`toolchain.check_candidate`) until one passes; that one is kept, the others are recorded as
failed and never applied.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from toolchain import build, fastmath, fusion, padding, partition, reform, roofline, transfer
from toolchain.errors import AgocError, first_line
from toolchain.opgraph import OpGraph, op_graph
from toolchain.pairing import TRAFFIC, check_rule, choose, choose_by, minis_ms as _minis_ms, pair_joins, time_join
from toolchain.timing import Timing, local_runner
from toolchain.weights import load_model

log = logging.getLogger("agoc.tuning")

SCHEMA = "agoc.tunedb/1"
FAILED_SECS = 1e9  # MetaSchedule records failed builds/runs with a huge run time


class TuningError(AgocError):
    """A tuning session cannot start or continue (bad database, settings mismatch)."""


@dataclass(frozen=True)
class TuneSettings:
    trials: int = 256  # whole-model budget
    partition: str = "ago"
    threshold: float | None = None  # AGO Td (default: shipped with the weight fit)
    keep_inside: int = 0  # AGO: a complex-op pair joined by a tensor of at least this many bytes stays in one
    # subgraph (partition.locality_units), and an intensive tile's slice of its intermediate is at most that
    # (intensive.intensive_schedule's tile_cache); 0: AGO's clustering and TILE_FACTOR_MAX alone
    intensive: bool = True  # False: AGO-NI
    reformer: bool = True  # False: AGO-NR
    split_fraction: float = 0.5  # share of a subgraph's budget spent on its minis first
    per_iter: int = 16  # candidates per search batch
    population: int = 128  # MetaSchedule's evolutionary search: candidates the cost model scores and
    # evolves (genetic rounds) before each batch is picked for measuring (its own default, 512, tuned
    # MobileNet-V2 no better per trial in 2.4x the time: bench/RESULTS.md, twenty-second session)
    stable_window: int = 16  # minis stop early when the last window of trials ...
    stable_tolerance: float = 0.02  # ... improved the best latency by less than this
    verify_top: int = 5  # candidates checked, best first, before giving up on a task
    cold_weights: bool = True  # time candidates with all arguments but the first flushed from cache
    # (toolchain/timing.py: in a model a kernel's weights come from memory); False: timed warm
    join_margin: float = 0.10  # a join still this much slower than its minis together after its first
    # batch hands the rest of its budget back to them (it would be built as its minis anyway)
    seed: int = 0
    scheduler: str = "weight"  # how the budget is spread over the tasks (SCHEDULERS)
    warmup: int = 8  # "latency" scheduler: the first batch every task gets (a split subgraph: one per
    # mini and one for its join) before the rest goes round by round where it saves the most model time
    prepack: bool = True  # weights layout-free: a schedule may store each weight in the order it reads
    # it (MetaSchedule's RewriteLayout; folded at build time, build.prepack_weights)
    transfer: int = 2  # a kernel's search starts from the verified schedules of up to this many kernels
    # with the same blocks, re-fitted to its loops (toolchain/transfer.py; each one a trial of its budget)

    @property
    def unit(self) -> int:
        """A task's first batch: what its floor is counted in."""
        return self.warmup if self.scheduler == "latency" else self.per_iter

    def to_json(self) -> dict:
        return asdict(self)


#: How a session spreads its trial budget over the tasks of a model.
SCHEDULERS = {
    "weight": "planned up front in proportion to AGO's weights (each task at least one batch of --per-iter); "
              "what the plan cannot place (the last kernels' unspent trials) goes round by round as with latency",
    "latency": "a first batch of --warmup per task, then rounds of --per-iter to the task whose next round "
               "is expected to save the most model time (its share of the model × expected gain, Ansor-style)",
    "roofline": "three quarters of the budget planned by weight, the last quarter in rounds of --per-iter to "
                "the task whose time in the model is furthest above its roofline floor (its work and bytes at "
                "the best rates the session measured) × the share of that gap a round is expected to close",
}

#: ``roofline``: the share of the budget that goes round by round (the rest is planned by weight, so
#: every task has its batches before any round is decided on measured times)
ROUND_SHARE = 0.25


@dataclass(frozen=True)
class Task:
    name: str  # kernel name + structural hash: identical kernels share one task
    phase: str  # "kernel" (final kernel, tuned directly), "mini" (reformer phase 1), "joined" (phase 2)
    members: tuple[str, ...]  # op-graph node ids (of the first instance)
    parent: str | None  # for minis: the joined task they belong to
    weight: float
    budget: int
    calls: int = 1  # how many times the model calls this kernel

    def to_json(self) -> dict:
        return {**asdict(self), "members": list(self.members)}

    @staticmethod
    def from_json(d: dict) -> "Task":
        return Task(**{**d, "members": tuple(d["members"])})


# ----------------------------------------------------------------------------- helpers


def as_built(mod):
    """A scheduled kernel's module as it is built and timed: a weight whose layout the schedule rewrote
    (``TuneSettings.prepack``) is passed rewritten, its rewrite block left out (the model does it once,
    at build time): its ``main``'s parameters are what a runner must pass."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)


#: seconds a candidate may take to build (LocalBuilder's per-candidate timeout). Every e2e database at
#: 112×112 (~10,000 trials, 2 build workers) built a batch of 16 in at most 40 s, most in 2 s; a class of
#: intensive-join candidates takes minutes: a 56-lane vectorised transpose (strided reads from NHWC)
#: under explicit unroll 512 built in 343 s (0.3 s without that vector, 6.9 s at unroll 64) and cost
#: the pairs suite 8 minutes for one batch at the old 120 s (bench/RESULTS.md, twenty-seventh session).
BUILD_TIMEOUT_S = 30


def fast_build(mod, target, _params=None):
    """``LocalBuilder`` ``f_build`` without the stock builder's ``tvm.s_tir.tensor_intrin`` import (≈11 s/batch)."""
    from tvm.driver import build as tvm_build

    return tvm_build(as_built(mod), target=target)


def plain(obj):
    """A TVM JSON-ish object (trace JSON: Arrays, IntImm, FloatImm, String) as plain Python."""
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj
    if hasattr(obj, "items"):
        return {str(k): plain(v) for k, v in obj.items()}
    if hasattr(obj, "value") and type(obj).__name__ in ("IntImm", "FloatImm", "StringImm"):
        return obj.value
    if isinstance(obj, (list, tuple)) or type(obj).__name__ in ("Array", "List"):
        return [plain(x) for x in obj]
    return str(obj)


def trial_latencies(work_dir: Path, func=None) -> list[float]:
    """Measured latency (s, median of the repeats) of every trial — of ``func``'s workload only, when
    given — in the order the tuner committed them (the database itself lists a workload's records
    best first).

    ``JSONDatabase`` appends one line per record to ``database_tuning_record.json``
    as results come in: ``[workload_index, [trace, run_secs, target, args_info]]``
    (``TuningRecord.as_json``; ``run_secs`` holds one entry per runner repeat), the index
    counting lines of ``database_workload.json`` (``[structural hash, module]``).
    A failed build or run is recorded with a run time of 1e10 s; it stays in the
    list as ``inf``.
    """
    if func is None:
        return [lat for _, lat in _records_in_order(Path(work_dir))]
    return trial_latencies_of(work_dir, {"f": func})["f"]


def _workload_hash(func) -> str:
    import tvm_ffi

    return str(tvm_ffi.structural_hash(workload_module(func)) & 0xFFFFFFFFFFFFFFFF)


def _record_workload(line: str) -> int:
    """The workload index of a ``database_tuning_record.json`` line, read without parsing the record."""
    return int(line[1:line.index(",")])


def _workload_indices(work_dir: Path) -> dict[str, set[int]]:
    """{workload structural hash: its line numbers in ``database_workload.json``} (what a record's
    workload index counts)."""
    path = work_dir / "database_workload.json"
    out: dict[str, set[int]] = {}
    for i, line in enumerate(path.read_text().splitlines() if path.exists() else []):
        if line.strip():
            out.setdefault(json.loads(line)[0], set()).add(i)
    return out


def _records_in_order(work_dir: Path, wanted: set | None = None) -> list[tuple[int, float]]:
    """(workload index, latency) of every record (of the ``wanted`` workload indices) in commit order
    (see :func:`trial_latencies`)."""
    path = work_dir / "database_tuning_record.json"
    out: list[tuple[int, float]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if wanted is not None and _record_workload(line) not in wanted:
            continue
        index, record = json.loads(line)
        secs = [float(s) for s in (record[1] or [])]
        lat = sorted(secs)[len(secs) // 2] if secs else math.inf
        out.append((int(index), math.inf if lat >= FAILED_SECS else lat))
    return out


def trial_latencies_of(work_dir: Path, funcs: dict, hashes: dict | None = None) -> dict:
    """:func:`trial_latencies` of several kernels ({name: PrimFunc}) from one reading of the database.
    ``hashes``: their workload hashes ({name: :func:`_workload_hash`}) when the caller already has them."""
    work_dir = Path(work_dir)
    hashes = hashes or {name: _workload_hash(func) for name, func in funcs.items()}
    index_of = _workload_indices(work_dir)
    owner: dict[int, list[str]] = {}
    for name in funcs:
        for i in index_of.get(hashes[name], ()):
            owner.setdefault(i, []).append(name)
    out: dict[str, list[float]] = {name: [] for name in funcs}
    for index, lat in _records_in_order(work_dir, set(owner)):
        for name in owner.get(index, ()):
            out[name].append(lat)
    return out


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
    their_index = {h: min(i) for h, i in _workload_indices(base.ms_dir).items()}
    our_index = {h: min(i) for h, i in _workload_indices(db.ms_dir).items()}
    ours_with_records = {index for index, _ in _records_in_order(db.ms_dir)}
    next_index = len(lines(db.ms_dir / "database_workload.json"))
    wanted: dict[int, tuple[int, str]] = {}  # their workload index -> (ours, task)
    added: list[str] = []
    for name, func in funcs.items():
        h = _workload_hash(func)
        if h not in their_index or our_index.get(h) in ours_with_records:
            continue
        if h not in our_index:
            our_index[h] = next_index + len(added)
            added.append(their_workloads[their_index[h]])
        wanted[their_index[h]] = (our_index[h], name)
    copied: dict[str, int] = {}
    records: list[str] = []
    for line in lines(base.ms_dir / "database_tuning_record.json"):
        target = wanted.get(_record_workload(line)) if line.strip() else None
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
        db._write("imported.json", {**before, **{k: before.get(k, 0) + n for k, n in copied.items()}})
    return copied


def workload_module(func):
    """``func`` alone in a fresh module, as MetaSchedule's workload — a deep copy: in TVM 0.27 a
    schedule made on a module nothing else holds edits it in place, down to the PrimFunc the module
    was made from (``Schedule(workload_module(f))`` then ``split`` changed ``f``)."""
    import tvm

    return tvm.IRModule({"main": tvm.ir.load_json(tvm.ir.save_json(func)).with_attr("global_symbol", "main")})


def scheduled(func, trace_json):
    """``func``'s workload scheduled by a trace (JSON, as the database and verified.json hold it)."""
    from tvm import s_tir

    sch = s_tir.Schedule(workload_module(func))
    s_tir.Trace.apply_json_to_schedule(trace_json, sch)
    return sch


def kernel_hash(func) -> str:
    """Identity of a kernel: identical PrimFuncs (whatever they are called) are one tuning task."""
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFF:012x}"


def task_name(kernel: str, func) -> str:
    return f"{kernel[:60]}-{kernel_hash(func)}"


def task_hash(name: str) -> str:
    """The :func:`kernel_hash` a :func:`task_name` ends with: the kernel's identity across partitions."""
    return name.rsplit("-", 1)[-1]


def group_kernels(fused_mod) -> list[tuple[str, object]]:
    """(kernel name, PrimFunc) of every call_tir in main, in call order (one per partition group)."""
    from tvm import relax

    out = []
    for block in fused_mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and v.op.name == "relax.call_tir":
                gv = v.args[0]
                out.append((gv.name_hint, fused_mod[gv]))
    return out


def _budgets(weights: list[float], total: int, minimum: int, floors: list[int] | None = None) -> list[int]:
    """Split ``total`` trials in whole batches of ``minimum`` in proportion to ``weights`` (largest
    remainder), each kernel at least its floor in batches (default one): the sum is ``total`` rounded
    to batches, or the sum of the floors when that is more."""
    if not weights:
        return []
    floors = floors or [1] * len(weights)
    units = max(total // minimum, sum(floors))
    alloc = [0] * len(weights)
    free, left = list(range(len(weights))), units
    while True:  # kernels whose share is under their floor get the floor; the rest share what is left
        scale = sum(weights[i] for i in free) or 1.0
        shares = {i: left * (weights[i] or 1e-12) / scale for i in free}
        low = [i for i in free if shares[i] < floors[i]]
        if not low:
            break
        for i in low:
            alloc[i], left = floors[i], left - floors[i]
            free.remove(i)
    for i in free:
        alloc[i] = int(shares[i])
    spare = units - sum(alloc)
    for i in sorted(free, key=lambda i: shares[i] - int(shares[i]), reverse=True)[:spare]:
        alloc[i] += 1
    return [a * minimum for a in alloc]


# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class TaskPlan:
    tasks: tuple[Task, ...]
    funcs: dict = field(hash=False)  # task name -> PrimFunc
    compositions: dict = field(hash=False)  # joined task -> [(mini task, {mini block: joined block}), ...]
    groups: tuple = ()  # the partition's groups (op ids), in order
    group_tasks: tuple = ()  # the task of each group
    split_of: dict = field(default_factory=dict, hash=False)  # group index -> its mini-subgraphs (op ids)


def _block_names(func) -> list[str]:
    from toolchain.opgraph import block_nests

    return [b.block for b in block_nests(func)]


def plan_tasks(mod, graph: OpGraph, spec, settings: TuneSettings) -> tuple[object, TaskPlan]:
    """Legalized module → (fused module, the tuning tasks)."""
    threshold = settings.threshold if settings.threshold is not None else partition.DEFAULT_THRESHOLD
    mark = build.mark_weights if settings.prepack else (lambda m: m)
    if settings.partition == "stock":
        fused = mark(build.fuse_stock(mod, spec))
        plan = partition.plan("stock", mod, spec, graph=graph)
    else:
        plan = partition.plan("ago", mod, spec, threshold, graph, keep_inside=settings.keep_inside)
        fused = mark(fusion.fuse_groups(mod, plan.groups, spec))
    kernels = group_kernels(fused)
    weights_by_node = plan.weights
    funcs: dict = {}
    final: dict[str, Task] = {}
    order: list[str] = []
    groups = plan.groups if settings.partition != "stock" else [()] * len(kernels)
    by_hash: dict[str, str] = {}
    for (kernel, func), group in zip(kernels, groups):
        name = by_hash.setdefault(kernel_hash(func), task_name(kernel, func))
        order.append(name)
        if name in final:
            final[name] = replace(final[name], calls=final[name].calls + 1)
            continue
        weight = sum(weights_by_node[n] for n in group) if group else 1.0
        funcs[name] = func
        final[name] = Task(name, "kernel", tuple(group), None, weight, 0)
    if settings.partition == "stock":  # weights of FuseOps kernels: from their own loop nests
        from toolchain.opgraph import OpNode, block_nests
        from toolchain.weights import loop_term

        model = load_model()
        for name, task in final.items():
            term = loop_term(OpNode(name, name, "simple", block_nests(funcs[name]), ()))
            final[name] = replace(task, weight=model.c * term + model.b)
    minis_of: dict[str, list] = {}
    split_of: dict[int, list] = {}
    charged: set = set(by_hash)  # structural hashes of the kernels, then of the minis already counted

    def new_minis(minis: list) -> list:
        """The minis of a join not tuned as a kernel or as an earlier join's mini (joins in order)."""
        fresh = [h for h in dict.fromkeys(kernel_hash(func) for (_, func), _ in minis) if h not in charged]
        charged.update(fresh)
        return fresh
    if settings.partition == "ago" and settings.reformer:
        split = reform.split_plan(graph, plan, threshold)
        mini_kernels = group_kernels(mark(fusion.fuse_groups(mod, split.plan.groups, spec)))
        for parent_index, parent in enumerate(order):
            minis = [(k, g) for k, g, p in zip(mini_kernels, split.plan.groups, split.parent_of) if p == parent_index]
            if len(minis) >= 2:  # one reducing op: tuned directly
                minis_of.setdefault(parent, minis)
                split_of[parent_index] = [g for _, g in minis]
    # a subgraph the reformer splits gets at least a batch per mini it brings (the stock partition gives
    # each of those ops a kernel and a batch of its own: equal footing at equal budget) and one for its
    # join: the composed seed alone never reaches the intensive-fusion structure. A mini identical to a
    # kernel or to an earlier join's mini is tuned once, there: it is not charged again.
    floors = [len(new_minis(minis_of[n])) + 1 if n in minis_of else 1 for n in final]
    # "latency": the plan is the first batches only; the rest of the budget goes round by round;
    # "roofline": the plan is all but ROUND_SHARE of the budget
    first_pass = {"latency": 0, "roofline": int(settings.trials * (1 - ROUND_SHARE))}.get(settings.scheduler,
                                                                                            settings.trials)
    # a kernel's share of the model's time is its weight (one call) times its calls (as Ansor's task
    # scheduler weighs a task by how often the model runs it)
    budgets = _budgets([t.weight * t.calls for t in final.values()], first_pass, settings.unit, floors)
    final = {n: replace(t, budget=b) for (n, t), b in zip(final.items(), budgets)}

    tasks: list[Task] = []
    compositions: dict = {}
    for parent, minis in minis_of.items():
        parent_task = final[parent]
        new = []
        for (kernel, func), mini in minis:
            name = by_hash.setdefault(kernel_hash(func), task_name(kernel, func))
            # every instance composes onto the joined kernel, even when identical minis share a task
            compositions.setdefault(parent, []).append(
                (name, _map_blocks(graph, mini, parent_task.members, func, funcs[parent]))
            )
            if name in funcs:
                continue  # an identical mini (or kernel) elsewhere is tuned once
            funcs[name] = func
            new.append(Task(name, "mini", tuple(mini), parent, sum(plan.weights[n] for n in mini), 0))
        # the minis get split_fraction of the budget, at least a batch each; the joined kernel the rest,
        # which may be only its seed (the composed schedule, measured) when the budget is tight
        share = min(parent_task.budget, max(settings.split_fraction * parent_task.budget, settings.unit * len(new)))
        mini_budgets = _budgets([t.weight for t in new], int(share), settings.unit)
        tasks.extend(replace(t, budget=b) for t, b in zip(new, mini_budgets))
        final[parent] = replace(parent_task, phase="joined", budget=max(1, parent_task.budget - sum(mini_budgets)))
    # a kernel that is also one of a join's minis (an identical op group elsewhere, tuned once) goes with
    # the minis, before every join: a join is composed from its minis' verified schedules
    composed = {name for parts in compositions.values() for name, _ in parts}
    tasks.extend(sorted(final.values(), key=lambda t: t.phase != "kernel" or t.name not in composed))
    return fused, TaskPlan(tuple(tasks), funcs, compositions, tuple(plan.groups), tuple(order), split_of)


def first_pass_trials(mod, spec, settings: TuneSettings) -> int:
    """Trials of the session's plan (``mod``: a legalized module): every task's share of the budget
    ("weight"), or its first batch only ("latency")."""
    _, plan = plan_tasks(mod, op_graph(mod), spec, settings)
    return sum(t.budget for t in plan.tasks)


def session_trials(first_pass: int, settings: TuneSettings) -> int:
    """Trials a session spends at most, its plan taking ``first_pass``: the plan ("weight"), or the
    whole budget ("latency", "roofline"; more where the plan's floors alone need more)."""
    return max(first_pass, settings.trials) if settings.scheduler in ("latency", "roofline") else first_pass


def planned_trials(mod, spec, settings: TuneSettings) -> int:
    """Trials a session with ``settings`` would spend on ``mod`` (a legalized module) at most: every
    kernel gets at least one search batch, so a model with many kernels can exceed ``settings.trials``."""
    return session_trials(first_pass_trials(mod, spec, settings), settings)


def _map_blocks(graph: OpGraph, mini: tuple[str, ...], joined: tuple[str, ...], mini_func, joined_func) -> dict:
    """Mini kernel block name → joined kernel block name, op by op.

    FuseTIR lays out a group's blocks op after op in binding order, each op contributing its own
    PrimFunc's blocks (renamed on clashes), so the k-th block of an op in one kernel is the k-th
    block of the same op in the other.
    """
    sizes = {n.id: len(n.blocks) for n in graph.nodes}
    mini_blocks, joined_blocks = _block_names(mini_func), _block_names(joined_func)
    if sum(sizes[n] for n in mini) != len(mini_blocks) or sum(sizes[n] for n in joined) != len(joined_blocks):
        return {}  # layout differs from the assumption: no composition for this mini
    start, offset = {}, 0
    for n in joined:
        start[n] = offset
        offset += sizes[n]
    mapping, offset = {}, 0
    for n in mini:
        for k in range(sizes[n]):
            mapping[mini_blocks[offset + k]] = joined_blocks[start[n] + k]
        offset += sizes[n]
    return mapping


# ----------------------------------------------------------------------------- the database directory


#: settings added since databases were first made, at the value a database made before them implicitly used
BEFORE_SETTING = {"cold_weights": False, "scheduler": "weight", "warmup": 8, "prepack": False, "keep_inside": 0}
#: settings a database may be resumed with at another value: the budget, how many sibling seeds a task
#: not yet started gets (a seed is measured like any candidate; the records stay comparable), and the
#: search's population (how candidates are found, not how they are measured)
RESUMABLE_SETTINGS = ("trials", "transfer", "population")


def _settings_but_trials(settings: dict) -> dict:
    return {k: v for k, v in {**TuneSettings().to_json(), **BEFORE_SETTING, **settings}.items()
            if k not in RESUMABLE_SETTINGS}


class TuneDB:
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

    def open_session(self, session: dict) -> None:
        existing = self.session
        if existing is None and self.root.is_dir() and any(self.root.iterdir()):
            held = ", ".join(sorted(p.name for p in self.root.iterdir())[:5])
            raise TuningError(f"{self.root} exists and is not a tuning database (it holds {held}); give --db a new "
                              "or empty directory (nothing was written)")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TuningError(f"cannot create the tuning database {self.root}: {exc.strerror or exc}; give --db a "
                              "directory you can write") from None
        if existing is not None:
            existing["layout"] = self.activation_layout
            existing["pad_channels"] = self.channel_padding
            existing["fast_math"] = self.fast_math
            session = {**session, "layout": session.get("layout", "NCHW"),
                       "pad_channels": session.get("pad_channels", False), "fast_math": session.get("fast_math", False)}
            unknown = sorted(set(existing["settings"]) - set(TuneSettings().to_json()))
            if unknown:  # a newer agoc made or resumed it: this one cannot tell whether its records compare
                raise TuningError(
                    f"{self.root} was tuned by a newer agoc, with settings this one does not know "
                    f"({', '.join(unknown)}); upgrade agoc, or use another --db")
            for key in ("model_sha256", "target", "layout", "pad_channels", "fast_math", "settings"):
                # the budget may change between runs: a larger one continues tuning, every record stays valid
                # (a setting added since a database was made counts at the value it had then: BEFORE_SETTING)
                old, now = ((_settings_but_trials(existing[key]), _settings_but_trials(session[key]))
                            if key == "settings" else (existing[key], session[key]))
                if old != now:
                    same = {"layout": f" (--layout {existing[key]})",
                            "pad_channels": f" ({'--pad-channels' if existing[key] else '--no-pad-channels'})",
                            "fast_math": f" ({'--fast-math' if existing[key] else '--exact-math'})"}
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

    @property
    def traffic(self) -> dict:
        """Joins judged by simulated memory traffic (host/judge.py), per cache geometry: {} if none."""
        return self._read("traffic.json", {})

    def save_traffic(self, geometry: str, record: dict) -> None:
        self._write("traffic.json", {**self.traffic, geometry: record})

    def ms_database(self):
        from tvm.s_tir import meta_schedule as ms

        self.ms_dir.mkdir(parents=True, exist_ok=True)
        return ms.database.JSONDatabase(work_dir=str(self.ms_dir))


def _setting_changes(old: dict, now: dict) -> str:
    """The settings two sessions disagree on, as ``name: database's → this run's``."""
    return ", ".join(f"{k}: {_short(old.get(k))} → {_short(now.get(k))}"
                     for k in sorted(set(old) | set(now)) if old.get(k) != now.get(k))


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) < 60 else text[:57] + "..."


def records_of(database, func) -> list:
    """All tuning records of one kernel (workload), best first (:func:`trial_latencies` has them in
    commit order)."""
    mod = workload_module(func)
    if not database.has_workload(mod):
        return []
    workload = database.commit_workload(mod)
    return [r for r in database.get_all_tuning_records() if r.workload.same_as(workload)]


def latency(record) -> float:
    secs = [float(s) for s in (record.run_secs or [])]
    if not secs:
        return math.inf
    value = sorted(secs)[len(secs) // 2]
    return math.inf if value >= FAILED_SECS else value


def stabilised(latencies: list[float], window: int, tolerance: float) -> bool:
    """True when the best latency improved by less than ``tolerance`` over the last ``window`` trials."""
    finite = [x for x in latencies]
    if len(finite) < 2 * window:
        return False
    before = min(finite[:-window])
    after = min(finite)
    return before < math.inf and after >= before * (1 - tolerance)


# ----------------------------------------------------------------------------- search spaces


def space_for(func, spec, intensive: bool, tile_cache: int = 0):
    """The MetaSchedule space for one kernel: intensive fusion where it applies (unless AGO-NI),
    otherwise TVM's default llvm space; both carry the static dropped-iteration check. ``tile_cache``:
    bytes an intensive tile's slice of the intermediate may take (``--keep-inside``; 0: no cap)."""
    from toolchain import intensive as intensive_space

    return intensive_space.make_space_generator(func, spec.tvm(), intensive=intensive, num_cores=spec.num_cores,
                                                tile_cache=tile_cache)


# ----------------------------------------------------------------------------- one task


@dataclass(frozen=True)
class Measure:
    """Where candidates are measured. The default (``None`` everywhere) is this machine:
    MetaSchedule's LocalRunner on the stock export. A device session (host/measure.py) passes
    its RPC runner and an export that makes a shared object the device loads (cross-compiled), and
    ``together``: times built kernels in turn in one device session (a farm's runner would spread
    them over its devices; a pairing compares kernels on one device)."""

    runner: object = None
    export: Callable | None = None  # LocalBuilder f_export
    where: str = "local"
    together: Callable | None = None  # (artifact paths, their PrimFuncs, rounds) -> ms per kernel per round


def _builder(spec, measure: "Measure | None", max_workers: int):
    from tvm.s_tir import meta_schedule as ms

    export = measure.export if measure is not None else None
    return ms.builder.LocalBuilder(f_build=fast_build, f_export=export, max_workers=max_workers,
                                      timeout_sec=BUILD_TIMEOUT_S)


def _runner(settings: TuneSettings, runner=None):
    if isinstance(runner, Measure):
        runner = runner.runner
    if runner is not None:
        return runner
    return local_runner(Timing(cold=settings.cold_weights))


#: A kernel's search space is exhausted when its last EXHAUSTED_ROUNDS search rounds together brought
#: fewer than EXHAUSTED_NEW new candidates. MetaSchedule measures each distinct schedule once; a layout
#: kernel (ShuffleNet's concatenate + reshape + transpose + split) has only a handful, and once they are
#: measured every round still samples, evolves and scores ~500 candidates (4-8 s here) to send 0 or 1,
#: without end: 13 trials in 11 minutes of a 48-trial budget. The rest of such a kernel's budget goes to
#: the next kernel (as when its search fails).
EXHAUSTED_ROUNDS = 3
EXHAUSTED_NEW = 4


def _exhaustion_callback():
    """A MetaSchedule measure callback that ends the task once its space is exhausted (see above);
    ``.exhausted`` then says so. It runs after the default callbacks (records are in the database)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class EndWhenExhausted(PyMeasureCallback):
        def __init__(self):
            self.rounds: list[int] = []
            self.exhausted = False

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            self.rounds.append(len(measure_candidates))
            last = self.rounds[-EXHAUSTED_ROUNDS:]
            if not self.exhausted and len(last) == EXHAUSTED_ROUNDS and sum(last) < EXHAUSTED_NEW:
                self.exhausted = True
                task_scheduler.terminate_task(task_id)

    return EndWhenExhausted()


def session_cost_model(funcs: dict, database, spec):
    """The session's cost model: one MetaSchedule XGB model for every kernel of the session, trained on
    every record ``database`` holds for ``funcs`` (a resumed session starts where it stopped).

    ``tune_tir`` would make a fresh model per call, and an XGB model predicts at random until it has
    seen ``num_warmup_samples`` (100) trials: with the 16-64 trials a kernel gets here, every search
    was random sampling. Shared over the session (as TVM's own ``tune_tasks`` shares one over a
    model's tasks), it ranks candidates from the session's 100th trial on. The records are the only
    state: nothing else is saved, so an interrupted session loses nothing of it."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    model = ms.cost_model.XGBModel(num_tuning_cores=spec.num_cores)
    for func in funcs.values():
        records = [r for r in records_of(database, func) if r.run_secs]
        if not records:
            continue
        mod = workload_module(func)
        context = ms.TuneContext(mod=mod, target=spec.tvm(), num_threads=spec.num_cores)
        candidates, results = [], []
        for record in records:
            sch = s_tir.Schedule(mod)
            try:
                record.trace.apply_to_schedule(sch, remove_postproc=False)
            except Exception:  # noqa: BLE001 - a record that no longer replays teaches nothing; it stays
                continue
            candidates.append(ms.search_strategy.MeasureCandidate(sch, record.args_info))
            results.append(ms.runner.RunnerResult(record.run_secs, None))
        model.update(context, candidates, results)
    return model


def session_cost_models(plan: "TaskPlan", database, spec) -> dict[bool, Callable]:
    """The session's cost models, each made when a search first needs it (warming one reads the
    records it learns from): ``[False]`` for kernels and minis, learning from theirs only; ``[True]``
    for joins, learning from every record (a join's blocks are its minis')."""
    joins = {t.name for t in plan.tasks if t.phase == "joined"}
    singles = {name: func for name, func in plan.funcs.items() if name not in joins}
    return {False: functools.cache(lambda: session_cost_model(singles, database, spec)),
            True: functools.cache(lambda: session_cost_model(plan.funcs, database, spec))}


def tune_trials(func, spec, database, trials: int, settings: TuneSettings, intensive: bool, work_dir: Path,
                measure: "Measure | None" = None, cost_model=None) -> bool:
    """Run ``trials`` more MetaSchedule trials of one kernel into ``database``; True when the search
    ended early because the kernel's search space is exhausted (:data:`EXHAUSTED_ROUNDS`).
    ``cost_model``: the session's (:func:`session_cost_model`); None: a fresh one."""
    from tvm.s_tir import meta_schedule as ms

    # MetaSchedule's console handler takes this logger's level: keep progress to our own display
    # (its full logs still go to work_dir/logs)
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    ms_logger.setLevel(logging.WARNING)
    # MetaSchedule re-lists this logger's handlers by name in its logging config; a handler someone
    # attached without a name (pytest's log capture does) makes it fail: leave those out
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    builder = _builder(spec, measure, max(1, min(spec.num_cores, os.cpu_count() or 1)))
    exhaustion = _exhaustion_callback()
    ms.tune_tir(
        workload_module(func),
        target=spec.tvm(),
        work_dir=str(work_dir),
        max_trials_global=trials,
        num_trials_per_iter=min(settings.per_iter, trials),
        builder=builder,
        runner=_runner(settings, measure),
        database=database,
        space=space_for(func, spec, intensive, settings.keep_inside).generator,
        num_tuning_cores=spec.num_cores,
        seed=settings.seed,
        measure_callbacks=[*ms.MeasureCallback.create("default"), exhaustion],
        cost_model=cost_model if cost_model is not None else "xgb",
        strategy=ms.search_strategy.EvolutionarySearch(
            population_size=settings.population, init_min_unmeasured=min(50, settings.population)),
    )
    return exhaustion.exhausted


def check_target(spec) -> dict:
    """The target a candidate is checked on: its own when it runs here; otherwise this machine's
    (the schedule — the trace — is what is checked: the known wrong candidates are wrong in TIR,
    on every target; the final model is verified on the device itself against onnxruntime)."""
    if spec.runs_on_host:
        return spec.tvm_target
    from toolchain.targets import resolve_target

    host = dict(resolve_target("host").tvm_target)
    host["num-cores"] = spec.num_cores
    return host


def check_candidate(func, record, spec, seed: int = 0, timeout: float = 300) -> dict:
    """Numeric check of one record in a fresh process (see :mod:`toolchain.check_candidate`)."""
    import tvm

    from toolchain.check_candidate import CHECK_ENV

    request = {
        "workload": tvm.ir.save_json(workload_module(func)),
        "trace": plain(record.trace.as_json()),
        "target": check_target(spec),
        "seed": seed,
    }
    env = {**os.environ, **CHECK_ENV, "TVM_NUM_THREADS": str(spec.num_cores)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "toolchain.check_candidate"], input=json.dumps(request), capture_output=True,
            text=True, env=env, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"check timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"ok": False, "reason": f"checker crashed (exit {done.returncode}): {done.stderr.strip()[-200:]}"}
    return json.loads(lines[-1])


def verify_task(task: Task, func, database, spec, settings: TuneSettings) -> dict:
    """Check candidates best-first until one passes; returns the verified.json entry of the task."""
    records = sorted(records_of(database, func), key=latency)
    rejected = []
    for record in records[: settings.verify_top]:
        if latency(record) == math.inf:
            break
        result = check_candidate(func, record, spec, seed=settings.seed)
        entry = {"latency_ms": latency(record) * 1e3, **{k: result.get(k) for k in ("max_abs", "max_ref")}}
        if result["ok"]:
            return {
                "status": "verified",
                "trace": plain(record.trace.as_json()),
                **entry,
                "trials": len(records),
                "rejected": rejected,
            }
        rejected.append({**entry, "reason": result.get("reason", "")})
    return {"status": "unverified" if records else "untuned", "trials": len(records), "rejected": rejected}


# ----------------------------------------------------------------------------- join: compose minis' schedules


def compose_joined(joined_func, minis: list[tuple[object, dict]]):
    """Replay each mini's kept trace on the joined kernel (block names mapped); a Schedule, or None.

    ``minis`` holds (trace JSON, block map) pairs. A step that does not replay on the joined kernel
    (seen: a mini's ``reverse_compute_at`` of a residual add, whose other operand the joined kernel
    computes itself) is left out when nothing refers to its results, otherwise the trace stops
    there (:func:`_replay_tolerant`); a mini of which nothing but lookups replays is skipped.
    """
    from tvm import s_tir

    sch = s_tir.Schedule(workload_module(joined_func))
    applied = 0
    for trace_json, block_map in minis:
        if not block_map:
            continue
        trial, kept, dropped = _replay_tolerant(sch, _rename_blocks(trace_json, block_map))
        if dropped:
            log.info("composition left out %d step(s) of a mini: %s", len(dropped), ", ".join(dropped))
        if not any(inst[0] not in LOOKUPS for inst in kept[0]):
            continue
        sch, applied = trial, applied + 1
    return sch if applied else None


LOOKUPS = ("GetSBlock", "GetBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers")


def _replay_tolerant(sch, trace_json, max_dropped: int = 8):
    """Replay ``trace_json`` on a copy of ``sch``: (the schedule, the trace JSON that replayed, the kinds
    of the steps left out). The first failing step is found by bisection over prefixes; a step without
    results is dropped and the rest tried again, one with results ends the trace there."""
    from tvm import s_tir

    def replays(trace) -> object | None:
        trial = sch.copy()
        try:
            s_tir.Trace.apply_json_to_schedule(trace, trial)
        except Exception:  # noqa: BLE001 - any failure to replay
            return None
        return trial

    insts, decisions = trace_json
    dropped: list[str] = []
    while True:
        done = replays([insts, decisions])
        if done is not None:
            return done, [insts, decisions], dropped
        lo, hi = 0, len(insts)  # prefix lo replays, prefix hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if replays(_prefix(insts, decisions, mid)) is not None:
                lo = mid
            else:
                hi = mid
        bad = lo  # the first step that fails
        kind = insts[bad][0]
        if insts[bad][3] or len(dropped) >= max_dropped:  # later steps may use its results: stop before it
            dropped.append(f"{kind} and the {len(insts) - bad - 1} steps after it")
            insts, decisions = _prefix(insts, decisions, bad)
            continue
        dropped.append(kind)
        insts = insts[:bad] + insts[bad + 1:]
        decisions = [[d[0] - (d[0] > bad), d[1]] for d in decisions if d[0] != bad]


def _prefix(insts, decisions, n: int):
    return [insts[:n], [d for d in decisions if int(d[0]) < n]]


def postprocess(sch, spec):
    """MetaSchedule's llvm postprocessors on a composed schedule, as the search applies them to every
    candidate: they turn the minis' ``meta_schedule.parallel`` / ``vectorize`` / ``unroll`` annotations
    into parallel, vectorised, unrolled loops (without them a composed kernel runs on one core,
    scalar: 5-10x slower). The schedule (its trace then records the steps), or None if one fails —
    by returning False or, as MetaSchedule's own search tolerates, by a TVM check failing inside it
    (``RewriteLayout`` on a gather's index load, BERT's ``take``): the reason is logged."""
    from tvm.s_tir import meta_schedule as ms

    from toolchain.intensive import postprocs

    ctx = ms.TuneContext(mod=sch.mod, target=spec.tvm(), space_generator="post-order-apply", num_threads=1)
    sch.enter_postproc()
    for proc in postprocs(check=False):
        proc._initialize_with_tune_context(ctx)
        try:
            if not proc.apply(sch):
                return None
        except Exception as exc:  # noqa: BLE001 - a TVM check inside a postprocessor: no schedule
            log.info("postprocessor %s failed: %s", type(proc).__name__, first_line(exc))
            return None
    return sch


def _unroll_of(trace_json) -> int | None:
    """The auto-unroll depth a MetaSchedule trace gives its kernel (the value of its root's
    ``meta_schedule.unroll_explicit`` annotation, a sampled categorical), or None."""
    insts, decisions = trace_json
    chosen = {int(d[0]): d[1] for d in decisions}
    values = {}  # random variable -> value, for the sampled categoricals
    for index, inst in enumerate(insts):
        if inst[0] == "SampleCategorical" and index in chosen and inst[3]:
            values[inst[3][0]] = plain(inst[2][0])[int(chosen[index])]
        if inst[0] == "Annotate" and inst[2] and inst[2][0] == "meta_schedule.unroll_explicit" and len(inst[1]) > 1:
            value = values.get(inst[1][1], inst[1][1])  # a sampled variable, or a literal
            return int(value) if isinstance(value, (int, float)) else None
    return None


def restore_unroll(sch, minis: list[tuple[object, dict]]) -> int:
    """Give each loop nest of a composed, postprocessed kernel its own mini's auto-unroll depth.

    MetaSchedule samples one unroll depth per kernel, as a root annotation; composed, the last mini's
    depth would rule every nest (measured on a MnasNet join of three convs: 0.19 ms with the right
    depths, 0.34 with the last mini's 512). Returns how many nests were changed."""
    nests: list = []  # (outermost loop, its For node, depth): the first mini to claim a nest sets it
    for trace_json, block_map in minis:
        depth = _unroll_of(trace_json)
        if depth is None:
            continue
        for name in block_map.values():  # (a reduction block is split into _init / _update by postprocessing)
            for block in (name, f"{name}_init", f"{name}_update"):
                try:
                    loops = sch.get_loops(sch.get_sblock(block))
                except Exception:  # noqa: BLE001 - inlined, or renamed: nothing of its own
                    continue
                if loops and not any(sch.get(loops[0]).same_as(node) for _, node, _ in nests):
                    nests.append((loops[0], sch.get(loops[0]), depth))
    for outer, _, depth in nests:
        for ann in ("pragma_auto_unroll_max_step", "pragma_unroll_explicit"):  # (annotate keeps an existing value)
            if ann in sch.get(outer).annotations:
                sch.unannotate(outer, ann)
        if depth:
            sch.annotate(outer, "pragma_auto_unroll_max_step", depth)
            sch.annotate(outer, "pragma_unroll_explicit", 1)
    return len(nests)


def _rename_blocks(trace_json, mapping: dict):
    """The search part of a trace JSON (up to ``EnterPostproc``) with its block names mapped.

    Postprocessing steps are left out: they depend on the whole function (e.g. the number of the
    root's child blocks), and MetaSchedule applies its postprocessors again to every seed it replays.
    """
    insts, decisions = trace_json
    out = []
    for inst in insts:
        if inst[0] == "EnterPostproc":
            break
        if inst[0] in ("GetSBlock", "GetBlock") and inst[2] and isinstance(inst[2][0], str):
            inst = [inst[0], inst[1], [mapping.get(inst[2][0], inst[2][0]), *inst[2][1:]], *inst[3:]]
        out.append(inst)
    return [out, [d for d in decisions if int(d[0]) < len(out)]]


def seed_joined(task: Task, plan: TaskPlan, database, spec, verified: dict, settings: TuneSettings,
                measure: "Measure | None" = None) -> bool:
    """Compose the minis' verified schedules onto the joined kernel and, if the result passes the
    static checks and builds, measure it and commit it as the joined kernel's first record: the
    search then starts from it. Its latency is measured like any candidate's, never estimated."""
    parts = [
        (verified[name]["trace"], mapping)
        for name, mapping in plan.compositions.get(task.name, [])
        if verified.get(name, {}).get("status") == "verified"
    ]
    func = plan.funcs[task.name]
    sch = compose_joined(func, parts) if parts else None
    if sch is not None:
        sch = postprocess(sch, spec)
    if sch is not None:
        restore_unroll(sch, parts)
    committed = sch is not None and commit_seed(sch, func, database, spec, settings, measure)
    if settings.intensive and settings.partition == "ago" and parts:  # and in the join's own space
        for fused in intensive_composed(func, parts, spec, settings.keep_inside):
            committed = commit_seed(fused, func, database, spec, settings, measure) or committed
    return committed


def intensive_composed(func, parts: list[tuple[object, dict]], spec, tile_cache: int = 0) -> list:
    """The minis' schedules composed into the intensive-fusion structure of the joined kernel
    (toolchain/intensive_seed.py), postprocessed, the nests outside the pair at their own minis'
    unroll depths; none where the join's space is not the intensive one or nothing composes.
    ``tile_cache``: the space's cap on a tile's slice of the intermediate (0: none)."""
    from toolchain import intensive, intensive_seed

    pair = intensive.find_pair(func)
    if pair is None or intensive.dry_run(func, pair, spec.tvm(), num_cores=spec.num_cores) is not None:
        return []
    inside = set(pair.blocks)
    out = []
    for sch in intensive_seed.intensive_seeds(func, pair, parts, spec.tvm(), spec.num_cores, tile_cache):
        sch = postprocess(sch, spec)
        if sch is not None:
            restore_unroll(sch, [(t, m) for t, m in parts if not inside & set(m.values())])
            out.append(sch)
    return out


def commit_seed(sch, func, database, spec, settings: TuneSettings, measure: "Measure | None" = None) -> bool:
    """A postprocessed schedule of ``func`` that passes the static checks and builds, measured like any
    candidate and committed as one of ``func``'s records (a search then starts from it). False when
    it fails a check, the build or the run."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from toolchain.race_check import parallel_races
    from toolchain.schedule_check import dropped_blocks, partial_weight_reads

    try:
        if dropped_blocks(sch.mod) or partial_weight_reads(sch.mod, func) or parallel_races(sch.mod):
            return False
    except Exception as exc:  # noqa: BLE001 - as the search's RejectDroppedIterations: unanalysable, kept
        log.info("static checks cannot analyse a seed (kept for the numeric check): %s", first_line(exc))
    built = _builder(spec, measure, 1).build([BuilderInput(sch.mod, spec.tvm())])[0]
    if built.error_msg:
        return False
    args = ms.arg_info.ArgInfo.from_prim_func(as_built(sch.mod)["main"])
    result = _runner(settings, measure).run([RunnerInput(built.artifact_path, "cpu", args)])[0].result()
    if result.error_msg or not result.run_secs:
        return False
    run_secs = [float(getattr(x, "value", x)) for x in result.run_secs]
    workload = database.commit_workload(workload_module(func))
    database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, run_secs, spec.tvm(), args))
    return True


def seed_from_siblings(task: Task, plan: TaskPlan, database, spec, verified: dict, settings: TuneSettings,
                       measure: "Measure | None" = None) -> list[str]:
    """Start ``task`` from the verified schedules of up to ``settings.transfer`` kernels with the same
    blocks (toolchain/transfer.py), each re-fitted to its loops, measured and committed as a record;
    the names of the kernels whose schedules were committed."""
    import tvm_ffi

    func = plan.funcs[task.name]
    done = {name: plan.funcs[name] for name, v in verified.items()
            if v.get("status") == "verified" and v.get("trace") and name in plan.funcs and name != task.name}
    seeded, seen = [], set()
    for name in transfer.siblings(func, done, settings.transfer):
        sch = transfer.transfer_schedule(workload_module(plan.funcs[name]), _rename_blocks(verified[name]["trace"], {}),
                                         workload_module(func))
        sch = postprocess(sch, spec) if sch is not None else None
        if sch is None:
            continue
        key = tvm_ffi.structural_hash(sch.mod)
        if key in seen:  # two siblings' schedules may land on the same one here
            continue
        seen.add(key)
        if commit_seed(sch, func, database, spec, settings, measure):
            seeded.append(name)
    return seeded


# ----------------------------------------------------------------------------- the session


def first_batch_vs_minis(joined: str, plan: TaskPlan, database, verified: dict, spec, settings: TuneSettings,
                         measure: "Measure | None" = None) -> dict | None:
    """A join's best candidate so far timed next to its minis' verified schedules (a pairing, see
    :func:`toolchain.pairing.time_join`), or None when a mini has none or the timing fails: the
    recorded latencies then decide whether the join yields its budget."""
    records = sorted(records_of(database, plan.funcs[joined]), key=latency)
    minis = [name for name, _ in plan.compositions.get(joined, [])]
    if not records or latency(records[0]) == math.inf or _minis_ms(minis, verified) is None:
        return None
    try:
        return time_join(plan, joined, plain(records[0].trace.as_json()), verified, spec, settings, measure)
    except Exception as exc:  # noqa: BLE001 - advice only
        log.info("timing a join next to its minis failed: %s", first_line(exc))
        return None


def _hand_back(composition: list, tasks: dict[str, Task], left: int, done: dict[str, int]) -> dict[str, int]:
    """A joined kernel's remaining ``left`` trials split over its minis in proportion to their weight
    (largest remainder): {mini task: the number of records it tunes to}."""
    names = list(dict.fromkeys(name for name, _ in composition if name in tasks))
    if not names or left <= 0:
        return {}
    weights = [tasks[n].weight or 1e-12 for n in names]
    exact = [left * w / sum(weights) for w in weights]
    share = [int(x) for x in exact]
    for i in sorted(range(len(names)), key=lambda i: share[i] - exact[i])[: left - sum(share)]:
        share[i] += 1
    return {n: done.get(n, 0) + k for n, k in zip(names, share) if k > 0}


def _record_counts(db, plan: TaskPlan, names: list[str]) -> dict[str, int]:
    """How many records each of the tasks ``names`` has: one reading of the database."""
    return {n: len(lat) for n, lat in trial_latencies_of(db.ms_dir, {n: plan.funcs[n] for n in names}).items()}


def _shares(composition: list, tasks: dict[str, Task], left: int) -> dict[str, int]:
    """How a join's ``left`` handed-back trials split over its minis: {mini: trials} (:func:`_hand_back`)."""
    return _hand_back(composition, tasks, left, {})


def handed_in(plan: TaskPlan, tasks: dict[str, Task], progress: dict) -> dict[str, int]:
    """Trials each mini was handed by joins that yielded ({mini: trials}), from the progress file:
    a resumed mini tunes to its own budget plus these (they are not its own budget's)."""
    out: dict[str, int] = {}
    for join, parts in plan.compositions.items():
        record = progress.get(join, {})
        if record.get("handed_back") is not None:
            for name, k in _shares(parts, tasks, record.get("handed_trials", 0)).items():
                out[name] = out.get(name, 0) + k
    return out


def _grow_hand_back(task: Task, plan: TaskPlan, tasks: dict[str, Task], handed: dict[str, int], progress: dict,
                    growth: int, db) -> dict[str, int]:
    """A join that handed its rest to its minis, resumed with a larger budget: the ``growth`` (its
    planned budget now, less its records and what it handed back before) goes to its minis too, as
    a fresh session at this budget would have handed it (the split is built as its minis). Returns
    the minis' new targets (records to tune to), recorded in the progress file."""
    if growth <= 0:
        return handed
    composition = plan.compositions.get(task.name, [])
    record = progress[task.name]
    before = record.get("handed_trials", 0)
    old, new = _shares(composition, tasks, before), _shares(composition, tasks, before + growth)
    counts = _record_counts(db, plan, list(new))
    grown = {**handed, **{n: counts[n] + k - old.get(n, 0) for n, k in new.items() if k > old.get(n, 0)}}
    progress[task.name] = {**record, "handed_back": grown, "handed_trials": before + growth}
    db.save_progress(progress)
    return grown


def unspent(plan: TaskPlan, joined: Task, spent: dict[str, int]) -> int:
    """Trials the joined task's own minis left when their tuning stabilised early: AGO's
    divide-and-conquer hands them to the join (the session spends its whole budget). A mini shared
    by several subgraphs belongs to the first (its ``parent``)."""
    return sum(max(0, t.budget - spent.get(t.name, t.budget)) for t in plan.tasks
               if t.phase == "mini" and t.parent == joined.name)


# ----------------------------------------------------------------------------- the latency scheduler


#: The latency scheduler's optimism: a task's next round of ``per_iter`` trials is expected to gain
#: PRIOR_GAIN × per_iter / (trials so far + per_iter) of its time before its own record says otherwise
#: (a fresh search gains most; Ansor's forward estimate plays this part).
PRIOR_GAIN = 0.5


def _share_closed(latencies: list[float], per_iter: int, floor_s: float) -> float:
    """The share of the distance from a task's best time down to ``floor_s`` its next round is expected
    to close: the mean of what its last ``per_iter`` trials closed (the search as it goes now) and the
    prior (:data:`PRIOR_GAIN`, falling with trials); the prior alone before it has two rounds."""
    prior = PRIOR_GAIN * per_iter / (len(latencies) + per_iter)
    if len(latencies) <= per_iter:
        return prior
    before, now = min(latencies[:-per_iter]), min(latencies)
    closed = (before - now) / (before - floor_s) if math.inf > before > floor_s else prior
    return (closed + prior) / 2


def expected_gain(latencies: list[float], per_iter: int) -> float:
    """The share of a task's time its next round is expected to save (the latency scheduler: no floor)."""
    return _share_closed(latencies, per_iter, 0.0)


def roofline_gain(latencies: list[float], per_iter: int, floor_s: float) -> float:
    """``roofline``: the share of a task's time its next round is expected to save — its gap (the share of
    its best time above its roofline floor, ``floor_s``) × the share of that gap a round is expected to
    close (:func:`_share_closed`). A task at its floor gains nothing, however slow; one far above it keeps
    its rounds while they pay."""
    now = min(latencies, default=math.inf)
    if not math.inf > now > floor_s:
        return 0.0
    return (now - floor_s) / now * _share_closed(latencies, per_iter, floor_s)


def task_ms(name: str, verified: dict, progress: dict) -> float | None:
    """A task's latency for one call: verified, else the best it measured, else None."""
    entry = verified.get(name, {})
    if entry.get("status") == "verified":
        return entry["latency_ms"]
    best = progress.get(name, {}).get("best_ms")
    return best if best is not None and best < math.inf else None


def model_times(plan: TaskPlan, verified: dict, progress: dict) -> dict[str, float]:
    """Each task's time in one run of the model (ms, every call): only tasks the model is built with
    now count — a split subgraph's join or its minis, as :func:`toolchain.pairing.choose` decides.
    A task's time is its verified latency, else the best it measured; a task with neither is left out."""
    out: dict[str, float] = {}
    for name in plan.group_tasks:  # one entry per subgraph instance: calls count themselves
        minis = [n for n, _ in plan.compositions.get(name, [])]
        parts = [name] if not minis or choose(name, minis, verified).build == "joined" else minis
        for part in parts:
            t = task_ms(part, verified, progress)
            if t is not None:
                out[part] = out.get(part, 0.0) + t
    return out


def tune_model(
    mod,
    model_sha256: str,
    spec,
    settings: TuneSettings,
    db_dir: Path,
    on_event: Callable[..., None] = lambda kind, **info: None,
    measure: Measure | None = None,
    base: Path | None = None,
) -> dict:
    """Tune every kernel of ``mod`` (a legalized module) into ``db_dir``; resumable. Returns the summary.

    ``measure``: where candidates run (default: this machine; see :class:`Measure`). ``base``: another
    tuning database to start from (:func:`import_records`: its records of the same kernels become
    theirs, counted against the budget like their own)."""
    graph = op_graph(mod)
    db = TuneDB(db_dir)
    db.open_session(
        {"schema": SCHEMA, "model_sha256": model_sha256, "target": spec.tvm_target, "layout": spec.layout,
         "pad_channels": padding.applied(mod), "fast_math": fastmath.applied(mod), "settings": settings.to_json()}
    )
    _, plan = plan_tasks(mod, graph, spec, settings)
    db.save_tasks(plan.tasks)
    db.save_layout(plan)
    if base is not None:
        copied = import_records(db_dir, base, plan.funcs)
        on_event("imported", base=str(base), tasks=copied)
    database = db.ms_database()
    verified = db.verified
    progress = db.progress
    first = sum(t.budget for t in plan.tasks)
    on_event("plan", tasks=[t.to_json() for t in plan.tasks], first_pass=first, total=session_trials(first, settings))
    work = db.root / "logs"
    tasks_by_name = {t.name: t for t in plan.tasks}
    intensive = settings.intensive and settings.partition == "ago"
    # the session's cost models (kernels and minis; joins), each made when a search first needs it
    cost_models = session_cost_models(plan, database, spec)

    def search(task: Task, done: int, budget: int, stop_when_stable: bool, check_join: bool):
        """Tune ``task`` until it has ``budget`` records; returns (done, search error, trials handed back).
        ``check_join``: once the joined kernel has had a batch of its own, stop and hand the rest back
        to its minis when it is still slower than they are together (by more than ``join_margin``)
        or when that batch found nothing faster than its composed seed."""
        func = plan.funcs[task.name]
        checked = False
        while done < budget:
            if check_join and not checked and done >= settings.unit:
                checked = True
                best_ms = progress.get(task.name, {}).get("best_ms")
                seed_ms = progress.get(task.name, {}).get("seed_ms")
                minis_ms = _minis_ms([n for n, _ in plan.compositions.get(task.name, [])], verified)
                together = first_batch_vs_minis(task.name, plan, database, verified, spec, settings, measure)
                if together is not None:  # timed next to its minis (toolchain/pairing.py)
                    slower = together["ratio"] * (1 + settings.join_margin) < 1
                else:
                    slower = None not in (minis_ms, best_ms) and best_ms > minis_ms * (1 + settings.join_margin)
                stuck = None not in (seed_ms, best_ms) and best_ms >= seed_ms * (1 - settings.stable_tolerance)
                if (slower or stuck) and plan.compositions.get(task.name):
                    on_event("join_yields", task=task.name, best_ms=best_ms, minis_ms=minis_ms, seed_ms=seed_ms,
                             left=budget - done, reason="slower than its minis" if slower else "no gain on its seed",
                             **({"together": together} if together else {}))
                    return done, None, budget - done
            # a join's first chunk is one batch, so that the comparison above comes early
            chunk = min(budget - done, settings.unit if check_join and not checked else 2 * settings.per_iter)
            try:
                exhausted = tune_trials(func, spec, database, chunk, settings, intensive, work / task.name, measure,
                                        cost_models[task.phase == "joined"]())
            except Exception as exc:  # noqa: BLE001 - a search that cannot run (e.g. a TVM space that
                # fails on this kernel's structure) ends this task, not the session; what it found stays
                error = first_line(exc)
                on_event("search_failed", task=task.name, reason=error)
                return done, error, 0
            lat = trial_latencies(db.ms_dir, func)  # in commit order: what stabilised() reads
            done = len(lat)
            best = min(lat) if lat else math.inf
            progress[task.name] = {**progress.get(task.name, {}), "trials": done,
                                   "best_ms": best * 1e3 if best < math.inf else None}
            db.save_progress(progress)
            on_event("trials", task=task.name, done=done, budget=budget, best_ms=best * 1e3)
            if exhausted:  # every distinct schedule measured: the rest of its budget goes on
                progress[task.name]["exhausted"] = True
                db.save_progress(progress)
                on_event("exhausted", task=task.name, done=done, left=budget - done)
                break
            if stop_when_stable and stabilised(lat, settings.stable_window, settings.stable_tolerance):
                on_event("stable", task=task.name, done=done)
                break
            if chunk <= 0:
                break
        return done, None, 0

    def keep(task: Task, done: int, search_error: str | None, started: float) -> None:
        """Verify the task's best candidates when it has new records (or its search failed)."""
        entry = verified.get(task.name, {})
        if entry.get("trials") != done or entry.get("status") != "verified" or search_error:
            on_event("verify", task=task.name)
            verified[task.name] = {**verify_task(task, plan.funcs[task.name], database, spec, settings),
                                   "phase": task.phase, **({"search_error": search_error} if search_error else {})}
            db.save_verified(verified)
        on_event("task_done", task=task.name, seconds=time.perf_counter() - started, result=verified[task.name])

    spent: dict[str, int] = {}  # trials each task has used (minis may stop early)
    carry = 0  # trials a kernel whose search failed left: the next kernel gets them
    given = handed_in(plan, tasks_by_name, progress)  # resumed: trials minis were handed by their joins
    for task in plan.tasks:  # minis come first, then kernels/joined subgraphs
        func = plan.funcs[task.name]
        lat = trial_latencies(db.ms_dir, func)
        done = len(lat)
        budget = task.budget + (unspent(plan, task, spent) if task.phase == "joined" else 0)
        if task.phase != "mini":
            budget, carry = budget + carry, 0
        budget += given.get(task.name, 0)  # its own budget is not what joins handed it (a kernel may be a mini too)
        handed = progress.get(task.name, {}).get("handed_back")  # {mini: trials it tunes to}, when resumed
        if handed:  # a database from an older split may name minis this plan no longer has: those are gone
            current = {name for name, _ in plan.compositions.get(task.name, [])}
            handed = {name: n for name, n in handed.items() if name in current}
        on_event("task", task=task.name, phase=task.phase, done=done, budget=budget)
        if done == 0:  # a join from its minis' schedules composed (AGO §V); any task, with --transfer,
            # from the schedules of kernels like it tuned before (siblings); the seeds are its first records
            composed = task.phase == "joined" and seed_joined(task, plan, database, spec, verified, settings, measure)
            seeded = seed_from_siblings(task, plan, database, spec, verified, settings, measure) \
                if settings.transfer else []
            lat = trial_latencies(db.ms_dir, func) if composed or seeded else lat
            if lat:
                done, seed = len(lat), min(lat)
                seed_ms = seed * 1e3 if seed < math.inf else None
                progress[task.name] = {"trials": done, "seed_ms": seed_ms, "best_ms": seed_ms,
                                       **({"siblings": seeded} if seeded else {})}
                db.save_progress(progress)
                on_event("seeded", task=task.name, composed=composed, siblings=seeded,
                         **({"best_ms": seed_ms} if seed_ms is not None else {}))
            if task.phase == "joined" and not composed:  # nothing composed: one batch of its own at least
                budget = max(budget, settings.unit)
        started = time.perf_counter()
        if task.phase == "mini" and stabilised(lat, settings.stable_window, settings.stable_tolerance):
            budget = done  # it stabilised before the session was interrupted: resuming adds nothing
        planned = budget
        if handed is not None or progress.get(task.name, {}).get("exhausted"):
            budget = done  # it handed the rest of its budget to its minis, or has no schedule left to try
        done, search_error, left = search(task, done, budget, stop_when_stable=task.phase == "mini",
                                          check_join=task.phase == "joined" and handed is None)
        spent[task.name] = done - given.get(task.name, 0)
        if task.phase != "mini":  # what a kernel's search could not spend (failed, exhausted) and did not
            carry += max(0, budget - done - left)  # hand to its minis goes to the next (a mini's: to its join)
        if handed is not None:  # resumed with a larger --trials: the join's growth goes where its rest went
            handed = _grow_hand_back(task, plan, tasks_by_name, handed, progress,
                                     planned - done - progress[task.name].get("handed_trials", 0), db)
        elif progress.get(task.name, {}).get("exhausted") and task.phase != "mini":
            carry += max(0, planned - budget)  # an exhausted kernel's growth: to the next kernel
        keep(task, done, search_error, started)
        if left:
            handed = _hand_back(plan.compositions.get(task.name, []), tasks_by_name, left,
                                _record_counts(db, plan, [n for n, _ in plan.compositions.get(task.name, [])]))
            progress[task.name] = {**progress.get(task.name, {}), "handed_back": handed, "handed_trials": left}
            db.save_progress(progress)
        for name, target in (handed or {}).items():  # the minis go on with the join's trials
            mini, started = tasks_by_name[name], time.perf_counter()
            mini_done = len(trial_latencies(db.ms_dir, plan.funcs[name]))
            on_event("task", task=name, phase="mini", done=mini_done, budget=target)
            mini_done, error, _ = search(mini, mini_done, target, stop_when_stable=False, check_join=False)
            carry += max(0, target - mini_done)
            keep(mini, mini_done, error, started)
        if handed and not progress[task.name].get("reseeded"):  # compose the minis' better schedules again
            if seed_joined(task, plan, database, spec, verified, settings, measure):
                on_event("seeded", task=task.name, again=True)
                keep(task, len(trial_latencies(db.ms_dir, func)), None, time.perf_counter())
            progress[task.name]["reseeded"] = True
            db.save_progress(progress)
    # the rest of the budget, round by round, where it saves most: with "latency" all but the first
    # batches; with "weight" what the plan could not place (a last kernel's carry has no task after it)
    out: set[str] = set()  # tasks whose search failed or ran dry in a round: no more rounds
    hashes = {name: _workload_hash(func) for name, func in plan.funcs.items()}  # once, not every round
    total = session_trials(first, settings)
    costs: dict = {}  # roofline: each task's work and bytes, counted at the first round
    while True:
        lats = trial_latencies_of(db.ms_dir, plan.funcs, hashes)
        left = total - sum(len(v) for v in lats.values())
        times = {n: t for n, t in model_times(plan, verified, progress).items()
                 if n not in out and not progress.get(n, {}).get("exhausted")
                 and not verified.get(n, {}).get("search_error")}
        if left <= 0 or not times:
            break
        if settings.scheduler == "roofline":  # the gap to each task's floor at the session's best rates
            costs = costs or {n: roofline.cost(f) for n, f in plan.funcs.items()}
            peaks = roofline.peaks(costs, {n: task_ms(n, verified, progress) for n in plan.funcs})
            floors = {n: roofline.floor_ms(costs[n], peaks) / 1e3 if peaks else 0.0 for n in times}
            gains = {n: t * roofline_gain(lats[n], settings.per_iter, floors[n]) for n, t in times.items()}
        else:
            gains = {n: t * expected_gain(lats[n], settings.per_iter) for n, t in times.items()}
        name = max(gains, key=gains.get)
        task, done = tasks_by_name[name], len(lats[name])
        target = done + min(settings.per_iter, left)
        on_event("round", task=name, model_ms=times[name], gain_ms=gains[name], left=left)
        on_event("task", task=name, phase=task.phase, done=done, budget=target)
        started = time.perf_counter()
        now, error, _ = search(task, done, target, stop_when_stable=False, check_join=False)
        if error or now <= done:
            out.add(name)
        keep(task, now, error, started)
    # join or minis: decided on the kept schedules timed together (toolchain/pairing.py)
    pair_joins(plan, verified, spec, settings, measure, on_event)
    db.save_verified(verified)
    return status(db_dir)


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
    estimate = 0.0
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
            }
        )
        if t.phase != "mini":  # what compile --db builds: the join or its minis (see pairing.choose)
            minis = layout.get("minis", {}).get(t.name, [])
            choice = choose(t.name, minis, verified)
            rows[-1]["build"] = choice.build if t.phase == "joined" else None
            rows[-1]["paired"] = v.get("paired") if choice.paired else None
            # (recorded latencies, like every other kernel's: a pairing's were taken in another process)
            chosen = rows[-1]["best_ms"] if choice.build == "joined" else _minis_ms(minis, verified)
            if chosen is not None:
                estimate += chosen * t.calls
    return {"session": session, "tasks": rows, "estimate_ms": estimate}


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


# ----------------------------------------------------------------------------- applying a database


def unfuse_slower(plan, db_dir: Path, joins: str = "latency", builds: dict[str, str] | None = None):
    """The partition to build with ``db_dir``'s schedules: ``plan`` (an AGO plan), except that a
    subgraph whose joined kernel measured slower than its mini-subgraphs together (verified
    latencies, one call each), or has no verified schedule while they all do, is built as those
    minis — fusing must pay for itself, on measurement. ``joins`` names another rule of
    :data:`toolchain.pairing.JOIN_RULES` (e.g. ``traffic:a76``: the database's traffic judgements decide);
    ``builds`` ({join task: "joined" | "minis"}) overrules it for the joins it names (host/judge.py's trial builds).
    Returns (plan, one record per subgraph unfused: its ops, both latencies, and why). A database without
    the session's layout, or made for another partition (another threshold), changes nothing."""
    try:
        check_rule(joins)
    except ValueError as exc:
        raise TuningError(str(exc)) from None
    db = TuneDB(db_dir)
    layout = db.layout
    if not layout.get("split_of"):
        return plan, []
    if [tuple(g) for g in layout["groups"]] != [tuple(g) for g in plan.groups]:
        log.warning("the tuning database was made for another partition (threshold, keep-inside?): nothing unfused")
        return plan, []
    verified = db.verified
    traffic = db.traffic.get(joins[len(TRAFFIC):], {}).get("joins", {}) if joins.startswith(TRAFFIC) else None
    groups: list = []
    unfused: list[dict] = []
    for index, group in enumerate(plan.groups):
        name = layout["group_tasks"][index]
        minis = [tuple(m) for m in layout["split_of"].get(str(index), [])]
        try:
            if name in (builds or {}):
                choice = replace(choose(name, layout.get("minis", {}).get(name, []), verified), build=builds[name],
                                 reason=f"built {builds[name]} on request")
            else:
                choice = choose_by(joins, name, layout.get("minis", {}).get(name, []), verified, traffic)
        except ValueError as exc:
            raise TuningError(f"{exc} in {db_dir}: `agoc compile --db {db_dir} --joins {joins[len(TRAFFIC):]}` "
                              "judges the joins first") from None
        if minis and choice.build == "minis":
            groups.extend(minis)
            unfused.append({"ops": list(group), "joined_ms": choice.joined_ms, "minis_ms": choice.minis_ms,
                            "minis": len(minis), "paired": choice.paired, "reason": choice.reason,
                            **({"joined_bytes": choice.joined_bytes, "minis_bytes": choice.minis_bytes}
                               if choice.joined_bytes is not None else {})})
            continue
        groups.append(tuple(group))
    return replace(plan, groups=tuple(groups)), unfused


def apply_verified(fused_mod, db_dir: Path, spec):
    """Schedule the fused module's kernels with the verified records of ``db_dir`` (others stay default);
    a database tuned with ``prepack`` also gets its rewritten weights folded (build.prepack_weights).
    Returns (module, how many kernels got a schedule, each kernel's name → the task it is in ``db_dir``)."""
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    db = TuneDB(db_dir)
    if db.session is None:
        raise TuningError(f"{db_dir} is not a tuning database; create one with `agoc tune`")
    prepack = _settings_but_trials(db.session.get("settings", {}))["prepack"]
    if prepack:  # the kernels as the session tuned them (same structural hash)
        fused_mod = build.mark_weights(fused_mod)
    verified = db.verified
    by_hash = {task_hash(t.name): t.name for t in db.tasks}
    memory = ms.database.MemoryDatabase()
    applied = 0
    tasks: dict[str, str] = {}
    seen: set[str] = set()
    for name, func in group_kernels(fused_mod):
        digest = kernel_hash(func)
        if digest in by_hash:
            tasks[name] = by_hash[digest]
        if digest in seen:
            continue
        seen.add(digest)
        entry = verified.get(by_hash.get(digest, ""))
        if not entry or entry.get("status") != "verified":
            continue
        sch = scheduled(func, entry["trace"])
        workload = memory.commit_workload(workload_module(func))
        memory.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, workload, [entry["latency_ms"] / 1e3], spec.tvm(), ms.arg_info.ArgInfo.from_prim_func(func)
            )
        )
        applied += 1
    with spec.tvm(), memory:
        out = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(fused_mod)
    return (build.prepack_weights(out, spec) if prepack else out), applied, tasks
