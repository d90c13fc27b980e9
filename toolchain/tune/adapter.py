"""The MetaSchedule adapter: builder and runner, the JSON database's records, cost models, the search of
one kernel, seeds measured and committed. The only module that runs MetaSchedule."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from toolchain.errors import first_line
from toolchain.timing import Timing, local_runner
from toolchain.tune import costmodel, forked, inlining, intrinsics, phases, workers
from toolchain.tune.race_check import parallel_races
from toolchain.tune.rolling import rolled
from toolchain.tune.schedule_check import dropped_blocks, out_of_bounds_writes, partial_weight_reads
from toolchain.tune.settings import TuneSettings
from toolchain.tune.space import make_space_generator, postprocs

log = logging.getLogger("agoc.tuning")

#: rounds of a join and its minis timed in turn (each round: every kernel once, one measurement)
PAIR_ROUNDS = 3

# ----------------------------------------------------------------------------- building and running


FAILED_SECS = 1e9  # MetaSchedule records failed builds/runs with a huge run time


def as_built(mod):
    """A scheduled kernel's module as it is built and timed: a weight whose layout the schedule rewrote
    (``TuneSettings.prepack``) is passed rewritten, its rewrite block left out (the model does it once,
    at build time): its ``main``'s parameters are what a runner must pass; line buffers rolled (tune/rolling.py)."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return rolled(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod))


#: seconds a candidate may take to build (LocalBuilder's per-candidate timeout; why 30: docs/tuning-internals.md)
BUILD_TIMEOUT_S = 30


def fast_build(mod, target, _params=None):
    """``LocalBuilder`` ``f_build`` without the stock builder's ``tvm.s_tir.tensor_intrin`` import (≈11 s/batch)."""
    from tvm.driver import build as tvm_build

    return tvm_build(as_built(mod), target=target)


def workload_module(func, guard: bool = True):
    """``func`` alone in a fresh module, as MetaSchedule's workload — a deep copy: in TVM 0.27 a
    schedule made on a module nothing else holds edits it in place, down to the PrimFunc the module
    was made from (``Schedule(workload_module(f))`` then ``split`` changed ``f``). Blocks whose inlining would
    copy their expression without bound are annotated not to be inlined (:mod:`toolchain.tune.inlining`; not with
    ``guard`` False: the kernel as a model holds it, which is what ApplyDatabase looks a record up by)."""
    import tvm

    mod = tvm.IRModule({"main": tvm.ir.load_json(tvm.ir.save_json(func)).with_attr("global_symbol", "main")})
    return inlining.guarded(mod) if guard else mod


def scheduled(func, trace_json):
    """``func``'s workload scheduled by a trace (JSON, as the database and verified.json hold it)."""
    from tvm import s_tir

    sch = s_tir.Schedule(workload_module(func))
    s_tir.Trace.apply_json_to_schedule(trace_json, sch)
    return sch


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


#: keep the builder's and the local runner's worker processes for the whole process (every batch, task and
#: seed) instead of starting new ones, each importing TVM, per batch (why: docs/tuning-internals.md)
REUSE_WORKERS = True
def make_builder(spec, measure: "Measure | None", max_workers: int):
    """The builder of candidates, timed as the ``build`` phase (:mod:`toolchain.tune.phases`); its worker
    processes kept for the process (:data:`REUSE_WORKERS`)."""
    from tvm.s_tir import meta_schedule as ms

    export = measure.export if measure is not None else None
    if REUSE_WORKERS:
        return workers.timed_builder()(workers.build_pool(max_workers, BUILD_TIMEOUT_S), export, fast_build)
    return workers.timed_builder()(ms.builder.LocalBuilder(f_build=fast_build, f_export=export,
                                                           max_workers=max_workers, timeout_sec=BUILD_TIMEOUT_S))


def make_runner(settings: TuneSettings, runner=None):
    """The runner of candidates, timed as the ``run`` phase; this machine's kept for the process."""
    if isinstance(runner, Measure):
        runner = runner.runner
    if runner is None:
        timing = Timing(cold=settings.cold_weights, report=phases.report_path())
        runner = workers.kept_runner(timing) if REUSE_WORKERS else local_runner(timing)
    return workers.timed_runner()(runner)


# ----------------------------------------------------------------------------- the JSON database's records


def open_database(ms_dir: Path):
    """MetaSchedule's JSON database in ``ms_dir`` (made if missing)."""
    from tvm.s_tir import meta_schedule as ms

    Path(ms_dir).mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(work_dir=str(ms_dir))


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
        return [lat for _, lat in records_in_order(Path(work_dir))]
    return trial_latencies_of(work_dir, {"f": func})["f"]


def workload_hash(func) -> str:
    import tvm_ffi

    return str(tvm_ffi.structural_hash(workload_module(func)) & 0xFFFFFFFFFFFFFFFF)


def record_workload(line: str) -> int:
    """The workload index of a ``database_tuning_record.json`` line, read without parsing the record."""
    return int(line[1:line.index(",")])


def workload_indices(work_dir: Path) -> dict[str, set[int]]:
    """{workload structural hash: its line numbers in ``database_workload.json``} (what a record's
    workload index counts)."""
    path = work_dir / "database_workload.json"
    out: dict[str, set[int]] = {}
    for i, line in enumerate(path.read_text().splitlines() if path.exists() else []):
        if line.strip():
            out.setdefault(json.loads(line)[0], set()).add(i)
    return out


def records_in_order(work_dir: Path, wanted: set | None = None) -> list[tuple[int, float]]:
    """(workload index, latency) of every record (of the ``wanted`` workload indices) in commit order
    (see :func:`trial_latencies`)."""
    path = work_dir / "database_tuning_record.json"
    out: list[tuple[int, float]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if wanted is not None and record_workload(line) not in wanted:
            continue
        index, record = json.loads(line)
        secs = [float(s) for s in (record[1] or [])]
        lat = sorted(secs)[len(secs) // 2] if secs else math.inf
        out.append((int(index), math.inf if lat >= FAILED_SECS else lat))
    return out


def trial_latencies_of(work_dir: Path, funcs: dict, hashes: dict | None = None) -> dict:
    """:func:`trial_latencies` of several kernels ({name: PrimFunc}) from one reading of the database.
    ``hashes``: their workload hashes ({name: :func:`workload_hash`}) when the caller already has them."""
    work_dir = Path(work_dir)
    hashes = hashes or {name: workload_hash(func) for name, func in funcs.items()}
    index_of = workload_indices(work_dir)
    owner: dict[int, list[str]] = {}
    for name in funcs:
        for i in index_of.get(hashes[name], ()):
            owner.setdefault(i, []).append(name)
    out: dict[str, list[float]] = {name: [] for name in funcs}
    for index, lat in records_in_order(work_dir, set(owner)):
        for name in owner.get(index, ()):
            out[name].append(lat)
    return out


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


# ----------------------------------------------------------------------------- searching one kernel


def space_for(func, spec, intensive: bool, tile_cache: int = 0):
    """The MetaSchedule space for one kernel: intensive fusion where it applies (unless AGO-NI),
    otherwise TVM's default llvm space; both carry the static dropped-iteration check. ``tile_cache``:
    bytes an intensive tile's slice of the intermediate may take (TuneSettings.tile_cache; 0: no cap)."""
    return make_space_generator(func, spec.tvm(), intensive=intensive, num_cores=spec.num_cores,
                                                tile_cache=tile_cache)


#: seconds a kernel's search space may take to generate before its search starts (in a forked child):
#: MetaSchedule's AutoInline + tiling of some kernels (a matmul with fast-math GELU and softmax) never returns
SPACE_TIMEOUT_S = 60.0

_SPACES_OK: set[tuple] = set()  # (workload, space, target) whose space generated within the bound here


class SpaceTimeout(RuntimeError):
    """A kernel whose search space did not generate within :data:`SPACE_TIMEOUT_S`."""


def check_space(func, spec, intensive: bool, tile_cache: int = 0, timeout: float | None = None) -> None:
    """Raise :class:`SpaceTimeout` unless ``func``'s search space generates within ``timeout`` seconds
    (default :data:`SPACE_TIMEOUT_S`), tried in a forked child once per kernel and space in this process."""
    key = (workload_hash(func), intensive, tile_cache, str(spec.tvm()))
    if key in _SPACES_OK:
        return
    limit = SPACE_TIMEOUT_S if timeout is None else timeout

    def designs() -> int:
        ctx = intrinsics.tune_context(mod=workload_module(func), target=spec.tvm(), num_threads=1,
                                      space_generator=space_for(func, spec, intensive, tile_cache).generator)
        return len(ctx.generate_design_space())

    ok, why = forked.call(designs, limit)
    if not ok and why.startswith("timed out"):
        raise SpaceTimeout(f"its search space did not generate within {limit:.0f} s")
    _SPACES_OK.add(key)  # a space that fails fails again in the search, with TVM's own error


#: A kernel's search space is exhausted when its last EXHAUSTED_ROUNDS search rounds together brought
#: fewer than EXHAUSTED_NEW new candidates. MetaSchedule measures each distinct schedule once; a layout
#: kernel (ShuffleNet's concatenate + reshape + transpose + split) has only a handful, and once they are
#: measured every round still samples, evolves and scores ~500 candidates (4-8 s here) to send 0 or 1,
#: without end: 13 trials in 11 minutes of a 48-trial budget. The rest of such a kernel's budget goes to
#: the next kernel (as when its search fails).
EXHAUSTED_ROUNDS = 3


EXHAUSTED_NEW = 4


def _exhaustion_callback(stop: Callable[[], bool] | None = None):
    """A MetaSchedule measure callback that ends the task once its space is exhausted (see above);
    ``.exhausted`` then says so. It runs after the default callbacks (records are in the database).
    ``stop``: asked after every batch; True ends the task too (the session's deadline)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class EndWhenExhausted(PyMeasureCallback):
        def __init__(self):
            self.rounds: list[int] = []
            self.exhausted = False
            self.ended = False  # this callback terminated the task (exhausted, or ``stop``)

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            self.rounds.append(len(measure_candidates))
            phases.add_trials(len(measure_candidates))
            last = self.rounds[-EXHAUSTED_ROUNDS:]
            if not self.exhausted and len(last) == EXHAUSTED_ROUNDS and sum(last) < EXHAUSTED_NEW:
                self.exhausted = self.ended = True
                task_scheduler.terminate_task(task_id)
            elif stop is not None and not task_scheduler.tasks_[task_id].is_terminated and stop():
                self.ended = True
                task_scheduler.terminate_task(task_id)

    return EndWhenExhausted()


def session_cost_model(funcs: dict, database, spec, pretrained: Path | None = None):
    """The session's cost model: one MetaSchedule XGB model for every kernel of the session, trained on
    every record ``database`` holds for ``funcs`` (a resumed session starts where it stopped).

    ``tune_tir`` would make a fresh model per call, and an XGB model predicts at random until it has
    seen ``num_warmup_samples`` (100) trials: with the 16-64 trials a kernel gets here, every search
    was random sampling. Shared over the session (as TVM's own ``tune_tasks`` shares one over a
    model's tasks), it ranks candidates from the session's 100th trial on. The records are the only
    state: nothing else is saved, so an interrupted session loses nothing of it.

    ``pretrained``: a model saved by :func:`toolchain.tune.costmodel.save` (a record library's): the model
    starts from it — it ranks candidates from the session's first batch on — and boosts on with the
    session's records."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    model = costmodel.fresh(spec) if pretrained is None else costmodel.load(pretrained, spec)
    with costmodel.deferred(model):  # one training on every record, not one per kernel
        for func in funcs.values():
            records = [r for r in records_of(database, func) if r.run_secs]
            if not records:
                continue
            mod = workload_module(func)
            context = intrinsics.tune_context(mod=mod, target=spec.tvm(), num_threads=spec.num_cores)
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


def session_cost_models(plan, database, spec, pretrained=None) -> dict[bool, Callable]:
    """The session's cost models, each made when a search first needs it (warming one reads the
    records it learns from): ``[False]`` for kernels and minis, learning from theirs only; ``[True]``
    for joins, learning from every record (a join's blocks are its minis')."""
    joins = {t.name for t in plan.tasks if t.phase == "joined"}
    singles = {name: func for name, func in plan.funcs.items() if name not in joins}
    return {False: functools.cache(lambda: session_cost_model(singles, database, spec, pretrained=pretrained)),
            True: functools.cache(lambda: session_cost_model(plan.funcs, database, spec, pretrained=pretrained))}


def tune_trials(func, spec, database, trials: int, settings: TuneSettings, intensive: bool, work_dir: Path,
                measure: "Measure | None" = None, cost_model=None, stop: Callable[[], bool] | None = None) -> bool:
    """Run ``trials`` more MetaSchedule trials of one kernel into ``database``; True when the search
    ended early because the kernel's search space is exhausted (:data:`EXHAUSTED_ROUNDS`).
    ``cost_model``: the session's (:func:`session_cost_model`); None: a fresh one. ``stop``: asked after
    each batch; True ends the search there (a deadline). Raises :class:`SpaceTimeout` when the kernel's space
    does not generate in time (:func:`check_space`)."""
    from tvm.s_tir import meta_schedule as ms

    # MetaSchedule's console handler takes this logger's level: keep progress to our own display
    # (its full logs still go to work_dir/logs)
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    ms_logger.setLevel(logging.WARNING)
    # MetaSchedule re-lists this logger's handlers by name in its logging config; a handler someone
    # attached without a name (pytest's log capture does) makes it fail: leave those out
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    builder = make_builder(spec, measure, max(1, min(spec.num_cores, os.cpu_count() or 1)))
    exhaustion = _exhaustion_callback(stop)
    intrinsics.load(spec.tvm())
    # an XGB model that has not seen enough records scores candidates with numpy's global generator:
    # seeded here, a search depends on its seed, kernel and records alone (tests/toolchain/test_determinism.py)
    np.random.seed((int(workload_hash(func)) ^ settings.seed) % 2**32)
    if cost_model is None:
        cost_model = ms.cost_model.XGBModel(num_tuning_cores=spec.num_cores)
    with phases.timed("search"):
        check_space(func, spec, intensive, settings.tile_cache)
        try:
            _search(func, spec, database, trials, settings, intensive, work_dir, measure, builder, exhaustion,
                    _timed_cost_model()(cost_model))
        except Exception as exc:  # noqa: BLE001 - one case is not a failure: MetaSchedule's scheduler joins the
            # task it picks next, so a task the callback ended there trips its own "not terminated" check; the
            # batch was measured and recorded, and ending it was the point
            if not (exhaustion.ended and "is_terminated" in str(exc)):
                raise
    return exhaustion.exhausted


def _search(func, spec, database, trials, settings, intensive, work_dir, measure, builder, exhaustion, cost_model):
    from tvm.s_tir import meta_schedule as ms

    ms.tune_tir(
        workload_module(func),
        target=spec.tvm(),
        work_dir=str(work_dir),
        max_trials_global=trials,
        num_trials_per_iter=min(settings.per_iter, trials),
        builder=builder,
        runner=make_runner(settings, measure),
        database=database,
        space=space_for(func, spec, intensive, settings.tile_cache).generator,
        num_tuning_cores=settings.search_threads or spec.num_cores,
        seed=settings.seed,
        measure_callbacks=[*ms.MeasureCallback.create("default"), exhaustion],
        cost_model=cost_model,
        strategy=ms.search_strategy.EvolutionarySearch(
            population_size=settings.population, init_min_unmeasured=min(50, settings.population)),
    )


@functools.cache
def _timed_cost_model():
    """A MetaSchedule cost model delegating to another, its ``update`` and ``predict`` counted as phases."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import PyCostModel

    @derived_object
    class TimedCostModel(PyCostModel):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def load(self, path: str) -> None:
            self.inner.load(path)

        def save(self, path: str) -> None:
            self.inner.save(path)

        def update(self, context, candidates, results) -> None:
            with phases.timed("update"):
                self.inner.update(context, candidates, results)

        def predict(self, context, candidates):
            with phases.timed("predict"):
                return self.inner.predict(context, candidates)

    return TimedCostModel


# ----------------------------------------------------------------------------- seeds and timings


def postprocess(sch, spec):
    """MetaSchedule's llvm postprocessors on a composed schedule, as the search applies them to every
    candidate: they turn the minis' ``meta_schedule.parallel`` / ``vectorize`` / ``unroll`` annotations
    into parallel, vectorised, unrolled loops (without them a composed kernel runs on one core,
    scalar: 5-10x slower). The schedule (its trace then records the steps), or None if one fails —
    by returning False or, as MetaSchedule's own search tolerates, by a TVM check failing inside it
    (``RewriteLayout`` on a gather's index load, BERT's ``take``): the reason is logged."""
    ctx = intrinsics.tune_context(mod=sch.mod, target=spec.tvm(), space_generator="post-order-apply", num_threads=1)
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


def passes_static_checks(sch, func) -> bool:
    """Whether a schedule of ``func`` drops no iteration, reads every weight whole, writes within its buffers and
    writes no buffer from two parallel iterations (a schedule they cannot analyse passes: the numeric check follows)."""
    try:
        return not (dropped_blocks(sch.mod) or partial_weight_reads(sch.mod, func) or out_of_bounds_writes(sch.mod)
                    or parallel_races(sch.mod))
    except Exception as exc:  # noqa: BLE001 - as the search's RejectDroppedIterations: unanalysable, kept
        log.info("static checks cannot analyse a schedule (kept for the numeric check): %s", first_line(exc))
        return True


def commit_seed(sch, func, database, spec, settings: TuneSettings, measure: "Measure | None" = None) -> bool:
    """A postprocessed schedule of ``func`` that passes the static checks and builds, measured like any
    candidate and committed as one of ``func``'s records (a search then starts from it). False when
    it fails a check, the build or the run."""
    from tvm.s_tir import meta_schedule as ms

    if not passes_static_checks(sch, func):
        return False
    run_secs = measure_schedule(sch, spec, settings, measure)
    if run_secs is None:
        return False
    args = ms.arg_info.ArgInfo.from_prim_func(as_built(sch.mod)["main"])
    workload = database.commit_workload(workload_module(func))
    database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, run_secs, spec.tvm(), args))
    phases.add_trials(1)
    return True


def measure_schedule(sch, spec, settings: TuneSettings, measure: "Measure | None" = None) -> list[float] | None:
    """A postprocessed schedule built and timed like any candidate: its run seconds, or None when the build or the
    run fails."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    built = make_builder(spec, measure, 1).build([BuilderInput(sch.mod, spec.tvm())])[0]
    if built.error_msg:
        return None
    try:
        args = ms.arg_info.ArgInfo.from_prim_func(as_built(sch.mod)["main"])
        result = make_runner(settings, measure).run([RunnerInput(built.artifact_path, "cpu", args)])[0].result()
    finally:
        _remove_built(built.artifact_path)
    if result.error_msg or not result.run_secs:
        return None
    return [float(getattr(x, "value", x)) for x in result.run_secs]


def time_together(kernels: list[tuple[object, object]], spec, settings, measure=None,
                  rounds: int = PAIR_ROUNDS) -> list[list[float]]:
    """Build each (PrimFunc, trace JSON) once and time them all in turn, ``rounds`` times (the order
    reversed every other round), on one runner — one worker process here, one device session over
    RPC (``measure.together``): per round, each kernel's latency in ms.
    Raises RuntimeError naming the kernel when one does not build or run."""
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    mods = [scheduled(func, trace).mod for func, trace in kernels]
    built = make_builder(spec, measure, 1).build([BuilderInput(m, spec.tvm()) for m in mods])
    try:
        for i, b in enumerate(built):
            if b.error_msg:
                raise RuntimeError(f"kernel {i} does not build: {b.error_msg.strip().splitlines()[-1]}")
        paths = [b.artifact_path for b in built]
        together = getattr(measure, "together", None) or functools.partial(_rounds_on_runner, settings, measure)
        return together(paths, [as_built(m)["main"] for m in mods], rounds)  # the parameters as built
    finally:
        for b in built:
            _remove_built(b.artifact_path)


def _remove_built(artifact_path: str | None) -> None:
    """A builder's file, what loading it made beside it (``NAME.so`` from a ``.tar``) and its temporary directory
    (its own; left when anything else is in it)."""
    if artifact_path:
        path = Path(artifact_path)
        beside = path.parent.iterdir() if path.parent.is_dir() else ()
        for p in [path, *(b for b in beside if b.name.startswith(path.name + "."))]:
            p.unlink(missing_ok=True)
        try:
            path.parent.rmdir()
        except OSError:
            pass


def round_order(n: int, r: int) -> list[int]:
    """The order kernels are timed in round ``r``: as given, reversed every other round."""
    return list(range(n))[::-1] if r % 2 else list(range(n))


def _rounds_on_runner(settings, measure, paths: list[str], funcs: list, rounds: int) -> list[list[float]]:
    """:func:`time_together`'s rounds on MetaSchedule's runner (this machine's: one worker process)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    args = [ms.arg_info.ArgInfo.from_prim_func(func) for func in funcs]
    runner = make_runner(settings, measure)
    table: list[list[float]] = []
    with tempfile.TemporaryDirectory(prefix="agoc-pair-") as tmp:
        for r in range(rounds):
            order = round_order(len(paths), r)
            inputs = []
            for i in order:  # a runner may delete what it ran: every round runs its own copy
                source = Path(paths[i])
                copy = Path(tmp) / f"r{r}-k{i}{''.join(source.suffixes)}"
                shutil.copyfile(source, copy)
                inputs.append(RunnerInput(str(copy), "cpu", args[i]))
            row = [0.0] * len(paths)
            for i, future in zip(order, runner.run(inputs)):
                result = future.result()
                if result.error_msg or not result.run_secs:
                    raise RuntimeError(f"kernel {i} failed to run: {(result.error_msg or 'no timing').strip()[-200:]}")
                secs = [float(getattr(x, "value", x)) for x in result.run_secs]
                row[i] = statistics.median(secs) * 1e3
            table.append(row)
    return table


# --------------------------------------------------------------------------------------------
# Checking a schedule numerically
