"""The pre-trained cost model (toolchain/tune/costmodel.py): trained on one kernel's measured schedules, saved
small and loaded back, it ranks the schedules of a similar kernel of other shapes, and a session's cost
models start from it."""

import json
import types

import numpy as np
import pytest

from toolchain.targets import resolve_target
from toolchain.tune import adapter, costmodel
from toolchain.tune.db import TuneDB

SPEC = resolve_target("host", num_cores=2)


def _conv(n_in: int, n_out: int, hw: int):
    """A 3x3 conv + ReLU (NCHW) as one PrimFunc."""
    from tvm import te, topi

    x = te.placeholder((1, n_in, hw, hw), name="x")
    w = te.placeholder((n_out, n_in, 3, 3), name="w")
    return te.create_prim_func([x, w, topi.nn.relu(topi.nn.conv2d_nchw(x, w, 1, 1, 1))])


def _sampled(func, n: int, seed: int) -> tuple[object, list]:
    """``func``'s workload and ``n`` random schedules of TVM's default space, postprocessed (trace JSON)."""
    from toolchain.tune import intrinsics

    mod = adapter.workload_module(func)
    traces = []
    for i in range(4 * n):
        context = intrinsics.tune_context(mod=mod, target=SPEC.tvm(), space_generator="post-order-apply",
                                          num_threads=1, rand_state=seed + i)
        sch = adapter.postprocess(context.generate_design_space()[0], SPEC)
        if sch is not None:
            traces.append(sch.trace.as_json())
        if len(traces) == n:
            break
    return mod, traces


def _measured(mod, traces: list) -> list[list[float]]:
    """Seconds per call of each schedule (3 repeats), built and timed here."""
    import tvm
    from tvm import s_tir

    dev, args, out = tvm.cpu(), None, []
    for trace in traces:
        sch = s_tir.Schedule(mod)
        s_tir.Trace.apply_json_to_schedule(trace, sch)
        lib = adapter.fast_build(sch.mod, SPEC.tvm())
        if args is None:
            rng = np.random.default_rng(0)
            args = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in p.ty.shape]).astype("float32"), dev)
                    for p in mod["main"].params]
        out.append([float(t) for t in lib.time_evaluator(lib.entry_name, dev, number=3, repeat=3)(*args).results])
    return out


@pytest.fixture(scope="module")
def kernels():
    """Two similar convs of other shapes, each with random schedules measured: (workload, traces, secs)."""
    first = _sampled(_conv(16, 16, 16), 40, seed=1)
    second = _sampled(_conv(8, 24, 12), 32, seed=1000)
    return [(mod, traces, _measured(mod, traces)) for mod, traces in (first, second)]


@pytest.fixture(scope="module")
def trained(kernels):
    (mod, traces, secs), _ = kernels
    return costmodel.train([(mod, t, s) for t, s in zip(traces, secs)], SPEC)


def weighted_order(scores, secs) -> float:
    """How often the model orders two schedules as they ran, each pair weighted by the faster one's speed
    relative to the fastest: the order among the fast schedules — the ones a search measures — counts,
    the order among the ones 50x slower hardly (MetaSchedule's model is trained that way). 0.5 at random."""
    med = np.array([np.median(s) for s in secs])
    scores = np.asarray(scores)
    speed = med.min() / med
    faster = med[:, None] < med[None, :]
    weight = np.where(faster, speed[:, None], 0.0)
    return float((weight * (scores[:, None] > scores[None, :])).sum() / weight.sum())


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
    """Held out: another conv, other channels and resolution. Better than chance by a margin, and not by luck:
    fewer than 1% of random orders of the same schedules do as well."""
    _, (mod, traces, secs) = kernels
    scores = costmodel.scores(trained, mod, traces, SPEC)
    assert None not in scores
    observed = weighted_order(scores, secs)
    rng = np.random.default_rng(0)
    chance = [weighted_order(rng.permutation(scores), secs) for _ in range(1000)]
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
