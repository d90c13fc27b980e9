"""host.bench.fit_weights: the budget rule, the least-squares fit, the calibration table, and (slow) one real tuning."""

from __future__ import annotations

import json
import math

import pytest

from host.bench import fit_weights as fw


def test_fit_recovers_exact_constants():
    c, b = 0.35, 4.0
    rows = [(t, n, c * t + b * n) for t, n in [(80, 2), (120, 3), (180, 6), (200, 4), (420, 8), (600, 11)]]
    got_c, got_b, r2 = fw.fit_constants(rows)
    assert got_c == pytest.approx(c, rel=1e-9)
    assert got_b == pytest.approx(b, rel=1e-9)
    assert r2 == pytest.approx(1.0)


def test_fit_accepts_budget_rows():
    rows = [{"loop_term_sum": t, "n_ops": n, "budget": 0.1 * t + 2 * n} for t, n in [(100, 2), (300, 4), (500, 9)]]
    c, b, _ = fw.fit_constants(rows)
    assert (c, b) == (pytest.approx(0.1), pytest.approx(2.0))


def test_negative_slope_falls_back_to_zero_bias():
    # budgets fall as loop terms grow: the free fit has c < 0
    rows = [(100, 4, 40.0), (200, 4, 30.0), (400, 4, 10.0)]
    result = fw.fit(rows)
    assert result.free_c < 0
    assert result.forced_b0
    assert result.b == 0.0
    assert result.c > 0
    assert result.c == pytest.approx((100 * 40 + 200 * 30 + 400 * 10) / (100**2 + 200**2 + 400**2))


def test_negative_bias_falls_back_to_zero_bias():
    rows = [(100, 2, 5.0), (200, 2, 15.0), (300, 2, 25.0)]  # exact with c=0.1, b=-2.5
    result = fw.fit(rows)
    assert result.free_b == pytest.approx(-2.5)
    assert result.forced_b0 and result.b == 0.0 and result.c > 0


def test_aggregate_averages_seed_replicates():
    base = {"loop_term_sum": 100.0, "n_ops": 2, "best_latency_ms": 1.0, "seconds": 10.0}
    rows = [
        {**base, "name": "a", "seed": 0, "budget": 10},
        {**base, "name": "a", "seed": 1, "budget": 30, "best_latency_ms": 0.5},
        {**base, "name": "b", "budget": 7},  # rows without a seed are seed 0
    ]
    agg = fw.aggregate(rows)
    assert [r["name"] for r in agg] == ["a", "b"]
    assert agg[0]["budget"] == 20 and agg[0]["budgets"] == [10, 30] and agg[0]["seeds"] == [0, 1]
    assert agg[0]["best_latency_ms"] == 0.5 and agg[0]["seconds"] == 20.0
    assert agg[1]["budget"] == 7 and agg[1]["seeds"] == [0]


def test_fit_needs_two_rows():
    with pytest.raises(ValueError):
        fw.fit([(100, 2, 10)])


def test_budget_rule_on_hand_written_sequence():
    # best-so-far 10, 8, 8, 5, 5, 4.95, 4.9: after trial 4 (best 5) the rest improves by 2 % in total
    assert fw.budget_of([10, 8, 8, 5, 5, 4.95, 4.9]) == 4


def test_budget_rule_is_cumulative():
    # five 1.5 % steps: no single step exceeds 2 %, but together they do
    seq = [10.0]
    for _ in range(5):
        seq.append(seq[-1] * 0.985)
    assert fw.budget_of(seq) == 5  # 10*0.985**4 is within 2 % of 10*0.985**5; 10*0.985**3 is not


def test_budget_rule_skips_failed_trials():
    inf = math.inf
    assert fw.budget_of([inf, inf, 3.0, 3.0, 2.99]) == 3
    assert fw.budget_of([2.0, 1e10, 1.0]) == 3  # MetaSchedule's failed-run marker is not a best
    with pytest.raises(ValueError):
        fw.budget_of([inf, inf])


def test_trial_latencies_read_in_commit_order(tmp_path):
    lines = [
        [0, [[], [0.003, 0.001, 0.002], {"kind": "llvm"}, []]],
        [0, [[], [1e10], {"kind": "llvm"}, []]],
        [0, [[], [0.0015], {"kind": "llvm"}, []]],
    ]
    (tmp_path / "database_tuning_record.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert fw.trial_latencies(tmp_path) == [0.002, math.inf, 0.0015]


def test_calibration_names_unique_and_anchors_valid():
    names = [c.name for c in fw.CALIBRATION]
    assert len(names) == len(set(names))
    assert 8 <= len(names) <= 16
    for cal in fw.CALIBRATION:
        assert cal.anchor.split(":")[0] in ("class", "func")
        assert cal.take >= 1


@pytest.fixture(scope="module")
def host_spec():
    from toolchain.targets import resolve_target

    return resolve_target("host", fast_math=False)  # the calibration's anchors name the exact ops


def _smallest_shape_variants():
    """One calibration row per (model, anchor, nth, take, offset), at its smallest shape."""
    chosen: dict = {}
    for cal in fw.CALIBRATION:
        key = (cal.model, cal.anchor, cal.nth, cal.take, cal.offset)
        if key not in chosen or math.prod(cal.shape) < math.prod(chosen[key].shape):
            chosen[key] = cal
    return list(chosen.values())


@pytest.mark.parametrize("cal", _smallest_shape_variants(), ids=lambda c: c.name)
def test_calibration_groups_fuse_into_one_primfunc(cal, host_spec):
    from tvm import tirx

    ex = fw.extract(cal, host_spec)
    assert isinstance(ex.func, tirx.PrimFunc)
    assert ex.n_ops == cal.take == len(ex.node_ids)
    assert ex.loop_term_sum > 0
    assert ex.func.body is not None


def test_calibration_covers_the_brief():
    """Single conv / pw / dw, a matmul, simple-op groups, pw→dw, dw→pw, a whole block; two sizes somewhere."""
    notes = " ".join(c.note for c in fw.CALIBRATION)
    for needle in ("3x3/2 conv", "1x1 conv", "depthwise", "softmax", "layer norm", "elementwise", "pw → dw → pw"):
        assert needle in notes
    assert any(c.shape[-1] == 112 for c in fw.CALIBRATION) and any(c.shape[-1] == 56 for c in fw.CALIBRATION)


@pytest.mark.slow
def test_measure_end_to_end_small(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    out = tmp_path / "budgets.json"
    smallest = "bert-softmax"
    doc = fw.measure([smallest], trials=6, out_path=out, work_root=tmp_path / "work", per_iter=3,
                     echo=lambda _m: None)
    (row,) = doc["subgraphs"]
    assert row["name"] == smallest and row["trials"] == 6
    assert 1 <= row["trials_measured"] <= 6
    assert 1 <= row["budget"] <= row["trials_measured"]
    assert row["best_latency_ms"] > 0
    assert row["loop_term_sum"] > 0
    saved = json.loads(out.read_text())
    assert saved["subgraphs"][0]["budget"] == row["budget"]
    assert saved["context"]["stability_rule"] == fw.STABILITY_RULE
    # resumable: a second call with the same trial count skips the subgraph
    messages: list[str] = []
    fw.measure([smallest], trials=6, out_path=out, work_root=tmp_path / "work", per_iter=3, echo=messages.append)
    assert any("skip" in m for m in messages)


def test_fit_file_writes_constants_and_source(tmp_path):
    rows = [{"name": f"s{i}", "loop_term_sum": t, "n_ops": n, "budget": 0.2 * t + 1.5 * n, "trials": 64,
             "best_latency_ms": 1.0, "seconds": 1.0}
            for i, (t, n) in enumerate([(100, 2), (250, 4), (400, 8), (600, 11)])]
    budgets = tmp_path / "budgets.json"
    context = {"cpu": "X", "llvm_mcpu": "y", "tvm_num_threads": "2"}
    budgets.write_text(json.dumps({"context": context, "subgraphs": rows}))
    out = tmp_path / "fit.json"
    fw.fit_file(budgets, out, echo=lambda _m: None, threshold=80)
    data = json.loads(out.read_text())
    assert data["c"] == pytest.approx(0.2) and data["b"] == pytest.approx(1.5) and data["n"] == 4
    assert data["source"].startswith("fitted by host/bench/fit_weights.py from ")
    assert "64 trials/subgraph" in data["source"]
    assert data["default_threshold"] == 80.0

    from toolchain.weights import default_threshold, load_model

    model = load_model(out)
    assert (model.c, model.b) == (pytest.approx(0.2), pytest.approx(1.5))
    assert default_threshold(48.0, out) == 80.0
