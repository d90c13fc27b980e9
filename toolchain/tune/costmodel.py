"""A pre-trained cost model: MetaSchedule's XGB model trained on a record library, saved small (the booster
and a JSON of what it learned from), and a session's models started from it then boosted on the session's
own records. Why and the numbers: docs/tuning-internals.md (A pre-trained cost model)."""

from __future__ import annotations

import contextlib
import functools
import json
import math
from pathlib import Path

#: the saved model's format: bumped when what :func:`save` writes, or the features it reads, change
FORMAT = 1
#: MetaSchedule's feature extractor the booster was trained on (a model is only valid with the same one)
FEATURES = "per-store-feature"
#: boosting rounds a session adds on top of the pre-trained booster per update (each update starts again from
#: the pre-trained booster, with every record of the session; why 25: docs/tuning-internals.md)
SESSION_ROUNDS = 25


def info_path(path: Path) -> Path:
    """The JSON beside a saved model (not ``cost_model.*``: a library finds its model by that glob)."""
    path = Path(path)
    return path.with_name(f"{path.stem}_info.json")


@functools.cache
def _model_class():
    """MetaSchedule's XGB model that boosts on from a pre-trained booster (``base``) instead of from scratch,
    and predicts with it from the first candidate on (no random warm-up)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum, _get_custom_call_back

    @derived_object
    class PretrainedXGB(XGBModel._cls):
        def __init__(self, base, num_tuning_cores: int, trained_on: dict | None = None):
            super().__init__(num_warmup_samples=0, adaptive_training=False, num_tuning_cores=num_tuning_cores)
            self.base, self.booster, self.trained_on = base, base, trained_on or {}

        def _train(self, xs, ys) -> None:  # XGBModel._train, boosting on from ``base``
            import xgboost as xgb

            packed = PackSum(xs=xs, ys=ys)
            start = None
            if self.base is not None:  # its own early-stopping state would end the new rounds at once
                start = self.base.copy()
                start.set_attr(best_score=None, best_iteration=None, best_msg=None)
            self.booster = xgb.train(
                self.config.to_dict(), packed.dmatrix, num_boost_round=SESSION_ROUNDS if start else 10000,
                obj=lambda pred, _d: packed.obj_square_error(pred), xgb_model=start,
                callbacks=[_get_custom_call_back(
                    early_stopping_rounds=self.early_stopping_rounds, verbose_eval=self.verbose_eval,
                    fevals=[lambda pred, _d: packed.rmse(pred),
                            lambda pred, _d: packed.average_peak_score(pred, self.average_peak_n)],
                    evals=[(packed.dmatrix, "tr")], cvfolds=None)])

    return PretrainedXGB


def candidates_of(mod, traces: list, spec) -> tuple[object, list, list[int]]:
    """(a tuning context of ``mod``, MeasureCandidates of the traces that replay on it, their indices)."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from toolchain.tune import intrinsics

    context = intrinsics.tune_context(mod=mod, target=spec.tvm(), num_threads=spec.num_cores)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    out, kept = [], []
    for i, trace in enumerate(traces):
        sch = s_tir.Schedule(mod)
        try:
            s_tir.Trace.apply_json_to_schedule(trace, sch)
        except Exception:  # noqa: BLE001 - a record that no longer replays teaches nothing
            continue
        out.append(ms.search_strategy.MeasureCandidate(sch, args))
        kept.append(i)
    return context, out, kept


def by_workload(samples) -> dict[str, tuple[object, list, list]]:
    """{workload structural hash: (workload, traces, run_secs)} of (workload IRModule, trace JSON, run_secs)
    samples; failed measurements (no or huge run_secs) left out."""
    import tvm_ffi

    groups: dict[str, tuple[object, list, list]] = {}
    for mod, trace, secs in samples:
        secs = [float(s) for s in secs or []]
        if not secs or not all(math.isfinite(s) and s < 1e9 for s in secs):
            continue
        key = str(tvm_ffi.structural_hash(mod))
        groups.setdefault(key, (mod, [], []))
        groups[key][1].append(trace)
        groups[key][2].append(secs)
    return groups


def fresh(spec, base=None, trained_on: dict | None = None):
    """A cost model for a search: boosting on from ``base`` (a booster), or MetaSchedule's own without one."""
    if base is None:
        from tvm.s_tir.meta_schedule.cost_model import XGBModel

        return XGBModel(num_tuning_cores=spec.num_cores)
    return _model_class()(base, spec.num_cores, trained_on)


def train(samples, spec):
    """A model trained on ``samples`` — (workload IRModule, trace JSON, run_secs) — each trace replayed on
    its workload and its features added per workload (as ``XGBModel.update`` does), then one training."""
    from tvm.s_tir import meta_schedule as ms

    groups = by_workload(samples)
    model = _model_class()(None, spec.num_cores)
    with deferred(model):
        for mod, traces, secs in groups.values():
            context, candidates, kept = candidates_of(mod, traces, spec)
            model.update(context, candidates, [ms.runner.RunnerResult(secs[i], None) for i in kept])
    if not model.data_size:
        raise ValueError("no sample replays on its workload: nothing to train a cost model on")
    model.base = model.booster
    model.trained_on = {"samples": model.data_size, "workloads": len(model.data)}
    model.data, model.data_size = type(model.data)(), 0  # the session's records start it over from ``base``
    return model


@contextlib.contextmanager
def deferred(model):
    """Updates of ``model`` (an XGB model) inside only add their features; one training at the end (each
    ``update`` would otherwise train on everything so far: one training per workload)."""
    adaptive = model.adaptive_training
    model.adaptive_training, model.last_train_size = True, math.inf  # XGBModel.update: "not grown enough"
    try:
        yield model
    finally:
        model.adaptive_training, model.last_train_size = adaptive, 0
    if model.data_size:
        _fit_all(model)


def _fit_all(model) -> None:
    """One training on every group the model holds (XGBModel.update's last step)."""
    import numpy as np

    features = [f for g in model.data.values() for f in g.features]
    ratios = np.concatenate([np.divide(g.min_cost, g.costs, out=np.zeros_like(g.costs), where=g.costs != 0)
                             for g in model.data.values()])
    model.last_train_size = model.data_size
    model._train(xs=features, ys=ratios)


def save(model, path: Path) -> Path:
    """The pre-trained booster to ``path`` (XGBoost's UBJSON, what ``Booster.save_raw`` gives) and, beside it,
    what it is (:func:`info_path`: format, features, xgboost version, samples, workloads)."""
    import xgboost

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(model.base.save_raw("ubj")))
    info = {"format": FORMAT, "features": FEATURES, "xgboost": xgboost.__version__, **model.trained_on}
    info_path(path).write_text(json.dumps(info, indent=1) + "\n")
    return path


def read_info(path: Path) -> dict:
    """What :func:`save` wrote beside ``path``; ValueError if it is missing or of another format."""
    where = info_path(path)
    if not where.exists():
        raise ValueError(f"{path} has no {where.name}: not a cost model saved by agoc")
    info = json.loads(where.read_text())
    if info.get("format") != FORMAT or info.get("features") != FEATURES:
        raise ValueError(f"{path} is a cost model of format {info.get('format')} ({info.get('features')}); this "
                         f"agoc reads format {FORMAT} ({FEATURES}): train it again")
    return info


def load(path: Path, spec):
    """A session's cost model starting from the booster saved at ``path`` (:func:`save`)."""
    import xgboost as xgb

    info = read_info(path)
    booster = xgb.Booster()
    booster.load_model(bytearray(Path(path).read_bytes()))
    return fresh(spec, booster, {k: info[k] for k in ("samples", "workloads") if k in info})


def scores(model, mod, traces: list, spec) -> list[float | None]:
    """The model's score of each trace on ``mod`` (higher: predicted faster); None where it does not replay."""
    context, candidates, kept = candidates_of(mod, traces, spec)
    out: list[float | None] = [None] * len(traces)
    for i, score in zip(kept, model.predict(context, candidates) if candidates else []):
        out[i] = float(score)
    return out


def ranking_accuracy(scores, secs) -> float:
    """How often ``scores`` order two schedules as they ran (``secs``: each one's run_secs), each pair weighted
    by the faster one's speed relative to the fastest: the order among the fast schedules — those a search
    measures — counts, the order among schedules 50x slower hardly (MetaSchedule's model is trained so:
    its training weights are those speeds). 0.5 for scores drawn at random."""
    import numpy as np

    med = np.array([float(np.median(s)) for s in secs])
    scores = np.asarray(scores, dtype=float)
    speed = med.min() / med
    weight = np.where(med[:, None] < med[None, :], speed[:, None], 0.0)
    total = weight.sum()
    return float((weight * (scores[:, None] > scores[None, :])).sum() / total) if total else 0.5
