"""The `agoc` CLI through typer's test runner: happy paths and every user error."""

import json

import onnx
from onnx import TensorProto, helper

import models
from models.registry import IR_VERSION, OPSET


def assert_clean_error(result, *fragments):
    """Exit 1, one line on stderr that starts with 'error:', no traceback."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_compile_verify_inspect_a_matmul_softmax_layernorm_model(cli, model_file, tmp_path):
    src = model_file("tiny-transformer")
    out = tmp_path / "art"
    result = cli("compile", src, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "tiny-transformer" in result.stdout and "kernels" in result.stdout

    result = cli("verify", out, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and report["reference"] == "onnxruntime"
    assert report["outputs"][0]["name"] == "output" and report["outputs"][0]["max_abs"] < 1e-3

    result = cli("verify", out)
    assert result.exit_code == 0 and "PASS" in result.stdout and "max abs err" in result.stdout

    result = cli("inspect", out)
    assert result.exit_code == 0
    for text in ("inputs", "outputs", "Softmax", "LayerNormalization", "fused kernels", "softmax"):
        assert text in result.stdout, text


def test_compile_zoo_reference_with_shape(cli, tmp_path):
    result = cli("compile", "zoo:tiny-cnn@1x3x32x32", "-o", tmp_path / "a")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["inputs"][0]["shape"] == [1, 3, 32, 32]


def test_verify_exits_1_when_over_tolerance(cli, tmp_path):
    out = tmp_path / "a"
    assert cli("compile", "zoo:tiny-cnn", "-o", out).exit_code == 0
    result = cli("verify", out, "--atol", "0", "--rtol", "1e-12")
    # TVM and onnxruntime sum in different orders: not bit-identical, so a zero tolerance fails
    assert result.exit_code == 1
    assert "FAIL" in result.stdout and "over tolerance" in result.stdout


def test_missing_file(cli, tmp_path):
    assert_clean_error(cli("compile", tmp_path / "absent.onnx", "-o", tmp_path / "o"), "no such file", "absent.onnx")


def test_non_onnx_file(cli, tmp_path):
    path = tmp_path / "image.onnx"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    assert_clean_error(cli("compile", path, "-o", tmp_path / "o"), "not a readable ONNX model")


def test_truncated_file(cli, model_file, tmp_path):
    data = model_file("tiny-transformer").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) - 100])
    assert_clean_error(cli("compile", path, "-o", tmp_path / "o"), "truncated or not ONNX")


def test_unsupported_op(cli, tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Det", ["r"], ["y"], name="det0")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION), path)
    assert_clean_error(cli("compile", path, "-o", tmp_path / "o"), "unsupported ONNX op: Det (node 'det0')")
    assert not (tmp_path / "o").exists()


def test_dynamic_dimensions_need_input_shape_but_a_dynamic_batch_defaults_to_1(cli, tmp_path):
    model = models.build("tiny-transformer")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[1].dim_param = "batch", "tokens"
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    assert_clean_error(
        cli("compile", path, "-o", tmp_path / "o"), "dynamic shape [batch, tokens, 32]", "--input-shape input=1x1x32"
    )
    dims[1].dim_value = 16
    onnx.save(model, path)
    result = cli("compile", path, "-o", tmp_path / "o")
    assert result.exit_code == 0, result.stderr
    assert "input 'input' has a dynamic batch dimension [batch, 16, 32]: compiling for batch 1" in result.stderr
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["inputs"][0]["shape"] == [1, 16, 32]
    result = cli("compile", path, "-o", tmp_path / "o", "--input-shape", "input=2x16x32")
    assert result.exit_code == 0, result.stderr
    assert "dynamic batch" not in result.stderr


def test_unknown_target(cli, tmp_path):
    assert_clean_error(
        cli("compile", "zoo:tiny-cnn", "--target", "riscv", "-o", tmp_path / "o"),
        "unknown target 'riscv'",
        "host, host-avx2, linux-arm64, android-arm64, android-arm64-ndk",
    )


def test_android_without_ndk(cli, tmp_path, monkeypatch):
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    assert_clean_error(
        cli("compile", "zoo:tiny-cnn", "--target", "android-arm64-ndk", "-o", tmp_path / "o"), "ANDROID_NDK_HOME"
    )


def test_bad_input_shape_and_unknown_zoo_model(cli, tmp_path):
    assert_clean_error(cli("compile", "zoo:tiny-cnn", "-s", "image=1x3x8x8", "-o", tmp_path / "o"), "'image'")
    assert_clean_error(cli("compile", "zoo:resnet-999", "-o", tmp_path / "o"), "unknown zoo model 'resnet-999'")
    # a spatial size alone (the suites' --shapes 112) is not a zoo shape: said so, not an internal error
    assert_clean_error(cli("partition", "zoo:mobilenet-v2@112"),
                       "bad shape '112' for zoo:mobilenet-v2: its input has 4 dimensions, "
                       "e.g. zoo:mobilenet-v2@1x3x224x224")


def test_verify_and_inspect_of_a_non_artifact(cli, tmp_path):
    assert_clean_error(cli("verify", tmp_path), "not an agoc artifact")
    assert_clean_error(cli("verify", tmp_path / "nothing"), "no artifact directory")


def test_verify_on_an_unknown_device(cli, tmp_path):
    assert cli("compile", "zoo:tiny-cnn", "-o", tmp_path / "a").exit_code == 0
    assert_clean_error(cli("verify", tmp_path / "a", "--device", "pixel9"), "unknown device 'pixel9'")


def test_debug_shows_the_exception(cli, tmp_path):
    from toolchain.errors import ModelLoadError

    result = cli("--debug", "compile", tmp_path / "absent.onnx", "-o", tmp_path / "o")
    assert result.exit_code == 1
    assert isinstance(result.exception, ModelLoadError)


def test_inspect_an_onnx_file_shows_ops_and_kernels(cli, model_file):
    result = cli("inspect", model_file("tiny-dwsep"), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["op_counts"] == {"Conv": 3, "Clip": 2, "Add": 1}
    assert data["inputs"] == [{"name": "input", "shape": [1, 8, 16, 16], "dtype": "float32"}]
    # stock FuseOps: one conv per kernel, and in NHWC (the default) a transpose of the input and the output
    assert len(data["kernels"]) == 5 and sum(k["name"].startswith("transpose") for k in data["kernels"]) == 2
    result = cli("inspect", model_file("tiny-dwsep"))
    assert result.exit_code == 0 and "Conv" in result.stdout and "fused kernels" in result.stdout


def test_inspect_a_dynamic_model_without_shape_still_shows_ops(cli, tmp_path):
    model = models.build("tiny-cnn")
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param, dims[2].dim_param = "N", "H"  # (a dynamic batch alone defaults to 1)
    path = tmp_path / "dyn.onnx"
    onnx.save(model, path)
    result = cli("inspect", path)
    assert result.exit_code == 0 and "Conv" in result.stdout and "no kernels" in result.stdout


def test_models_list_and_export(cli, tmp_path):
    result = cli("models", "list")
    assert result.exit_code == 0 and "tiny-cnn" in result.stdout
    out = tmp_path / "m.onnx"
    result = cli("models", "export", "tiny-cnn", "--shape", "1x3x8x8", "-o", out)
    assert result.exit_code == 0
    exported = onnx.load(str(out))
    assert [d.dim_value for d in exported.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 8, 8]
    assert_clean_error(cli("models", "export", "nope", "-o", out), "unknown zoo model 'nope'")


def test_targets_and_version(cli):
    result = cli("targets")
    assert result.exit_code == 0 and "android-arm64" in result.stdout and "linux-arm64" in result.stdout
    result = cli("--version")
    assert result.exit_code == 0 and "apache-tvm 0.27.0.post1" in result.stdout


def test_every_tuning_event_has_one_renderer_and_reads_as_a_line():
    """host/progress.py: each typed event of toolchain.tune.events renders (Verifying alone shows nothing)."""
    import io

    from rich.console import Console

    from host.progress import RENDERERS, TuneProgress
    from toolchain.tune import events as ev

    assert set(RENDERERS) == set(ev.EVENTS) - {ev.Verifying}
    out = io.StringIO()
    view = TuneProgress(Console(file=out, width=200), trials=16, unit=16, scheduler="latency")
    tasks = [{"name": "j", "phase": "joined", "budget": 16}, {"name": "m", "phase": "mini", "budget": 16}]
    with view:
        for event in (ev.Planned(tasks, first_pass=32, total=32, floor=48, unreached=1, allowance=20,
                                 estimate_s=95.0, deadline_s=600.0, trial_s=1.5), ev.Imported("base.db", {"m": 3}),
                      ev.TaskStarted("m", "mini", 0, 16), ev.Seeded("j", composed=True, siblings=["k"], best_ms=0.5),
                      ev.Trials("m", 8, 16, 1.25), ev.Stable("m", 8), ev.Exhausted("m", 8, 8),
                      ev.SearchFailed("m", "no space"), ev.JoinYields("j", 2.0, 1.5, 1.0, 8, "slower"),
                      ev.Verifying("m"), ev.TaskDone("m", 1.0, {"status": "verified", "latency_ms": 1.0}),
                      ev.Round("m", 1.0, 0.1, 8), ev.Pairing("j", 2), ev.Paired("j", 2.0, 1.0, 0.5),
                      ev.Paired("j", error="timeout"), ev.Seeded("j", again=True), ev.OutOfTime(12),
                      ev.Seeded("k", library=["a/b"], best_ms=0.25)):
            view(event)
    text = out.getvalue()
    for line in ("plan: 1 kernel (1 split into 1 minis), 32 trials, 20 of them left (a first batch of 16 for every "
                 "task would take 48: the 1 the budget does not reach start from a seed or are built with an untuned "
                 "schedule)",
                 "about 1 min 35 s (1.5 s a trial, estimated), stopping by 10 min", "32 of them a first batch",
                 "time is up: no more search (12 trials unspent)", "k: starts from 1 schedule(s) from the record "
                 "library (best 0.2500 ms)",
                 "from base.db: 3 records of 1 kernel(s) copied in", "j: starts from the composed mini schedules and "
                 "the schedules of 1 kernel(s) like it (best 0.5000 ms)",
                 "m: stable after 8 trials, 8 left to its join",
                 "every schedule of its space measured after 8 trials; 8 left", "m: the search failed (no space)",
                 "j: 2.0000 ms after a batch, its minis together 1.5000 ms (slower): its 8 remaining",
                 "m: 1.0000 ms verified",
                 "round for m: 1.0000 ms of the model, expected to save 0.1000 ms; 8 trials left",
                 "j timed next to its minis: 2.0000 ms, its minis together 1.0000 ms → built as its minis",
                 "j timed next to its minis: error: timeout", "j: composed again from its minis"):
        assert line in text, line
