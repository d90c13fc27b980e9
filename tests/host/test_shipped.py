"""`make bench-shipped` (host/bench/shipped.py): the verdict per size, the share of the peak read from a per-kernel
run, the chart, and one small run of the whole suite (a tune, two verified builds, timings beside onnxruntime)."""

import json
from dataclasses import asdict

import pytest

from host.bench import shipped


def _point(model, size, ratios: dict, note=""):
    timed = {"tuned": {t: {"ms": {}, "onnxruntime_ms": {}, "note": "", "speedup": r} for t, r in ratios.items()}}
    return shipped.Point(model, size, 100.0, 256, timed if ratios else {}, note=note)


def test_a_size_is_met_only_where_every_thread_count_and_regime_reaches_its_target():
    points = [_point("a", 112, {"2": {"warm": 1.2, "cold": 1.15}, "1": {"warm": 1.1, "cold": 1.3}}),
              _point("b", 112, {"2": {"warm": 1.2, "cold": 1.05}}),
              _point("c", 112, {}, note="tune exited 1"),
              _point("a", 224, {"2": {"warm": 1.0, "cold": 1.01}}),
              _point("a", 56, {"2": {"warm": 0.5, "cold": 0.5}})]  # no target at 56: no verdict
    found = shipped.verdict(points)
    assert set(found) == {"112", "224"}
    assert found["112"]["met"] == ["a"] and found["112"]["not_timed"] == ["c"]
    assert found["112"]["below"] == [{"model": "b", "threads": 2, "regime": "cold", "ratio": 1.05}]
    assert found["224"] == {"target": 1.0, "met": ["a"], "below": [], "not_timed": []}


def test_an_unknown_model_is_refused_before_any_tune(tmp_path, capsys):
    assert shipped.main(["--models", "squeezenet", "--work", str(tmp_path / "w")]) == 1
    assert "squeezenet-1.1" in capsys.readouterr().err and not (tmp_path / "w").exists()
    from models.registry import MODELS as ZOO

    assert set(shipped.MODELS) <= {z.name for z in ZOO}


def test_the_share_of_the_peak_is_the_models_flops_over_its_kernels_time_and_over_its_own():
    result = {"peak": {"gflops": 200.0}, "median_ms": 2.0,
              "kernels": [{"flops": 1e8, "calls_per_run": 2, "median_ms": 1.0},  # 0.2 GFLOP in 1 ms
                          {"flops": 2e8, "calls_per_run": 1, "median_ms": 1.0},
                          {"flops": None, "calls_per_run": 1, "median_ms": 0.5}]}  # no count: time, no work
    share = shipped.share_of_peak(result)
    assert share["gflop"] == pytest.approx(0.4) and share["kernels_ms"] == pytest.approx(2.5)
    assert share["gflops"] == pytest.approx(160.0) and share["fraction"] == pytest.approx(0.8)
    assert share["model_ms"] == 2.0 and share["model_fraction"] == pytest.approx(1.0)  # 0.4 GFLOP in 2 ms
    assert shipped.share_of_peak({"kernels": result["kernels"]})["fraction"] is None  # no peak measured
    assert shipped.share_of_peak({"kernels": result["kernels"]})["model_fraction"] is None


def test_a_disturbed_per_kernel_sitting_is_timed_again(tmp_path, monkeypatch):
    def result(kernels_ms, model_ms):
        return {"median_ms": model_ms, "peak": {"gflops": 100.0},
                "kernels": [{"flops": 1e8, "calls_per_run": 1, "median_ms": kernels_ms}]}

    assert not shipped.disturbed(result(1.1, 1.0)) and shipped.disturbed(result(2.0, 1.0))
    assert not shipped.disturbed({"kernels": []})  # nothing timed: nothing to judge
    sittings = [result(2.0, 1.0), result(1.0, 1.0)]  # the first disturbed (the kernels twice the model), then not

    def fake_run(words, stdout, **kw):
        stdout.write(json.dumps(sittings.pop(0)))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(shipped.subprocess, "run", fake_run)
    share = shipped.peak_share(tmp_path / "p" / "tuned", 2, tmp_path / "commands.log")
    assert share["kernels_ms"] == 1.0 and share["fraction"] == 1.0 and "2 sittings" in share["note"]
    assert not sittings
    sittings[:] = [result(2.0, 1.0)] * shipped.SITTINGS  # disturbed every time: the last kept, said so
    share = shipped.peak_share(tmp_path / "p" / "tuned", 2, tmp_path / "commands.log")
    assert share["kernels_ms"] == 2.0 and f"in {shipped.SITTINGS}" in share["note"] and not sittings


def test_the_chart_is_written(tmp_path):
    ratios = {"2": {"warm": 1.2, "cold": 1.3}, "1": {"warm": 0.9, "cold": 1.0}}
    doc = {"points": [asdict(_point("mobilenet-v2", 224, ratios))]}
    path = shipped.chart(doc, tmp_path / "c.png")
    from PIL import Image

    assert Image.open(path).size[0] >= 480


def test_a_point_resumes_only_what_the_same_code_made(tmp_path, monkeypatch):
    """A point's work directory is named by the code (and tune options) that made it: a run of other code tunes
    afresh and leaves the earlier point where it is."""
    from types import SimpleNamespace

    assert shipped.code_version() == shipped.code_version() != shipped.code_version(["--trials", "4"])
    args = SimpleNamespace(work=tmp_path, tune_args=[], threads=[1], rounds=1, calls=1)
    earlier = tmp_path / f"tiny-cnn-16-{shipped.code_version()}" / "point.json"
    earlier.parent.mkdir()
    earlier.write_text(json.dumps(asdict(shipped.Point("tiny-cnn", 16, 5.0, 4, code=shipped.code_version()))))
    commands = []

    def run_logged(command, log):
        commands.append(command)
        raise RuntimeError("stopped here")

    monkeypatch.setattr(shipped, "run_logged", run_logged)
    assert shipped.run_point("tiny-cnn", 16, args, tmp_path / "log").tune_s == 5.0  # the same code: resumed
    assert commands[-1][1] == "compile"
    monkeypatch.setattr(shipped, "code_version", lambda extra=(): "other")
    point = shipped.run_point("tiny-cnn", 16, args, tmp_path / "log")
    assert commands[-1][1] == "tune" and point.tune_s is None and point.code == "other"
    assert (tmp_path / "tiny-cnn-16-other" / "point.json").exists() and earlier.exists()


@pytest.mark.e2e  # about two minutes: a short tune, two builds checked against onnxruntime, the timings
def test_a_small_run_tunes_builds_times_and_resumes_after_its_tune(tmp_path, capsys):
    args = ["--models", "tiny-cnn", "--sizes", "16", "--threads", "1", "--rounds", "2", "--calls", "3",
            "--tune-args", "--trials 4", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out")]
    assert shipped.main(args) == 0
    [written] = (tmp_path / "out").glob("shipped-*.json")
    doc = json.loads(written.read_text())
    [point] = doc["points"]
    assert point["note"] == "" and 0 < point["trials"] <= 4 and point["tune_s"] > 0
    for build in shipped.BUILDS:
        one = point["timed"][build]["1"]
        assert set(one["speedup"]) == {"warm", "cold"} and all(v > 0 for v in one["speedup"].values())
    assert point["peak"]["gflop"] > 0 and written.with_suffix(".png").exists()
    assert doc["verdict"] == {}  # no target at 16
    assert shipped.main(args) == 0  # resumed: the tune not run again, the builds timed again
    commands = (tmp_path / "w" / "commands.log").read_text().splitlines()
    assert sum(" tune zoo:tiny-cnn" in line for line in commands if line.startswith("$ ")) == 1
    assert "tuned in" in capsys.readouterr().out


def test_the_models_flops_leave_out_the_channels_a_build_pads(tmp_path):
    """A conv padded 520 → 528 and classifiers 1000 → 1024 (toolchain/padding.py) compute zero channels that are not
    the model's work: the share of the peak counts the model as it is."""
    from tests.toolchain.test_padding import head_model
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target

    spec = resolve_target("host")
    artifact = compile_model(CompileRequest(head_model(), "padded-head", spec), find_compiler(spec), tmp_path / "a")
    built = sum(k.get("flops", 0) * k["calls"] for k in artifact.manifest.kernels)
    assert artifact.manifest.partition_info["padded"] and 0 < shipped.model_flops(tmp_path / "a") < built
    assert shipped.model_flops(tmp_path / "missing") == 0
