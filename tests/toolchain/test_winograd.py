"""Winograd 3×3 convs (toolchain/winograd.py, toolchain/tune/winograd.py): which convs, the kernel's numbers against
a direct conv's at both tiles and ragged sizes, its schedule, a model built and verified, and the databases that
record it."""

import numpy as np
import pytest

from host.devices import LocalDevice
from models.builder import GraphBuilder
from toolchain import build, onnx_import, winograd
from toolchain.errors import UnsupportedModelError
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.targets import find_compiler, resolve_target
from toolchain.tune import microkernel
from toolchain.tune import winograd as winograd_schedule
from toolchain.tune.db import TuneDB
from toolchain.tune.settings import SCHEMA, TuneSettings, TuningError
from toolchain.verify import verify_artifact


def direct_conv(x: np.ndarray, w_ohwi: np.ndarray, padding) -> np.ndarray:
    """NHWC 3×3 stride-1 conv in float64, the reference."""
    top, left, bottom, right = padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    ho, wo = xp.shape[1] - 2, xp.shape[2] - 2
    out = np.zeros((1, ho, wo, w_ohwi.shape[0]))
    for r in range(3):
        for s in range(3):
            out += np.einsum("nhwi,oi->nhwo", xp[:, r:r + ho, s:s + wo, :], w_ohwi[:, r, s, :].astype(np.float64))
    return out


def run_kernel(conv: winograd.Conv, x, w_ohwi, scheduled: bool):
    import tvm

    spec = resolve_target("host")
    func = winograd.kernel(conv)
    if scheduled:
        sch, shape = winograd_schedule.schedule(func, spec.tvm())
        assert sch is not None, shape
        mod = sch.mod
    else:
        mod = tvm.IRModule({"main": func})
    lib = tvm.compile(mod, target=spec.tvm())
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((1, conv.out_height, conv.out_width, conv.out_channels), "float32"), dev)
    lib["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(winograd.transformed_weight(w_ohwi, conv.m), dev), out)
    return out.numpy()


@pytest.mark.parametrize("m, size, channels, padding", [
    (4, (14, 14), (16, 32), (1, 1, 1, 1)),
    (4, (13, 15), (8, 24), (1, 1, 1, 1)),  # ragged: the last tiles cut off, odd channel counts of vectors
    (2, (7, 7), (32, 16), (1, 1, 1, 1)),
    (2, (9, 8), (16, 16), (0, 0, 0, 0)),  # "valid": no padding, 7 × 6 outputs
    (4, (16, 12), (16, 16), (0, 1, 2, 1)),  # asymmetric padding
])
@pytest.mark.parametrize("scheduled", [False, True])
def test_the_kernel_computes_the_direct_conv(m, size, channels, padding, scheduled):
    rng = np.random.default_rng(1)
    conv = winograd.Conv(*size, *channels, padding, m)
    x = rng.uniform(-1, 1, (1, *size, channels[0])).astype("float32")
    w = rng.uniform(-1, 1, (channels[1], 3, 3, channels[0])).astype("float32")
    got, want = run_kernel(conv, x, w, scheduled), direct_conv(x, w, padding)
    assert got.shape == want.shape
    # F(4, 3)'s transforms scale by up to 10: a few float32 roundings of values ~10 ulp apart; well within verify's
    # 1e-5 + 1e-4 of the largest output
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


def test_its_schedule_is_one_register_block_for_the_matmul_and_nothing_matmul_like_takes_it():
    spec = resolve_target("host")
    func = winograd.kernel(winograd.Conv(28, 28, 32, 64, (1, 1, 1, 1), 4))
    assert winograd.is_winograd(func)
    assert microkernel.matmul_like(func) is None  # the register block's other rules never see its blocks
    sch, shape = microkernel.register_block(func, spec.tvm())
    assert sch is not None and len(shape.split("×")) == 3
    lowered = str(sch.mod)
    assert lowered.count("T.parallel") >= 3  # the two transforms and the matmul, each over all cores


def conv_call(shape=(1, 16, 16, 16), weight=(32, 3, 3, 16), strides=(1, 1), groups=1, padding=(1, 1, 1, 1),
              layout=("NHWC", "OHWI")):
    from tvm import relax

    x = relax.Var("x", relax.TensorType(shape, "float32"))
    w = relax.const(np.zeros(weight, "float32"))
    return relax.op.nn.conv2d(x, w, strides=strides, padding=padding, groups=groups, data_layout=layout[0],
                              kernel_layout=layout[1])


def test_which_convs_it_takes():
    assert winograd.conv_of(conv_call()).m == 4  # 16 × 16 outputs: 4 × 4 tiles
    assert winograd.conv_of(conv_call(shape=(1, 8, 8, 16))).m == 2  # 8 × 8: 4 tiles of 4 × 4, 16 of 2 × 2
    # ResNet's 14 × 14 × 256: 4 × 4 tiles' transformed weight is 9.4 MB, 2 × 2 tiles' 4.2 MB
    assert winograd.conv_of(conv_call(shape=(1, 14, 14, 256), weight=(256, 3, 3, 256))).m == 2
    refused = {
        "a stride of 2": conv_call(strides=(2, 2)),
        "a 1×1 window": conv_call(weight=(32, 1, 1, 16), padding=(0, 0, 0, 0)),
        "groups": conv_call(weight=(16, 3, 3, 1), groups=16),
        "few input channels (a stem)": conv_call(shape=(1, 16, 16, 3), weight=(32, 3, 3, 3)),
        "a small output": conv_call(shape=(1, 5, 5, 16)),
        "too large a transformed weight for its tiles (ResNet's 7 × 7 × 512)": conv_call(
            shape=(1, 7, 7, 512), weight=(512, 3, 3, 512)),
        "NCHW": conv_call(shape=(1, 16, 16, 16), weight=(32, 16, 3, 3), layout=("NCHW", "OIHW")),
    }
    for why, call in refused.items():
        assert winograd.conv_of(call) is None, why


def model_3x3():
    """x → 3×3 conv 16 → 32 + ReLU → 3×3 conv 32 → 16 at 20 × 20, and a stride-2 conv beside them that stays direct."""
    g = GraphBuilder("wino", seed=0)
    x = g.input("x", (1, 16, 20, 20))
    h = g.conv(x, 16, 32, 3, name="c1", act="relu")
    y = g.conv(h, 32, 16, 3, name="c2")
    return g.finish(g.add(y, x, name="res"), (1, 16, 20, 20))


def _legalized(model, **kw):
    spec = resolve_target("host", **kw)
    return build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)


def test_legalizing_rewrites_the_3x3_convs_and_direct_conv_keeps_them():
    wino, direct = _legalized(model_3x3()), _legalized(model_3x3(), winograd=False)
    assert winograd.applied(wino) and not winograd.applied(direct)
    names = " ".join(gv.name_hint for gv in wino.functions)
    assert names.count(winograd.FUNC_NAME) == 2
    assert winograd.FUNC_NAME not in " ".join(gv.name_hint for gv in direct.functions)


@pytest.mark.parametrize("partition", ["ago", "stock"])
def test_a_model_built_with_winograd_convs_matches_onnxruntime(partition, tmp_path):
    from toolchain.settings import PartitionSettings

    spec = resolve_target("host")
    request = CompileRequest(model_3x3(), "wino", spec, partition=PartitionSettings(partition),
                             dump_dir=tmp_path / "ir")
    artifact = compile_model(request, find_compiler(spec), tmp_path / "a")
    given = artifact.manifest.untuned["given"]
    winos = [g for g in given if winograd.FUNC_NAME in g["kernel"]]
    assert len(winos) == 2 and all(g["source"] == "block" for g in winos), given  # its own schedule, not a sample
    # ...and applied: its transforms' blocks are annotated not to be inlined in a search (tune.inlining), which a
    # lookup by the model's kernel missed, leaving it unscheduled (one core, 30x slower)
    built = (tmp_path / "ir" / "04_scheduled.py").read_text().split("@T.prim_func")
    kernels = [k for k in built if f"def fused_{winograd.FUNC_NAME}" in k]
    assert len(kernels) == 2 and all("T.parallel" in k for k in kernels)
    report = verify_artifact(artifact, LocalDevice())
    assert report.passed, report.to_json()


def test_a_database_keeps_the_convs_it_was_tuned_with(tmp_path):
    """Winograd and direct convs are different kernels: a database made before the setting (direct) resumes only
    with direct convs, and compiles only with them, where the model has such a conv."""
    old = {"schema": SCHEMA, "model_sha256": "a" * 64, "target": {"kind": "llvm"}, "layout": "NHWC",
           "settings": TuneSettings(trials=8).to_json()}
    db = TuneDB(tmp_path)
    db.open_session(old)
    assert db.winograd is False
    with pytest.raises(TuningError, match="different winograd.*--direct-conv"):
        db.open_session({**old, "winograd": True})
    spec = resolve_target("host")
    with pytest.raises(UnsupportedModelError, match="direct 3×3 convs; compile with --direct-conv"):
        compile_model(CompileRequest(model_3x3(), "wino", spec, db=tmp_path), find_compiler(spec), tmp_path / "a")


def test_a_tune_searches_its_matmuls_block_and_every_sample_computes_the_conv():
    """MetaSchedule's own space failed on the transforms ("TensorRegion pattern match failed"): a Winograd conv is
    searched in its own schedule with the matmul's rows and vectors sampled, and the samples are right."""
    from toolchain.tune.adapter import workload_module
    from toolchain.tune.candidates import random_args, run
    from toolchain.tune.intrinsics import tune_context
    from toolchain.tune.space import make_space_generator

    spec = resolve_target("host")
    func = winograd.kernel(winograd.Conv(14, 14, 16, 64, (1, 1, 1, 1), 4))
    chosen = make_space_generator(func, spec.tvm())
    assert chosen.kind == "winograd"
    ctx = tune_context(mod=workload_module(func), target=spec.tvm(), space_generator=chosen.generator, num_threads=1)
    (design,) = ctx.generate_design_space()
    decisions = [d for inst, d in design.trace.decisions.items() if inst.kind.name == "SamplePerfectTile"]
    assert len(decisions) == 2  # the rows of tiles, the vectors of output channels
    args = random_args(func, 0)
    np.testing.assert_allclose(run(design.mod, args, spec.tvm())[-1], run(func, args, spec.tvm())[-1],
                               rtol=1e-4, atol=1e-4)
