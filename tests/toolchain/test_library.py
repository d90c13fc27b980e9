"""Record libraries (toolchain/tune/library.py): the verified schedules of many tuning databases for one
target, deduplicated per kernel, from which a kernel of another model or shape starts its search."""

import functools
import json
from pathlib import Path

import pytest

import models
from toolchain import build, onnx_import
from toolchain.targets import resolve_target
from toolchain.tune import library
from toolchain.tune.adapter import open_database, postprocess, records_of, workload_module
from toolchain.tune.candidates import check_candidate
from toolchain.tune.db import TuneDB
from toolchain.tune.plan import group_kernels
from toolchain.tune.settings import SCHEMA, Task, TuneSettings
from toolchain.tune.traces import plain

SPEC = resolve_target("host")
PW = "fused_conv2d_add_maximum_minimum"  # tiny-dwsep's expanding pointwise conv (+ bias, ReLU6)
DW = "fused_conv2d1_add_maximum_minimum"  # its depthwise conv


def _kernels(shape):
    model = models.build("tiny-dwsep", shape)
    mod = build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), SPEC)
    return {name: f for name, f in group_kernels(build.fuse_stock(mod, SPEC)) if name in (PW, DW)}


@pytest.fixture(scope="module")
def small():
    return _kernels((1, 8, 8, 8))


@functools.cache
def _schedule(func):
    """A schedule of ``func`` as a search's candidate, postprocessed: its conv's output channels split in
    eight-wide tiles (a tile split to re-fit), its outer loops parallel."""
    from tvm import s_tir

    from toolchain.tune import transfer

    sch = s_tir.Schedule(workload_module(func))
    conv = next(b.block for b in transfer.block_nests(func) if b.reduce_extents)
    n, h, _, c, *_ = sch.get_loops(sch.get_sblock(conv))
    channels = int(sch.get(c).extent)
    sch.split(c, sch.sample_perfect_tile(c, n=2, max_innermost_factor=16, decision=[channels // 8, 8]))
    sch.parallel(sch.fuse(n, h))
    return postprocess(sch, SPEC)


def _database(root: Path, kernels: dict, ms_each: dict, spec=SPEC, sha: str = "a" * 64) -> Path:
    """A tuning database as a session leaves it, without measuring: each kernel one record of the given
    latency (ms), verified."""
    from tvm.s_tir import meta_schedule as ms

    db = TuneDB(root)
    db.open_session({"schema": SCHEMA, "model_sha256": sha, "target": spec.tvm_target, "layout": spec.layout,
                     "pad_channels": False, "fast_math": False, "settings": TuneSettings().to_json()})
    database = open_database(db.ms_dir)
    verified = {}
    for name, func in kernels.items():
        sch = _schedule(func)
        workload = database.commit_workload(workload_module(func))
        args = ms.arg_info.ArgInfo.from_prim_func(func)
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [ms_each[name] / 1e3],
                                                               spec.tvm(), args))
        verified[f"{name}-0"] = {"status": "verified", "trace": plain(sch.trace.as_json()),
                                 "latency_ms": ms_each[name]}
    db.save_verified(verified)
    return root


def test_a_library_holds_each_verified_kernel_once_with_its_workload_and_signature(small, tmp_path):
    db = _database(tmp_path / "db", small, {PW: 0.05, DW: 0.02})
    lib = library.build([db], tmp_path / "lib", device="local", command="agoc library build db --out lib")
    assert sorted(e.name.split("/")[1] for e in lib.entries.values()) == sorted(f"{n}-0" for n in small)
    assert lib.counts() == {"conv2d_nhwc": 1, "group_conv2d_nhwc": 1}
    meta = json.loads((tmp_path / "lib" / "library.json").read_text())
    assert meta["format"] == library.FORMAT and meta["target_key"] == library.target_key(SPEC.tvm_target)
    assert meta["layout"] == SPEC.layout and meta["device"] == "local"
    assert meta["commands"] == ["agoc library build db --out lib"]
    assert meta["sources"][0]["model_sha256"] == "a" * 64 and meta["sources"][0]["database"] == str(db)
    loaded = library.Library.load(tmp_path / "lib")
    entry = loaded.entries[next(iter(lib.entries))]
    assert entry.latency_ms in (0.05, 0.02) and entry.trace and entry.samples
    import tvm

    assert "main" in [g.name_hint for g in tvm.ir.load_json(entry.workload).functions]  # re-loadable
    samples = list(loaded.samples())
    assert len(samples) == 2 and all(secs and trace for _, trace, secs in samples)
    assert loaded.cost_model is None  # two samples: too few to train a cost model on


def test_a_library_with_enough_samples_trains_its_cost_model_and_a_session_can_load_it(small, tmp_path, monkeypatch):
    from toolchain.tune import costmodel

    monkeypatch.setattr(library, "MIN_SAMPLES", 2)
    db = _database(tmp_path / "db", small, {PW: 0.05, DW: 0.02})
    lib = library.build([db], tmp_path / "lib", device="local")
    assert lib.cost_model == tmp_path / "lib" / library.COST_MODEL
    assert costmodel.read_info(lib.cost_model)["samples"] == 2
    model = costmodel.load(lib.cost_model, SPEC)
    pw = small[PW]
    (score,) = costmodel.scores(model, workload_module(pw), [plain(_schedule(pw).trace.as_json())], SPEC)
    assert score is not None
    monkeypatch.setattr(library, "MIN_SAMPLES", 3)  # rebuilt with too few: the stale model goes
    assert library.build([db], tmp_path / "lib", device="local").cost_model is None


def test_extending_a_library_keeps_the_faster_schedule_of_a_kernel(small, tmp_path):
    first = _database(tmp_path / "one", small, {PW: 0.05, DW: 0.02}, sha="a" * 64)
    second = _database(tmp_path / "two", {PW: small[PW]}, {PW: 0.01}, sha="b" * 64)
    library.build([first], tmp_path / "lib", command="one")
    lib = library.build([second], tmp_path / "lib", command="two")
    assert len(lib.entries) == 2  # the pointwise conv once
    pw = next(e for e in lib.entries.values() if e.op == "conv2d_nhwc")
    assert pw.latency_ms == 0.01 and pw.source == "b" * 64
    assert lib.meta["commands"] == ["one", "two"] and len(lib.sources) == 2
    assert len(list((tmp_path / "lib").glob("records-*"))) == 1  # the old records file replaced
    slower = _database(tmp_path / "three", {PW: small[PW]}, {PW: 0.09}, sha="c" * 64)
    lib = library.build([slower], tmp_path / "lib")
    assert next(e for e in lib.entries.values() if e.op == "conv2d_nhwc").latency_ms == 0.01


def test_a_library_refuses_another_target_or_layout_and_a_folder_not_its_own(small, tmp_path):
    library.build([_database(tmp_path / "db", small, {PW: 0.05, DW: 0.02})], tmp_path / "lib")
    before = (tmp_path / "lib" / "library.json").read_text()
    other = resolve_target("host-avx2")  # haswell: another CPU
    with pytest.raises(library.LibraryError, match="another --out"):
        library.build([_database(tmp_path / "avx2", {}, {}, spec=other)], tmp_path / "lib")
    nchw = resolve_target("host", layout="NCHW")
    with pytest.raises(library.LibraryError, match="layout"):
        library.build([_database(tmp_path / "nchw", {}, {}, spec=nchw)], tmp_path / "lib")
    assert (tmp_path / "lib" / "library.json").read_text() == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(library.LibraryError, match="not a record library"):
        library.build([tmp_path / "db"], mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    with pytest.raises(library.LibraryError, match="not a tuning database"):
        library.build([mine], tmp_path / "lib2")
    assert not (tmp_path / "lib2").exists()


def test_the_library_serves_only_its_target_and_layout(small, tmp_path):
    lib = library.build([_database(tmp_path / "db", small, {PW: 0.05, DW: 0.02})], tmp_path / "lib")
    assert lib.serves(SPEC)
    assert not lib.serves(resolve_target("host-avx2")) and not lib.serves(resolve_target("host", layout="NCHW"))
    with pytest.raises(library.LibraryError, match="--no-library"):
        lib.check(resolve_target("linux-arm64"))
    task = Task("t", "kernel", (), None, 1.0, 16)
    assert lib.seed(task, small[PW], None, resolve_target("host-avx2"), TuneSettings(), None) == []
    assert lib.seed(task, small[PW], None, SPEC, TuneSettings(transfer=0), None) == []  # no seed the budget has not


def test_a_kernel_of_another_shape_starts_from_a_library_schedule_that_verifies(small, tmp_path):
    """The library's pointwise conv of tiny-dwsep at 8×8 seeds the same conv at 12×12 with 16 channels
    (not in the library): re-fitted, measured, committed as its record, and numerically right."""
    lib = library.build([_database(tmp_path / "db", small, {PW: 0.05, DW: 0.02})], tmp_path / "lib")
    large = _kernels((1, 16, 12, 12))
    func = large[PW]
    assert library.Library.load(tmp_path / "lib").nearest(small[PW], 2)[0].workload_hash == \
        next(e.workload_hash for e in lib.entries.values() if e.op == "conv2d_nhwc")  # its own first
    database = open_database(tmp_path / "session")
    seeded = lib.seed(Task("t", "kernel", (), None, 1.0, 16), func, database, SPEC, TuneSettings(transfer=1), None)
    assert seeded == [f"{'a' * 8}/{PW}-0"]
    (record,) = records_of(database, func)
    assert record.run_secs and check_candidate(func, record, SPEC)["ok"]


def test_library_cli_builds_and_shows_with_exit_codes(small, tmp_path):
    from typer.testing import CliRunner

    from host.cli import app

    db = _database(tmp_path / "db", small, {PW: 0.05, DW: 0.02})
    runner = CliRunner()
    done = runner.invoke(app, ["library", "build", str(db), "--out", str(tmp_path / "lib"), "--device", "local"])
    assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["library", "show", str(tmp_path / "lib")])
    assert done.exit_code == 0 and "group_conv2d_nhwc" in done.output and "a" * 12 in done.output
    done = runner.invoke(app, ["library", "show", str(tmp_path)])
    assert done.exit_code == 1 and "agoc library build" in done.output
    done = runner.invoke(app, ["library", "build", str(tmp_path / "lib"), "--out", str(tmp_path / "x")])
    assert done.exit_code == 1 and "not a tuning database" in done.output
    avx2 = library.build([_database(tmp_path / "avx2", small, {PW: 0.05, DW: 0.02}, spec=resolve_target("host-avx2"))],
                         tmp_path / "lib-avx2")
    done = runner.invoke(app, ["tune", "zoo:tiny-cnn", "--db", str(tmp_path / "tuned"), "--library", str(avx2.path)])
    assert done.exit_code == 1 and "--no-library" in done.output
    assert not (tmp_path / "tuned").exists()  # refused before anything was written
