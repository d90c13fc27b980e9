"""`agoc bench ARTIFACT --against onnxruntime`: both engines timed on this machine, in processes of their own,
warm and cold; the ratio is theirs. Timings are not asserted, only that both ran and the ratio is theirs."""

import json

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
        assert abs(doc["speedup"][regime] - ms["onnxruntime"] / ms["agoc"]) < 1e-9
    table = cli("bench", out, "--against", "onnxruntime", "--repeat", "30")
    assert table.exit_code == 0 and "speed-up" in table.stdout and "cold" in table.stdout


    assert_clean_error(cli("bench", out, "--against", "tflite"), "--against onnxruntime")
    assert_clean_error(cli("bench", out, "--against", "onnxruntime", "--device", "qemu"), "leave out --device")
