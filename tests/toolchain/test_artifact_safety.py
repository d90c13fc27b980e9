"""Nothing lost: an output directory is replaced only when it is positively agoc's own artifact."""

import json
import os

import numpy as np
import pytest

import models
from toolchain.artifact import check_replaceable, elf_damage, foreign_entries, load_artifact, staged_directory
from toolchain.errors import ArtifactError, SelfCheckError
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.targets import find_compiler, resolve_target


def compile_tiny(out, device=None, **kw):
    spec = resolve_target("host")
    kw.setdefault("untuned", "plain")  # what these tests write and check is the artifact, not its schedules
    request = CompileRequest(models.build("tiny-cnn"), "tiny-cnn", spec, **kw)
    return compile_model(request, find_compiler(spec), out, device=device)


def tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def fake_artifact(root, extra=()):
    """The files of an agoc artifact as its manifest names them (contents need not be real here)."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"schema": "agoc.artifact/1", "library": "model.so", "model": {"file": "model.onnx"},
                "inputs": [{"file": "data/input_0.bin"}], "outputs": [{"file": "data/expected_0.bin"}]}
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "data").mkdir()
    for rel in ("model.so", "model.onnx", "io.txt", "data/input_0.bin", "data/expected_0.bin", *extra):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    return root


def test_a_folder_holding_a_manifest_json_of_its_own_is_not_replaced(tmp_path):
    web = tmp_path / "webapp"
    (web / "src").mkdir(parents=True)
    (web / "manifest.json").write_text('{"name": "my app", "icons": []}')
    (web / "index.html").write_text("<html>")
    (web / "src" / "app.js").write_text("main()")
    before = tree(web)
    with pytest.raises(ArtifactError, match="not an agoc artifact.*index.html"):
        compile_tiny(web)
    assert tree(web) == before and (web / "index.html").read_text() == "<html>"


def test_compiling_to_dot_inside_an_artifact_refuses_and_keeps_it(tmp_path, monkeypatch):
    art = compile_tiny(tmp_path / "art")
    (art.root / "notes.txt").write_text("mine")
    before = tree(art.root)
    monkeypatch.chdir(art.root)
    with pytest.raises(ArtifactError, match="the directory you are in"):
        compile_tiny(".")
    assert tree(art.root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_an_artifact_with_a_file_added_by_the_user_is_not_replaced(tmp_path):
    root = fake_artifact(tmp_path / "a", extra=("data/my_calibration.npy",))
    assert foreign_entries(root) == ["data/my_calibration.npy"]
    with pytest.raises(ArtifactError, match="my_calibration.npy"):
        check_replaceable(root)


def test_an_artifact_holding_only_its_own_files_is_replaceable(tmp_path):
    root = fake_artifact(tmp_path / "a")
    assert foreign_entries(root) == []
    check_replaceable(root)


@pytest.mark.parametrize("schema", ["other/1", None])
def test_a_manifest_without_agocs_schema_marks_nothing_as_agocs(tmp_path, schema):
    root = fake_artifact(tmp_path / "a")
    data = json.loads((root / "manifest.json").read_text())
    data["schema"] = schema
    (root / "manifest.json").write_text(json.dumps(data))
    assert "manifest.json" in foreign_entries(root)


def test_parents_of_the_working_directory_and_symlinks_are_refused(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    with pytest.raises(ArtifactError, match="the directory you are in"):
        check_replaceable(tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "link")
    with pytest.raises(ArtifactError, match="symbolic link"):
        check_replaceable(tmp_path / "link")


def test_a_symlink_inside_an_artifact_makes_it_foreign(tmp_path):
    root = fake_artifact(tmp_path / "a")
    (root / "io.txt").unlink()
    os.symlink(tmp_path, root / "io.txt")
    assert foreign_entries(root) == ["io.txt"]


def test_a_failed_build_keeps_the_old_artifact_and_leaves_no_staging(tmp_path):
    root = fake_artifact(tmp_path / "a")
    before = tree(root)
    with pytest.raises(RuntimeError):
        with staged_directory(root) as staging:
            (staging / "model.so").write_text("new")
            raise RuntimeError("build failed")
    assert tree(root) == before and (root / "model.so").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_a_file_appearing_in_out_during_the_build_stops_the_replacement(tmp_path):
    root = fake_artifact(tmp_path / "a")
    with pytest.raises(ArtifactError, match="late.txt"):
        with staged_directory(root) as staging:
            (staging / "manifest.json").write_text("{}")
            (root / "late.txt").write_text("the user's")
    assert (root / "late.txt").read_text() == "the user's" and (root / "model.so").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_an_unwritable_destination_is_refused_before_the_build(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="cannot write"):
        compile_tiny(tmp_path / "file" / "out")
    with pytest.raises(ArtifactError, match="cannot write"):
        compile_tiny("/proc/agoc-out")


class WrongDevice:
    """A device that returns every output plus one: what a miscompiled library looks like."""

    name = "wrong"

    def run(self, artifact, inputs):
        from toolchain.runtime import VMSession

        outputs = [t.info.name for t in artifact.manifest.outputs]
        real = VMSession(artifact.library_path, [t.info for t in artifact.manifest.inputs], outputs).run(inputs)
        return {k: v + np.float32(1) for k, v in real.items()}


def test_a_library_that_disagrees_with_onnxruntime_is_not_written(tmp_path):
    old = compile_tiny(tmp_path / "a")
    with pytest.raises(SelfCheckError, match="disagrees with onnxruntime on wrong.*max abs error 1"):
        compile_tiny(tmp_path / "a", seed=5, device=WrongDevice())
    assert load_artifact(tmp_path / "a").manifest.sample_seed == old.manifest.sample_seed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_the_self_check_is_recorded_and_no_check_skips_it(tmp_path):
    art = compile_tiny(tmp_path / "a")
    assert art.manifest.check["status"] == "passed" and art.manifest.check["max_abs"] < 1e-4
    art = compile_tiny(tmp_path / "b", check=False, device=WrongDevice())
    assert art.manifest.check == {"status": "skipped", "reason": "--no-check"}


def test_an_arm_build_without_a_device_is_recorded_unchecked(tmp_path):
    from tests.conftest import require_tool

    require_tool("aarch64-linux-gnu-g++")
    spec = resolve_target("linux-arm64")
    art = compile_model(CompileRequest(models.build("tiny-cnn"), "t", spec, untuned="plain"), find_compiler(spec),
                        tmp_path / "a")
    assert art.manifest.check["status"] == "unchecked" and "agoc verify" in art.manifest.check["reason"]


def test_a_truncated_library_is_reported_not_loaded(tmp_path):
    art = compile_tiny(tmp_path / "a")
    data = art.library_path.read_bytes()
    assert elf_damage(art.library_path) is None
    art.library_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="damaged.*cut short"):
        load_artifact(art.root)
    art.library_path.write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="not a 64-bit"):
        load_artifact(art.root)


def test_a_tuning_database_is_never_made_inside_a_foreign_folder(tmp_path):
    from toolchain.tune.db import TuneDB
    from toolchain.tune.settings import TuningError

    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "thesis.tex").write_text("precious")
    with pytest.raises(TuningError, match="not a tuning database.*thesis.tex"):
        TuneDB(tmp_path / "db").open_session({"settings": {}})
    assert tree(tmp_path / "db") == ["thesis.tex"]


def test_a_work_dir_is_emptied_only_when_agoc_made_it(tmp_path):
    from toolchain.artifact import WORK_MARKER, fresh_work_dir

    work = fresh_work_dir(tmp_path / "w")
    (work / "database_tuning_record.json").write_text("[]")
    assert tree(fresh_work_dir(work)) == [WORK_MARKER]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.csv").write_text("1,2")
    with pytest.raises(ArtifactError, match="not a work directory of agoc's"):
        fresh_work_dir(tmp_path / "mine")
    assert tree(tmp_path / "mine") == ["data.csv"]


def test_the_users_sample_inputs_are_stored_and_checked(tmp_path):
    from toolchain.errors import InputShapeError

    x = np.full((1, 3, 16, 16), 0.5, np.float32)
    art = compile_tiny(tmp_path / "a", samples={"input": x})
    assert np.array_equal(art.read_inputs()["input"], x) and art.manifest.check["status"] == "passed"
    with pytest.raises(InputShapeError, match="sample input 'input' is float32\\[1, 3, 8, 8\\]"):
        compile_tiny(tmp_path / "b", samples={"input": x[:, :, :8, :8]})
    with pytest.raises(InputShapeError, match="not inputs of the model"):
        compile_tiny(tmp_path / "b", samples={"input": x, "other": x})
