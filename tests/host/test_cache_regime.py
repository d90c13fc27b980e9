"""The benchmark's cache regimes: what a timed call finds in cache, the same for every engine."""

import os

import pytest

from host import bench, cache_regime
from host.bench import Case
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


@pytest.mark.parametrize("name, flushes, rehearsals", [("cold", 1, 0), ("warm", 0, 1), ("shared", 0, 0)])
def test_the_suite_prepares_every_timed_call_of_every_engine_as_its_regime_says(tmp_path, name, flushes, rehearsals):
    settings = tiny_settings(rounds=2, calls_per_round=2, cache=name)
    doc = bench.run_suite(bench.SUITES["tiny"], [Case("tiny-dwsep", (1, 8, 16, 16))], settings, tmp_path,
                          variants=["tvm-stock", "tvm-ago", "onnxruntime"])
    assert doc["context"]["settings"]["cache"] == name
    assert f"cache regime '{name}'" in doc["context"]["protocol"]
    variants = doc["results"][0]["variants"]
    tvm_calls, ort_calls = 2 * 2 * 2, 2 * 2  # rounds × calls × the worker's engines
    for variant, calls in (("tvm-stock", tvm_calls), ("tvm-ago", tvm_calls), ("onnxruntime", ort_calls)):
        assert variants[variant]["status"] == "ok"
        assert variants[variant]["worker"]["cache"] == {"regime": name, "flushes": flushes * calls,
                                                        "rehearsals": rehearsals * calls}
        assert variants[variant]["worker"]["peak_rss_mb"] > 0
