"""The phone-cache proxy (host/bench/proxy.py): geometries, the valgrind command, callgrind parsing, and
on a tiny conv pair under valgrind: identical counts run to run, less DRAM traffic when fused."""

from __future__ import annotations

import pytest

import models
from host.bench import proxy
from tests.conftest import require_tool
from toolchain.pipeline import CompileRequest, compile_model
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target

# A callgrind output file as written with --compress-strings=no --compress-pos=no (cut down).
CALLGRIND_OUT = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw ILdmr DLdmr DLdmw
summary: 1000 400 100 5 40 10 2 20 8 1 3 4

ob=/work/build/runner/host/agoc-runner
fl=???
fn=tvm::runtime::vm::VirtualMachineImpl::RunInstrCall
0 30 10 5
cob=/tmp/art/model.so
cfi=./IRModule.CodeGenLLVM
cfn=__tvm_ffi_fused_conv2d_add
calls=2 0
0 600 300 80 1 30 8 1 15 6 0 2 3
cob=/tmp/art/model.so
cfi=./IRModule.CodeGenLLVM
cfn=__tvm_ffi_fused_conv2d1_add
calls=1 0
0 100 20 4 0 2
cfn=__tvm_ffi_fused_conv2d_add
calls=1 0
0 50 10 1

fn=__tvm_ffi_fused_conv2d_add
0 10 1
totals: 990 400 100 5 40 10 2 20 8 1 3 4
"""


def test_parse_callgrind_reads_summary_and_inclusive_call_costs():
    profile = proxy.parse_callgrind(CALLGRIND_OUT)
    assert profile.events[:3] == ("Ir", "Dr", "Dw") and len(profile.events) == 12
    assert profile.totals["Ir"] == 1000  # summary:, not totals:
    conv = profile.inclusive["__tvm_ffi_fused_conv2d_add"]  # two call sites, summed
    assert conv == {"Ir": 650, "Dr": 310, "Dw": 81, "I1mr": 1, "D1mr": 30, "D1mw": 8, "ILmr": 1, "DLmr": 15,
                    "DLmw": 6, "ILdmr": 0, "DLdmr": 2, "DLdmw": 3}
    assert profile.inclusive["__tvm_ffi_fused_conv2d1_add"]["D1mr"] == 2  # short lines: trailing zeros
    assert proxy.ll_misses(conv) == 22
    assert proxy.memory_bytes(conv, 64) == (22 + 5) * 64  # (LL misses + dirty evictions) x line


def test_parse_callgrind_rejects_other_files():
    with pytest.raises(proxy.ProxyError, match="no events"):
        proxy.parse_callgrind("hello\n")


def test_geometries_have_sources_and_sizes_valgrind_accepts():
    assert {"a76", "a55", "small-slc"} <= set(proxy.GEOMETRIES_BY_NAME)
    a76 = proxy.geometry("a76")
    assert (a76.l1d.size, a76.l2.size, [c.size for c in a76.llc]) == (64 << 10, 512 << 10, [2 << 20, 4 << 20])
    for geo in proxy.GEOMETRIES:
        assert "TRM" in geo.source and geo.llc
        for cache in (geo.l1i, geo.l1d, geo.l2, *geo.llc):
            sets = cache.size // (cache.assoc * cache.line)
            assert sets * cache.assoc * cache.line == cache.size and sets & (sets - 1) == 0  # power of two
    with pytest.raises(proxy.ProxyError, match="unknown cache geometry 'a99'; choose one of: a76, a55"):
        proxy.geometry("a99")


def test_callgrind_command_is_a_list_in_a_fixed_environment(tmp_path):
    geo = proxy.geometry("a76")
    cmd = proxy.callgrind_command("/usr/bin/valgrind", tmp_path / "agoc-runner", tmp_path / "art", geo, geo.llc[0],
                                  tmp_path / "cg.out", warmup=2, calls=1)
    assert cmd[:2] == ["env", "-i"] and "TVM_NUM_THREADS=1" in cmd
    assert all(isinstance(a, str) for a in cmd)
    for flag in ("--tool=callgrind", "--cache-sim=yes", "--simulate-wb=yes", "--collect-atstart=no",
                 "--D1=65536,4,64", "--I1=65536,4,64", "--LL=2097152,16,64"):
        assert flag in cmd
    assert cmd[cmd.index("--threads") + 1] == "1" and cmd[cmd.index("--warmup") + 1] == "2"


def test_avx512_kernels_are_recognised():
    assert proxy.has_avx512({"kind": "llvm", "mcpu": "znver5"})
    assert not proxy.has_avx512(resolve_target("host-avx2").tvm_target)


def test_missing_valgrind_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(proxy.ProxyError, match="valgrind not found.*make setup"):
        proxy.find_valgrind()


def test_weights_set_the_floor_of_dram_traffic_where_they_overflow_the_cache(tmp_path):
    import onnx
    from onnx import numpy_helper

    model = models.build("tiny-dwsep")
    onnx.save(model, tmp_path / "m.onnx")
    expected = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert proxy.weight_bytes(tmp_path / "m.onnx") == expected > 0
    a76 = proxy.geometry("a76")  # shared caches of 2 and 4 MiB
    assert proxy.weights_floor(3 * proxy.MIB, a76) == {"2MiB": 3 * proxy.MIB, "4MiB": 0}
    assert proxy.weights_floor(expected, a76) == {"2MiB": 0, "4MiB": 0}


def test_ratios_report_the_least_dram_ratio_the_weights_allow():
    def figures(dram: dict, floor: dict) -> dict:
        return {"model_figures": {"instructions": 10, "d1_misses": 4, "l2_misses": 2, "dram_bytes": dram,
                                  "weight_bytes": 3 * proxy.MIB,
                                  "dram_beyond_weights": {k: v - floor[k] for k, v in dram.items()}}}

    floor = {"2MiB": 3 * proxy.MIB, "4MiB": 0}
    stock = figures({"2MiB": 5 * proxy.MIB, "4MiB": 2 * proxy.MIB}, floor)
    fused = figures({"2MiB": 4 * proxy.MIB, "4MiB": 1 * proxy.MIB}, floor)
    ratio = proxy.ratios(fused, stock)
    assert ratio["dram_bytes"] == {"2MiB": 0.8, "4MiB": 0.5}
    assert ratio["dram_beyond_weights"] == {"2MiB": 0.5, "4MiB": 0.5}
    # no schedule goes below the 3 MiB of weights streamed through a 2 MiB cache: 3/5 of stock's traffic
    assert ratio["dram_floor"] == {"2MiB": 0.6, "4MiB": 0.0}
    older = {"model_figures": {k: v for k, v in stock["model_figures"].items() if k != "dram_beyond_weights"}}
    assert proxy.ratios(fused, older)["dram_floor"] == {}  # results from before the floor was recorded


def test_cli_rejects_an_unknown_geometry(cli, tmp_path):
    result = cli("bench", tmp_path, "--proxy", "a99")
    assert result.exit_code == 1 and "unknown cache geometry 'a99'" in result.output


# ----------------------------------------------------------------------------- under valgrind

# pw→dw at 28×28: the 144-channel intermediate (451 KB) plus the depthwise conv's padded copy
# overflow a 2 MiB last level between calls when the convs run apart; fused, they do not.
PAIR = ("pair-pw-dw", (1, 24, 28, 28))


@pytest.fixture(scope="module")
def pair_artifacts(tmp_path_factory):
    require_tool("valgrind")
    from tests.runner.test_runner import build_runner

    build_runner("host")  # the proxy runs the host runner (with its callgrind client requests)
    root = tmp_path_factory.mktemp("proxy")
    spec = resolve_target("host-avx2")
    built = {}
    for partition in ("stock", "ago"):
        request = CompileRequest(models.build(*PAIR), PAIR[0], spec, partition=PartitionSettings(partition, 1e9),
                                 joins="joined",  # the join itself, untuned (without it: its minis)
                                 untuned="sampled")  # both from their spaces (not the stock kernels' register blocks)
        built[partition] = compile_model(request, find_compiler(spec), root / partition)
    convs = {p: [k for k in a.manifest.kernels if "conv2d" in k["name"]] for p, a in built.items()}
    assert len(convs["stock"]) == 2 and len(convs["ago"]) == 1  # (and in NHWC a transpose at each edge)
    return built


@pytest.fixture(scope="module")
def fused_measured(pair_artifacts):
    """The fused pair under valgrind (a76), measured once for the tests below."""
    return proxy.measure(pair_artifacts["ago"], proxy.geometry("a76"))


def test_two_runs_give_identical_counts(pair_artifacts, fused_measured):
    first = fused_measured
    second = proxy.measure(pair_artifacts["ago"], proxy.geometry("a76"))
    assert first["events"] == second["events"] and first["kernels"] == second["kernels"]
    figures = first["model_figures"]
    assert figures["instructions"] > 0 and figures["d1_misses"] > 0 and set(figures["dram_bytes"]) == {"2MiB", "4MiB"}
    assert first["calls"] == 1 and first["warmup"] == 2 and first["threads"] == 1
    assert figures["weight_bytes"] > 0  # the pair's weights fit the shared cache: no floor to take off
    assert figures["dram_beyond_weights"] == figures["dram_bytes"]
    # the one fused kernel carries (almost) all of the model's work (NHWC: beside the edge transposes)
    (kernel,) = [k for k in first["kernels"] if "conv2d" in k["name"]]
    assert first["kernels_not_found"] == []
    assert 0.95 * figures["instructions"] < kernel["instructions"] <= figures["instructions"]
    # its weights, from the manifest (the model's initializers as the kernels take them): no floor here either
    assert abs(kernel["weight_bytes"] - figures["weight_bytes"]) <= 64
    assert kernel["dram_beyond_weights"] == kernel["dram_bytes"]


def test_fused_pair_moves_fewer_dram_bytes_than_the_unfused_pair(pair_artifacts, fused_measured):
    fused, unfused = fused_measured, proxy.measure(pair_artifacts["stock"], proxy.geometry("a76"))
    assert len([k for k in unfused["kernels"] if "conv2d" in k["name"]]) == 2
    assert sum(k["weight_bytes"] for k in unfused["kernels"]) == sum(k["weight_bytes"] for k in fused["kernels"]) > 0
    assert fused["model_figures"]["dram_bytes"]["2MiB"] < 0.5 * unfused["model_figures"]["dram_bytes"]["2MiB"]
    assert fused["model_figures"]["l2_misses"] < unfused["model_figures"]["l2_misses"]
    ratio = proxy.ratios(fused, unfused)
    assert ratio["dram_bytes"]["2MiB"] < 0.5


@pytest.mark.e2e
def test_bench_suite_records_proxy_figures_beside_latency(tmp_path):
    require_tool("valgrind")
    from rich.console import Console

    from host import bench, render
    from host.chart import speedup_chart
    from tests.runner.test_runner import build_runner

    build_runner("host")
    settings = bench.Settings(threads=1, rounds=1, calls_per_round=1, warmup=1, gap_s=0.01, seed=0, quick=True,
                              proxy="a76")
    doc = bench.run_suite(bench.SUITES["tiny"], [bench.Case("tiny-dwsep", (1, 8, 16, 16))], settings, tmp_path,
                          variants=["tvm-stock", "tvm-ago", "onnxruntime"])
    assert doc["context"]["proxy"]["geometry"] == "a76"
    variants = doc["results"][0]["variants"]
    for name in ("tvm-stock", "tvm-ago"):
        record = variants[name]
        assert record["status"] == "ok" and "latency_ms" in record
        assert record["proxy"]["status"] == "ok" and record["proxy"]["schema"] == "agoc.proxy/1"
        # this host's default build may use AVX-512: the proxy then ran a verified host-avx2 rebuild
        assert not proxy.has_avx512(record["proxy"]["target"])
    assert "tvm-stock" in variants["tvm-ago"]["proxy_vs"] and "proxy" not in variants["onnxruntime"]
    rows = {r["variant"]: r for r in bench.summary_rows(doc)}
    assert rows["tvm-ago"]["proxy_status"] == "ok" and "tvm-stock" in rows["tvm-ago"]["dram_vs"]
    Console(width=200, file=open(tmp_path / "table.txt", "w")).print(render.proxy_bench_table(doc))
    assert "tvm-ago" in (tmp_path / "table.txt").read_text()
    speedup_chart(doc, tmp_path / "chart.png")
