"""`--precision fp16` in tuning: a float16 candidate is held to float16's tolerance, a session and a record library
keep one precision, and a float16 session's roof is a float16 matmul."""

import json

import pytest

from toolchain.targets import resolve_target
from toolchain.tune import check_candidate
from toolchain.tune.db import TuneDB
from toolchain.tune.library import Library, LibraryError, _check_same, target_key
from toolchain.tune.settings import SCHEMA, TuneSettings, TuningError

HOST = resolve_target("host", num_cores=2)


def _matmul(dtype: str, m: int = 32, k: int = 512, n: int = 32):
    from tvm import te

    a, b = te.placeholder((m, k), name="A", dtype=dtype), te.placeholder((k, n), name="B", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def _summed_in_another_order(func):
    """A right schedule that adds the reduction up in 8 partial sums (rfactor): another rounding, the same maths."""
    from tvm import s_tir

    from toolchain.tune.adapter import workload_module

    sch = s_tir.Schedule(workload_module(func))
    k = sch.get_loops(sch.get_sblock("C"))[-1]
    _, inner = sch.split(k, factors=[None, 8])
    sch.rfactor(inner, 0)
    return sch


def _check(func, sch) -> dict:
    import tvm

    from toolchain.tune.adapter import workload_module
    from toolchain.tune.traces import plain

    return check_candidate.check(tvm.ir.save_json(workload_module(func)), plain(sch.trace.as_json()),
                                 HOST.tvm_target)


def test_a_float16_candidate_is_held_to_float16s_tolerance_and_a_float32_one_to_float32s():
    """The same reordering of a 512-long sum: within float16's tolerance in float16 (and beyond float32's: the
    tolerance is what lets it pass), within float32's in float32."""
    assert check_candidate.tolerance("float16") == (1e-3, 2e-2)
    assert check_candidate.tolerance("float32") == (check_candidate.ATOL, check_candidate.RTOL)
    half = _matmul("float16")
    found = _check(half, _summed_in_another_order(half))
    assert found["ok"], found
    assert found["max_abs"] > check_candidate.ATOL + check_candidate.RTOL * found["max_ref"], found
    single = _matmul("float32")
    assert _check(single, _summed_in_another_order(single))["ok"]


def _session(spec, precision: str | None) -> dict:
    return {"schema": SCHEMA, "model_sha256": "0" * 64, "target": spec.tvm_target, "layout": spec.layout,
            "pad_channels": False, "fast_math": False, "settings": TuneSettings().to_json(),
            **({"precision": precision} if precision else {})}


def test_a_database_keeps_the_precision_it_was_tuned_in(tmp_path):
    half, single = resolve_target("linux-arm64", precision="fp16"), resolve_target("linux-arm64")
    db = TuneDB(tmp_path / "db")
    db.open_session(_session(half, "fp16"))
    assert db.precision == "fp16"
    db.open_session(_session(half, "fp16"))  # resumed in the same precision
    with pytest.raises(TuningError, match=r"different precision \(\"fp16\" vs \"fp32\"\).*--precision fp16"):
        db.open_session(_session(single, "fp32"))
    old = TuneDB(tmp_path / "old")  # made before the setting: float32, and resumed so
    old.open_session(_session(single, None))
    assert old.precision == "fp32"
    old.open_session(_session(single, "fp32"))
    assert json.loads((tmp_path / "old" / "session.json").read_text()).get("precision", "fp32") == "fp32"


def test_a_library_holds_one_precision_and_serves_only_it(tmp_path):
    half, single = resolve_target("linux-arm64", precision="fp16"), resolve_target("linux-arm64")
    key = target_key(single.tvm_target)
    assert key == target_key(half.tvm_target)  # the mattr is not in the key: the precision tells them apart
    made_before = Library(tmp_path, {"target_key": key, "layout": "NHWC"})
    assert made_before.precision == "fp32" and made_before.serves(single) and not made_before.serves(half)
    with pytest.raises(LibraryError, match=r"\(NHWC, fp32\), not for .*\(NHWC, fp16\)"):
        made_before.check(half)
    assert Library(tmp_path, {"target_key": key, "layout": "NHWC", "precision": "fp16"}).serves(half)
    found = {"target": half.tvm_target, "layout": "NHWC", "precision": "fp16"}
    with pytest.raises(LibraryError, match="one precision per library"):
        _check_same({"target": single.tvm_target, "target_key": key, "layout": "NHWC"}, found, tmp_path / "db",
                    tmp_path / "lib")


def test_a_float16_sessions_roof_is_a_float16_matmul_with_a_register_block():
    from toolchain import roofline
    from toolchain.tune.untuned import block_schedule

    probe = roofline.roof_probe("float16")
    assert {str(p.ty.dtype) for p in probe.params} == {"float16"}
    sch, shape = block_schedule(probe, resolve_target("linux-arm64", precision="fp16"))
    assert sch is not None and shape.count("×") == 2
    assert "float16" in sch.mod.script()
