"""The benchmark's cache regimes: what a timed call finds in cache, the same for every engine."""

import os

import pytest

from host import bench
from host.bench import Case, cache_regime
from tests.host.test_bench import tiny_settings


def _sysfs(tmp_path, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = tmp_path / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return tmp_path


def test_host_caches_reads_the_last_level_and_the_largest_below_it(tmp_path):
    sysfs = _sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                              (3, "Unified", "32768K")])
    assert cache_regime.host_caches(sysfs) == (1 << 20, 32 << 20)
    # a phone-like core: private L2, shared L3 of 2 MiB
    sysfs = _sysfs(tmp_path / "phone", [(1, "Data", "64K"), (2, "Unified", "512K"), (3, "Unified", "2M")])
    assert cache_regime.host_caches(sysfs) == (512 << 10, 2 << 20)
    # nothing to read: the fallbacks
    assert cache_regime.host_caches(tmp_path / "none") == (cache_regime.FALLBACK_PRIVATE, cache_regime.FALLBACK_SHARED)


def test_each_cpu_writes_twice_its_private_cache_and_its_share_of_twice_the_shared_one():
    assert cache_regime.flush_bytes_per_cpu(2, 1 << 20, 32 << 20) == (2 << 20) + (32 << 20)
    assert cache_regime.flush_bytes_per_cpu(3, 100, 10) == 200 + 7  # rounded up: together at least twice


def test_an_unknown_regime_is_named_with_the_choices():
    with pytest.raises(ValueError, match="unknown cache regime 'hot'.*cold, warm, shared"):
        cache_regime.regime("hot")


def test_the_flusher_writes_every_buffer_from_a_thread_pinned_to_each_cpu():
    cpus = sorted(os.sched_getaffinity(0))
    flusher = cache_regime.Flusher(bytes_per_cpu=1 << 16)
    try:
        flusher.flush()
        flusher.flush()
        assert flusher.flushes == 2 and len(flusher._buffers) == len(cpus)
        assert all(int(buf.min()) == int(buf.max()) == 2 for buf in flusher._buffers)  # every line, every time
        pinned = {os.sched_getaffinity(t.native_id) == {cpu} for t, cpu in zip(flusher._threads, flusher.cpus)}
        assert pinned == {True}
        assert os.sched_getaffinity(0) == set(cpus)  # the caller is not pinned
    finally:
        flusher.close()
    assert not any(t.is_alive() for t in flusher._threads)


class _Recorder:
    """Stands in for an engine: records the order of its calls (timed or not) in a shared log."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __call__(self):
        self.log.append(self.name)


@pytest.mark.parametrize("name", ["cold", "warm", "shared"])
def test_the_worker_calls_its_engines_in_the_regimes_order(monkeypatch, capsys, name):
    """cold and warm: each engine's calls back to back after one untimed call (cold: a flush before each
    timed call); shared: one call each per pass."""
    import io
    import json
    import sys

    from host.bench import worker as bench_worker

    log = []
    monkeypatch.setattr(bench_worker, "_load", lambda entry, threads, warmup: (_Recorder(entry["name"], log), 0.0))

    class LoggedFlusher:
        cpus, bytes_per_cpu = [0], 1

        def flush(self):
            log.append("flush")

    monkeypatch.setattr(cache_regime, "Flusher", LoggedFlusher)
    commands = [{"cmd": "run", "n": 2, "order": ["a", "b"]}, {"cmd": "quit"}]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(c) + "\n" for c in commands)))
    config = {"threads": 1, "warmup": 0, "cache": name,
              "engines": [{"name": n, "engine": "tvm", "artifact": "-"} for n in ("a", "b")]}
    assert bench_worker.main(["worker", json.dumps(config)]) == 0
    replies = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert replies[0]["cache"] == name
    expected = {"cold": ["a", "flush", "a", "flush", "a", "b", "flush", "b", "flush", "b"],
                "warm": ["a", "a", "a", "b", "b", "b"],
                "shared": ["a", "b", "a", "b"]}[name]
    assert log == expected
    run = replies[1]
    assert {k: len(v) for k, v in run["samples_ms"].items()} == {"a": 2, "b": 2}
    assert run["flushes"] == expected.count("flush") and run["rehearsals"] == (2 if name != "shared" else 0)


@pytest.mark.e2e
@pytest.mark.parametrize("name, flushes, rehearsals", [("cold", 2, 1), ("warm", 0, 1), ("shared", 0, 0)])
def test_the_suite_records_how_every_engines_calls_were_prepared(tmp_path, name, flushes, rehearsals):
    settings = tiny_settings(rounds=2, calls_per_round=2, cache=name)
    doc = bench.run_suite(bench.SUITES["tiny"], [Case("tiny-dwsep", (1, 8, 16, 16))], settings, tmp_path,
                          variants=["tvm-stock", "tvm-ago", "onnxruntime"])
    assert doc["context"]["settings"]["cache"] == name
    assert f"cache regime '{name}'" in doc["context"]["protocol"]
    variants = doc["results"][0]["variants"]
    # per round and engine: flushes (one per timed call) and rehearsals (one per block); × rounds × engines
    for variant, engines in (("tvm-stock", 2), ("tvm-ago", 2), ("onnxruntime", 1)):
        assert variants[variant]["status"] == "ok"
        assert variants[variant]["worker"]["cache"] == {"regime": name, "flushes": flushes * 2 * engines,
                                                        "rehearsals": rehearsals * 2 * engines}
        assert variants[variant]["worker"]["peak_rss_mb"] > 0
