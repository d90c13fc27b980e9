"""Weight prefetch (toolchain/prefetch.py): a register-blocked kernel over pre-packed weight panels asks, step by
step, for the next task's panel — in the ARM and x86 assembly, with the same results — and only where its rules
say it pays."""

import numpy as np
import pytest

from tests.toolchain.test_asm import TARGETS
from toolchain import asm, prefetch
from toolchain.tune.microkernel import block_matmul


def packed_matmul(k: int, tiles: int, rows: int, vectors: int, lanes: int, m: int = 14, packed: bool = True):
    """C[i, j] = Σ A[i, r] · W[j // P, r, j % P] (P = vectors · lanes: a weight pre-packed in panels of P output
    channels, as ``build.prepack_weights`` stores a blocked kernel's), register-blocked, W marked a weight."""
    from tvm import s_tir, te

    panel = vectors * lanes
    a = te.placeholder((m, k), name="A")
    w = te.placeholder((tiles, k, panel) if packed else (k, tiles * panel), name="W")
    r = te.reduce_axis((0, k), name="r")
    read = (lambda j: w[j // panel, r, j % panel]) if packed else (lambda j: w[r, j])
    c = te.compute((m, tiles * panel), lambda i, j: te.sum(a[i, r] * read(j), axis=r), name="C")
    sch = s_tir.Schedule(te.create_prim_func([a, w, c]))
    return block_matmul(sch, "C", rows, vectors, lanes).mod["main"].with_attr(prefetch.WEIGHTS_ATTR, [1])


#: per ISA: (rows, vectors) of a 7-row block, and panels enough for a weight over the weight_bytes rule
SHAPES = {"neon": (7, 3, 24), "avx512": (7, 2, 8), "avx2": (6, 2, 16)}


def weight_bytes(k: int, tiles: int, vectors: int, lanes: int) -> int:
    return k * tiles * vectors * lanes * 4


def hot(func, isa: str, pipeline: str):
    import tvm

    arch, _, target = TARGETS[isa]
    prefetch.register()
    return asm.hottest(asm.innermost_loops(asm.assembly(func, tvm.target.Target(target), pipeline=pipeline), arch))


@pytest.mark.parametrize("isa", TARGETS)
def test_the_hot_loop_prefetches_the_next_panel_without_spilling(isa):
    _, unit, _ = TARGETS[isa]
    rows, vectors, tiles = SHAPES[isa]
    assert weight_bytes(160, tiles, vectors, unit.lanes) >= prefetch.BOUND["weight_bytes"]
    func = packed_matmul(160, tiles, rows, vectors, unit.lanes, m=2 * rows)
    plain, fetched = hot(func, isa, "default"), hot(func, isa, prefetch.PIPELINE)
    assert plain.prefetches == 0 and fetched.prefetches >= 1, (plain, fetched)
    assert fetched.spills == 0 and fetched.fmas == plain.fmas >= rows * vectors, fetched


def test_the_prefetch_points_one_panel_on_and_changes_no_result():
    import tvm
    from tvm.s_tir import pipeline as stock

    rows, vectors, lanes, tiles, k = 7, 2, 8, 16, 160  # 8 lanes: any x86-64 or AArch64 host runs them
    func = packed_matmul(k, tiles, rows, vectors, lanes)
    target = tvm.target.Target("llvm")
    lowered = stock.default_s_tir_pipeline()[0](tvm.tirx.transform.BindTarget(target.with_host(target))(
        tvm.IRModule({"main": func})))["main"]
    _, streams = prefetch.add_prefetches(lowered, prefetch.weight_names(func))
    assert [(s.width, s.ahead) for s in streams] == [(vectors * lanes, k * vectors * lanes)]  # the next task's panel

    rng = np.random.default_rng(0)
    a = rng.standard_normal((14, k)).astype("float32")
    w = rng.standard_normal((tiles, k, vectors * lanes)).astype("float32")
    want = a @ w.transpose(1, 0, 2).reshape(k, -1)
    dev = tvm.cpu()
    for pipeline in ("default", prefetch.register()):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline=pipeline)
        out = tvm.runtime.tensor(np.zeros(want.shape, "float32"), dev)
        lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(w, dev), out)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["small weight", "unpacked weight", "large panel"])
def test_no_prefetch_where_a_rule_says_it_does_not_pay(case):
    _, unit, _ = TARGETS["avx512"]
    rows, vectors, tiles = SHAPES["avx512"]
    k = {"small weight": 64, "unpacked weight": 160, "large panel": 1024}[case]
    func = packed_matmul(k, tiles if case != "small weight" else 2, rows, vectors, unit.lanes,
                         packed=case != "unpacked weight")
    assert (case == "small weight") == (weight_bytes(k, tiles if case != "small weight" else 2, vectors, unit.lanes)
                                        < prefetch.BOUND["weight_bytes"])
    assert hot(func, "avx512", prefetch.PIPELINE).prefetches == 0


def test_the_rules_are_a_table_with_reasons():
    assert {name for name, *_ in prefetch.RULES} == set(prefetch.BOUND)
    assert all(bound > 0 and len(why) > 20 for _, bound, why in prefetch.RULES)


def late_conv(channels_in: int = 160, channels_out: int = 960, size: int = 7):
    """A model of one late pointwise conv (MobileNet-V2 @224's 7 × 7 × 160 → 960: 614 KB of weights) and a ReLU."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((channels_out, channels_in, 1, 1)).astype("float32") * 0.1, "w")
    b = numpy_helper.from_array(rng.standard_normal(channels_out).astype("float32"), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "late_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels_out, size, size])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target, tool, instruction", [("host", "objdump", "prefetch"),
                                                         ("linux-arm64", "aarch64-linux-gnu-objdump", "prfm")])
def test_a_compiled_model_prefetches_its_late_convs_weights_unless_asked_not_to(target, tool, instruction, tmp_path):
    import subprocess

    from host.devices import LocalDevice
    from tests.conftest import require_tool
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target
    from toolchain.verify import verify_artifact

    require_tool(tool)
    if target != "host":
        require_tool("aarch64-linux-gnu-g++")
    counts = {}
    for on in (True, False):
        spec = resolve_target(target, weight_prefetch=on)
        artifact = compile_model(CompileRequest(late_conv(), "late-conv", spec), find_compiler(spec),
                                 tmp_path / f"{target}-{on}")
        code = subprocess.run([tool, "-d", str(artifact.library_path)], capture_output=True, text=True, check=True)
        counts[on] = code.stdout.count(instruction)
        if target == "host":  # written only after the check against onnxruntime; verified again here
            assert verify_artifact(artifact, LocalDevice()).passed
        assert artifact.manifest.target.get("weight_prefetch", True) is on
    assert counts[True] > counts[False], counts  # (the runtime linked in may prefetch on its own)


def test_a_kernel_the_pass_cannot_read_is_built_without_prefetch(monkeypatch, caplog):
    import tvm

    def broken(func, weights):
        raise ValueError("an IR shape this pass has not met")

    _, unit, target = TARGETS["avx512"]
    rows, vectors, tiles = SHAPES["avx512"]
    func = packed_matmul(160, tiles, rows, vectors, unit.lanes)
    monkeypatch.setattr(prefetch, "add_prefetches", broken)
    prefetch.register()
    code = asm.assembly(func, tvm.target.Target(target), pipeline=prefetch.PIPELINE)
    assert asm.hottest(asm.innermost_loops(code, "x86_64")).prefetches == 0
    assert "weight prefetch left out of" in caplog.text
