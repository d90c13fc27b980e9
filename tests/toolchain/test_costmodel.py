"""The pre-trained cost model (toolchain/tune/costmodel.py): trained on one kernel's schedules, saved small and
loaded back, it ranks the schedules of a similar kernel of other shapes, and a session's cost models start
from it. Deterministic: the schedules are drawn with fixed seeds, their costs a function of the schedule."""

import json
import types

import numpy as np
import pytest

from toolchain.targets import resolve_target
from toolchain.tune import adapter, costmodel
from toolchain.tune.db import TuneDB

SPEC = resolve_target("host", num_cores=2)


def _matmul(n: int, m: int, k: int):
    """An (n, k) x (k, m) matmul as one PrimFunc."""
    from tvm import te

    a, b = te.placeholder((n, k), name="a"), te.placeholder((k, m), name="b")
    r = te.reduce_axis((0, k), name="r")
    return te.create_prim_func([a, b, te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")])


def _sampled(func, n: int, seed: int) -> tuple[object, list]:
    """``func``'s workload and ``n`` random schedules of TVM's default space, postprocessed as the search
    postprocesses its candidates (trace JSON)."""
    from toolchain.tune import intrinsics
    from toolchain.tune.space import postprocs

    mod = adapter.workload_module(func)
    context = intrinsics.tune_context(mod=mod, target=SPEC.tvm(), space_generator="post-order-apply",
                                      num_threads=1, rand_state=seed)
    procs = postprocs(check=False)
    for proc in procs:
        proc._initialize_with_tune_context(context)
    traces = []
    while len(traces) < n:
        sch = context.generate_design_space()[0]  # every call samples its decisions anew
        sch.enter_postproc()
        if all(proc.apply(sch) for proc in procs):
            traces.append(sch.trace.as_json())
    return mod, traces


CORES = 2


def _steps(stmt, scale: float = 1.0) -> float:
    """Sequential steps of a scheduled loop nest: every store weighs the product of its enclosing loops'
    extents, a parallel loop's split over CORES, a vectorised loop's as one step."""
    from tvm import tirx

    if isinstance(stmt, tirx.For):
        extent = int(stmt.extent)
        factor = {tirx.ForKind.VECTORIZED: 1, tirx.ForKind.PARALLEL: -(-extent // CORES)}.get(stmt.kind, extent)
        return _steps(stmt.body, scale * factor)
    if isinstance(stmt, tirx.BufferStore):
        return scale
    if isinstance(stmt, tirx.SeqStmt):
        return sum(_steps(s, scale) for s in stmt.seq)
    children = [getattr(stmt, name, None) for name in ("block", "body", "then_case", "else_case", "init")]
    return sum(_steps(c, scale) for c in children if c is not None)


def _costs(mod, traces: list) -> list[list[float]]:
    """A run time for each schedule that is a function of the schedule alone (:func:`_steps`): what runs in
    parallel, vectorised or in sequence — what a cost model must learn from a schedule's features, without
    the noise of timing on a shared machine (tests never assert on wall-clock time; the model's ranking of
    measured schedules: host/bench/costmodel_fit.py, docs/tuning-internals.md)."""
    return [[_steps(adapter.scheduled(mod["main"], trace).mod["main"].body) * 1e-9] for trace in traces]


@pytest.fixture(scope="module")
def kernels():
    """Two matmuls of other shapes, each with random schedules and their costs: (workload, traces, secs)."""
    first = _sampled(_matmul(64, 64, 64), 40, seed=1)
    second = _sampled(_matmul(48, 96, 80), 32, seed=1000)
    return [(mod, traces, _costs(mod, traces)) for mod, traces in (first, second)]


@pytest.fixture(scope="module")
def trained(kernels):
    (mod, traces, secs), _ = kernels
    return costmodel.train([(mod, t, s) for t, s in zip(traces, secs)], SPEC)


def test_a_saved_model_is_small_says_what_it_is_and_predicts_the_same(trained, kernels, tmp_path):
    _, (mod, traces, _) = kernels
    path = costmodel.save(trained, tmp_path / "cost_model.bin")
    info = json.loads(costmodel.info_path(path).read_text())
    assert info["samples"] == 40 and info["workloads"] == 1 and info["format"] == costmodel.FORMAT
    assert info["xgboost"] and path.stat().st_size < 1_000_000  # the booster only, not the features
    loaded = costmodel.load(path, SPEC)
    assert costmodel.scores(loaded, mod, traces, SPEC) == pytest.approx(costmodel.scores(trained, mod, traces, SPEC))
    info["format"] = costmodel.FORMAT + 1
    costmodel.info_path(path).write_text(json.dumps(info))
    with pytest.raises(ValueError, match="train it again"):
        costmodel.load(path, SPEC)


def test_a_model_trained_on_one_kernel_ranks_a_similar_kernels_schedules(trained, kernels):
    """Held out: another matmul, every dimension another size. Better than chance by a margin (0.78 here; 0.69
    and 0.80 with other seeds), and not by luck: fewer than 1% of random orders of the same schedules do as
    well."""
    _, (mod, traces, secs) = kernels
    scores = costmodel.scores(trained, mod, traces, SPEC)
    assert None not in scores
    observed = costmodel.ranking_accuracy(scores, secs)
    rng = np.random.default_rng(0)
    chance = [costmodel.ranking_accuracy(rng.permutation(scores), secs) for _ in range(1000)]
    assert observed >= 0.65
    assert np.mean([c >= observed for c in chance]) < 0.01


def test_a_sessions_cost_models_start_from_the_pretrained_one_then_learn_its_records(trained, kernels, tmp_path):
    """Before the session has measured anything its models already rank (a stock model guesses at random
    for its first 100 trials); its records then boost on top of the pre-trained model."""
    from tvm.s_tir import meta_schedule as ms

    _, (mod, traces, secs) = kernels
    path = costmodel.save(trained, tmp_path / "lib" / "cost_model.bin")
    func = mod["main"]
    plan = types.SimpleNamespace(tasks=[], funcs={"conv": func})
    database = TuneDB(tmp_path / "db").ms_database()
    models = adapter.session_cost_models(plan, database, SPEC, pretrained=path)
    first = costmodel.scores(models[False](), mod, traces, SPEC)
    assert first == costmodel.scores(models[False](), mod, traces, SPEC)  # not random: the same twice
    assert first == pytest.approx(costmodel.scores(trained, mod, traces, SPEC))
    workload = database.commit_workload(mod)
    args = ms.arg_info.ArgInfo.from_prim_func(func)
    for trace, run_secs in zip(traces[:16], secs[:16]):
        sch = adapter.scheduled(func, trace)
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, run_secs, SPEC.tvm(), args))
    resumed = adapter.session_cost_models(plan, database, SPEC, pretrained=path)[False]()
    assert resumed.data_size == 16  # the session's own records, on top of the pre-trained booster
    assert costmodel.scores(resumed, mod, traces, SPEC) != pytest.approx(first)
