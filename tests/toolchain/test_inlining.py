"""Blocks kept out of AutoInline where inlining grows without bound (toolchain/tune/inlining.py)."""

import models
from tests.toolchain.test_fastmath import _legalized, every_op_model
from toolchain.opgraph import op_graph
from toolchain.targets import resolve_target
from toolchain.tune import inlining
from toolchain.tune.adapter import workload_module
from toolchain.tune.plan import plan_tasks
from toolchain.tune.settings import TuneSettings


def _kernels(model):
    """The kernels an AGO tuning session of ``model`` tunes, by name."""
    mod = _legalized(model)
    return plan_tasks(mod, op_graph(mod), resolve_target("host"), TuneSettings(trials=64))[1].funcs


def test_a_chain_of_fast_math_polynomials_keeps_the_blocks_that_would_blow_up_as_buffers():
    func = next(f for name, f in _kernels(every_op_model()).items() if "fast_erf" in name)
    heavy = inlining.heavy_blocks(func)
    assert heavy and all(name.startswith("T_fast_") for name in heavy), heavy
    # the limit decides: a lower one keeps more blocks as buffers (erf's ~200 nodes too), a huge one none
    assert set(heavy) < set(inlining.heavy_blocks(func, limit=100))
    assert inlining.heavy_blocks(func, limit=10**9) == []
    annotated = workload_module(func)["main"]
    assert str(annotated).count(inlining.ANNOTATION) == len(heavy)


def test_ordinary_kernels_are_left_as_they_are():
    for name, func in _kernels(models.build("tiny-cnn")).items():
        assert inlining.heavy_blocks(func) == [], name
        assert inlining.ANNOTATION not in str(workload_module(func)["main"]), name
