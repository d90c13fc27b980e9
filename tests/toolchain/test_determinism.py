"""The same seed, budget and library give the same database: nothing in a session draws from an unseeded
source (with the default single-threaded search: ``search_threads``). Candidates are timed by a runner
that gives each one the same time — on a real machine the times differ from run to run, and so do the
decisions that read them (docs/tuning-internals.md)."""

import json

import numpy as np
import pytest

from toolchain import build, onnx_import
from toolchain.settings import PartitionSettings
from toolchain.targets import resolve_target
from toolchain.tune.adapter import Measure
from toolchain.tune.session import tune_model
from toolchain.tune.settings import TuneSettings

SPEC = resolve_target("host", layout="NCHW")


def _constant_runner():
    """A MetaSchedule runner that times every candidate at 1 ms without running it."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerFuture, RunnerResult

    @derived_object
    class Constant(PyRunner):
        def run(self, runner_inputs):
            return [RunnerFuture(lambda: True, lambda: RunnerResult([1e-3], None)) for _ in runner_inputs]

    return Constant()


def _traces(db_dir) -> list:
    """Every record's (workload, trace) in commit order: what the search chose, not what it measured."""
    lines = (db_dir / "ms" / "database_tuning_record.json").read_text().splitlines()
    return [(json.loads(line)[0], json.loads(line)[1][0]) for line in lines if line.strip()]


@pytest.fixture(scope="module")
def one_conv():
    """One conv + relu in NCHW: one kernel, so the test times the search, not a model's verifications."""
    from models.builder import GraphBuilder

    b = GraphBuilder("one-conv")
    x = b.conv(b.input("x", (1, 8, 16, 16)), 8, 16, 3, name="conv", act="relu")
    model = b.finish(x, (1, 16, 16, 16))
    return build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)


@pytest.mark.e2e
def test_the_same_seed_and_budget_give_the_same_records_and_another_seed_does_not(one_conv, tmp_path):
    measure = Measure(runner=_constant_runner())
    settings = TuneSettings(trials=10, per_iter=4, population=16, partition=PartitionSettings("stock"))
    for name in ("a", "b"):
        np.random.seed(len(name) * 7 + ord(name))  # whatever the process drew before: not an input
        tune_model(one_conv, "0" * 64, SPEC, settings, tmp_path / name, measure=measure)
    first, again = _traces(tmp_path / "a"), _traces(tmp_path / "b")
    assert len(first) == 10 and first == again
    other = TuneSettings(trials=4, per_iter=4, population=16, partition=PartitionSettings("stock"), seed=1)
    tune_model(one_conv, "0" * 64, SPEC, other, tmp_path / "c", measure=measure)
    assert _traces(tmp_path / "c") != first[:4]  # the comparison can fail: the seed is an input
