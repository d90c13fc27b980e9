"""`agoc bench ARTIFACT --against onnxruntime`: both engines timed on this machine, in processes of their own,
warm and cold; the ratio is theirs. Timings are not asserted, only that both ran and the ratio is theirs."""

import json

import pytest

from tests.host.test_cli import assert_clean_error


def test_a_host_artifact_is_timed_beside_onnxruntime_in_both_regimes_and_nothing_else_is(cli, tmp_path):
    out = tmp_path / "art"
    assert cli("compile", "zoo:tiny-cnn", "-o", out).exit_code == 0
    result = cli("bench", out, "--against", "onnxruntime", "--repeat", "30", "--threads", "1", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["threads"] == 1 and doc["rounds"] == 3
    for regime in ("warm", "cold"):
        ms = doc["median_ms"][regime]
        assert ms["agoc"] > 0 and ms["onnxruntime"] > 0 and not doc["failures"][regime]
        rounds = doc["per_round_ms"][regime]  # the median of the rounds' ratios: both engines timed in each
        assert len(rounds["agoc"]) == len(rounds["onnxruntime"]) == 3
        paired = sorted(o / a for o, a in zip(rounds["onnxruntime"], rounds["agoc"]))[1]
        assert abs(doc["speedup"][regime] - paired) < 1e-9
    assert set(doc["disturbed_rounds"]) == {"warm", "cold"}
    table = cli("bench", out, "--against", "onnxruntime", "--repeat", "30")
    assert table.exit_code == 0 and "speed-up" in table.stdout and "cold" in table.stdout


    assert_clean_error(cli("bench", out, "--against", "tflite"), "--against onnxruntime")
    assert_clean_error(cli("bench", out, "--against", "onnxruntime", "--device", "qemu"), "leave out --device")


@pytest.mark.slow  # ~1 minute: the engines crawl beside the busy processes
def test_rounds_timed_while_other_programs_hold_the_cores_are_flagged(cli, tmp_path):
    """A busy process on every core: the engines' threads (one per core) wait on a run queue, and the table says so."""
    import os
    import subprocess
    import sys

    out = tmp_path / "art"
    assert cli("compile", "zoo:tiny-cnn", "-o", out).exit_code == 0
    hogs = [subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 60: pass"])
            for _ in range((os.cpu_count() or 1) + 1)]
    try:
        result = cli("bench", out, "--against", "onnxruntime", "--repeat", "30")  # a thread per core, each held
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.exit_code == 0, result.stderr
    assert "other programs kept this machine's cores busy" in " ".join(result.stdout.split())


def test_the_table_names_the_rounds_other_programs_disturbed():
    from rich.console import Console

    from host.bench.against import Comparison
    from host.render import against_table

    def shown(disturbed):
        result = Comparison(2, 5, 10, {"warm": {"agoc": 1.0, "onnxruntime": 1.2}}, {"warm": 1.2}, {"warm": {}},
                            disturbed)
        console = Console(width=200, record=True)
        console.print(against_table("m", result))
        return " ".join(console.export_text().split())

    assert "onnxruntime 2/5 warm" in shown({"warm": {"onnxruntime": 2}})
    assert "other programs" not in shown({"warm": {}})


def test_the_ratio_is_the_median_of_the_rounds_ratios_so_a_slow_spell_of_the_host_cancels():
    """Round 3 ran in a slow spell for both engines: each round's ratio is 1.2, the ratio of the medians is not."""
    from host.bench.against import paired_ratio

    per_round = {"agoc": [1.0, 1.0, 3.0, 3.0, 3.0], "onnxruntime": [1.2, 1.2, 3.6, 3.6, 3.6]}
    medians = {"agoc": 1.0, "onnxruntime": 3.6}  # as if the engines' samples fell unevenly into the spell
    assert paired_ratio(per_round, medians) == pytest.approx(1.2)
    assert paired_ratio({"agoc": [1.0], "onnxruntime": []}, medians) == pytest.approx(3.6)  # no pairs: the medians'


def test_another_build_is_timed_in_the_same_rounds_and_its_ratio_is_the_rounds(cli, tmp_path):
    """AGO's build against stock TVM's and onnxruntime in one run: each member's ratio to the artifact from the rounds
    where both were timed; a build of other inputs, or no build at all, is refused before anything is timed."""
    ago, stock, other = tmp_path / "ago", tmp_path / "stock", tmp_path / "other"
    assert cli("compile", "zoo:tiny-cnn", "-o", ago).exit_code == 0
    assert cli("compile", "zoo:tiny-cnn", "-o", stock, "--partition", "stock").exit_code == 0
    result = cli("bench", ago, "--against", "onnxruntime", "--against", stock, "--repeat", "30", "--threads", "1",
                 "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["builds"] == {"stock": str(stock)}
    for regime in ("warm", "cold"):
        rounds = doc["per_round_ms"][regime]
        assert len(rounds["agoc"]) == len(rounds["stock"]) == len(rounds["onnxruntime"]) == 3
        for member in ("stock", "onnxruntime"):
            paired = sorted(o / a for o, a in zip(rounds[member], rounds["agoc"]))[1]
            assert abs(doc["versus"][regime][member] - paired) < 1e-9
        assert doc["speedup"][regime] == doc["versus"][regime]["onnxruntime"]
    table = cli("bench", ago, "--against", stock, "--repeat", "30")  # builds alone, no reference
    text = " ".join(table.stdout.split())
    assert table.exit_code == 0 and "stock ÷ ago" in text and "onnxruntime ms" not in text

    assert cli("compile", "zoo:tiny-cnn@1x3x32x32", "-o", other).exit_code == 0
    assert_clean_error(cli("bench", ago, "--against", other), "same input shape")
    assert_clean_error(cli("bench", ago, "--against", tmp_path / "nowhere"), "no artifact directory")
