"""The benchmark harness: schema of the results, failure recording, statistics. No timing asserts."""

import json
from dataclasses import replace

import pytest
from PIL import Image

from host import bench
from host.bench import Case, Settings, Variant


def tiny_settings(**kw):
    base = dict(threads=1, rounds=2, calls_per_round=2, warmup=1, gap_s=0.01, seed=3, quick=True)
    return Settings(**{**base, **kw})


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    work = tmp_path_factory.mktemp("bench")
    settings = tiny_settings(rounds=3)  # odd, so the median of reciprocal ratios is the reciprocal median
    return bench.run_suite(bench.SUITES["tiny"], [Case("tiny-cnn", (1, 3, 16, 16))], settings, work)


def test_results_document_schema(document):
    assert document["schema"] == "agoc.bench/1" and document["suite"] == "tiny"
    ctx = document["context"]
    assert {"cpu", "machine", "cores", "memory_gib", "os"} <= set(ctx["machine"])
    assert ctx["threads"] == 1 and ctx["versions"]["apache-tvm"] == "0.27.0.post1"
    assert ctx["settings"]["rounds"] == 3 and ctx["settings"]["calls_per_round"] == 2
    assert [v["name"] for v in ctx["variants"]] == ["tvm-stock", "onnxruntime"]
    assert ctx["min_trial_budgets"] == {"tvm-stock": 0, "onnxruntime": 0}
    (entry,) = document["results"]
    assert entry["model"] == "tiny-cnn" and entry["shape"] == [1, 3, 16, 16]
    tvm, ort = entry["variants"]["tvm-stock"], entry["variants"]["onnxruntime"]
    assert tvm["status"] == ort["status"] == "ok"
    assert tvm["verify"]["passed"] and tvm["verify"]["max_abs"] < 1e-3
    # NHWC: the input's transpose, conv + bias + relu + add, the transpose back before the flatten (a view
    # after it), matmul + add
    assert tvm["kernels"] == 4
    for res in (tvm, ort):
        lat = res["latency_ms"]
        assert len(lat["samples"]) == 6 and lat["n"] == 6  # rounds × calls
        assert 0 < lat["min"] <= lat["p10"] <= lat["median"] <= lat["p90"] <= lat["max"]
        assert len(res["round_medians_ms"]) == 3
        assert res["worker"]["peak_rss_mb"] > 0 and res["model_rss_mb"] is not None
    assert set(tvm["speedup_vs"]) == {"onnxruntime"} and set(ort["speedup_vs"]) == {"tvm-stock"}
    # the two directions are reciprocal round by round
    assert tvm["speedup_vs"]["onnxruntime"]["median"] * ort["speedup_vs"]["tvm-stock"]["median"] == pytest.approx(1.0)
    json.dumps(document)  # serialisable as is


def test_the_suite_records_both_partitions_and_the_partitioning_time(document):
    (entry,) = document["results"]
    fig = entry["partition"]
    assert fig["ops"] == 9  # tiny-cnn legalized: transpose, conv, add, relu, add, transpose, reshape, matmul, add
    for method in ("ago", "stock"):
        assert fig[method]["acyclic"] and 0 < fig[method]["seconds"] < 60
        assert {"subgraphs", "trivial", "jain", "chains", "max_complex_ops"} <= set(fig[method])
    # the tvm-stock variant's groups (NHWC: 2 transposes)
    assert fig["ago"]["subgraphs"] <= fig["stock"]["subgraphs"] == 4


def test_write_results_gives_json_and_png_without_overwriting(document, tmp_path):
    first, png = bench.write_results(document, tmp_path)
    second, _ = bench.write_results(document, tmp_path)
    assert first.name.startswith("tiny-") and first.suffix == ".json" and second != first
    assert json.loads(first.read_text())["schema"] == "agoc.bench/1"
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 600 and image.height > 150


def test_tvm_variants_share_one_worker_and_are_timed_call_by_call(monkeypatch, tmp_path):
    """…and each one's memory is measured in a worker of its own: in a shared process what loading a
    model adds depends on what the allocator kept from the models loaded before it."""
    made = []

    class Recording(bench.Worker):
        def __init__(self, members, settings):
            super().__init__(members, settings)
            made.append((list(members), dict(self.hello["model_rss_mb"])))

    monkeypatch.setattr(bench.run, "Worker", Recording)
    doc = bench.run_suite(
        bench.SUITES["tiny"], [Case("tiny-dwsep", (1, 8, 16, 16))], tiny_settings(rounds=2, calls_per_round=3),
        tmp_path, variants=["tvm-stock", "tvm-ago", "onnxruntime"],
    )
    variants = doc["results"][0]["variants"]
    assert sorted(variants["tvm-stock"]["worker"]["engines"]) == ["tvm-ago", "tvm-stock"]
    assert variants["tvm-ago"]["worker"] == variants["tvm-stock"]["worker"]
    assert variants["onnxruntime"]["worker"]["engines"] == ["onnxruntime"]
    for name in ("tvm-stock", "tvm-ago", "onnxruntime"):
        assert variants[name]["latency_ms"]["n"] == 6 and len(variants[name]["round_medians_ms"]) == 2
    assert set(variants["tvm-ago"]["speedup_vs"]) == {"tvm-stock", "onnxruntime"}
    alone = {names[0]: rss[names[0]] for names, rss in made if len(names) == 1 and names[0].startswith("tvm")}
    assert set(alone) == {"tvm-stock", "tvm-ago"}
    assert all(variants[name]["model_rss_mb"] == alone[name] for name in alone)


def test_a_variant_that_does_not_load_fails_alone_in_its_shared_worker(tmp_path):
    good = bench.run_suite(bench.SUITES["tiny"], [Case("tiny-cnn", (1, 3, 16, 16))], tiny_settings(rounds=1),
                           tmp_path / "w", variants=["tvm-stock"])
    artifact = tmp_path / "w" / "tiny-cnn@1x3x16x16" / "tvm-stock"
    assert good["results"][0]["variants"]["tvm-stock"]["status"] == "ok"
    broken = tmp_path / "broken"
    broken.mkdir()
    members = {"tvm-stock": (bench.VARIANTS_BY_NAME["tvm-stock"], artifact),
               "tvm-ago": (bench.VARIANTS_BY_NAME["tvm-ago"], broken)}
    worker = bench.Worker(members, tiny_settings())
    try:
        assert list(worker.errors) == ["tvm-ago"] and worker.names == ["tvm-stock"]
        samples, medians, failures = bench.measure_rounds([worker], tiny_settings(rounds=2),
                                                          __import__("random").Random(0), lambda *a, **k: None)
    finally:
        worker.close()
    assert len(samples["tvm-stock"]) == 4 and not failures and "tvm-ago" not in samples


def test_each_worker_is_timed_with_the_others_stopped_and_all_go_on_after_even_when_one_fails():
    """An idle engine's spinning threads (onnxruntime's) would take the cores of the engine being timed."""
    import random

    log = []

    class Fake:
        def __init__(self, name, fail=False):
            self.names, self.fail, self.held = [name], fail, False

        def hold(self, held):
            self.held = held

        def run(self, n, order):
            log.append((self.names[0], [w.held for w in workers]))
            if self.fail:
                raise RuntimeError("crashed")
            return {self.names[0]: [1.0] * n}

    workers = [Fake("a"), Fake("b"), Fake("c", fail=True)]
    samples, _, failures = bench.measure_rounds(workers, tiny_settings(rounds=2), random.Random(0),
                                                lambda *a, **k: None)
    assert len(log) == 5 and set(failures) == {"c"} and len(samples["a"]) == len(samples["b"]) > 0
    for name, held in log:  # the one being timed runs, every other is stopped
        assert held == [w.names[0] != name for w in workers]
    assert not any(w.held for w in workers)  # all let go at the end


def test_a_failing_variant_is_recorded_and_the_suite_continues(monkeypatch, tmp_path):
    broken = Variant("tvm-broken", "tvm", "a partition that does not exist", partition="no-such-partition")
    monkeypatch.setitem(bench.VARIANTS_BY_NAME, broken.name, broken)
    doc = bench.run_suite(
        bench.SUITES["tiny"], [Case("tiny-dwsep", (1, 8, 16, 16))], tiny_settings(rounds=1),
        tmp_path, variants=["tvm-broken", "tvm-stock", "onnxruntime"],
    )
    variants = doc["results"][0]["variants"]
    assert variants["tvm-broken"]["status"] == "failed"
    assert "unknown --partition 'no-such-partition'" in variants["tvm-broken"]["reason"]
    assert variants["tvm-stock"]["status"] == "ok" and variants["onnxruntime"]["status"] == "ok"


def test_a_variant_that_starts_from_another_is_tuned_after_it_and_fails_clearly_without_it(monkeypatch, tmp_path):
    """tvm-ago-from-stock starts from tvm-stock-tuned's database (agoc tune --from): listed first or not,
    it is tuned after its base, which it is handed; without its base in the run it fails, saying so."""
    from toolchain.tune import session as tune_session
    from toolchain.tune.events import Imported

    calls = []

    def fake_tune(mod, sha, spec, settings, db, on_event=None, measure=None, base=None):
        calls.append((settings.partition.method, base))
        db.mkdir(parents=True)
        (db / "session.json").write_text("{}")
        if base is not None:
            on_event(Imported(base=str(base), tasks={"k": 3}))
        return {"tasks": [], "estimate_ms": 1.0, "trials": 0}

    monkeypatch.setattr(tune_session, "tune_model", fake_tune)
    case = Case("tiny-dwsep", (1, 8, 16, 16))
    variants = [bench.VARIANTS_BY_NAME[n] for n in ("tvm-ago-from-stock", "tvm-stock-tuned")]
    results = bench.run_case(case, variants, bench.SUITES["tiny"], tiny_settings(rounds=1), tmp_path,
                             __import__("random").Random(0), lambda *a, **k: None)
    assert calls == [("stock", None), ("ago", tmp_path / case.label / "tvm-stock-tuned.db")]
    assert "add --variants" not in results["tvm-ago-from-stock"].get("reason", "")  # its base was in the run
    alone = bench.run_case(case, variants[:1], bench.SUITES["tiny"], tiny_settings(rounds=1), tmp_path / "alone",
                           __import__("random").Random(0), lambda *a, **k: None)
    assert alone["tvm-ago-from-stock"]["status"] == "failed"
    assert "add --variants tvm-stock-tuned" in alone["tvm-ago-from-stock"]["reason"]


def test_an_internal_error_in_one_variant_does_not_end_the_suite(monkeypatch, tmp_path):
    import toolchain.pipeline

    compile_model = toolchain.pipeline.compile_model

    def crash(request, *args, **kwargs):
        if request.partition.method == "stock":
            raise RuntimeError("ScheduleError: something TVM did not expect")
        return compile_model(request, *args, **kwargs)

    monkeypatch.setattr(toolchain.pipeline, "compile_model", crash)
    doc = bench.run_suite(bench.SUITES["tiny"], [Case("tiny-dwsep", (1, 8, 16, 16))], tiny_settings(rounds=1),
                          tmp_path, variants=["tvm-stock", "tvm-ago", "onnxruntime"])
    variants = doc["results"][0]["variants"]
    assert variants["tvm-ago"]["status"] == "ok"
    assert variants["tvm-stock"]["status"] == "failed"
    assert variants["tvm-stock"]["reason"] == ("internal error: RuntimeError: ScheduleError: "
                                               "something TVM did not expect")
    assert variants["onnxruntime"]["status"] == "ok"


def test_stats_and_ratios():
    s = bench.stats([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    r = bench.ratio_stats([2.0, 4.0, 6.0], [1.0, 1.0, 2.0])  # per-round baseline / variant
    assert r == {"median": 3.0, "p10": pytest.approx(2.2), "rounds": 3}


def test_the_engine_order_has_a_seed_of_its_own(monkeypatch, tmp_path):
    """--order-seed changes the per-round order only: the tuning settings (which a database must match
    to be resumed) stay those of --seed."""
    suite, variant = bench.SUITES["e2e"], bench.VARIANTS_BY_NAME["tvm-ago-tuned"]
    plain, reordered = tiny_settings(seed=3), tiny_settings(seed=3, order_seed=8)
    assert plain.order == 3 and reordered.order == 8
    assert bench.tune_settings(variant, suite, reordered) == bench.tune_settings(variant, suite, plain)
    assert bench.tune_settings(variant, suite, tiny_settings(seed=4)).seed == 4
    seeds, real = [], bench.run.random.Random
    monkeypatch.setattr(bench.run.random, "Random", lambda seed: seeds.append(seed) or real(seed))
    document = bench.run_suite(bench.SUITES["tiny"], [], reordered, tmp_path)
    assert seeds == [8] and document["context"]["settings"]["order_seed"] == 8


def test_quick_cases_keep_the_smallest_shape_of_each_model():
    cases = bench.suite_cases(bench.SUITES["host"], quick=True)
    by_model = {c.model: c.shape for c in cases}
    assert by_model["mobilenet-v2"] == (1, 3, 56, 56) and by_model["bert-tiny"] == (1, 128)
    assert len(cases) == len(by_model)
    full = bench.suite_cases(bench.SUITES["host"], quick=False, models=["squeezenet-1.1"], shapes=[56, 112])
    assert [c.shape[-1] for c in full] == [56, 112]


def test_bench_suite_cli_rejects_unknown_names(cli):
    result = cli("bench-suite", "nosuch")
    assert result.exit_code == 1 and "unknown suite 'nosuch'" in result.stderr
    result = cli("bench-suite", "tiny", "--variants", "tvm-magic")
    assert result.exit_code == 1 and "unknown variant 'tvm-magic'" in result.stderr


def test_every_tuned_variant_of_a_case_gets_the_same_budget_even_when_one_needs_more_than_the_suites():
    # tiny-cnn's stock partition has 3 kernels (in NCHW; NHWC adds two transposes): at one batch each a 16-trial
    # suite budget is not enough
    tuned = [bench.VARIANTS_BY_NAME["tvm-stock-tuned"], bench.VARIANTS_BY_NAME["tvm-ago-tuned"]]
    settings = tiny_settings(trials=16, layout="NCHW")
    budget = bench.equal_budget(Case("tiny-cnn", (1, 3, 16, 16)), tuned, bench.SUITES["e2e"], settings)
    assert budget == 64  # 3 kernels × one batch of 16, and a quarter more to spread by weight, whole batches
    # the roofline scheduler plans by weight as well (its rounds come out of the same budget)
    assert bench.equal_budget(Case("tiny-cnn", (1, 3, 16, 16)), tuned, bench.SUITES["e2e"],
                              replace(settings, scheduler="roofline")) == 64
    roomy = tiny_settings(trials=160, layout="NCHW")
    assert bench.equal_budget(Case("tiny-cnn", (1, 3, 16, 16)), tuned, bench.SUITES["e2e"], roomy) == 160
    # the latency scheduler: a first batch of 8 per task (AGO: 1 kernel per subgraph; stock: 3 kernels),
    # and at least twice the larger first pass, so that half the budget or more goes round by round
    latency = replace(tiny_settings(trials=16, layout="NCHW"), scheduler="latency")
    assert bench.equal_budget(Case("tiny-cnn", (1, 3, 16, 16)), tuned, bench.SUITES["e2e"], latency) == 48
    assert bench.equal_budget(Case("tiny-cnn", (1, 3, 16, 16)), tuned, bench.SUITES["e2e"],
                              replace(roomy, scheduler="latency")) == 160


def test_bench_suite_cli_logs_one_line_per_stage_when_not_on_a_terminal(cli, tmp_path):
    result = cli("bench-suite", "tiny", "--models", "tiny-cnn", "--quick", "--rounds", "1", "--calls", "1",
                 "--out", tmp_path / "results", "--work-dir", tmp_path / "work")
    assert result.exit_code == 0, result.stderr
    assert "tiny-cnn@1x3x16x16: compiling + verifying tvm-stock" in result.stderr
    assert "measuring" in result.stderr
    (written,) = (tmp_path / "results").glob("tiny-*.json")
    assert json.loads(written.read_text())["results"][0]["variants"]["tvm-stock"]["status"] == "ok"


def test_bench_report_prints_a_saved_run_and_refuses_other_files(document, cli, tmp_path):
    path, _ = bench.write_results(document, tmp_path)
    result = cli("bench-report", path, "--png", tmp_path / "again.png")
    assert result.exit_code == 0, result.stderr
    assert all(s in result.stdout for s in ("tiny-cnn@1x3x16x16", "tvm-stock", "× vs onnxruntime"))
    assert "partitions (AGO | stock TVM)" in result.stdout
    assert (tmp_path / "again.png").stat().st_size > 0
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    result = cli("bench-report", other)
    assert result.exit_code == 1 and "not an agoc benchmark result" in result.stderr
    assert "no such file" in cli("bench-report", tmp_path / "missing.json").stderr


LATENCY = {"median": 1.0, "p10": 0.9, "p90": 1.1}


def _run(*cases):
    """A results document with only what the geomean reads: per case, the AGO variant's speed-up over stock."""
    return {"schema": bench.SCHEMA, "suite": "e2e", "context": {"threads": 2, "baselines": ["tvm-stock-tuned"]},
            "results": [{"label": label, "variants": {
                "tvm-stock-tuned": {"status": "ok", "latency_ms": LATENCY, "speedup_vs": {}},
                "tvm-ago-tuned": {"status": "ok", "latency_ms": LATENCY,
                                  "speedup_vs": {"tvm-stock-tuned": {"median": x, "p10": x, "rounds": 3}}},
            }} for label, x in cases]}


def test_geomean_over_models_takes_each_models_median_over_runs():
    # mobilenet measured twice (1.0 and 1.5: median 1.25), squeezenet once (2.0): geomean sqrt(1.25 * 2.0)
    (row,) = bench.geomean_speedups([_run(("mobilenet-v2@1x3x112x112", 1.0), ("squeezenet-1.1@1x3x112x112", 2.0)),
                                     _run(("mobilenet-v2@1x3x112x112", 1.5))])
    assert (row["variant"], row["baseline"]) == ("tvm-ago-tuned", "tvm-stock-tuned")
    assert row["geomean"] == pytest.approx((1.25 * 2.0) ** 0.5)
    assert row["cases"]["mobilenet-v2@1x3x112x112"] == {"median": 1.25, "runs": [1.0, 1.5]}
    assert bench.geomean_speedups([_run()]) == []


def test_runs_in_different_cache_regimes_are_never_pooled():
    cold = _run(("mobilenet-v2@1x3x112x112", 1.2))
    cold["context"]["settings"] = {"cache": "cold"}
    rows = bench.geomean_speedups([_run(("mobilenet-v2@1x3x112x112", 0.8)), cold])  # the first: before the setting
    assert {row["cache"]: row["geomean"] for row in rows} == {"shared": pytest.approx(0.8), "cold": pytest.approx(1.2)}


def test_bench_report_of_several_runs_prints_the_geomean_over_their_cases(cli, tmp_path):
    paths = []
    for i, cases in enumerate([[("mobilenet-v2@1x3x112x112", 0.5), ("mnasnet@1x3x112x112", 2.0)],
                               [("mobilenet-v2@1x3x112x112", 0.7)]]):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(_run(*cases)))
    result = cli("bench-report", *paths)
    assert result.exit_code == 0, result.stderr
    assert "geomean speed-up over the cases (2 runs)" in result.stdout
    assert "1.10×" in result.stdout  # sqrt(0.6 * 2.0)
    assert "0.50–0.70, 2 runs" in result.stdout


def test_a_suite_run_records_its_geomean(document):
    summary = document["summary"]["geomean_speedup"]
    ratio = document["results"][0]["variants"]["tvm-stock"]["speedup_vs"]["onnxruntime"]["median"]
    assert summary["tvm-stock"]["onnxruntime"] == pytest.approx(ratio)  # one case: its own speed-up


def test_bench_layout_tunes_the_same_kernel_in_both_layouts_and_writes_the_ratio(tmp_path, monkeypatch):
    """`make bench-layout`: one conv kernel of tiny-cnn, 2 trials per layout, timed and compared."""
    import functools

    import toolchain.tune
    import toolchain.tune.settings
    from host.bench import layout as bench_layout

    # a search population of 8, not 128: the search's own cost is not what is tested here
    small = functools.partial(toolchain.tune.settings.TuneSettings, population=8)
    for module in (toolchain.tune, toolchain.tune.settings):
        monkeypatch.setattr(module, "TuneSettings", small, raising=False)

    assert bench_layout.main(["--model", "tiny-cnn", "--size", "16", "--trials", "2", "--kernels", "1",
                              "--threads", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("layout-tiny-cnn-16-*.json")
    result = json.loads(path.read_text())
    (row,) = result["kernels"]
    assert row["kernel"].startswith("fused_conv2d") and row["calls"] == 1
    assert row["NCHW"] > 0 and row["NHWC"] > 0
    assert row["nchw_over_nhwc"] == pytest.approx(row["NCHW"] / row["NHWC"])
    assert result["summed_nchw_over_nhwc"] == pytest.approx(row["nchw_over_nhwc"])


def test_a_tuned_variant_records_how_its_search_did_on_the_kernels_the_baseline_tuned(tmp_path):
    """Beside its tuning record, a tuned variant gets the geometric mean of its verified latencies over
    the stock partition's on the same kernels (by structural hash, whatever the partition named them)."""
    from toolchain.tune.db import TuneDB
    from toolchain.tune.settings import SCHEMA, Task, TuneSettings

    hashes = ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc")
    for name, ms, names in (("tvm-ago-tuned", [0.2, 0.3, 1.0], ("mini", "mini", "joined")),
                            ("tvm-stock-tuned", [0.1, 0.3], ("k", "k"))):
        db = TuneDB(tmp_path / f"{name}.db")
        db.open_session({"schema": SCHEMA, "model_sha256": "m", "target": {"kind": "llvm"},
                         "settings": TuneSettings().to_json()})
        tasks = [Task(f"{n}{i}-{h}", "kernel", (), None, 1.0, 16) for i, (n, h) in enumerate(zip(names, hashes))]
        db.save_tasks(tasks)
        db.save_verified({t.name: {"status": "verified", "latency_ms": m} for t, m in zip(tasks, ms)})
    results = {"tvm-ago-tuned": {"tuning": {}}, "tvm-stock-tuned": {"tuning": {}}, "tvm-ago-ni": {"status": "failed"}}
    tuned = [bench.VARIANTS_BY_NAME[n] for n in ("tvm-stock-tuned", "tvm-ago-tuned", "tvm-ago-ni")]
    bench.same_kernels(results, tuned, tmp_path)
    assert results["tvm-ago-tuned"]["tuning"]["same_kernels"] == {
        "vs": "tvm-stock-tuned", "kernels": 2, "geomean": pytest.approx(2 ** 0.5)}
    assert "tuning" not in results["tvm-ago-ni"] and "same_kernels" not in results["tvm-stock-tuned"]["tuning"]


def test_a_variant_built_from_another_variants_database_matches_its_partition_and_tunes_nothing(tmp_path):
    """tvm-ago-a76 / tvm-ago-locality-a76 (compile --joins a76 on another variant's database): the
    database they name is a tuned variant cut the same way (else compile --db would refuse its groups),
    and they spend no trials of their own."""
    shared = [v for v in bench.VARIANTS if v.db_of]
    assert {v.name for v in shared} >= {"tvm-ago-a76", "tvm-ago-locality-a76"}
    for v in shared:
        owner = bench.VARIANTS_BY_NAME[v.db_of]
        assert owner.tuned and not owner.db_of and v.tuned
        assert (owner.partition, owner.keep_inside, owner.intensive, owner.reformer) == (
            v.partition, v.keep_inside, v.intensive, v.reformer)
        case = Case("mnasnet", (1, 3, 112, 112))
        assert bench.variant_db(case, v, tmp_path) == tmp_path / case.label / f"{v.db_of}.db"
        assert bench.join_rule(v) == f"traffic:{v.joins}"
    assert bench.join_rule(bench.VARIANTS_BY_NAME["tvm-ago-tuned"]) == "latency"


def test_the_locality_variants_build_what_an_arm_preset_builds_by_default():
    """The phone-cache variants carry no hand-set size: their partition and intensive tile cap are what
    `agoc tune --target linux-arm64` takes with no --keep-inside (the A76 geometry's locality), and the host
    preset's default keeps none."""
    from host.bench.variants import partition_of
    from host.commands.common import partition_settings

    suite = bench.SUITES["e2e"]
    for name in ("tvm-ago-locality", "tvm-ago-locality-a76"):
        parts, tile_cache = partition_of(bench.VARIANTS_BY_NAME[name], suite)
        arm, arm_cache, why = partition_settings("ago", parts.threshold, None, "linux-arm64")
        assert (parts, tile_cache) == (arm, arm_cache) and tile_cache > 0 and "a76" in why
    host_parts, host_cache, _ = partition_settings("ago", None, None, "host")
    assert host_cache == 0 and host_parts.locality_unit == 0


def test_the_machine_names_its_vector_unit_figures_from_other_units_do_not_compare():
    from host.bench.suites import cpu_info

    x86 = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx fma avx2\n\n"
           "processor\t: 1\nmodel name\t: other\nflags\t\t: sse2\n")
    assert cpu_info(x86) == ("AMD EPYC 7B13", "avx2")
    assert cpu_info("model name : Xeon\nflags : sse2 avx2 avx512f avx512bw\n")[1] == "avx512"
    assert cpu_info("processor : 0\nFeatures : fp asimd evtstrm aes\nCPU part : 0xd0b\n") == (None, "neon")
    assert cpu_info("") == (None, None)
