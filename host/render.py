"""rich tables for the CLI. Pure functions: records in, renderables out."""

from __future__ import annotations

from rich.table import Table

from toolchain.artifact import Artifact
from toolchain.onnx_import import DeclaredInput
from toolchain.verify import VerifyReport


def _shape(shape) -> str:
    return "×".join("?" if d is None else str(d) for d in shape)


def tensors_table(title: str, rows: list[tuple[str, str, str]]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("name")
    table.add_column("shape")
    table.add_column("dtype")
    for row in rows:
        table.add_row(*row)
    return table


def op_counts_table(counts: dict[str, int]) -> Table:
    table = Table(title=f"ONNX ops ({sum(counts.values())} nodes)", title_justify="left")
    table.add_column("op")
    table.add_column("count", justify="right")
    for op, n in counts.items():
        table.add_row(op, str(n))
    return table


def kernels_table(kernels: list[dict]) -> Table:
    calls = sum(k["calls"] for k in kernels)
    table = Table(title=f"fused kernels ({len(kernels)} kernels, {calls} calls)", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("kernel")
    table.add_column("calls", justify="right")
    for i, k in enumerate(kernels):
        table.add_row(str(i), k["name"], str(k["calls"]))
    return table


def declared_inputs_rows(inputs: list[DeclaredInput]) -> list[tuple[str, str, str]]:
    return [(i.name, _shape(i.dims), i.dtype) for i in inputs]


def artifact_summary(artifact: Artifact) -> Table:
    m = artifact.manifest
    table = Table(title=f"artifact {artifact.root}", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    table.add_row("model", f"{m.model_name} (sha256 {m.model_sha256[:12]}…)")
    table.add_row("target", f"{m.target['preset']}  {m.target['tvm_target']}")
    table.add_row("compiler", f"{m.compiler['version']} ({m.compiler['path']})")
    table.add_row("partition", m.partition)
    table.add_row("library", f"{m.library} ({artifact.library_path.stat().st_size / 1024:.0f} KiB)")
    table.add_row("versions", ", ".join(f"{k} {v}" for k, v in m.versions.items()))
    table.add_row("compiled", f"{m.created} in {m.compile_seconds:.1f} s")
    return table


def verify_table(report: VerifyReport) -> Table:
    status = "[green]PASS[/green]" if report.passed else "[red]FAIL[/red]"
    title = (
        f"verify on {report.device} vs {report.reference}: {status}  "
        f"(pass: max abs ≤ {report.atol:g} + {report.rtol:g}·max|ref|)"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("output")
    table.add_column("shape")
    table.add_column("max abs err", justify="right")
    table.add_column("max rel err", justify="right")
    table.add_column("max |ref|", justify="right")
    table.add_column("result")
    for o in report.outputs:
        shape = _shape(o.shape) if o.shape == o.ref_shape else f"{_shape(o.shape)} ≠ {_shape(o.ref_shape)}"
        result = "[green]ok[/green]" if o.passed else "[red]over tolerance[/red]"
        if o.nonfinite:
            result = f"[red]{o.nonfinite} NaN/Inf[/red]"
        table.add_row(o.name, shape, f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", f"{o.max_ref:.3g}", result)
    return table


def bench_table(document: dict) -> Table:
    from host.bench import cache_of, summary_rows

    baselines = document["context"]["baselines"]
    cache = cache_of(document)
    table = Table(title=f"bench '{document['suite']}' ({document['context']['threads']} threads, caches {cache} "
                  "before each call)", title_justify="left")
    for col in ("case", "variant", "kernels", "trials", "median ms", "p10–p90 ms", "max abs err"):
        table.add_column(col, justify="right" if col != "case" and col != "variant" else "left")
    for base in baselines:
        table.add_column(f"× vs {base}", justify="right")
    for row in summary_rows(document):
        counts = ["" if row[k] is None else str(row[k]) for k in ("kernels", "trials")]
        if row["status"] != "ok":
            cells = [row["case"], row["variant"], *counts, f"[red]{row['status']}[/red]", row["reason"][:60], ""]
        else:
            cells = [
                row["case"],
                row["variant"],
                *counts,
                f"{row['median_ms']:.3f}",
                f"{row['p10_ms']:.3f}–{row['p90_ms']:.3f}",
                "ref" if row["max_abs"] is None else f"{row['max_abs']:.2g}",
            ]
        for base in baselines:
            ratio = row["speedup_vs"].get(base)
            cells.append("" if ratio is None else f"[{'green' if ratio >= 1 else 'red'}]{ratio:.2f}×[/]")
        table.add_row(*cells)
    return table


def partition_bench_table(document: dict) -> Table:
    """Per case: AGO's partition beside the stock one (what ``agoc partition`` prints), and how long AGO took."""
    table = Table(title="partitions (AGO | stock TVM)", title_justify="left")
    for col in ("case", "ops", "subgraphs", "trivial", "Jain", "partitioning ms", "complex chains (AGO)"):
        table.add_column(col, justify="left" if col in ("case", "complex chains (AGO)") else "right")
    for entry in document["results"]:
        fig = entry.get("partition")
        if fig is None:
            continue
        if "ago" not in fig:
            table.add_row(entry["label"], "", f"[red]{fig.get('status', 'failed')}[/red]", fig.get("reason", "")[:60])
            continue
        ago, stock = fig["ago"], fig["stock"]
        table.add_row(
            entry["label"], str(fig["ops"]), f"{ago['subgraphs']} | {stock['subgraphs']}",
            f"{ago['trivial']} | {stock['trivial']}", f"{ago['jain']:.2f} | {stock['jain']:.2f}",
            f"{ago['seconds'] * 1e3:.1f} | {stock['seconds'] * 1e3:.1f}", chains_cell(ago["chains"]),
        )
    return table


def geomean_table(rows: list[dict], runs: int) -> Table:
    """Speed-ups over the models (``bench.geomean_speedups``): per variant, baseline and cache regime the
    geometric mean, and each case's speed-up (the median over the runs that measured it, their range when
    several did)."""
    table = Table(title=f"geomean speed-up over the cases ({runs} run{'s' if runs != 1 else ''})", title_justify="left")
    for col in ("variant", "vs", "caches", "geomean", "per case"):
        table.add_column(col, justify="right" if col == "geomean" else "left")
    for row in rows:
        cases = []
        for label, case in row["cases"].items():
            spread = f" ({min(case['runs']):.2f}–{max(case['runs']):.2f}, {len(case['runs'])} runs)" \
                if len(case["runs"]) > 1 else ""
            cases.append(f"{label} {case['median']:.2f}×{spread}")
        g = row["geomean"]
        table.add_row(row["variant"], row["baseline"], row["cache"],
                      f"[{'green' if g >= 1 else 'red'}]{g:.2f}×[/]", "; ".join(cases))
    return table


def _mega(value) -> str:
    return "" if value is None else f"{value / 1e6:.2f}"


def _kilo(value) -> str:
    return "" if value is None else f"{value / 1e3:.1f}"


def proxy_result_table(result: dict) -> Table:
    """`agoc bench OUT --proxy G`: simulated figures per inference, the model and each fused kernel."""
    geo = result["geometry"]
    llc = [f"{c['size'] // 2**20}MiB" if c["size"] % 2**20 == 0 else f"{c['size'] // 1024}KiB" for c in geo["llc"]]
    l2 = geo["l2"]["size"] // 1024
    table = Table(
        title=f"phone-cache proxy '{geo['name']}': {result['model']}, per inference (valgrind callgrind, "
              f"{result['calls']} collected call(s) after {result['warmup']} warm-up, 1 thread, "
              f"{result['seconds']:.1f} s)",
        title_justify="left",
    )
    table.add_column("kernel")
    for col in ("instructions M", "D1 misses k", f"L2 misses k (LL {l2} KiB)", "L2 traffic MB",
                *(f"DRAM MB (LL {size})" for size in llc), "weights MB",
                *(f"beyond weights MB ({size})" for size in llc)):
        table.add_column(col, justify="right")

    def row(name: str, f: dict, style: str = "") -> None:
        beyond = f.get("dram_beyond_weights", {})
        cells = [_mega(f["instructions"]), _kilo(f["d1_misses"]), _kilo(f["l2_misses"]), _mega(f["l2_bytes"]),
                 *(_mega(f["dram_bytes"].get(size)) for size in llc),
                 _mega(f["weight_bytes"]) if "weight_bytes" in f else "",
                 *(_mega(beyond[size]) if size in beyond else "" for size in llc)]
        table.add_row(f"[{style}]{name}[/]" if style else name, *cells)

    model = result["model_figures"]
    row("whole model", model, "bold")
    for kernel in result["kernels"]:
        row(kernel["name"], kernel)
    return table


def proxy_bench_table(document: dict) -> Table:
    """Simulated phone-cache traffic of every variant of a suite (`bench-suite --proxy`), and ratios."""
    from host.bench import summary_rows

    proxy = document["context"].get("proxy") or {}
    rows = summary_rows(document)
    sizes = next((list(r["proxy"]["dram_bytes"]) for r in rows if r.get("proxy")), [])
    bases = [b for b in proxy.get("baselines", []) if any(b in r.get("dram_vs", {}) for r in rows)]
    table = Table(title=f"phone-cache proxy '{proxy.get('geometry')}': per inference (lower is better)",
                  title_justify="left")
    table.add_column("case")
    table.add_column("variant")
    for col in ("instr. M", "D1 misses k", "L2 misses k", *(f"DRAM MB ({s})" for s in sizes)):
        table.add_column(col, justify="right")
    for base in bases:
        table.add_column(f"DRAM ÷ {base} ({' / '.join(sizes)})", justify="right")
        table.add_column(f"beyond weights ÷ {base}", justify="right")
        table.add_column(f"least possible ÷ {base}", justify="right")  # the weights alone

    def ratio_cell(ratio: dict | None) -> str:
        return "" if not ratio else " / ".join(
            "–" if v is None else f"[{'green' if v <= 1 else 'red'}]{v:.2f}[/]" for v in ratio.values())

    for r in rows:
        if r.get("proxy_status") is None:
            continue
        if r["proxy_status"] != "ok":
            table.add_row(r["case"], r["variant"], f"[red]{r['proxy_status']}[/red]",
                          *([""] * (2 + len(sizes) + 3 * len(bases))))
            continue
        f = r["proxy"]
        cells = [_mega(f["instructions"]), _kilo(f["d1_misses"]), _kilo(f["l2_misses"]),
                 *(_mega(f["dram_bytes"].get(s)) for s in sizes)]
        for base in bases:
            cells += [ratio_cell(r["dram_vs"].get(base)), ratio_cell(r.get("dram_beyond_weights_vs", {}).get(base)),
                      ratio_cell(r.get("dram_floor_vs", {}).get(base))]
        table.add_row(r["case"], r["variant"], *cells)
    return table


STAT_ROWS = (
    ("subgraphs", "subgraphs", "{:d}"),
    ("trivial", "trivial subgraphs", "{:d}"),
    ("mean_weight", "mean weight", "{:.1f}"),
    ("median_weight", "median weight", "{:.1f}"),
    ("jain", "Jain's fairness index", "{:.3f}"),
    ("max_complex_ops", "max complex ops / subgraph", "{:d}"),
    ("acyclic", "acyclic", "{}"),
    ("seconds", "partitioning time (s)", "{:.3f}"),
)


def partition_stats_table(label: str, summary: dict, threshold: float, trivial_cut: float) -> Table:
    table = Table(
        title=f"{label}: AGO (Td {threshold:g}) vs stock TVM partition (trivial: weight < {trivial_cut:g})",
        title_justify="left",
    )
    table.add_column("statistic")
    table.add_column("AGO", justify="right")
    table.add_column("stock TVM", justify="right")
    for key, name, fmt in STAT_ROWS:
        table.add_row(name, fmt.format(summary["ago"][key]), fmt.format(summary["stock"][key]))
    table.add_row("complex chains in one subgraph", chains_cell(summary["ago"]["chains"]),
                  chains_cell(summary["stock"]["chains"]))
    return table


_SHORT_CLASS = {"pointwise_conv": "pw", "depthwise_conv": "dw"}


def chains_cell(chains: dict[str, int]) -> str:
    """``{"pointwise_conv→depthwise_conv": 7, ...}`` → ``"pw→dw 7, ..."``."""
    def short(pair: str) -> str:
        return "→".join(_SHORT_CLASS.get(k, k) for k in pair.split("→"))
    return ", ".join(f"{short(p)} {n}" for p, n in chains.items()) or "none"


def subgraphs_table(graph, plan, trivial_cut: float) -> Table:
    nodes = graph.by_id
    table = Table(title=f"AGO subgraphs ({len(plan.groups)})", title_justify="left")
    for col, just in (("#", "right"), ("ops", "right"), ("complex", "right"), ("weight", "right"), ("members", "left")):
        table.add_column(col, justify=just)
    for i, group in enumerate(plan.groups):
        complex_ops = [nodes[n] for n in group if nodes[n].is_complex]
        weight = plan.group_weight(group)
        members = ", ".join(f"{nodes[n].func}" for n in group)
        table.add_row(
            str(i),
            str(len(group)),
            " ".join(n.op_class.replace("_conv", "") for n in complex_ops) or "-",
            f"{weight:.0f}" + (" [dim](trivial)[/dim]" if weight < trivial_cut else ""),
            members if len(members) < 90 else members[:87] + "...",
        )
    return table


def decisions_table(decisions, graph) -> Table:
    table = Table(title="AGO clustering decisions (declined merges, excluded neighbours, pairs kept together)",
                  title_justify="left")
    table.add_column("decision")
    table.add_column("subgraph")
    table.add_column("partner")
    table.add_column("reason")
    funcs = {n.id: n.func for n in graph.nodes}
    for d in decisions:
        if d.kind == "merged" or (d.kind == "unit" and not d.partner):  # a conv and its epilogue: always
            continue
        table.add_row(d.kind, _short(d.nodes, funcs), _short(d.partner, funcs), d.reason)
    return table


def traffic_table(record: dict, judged_now=()) -> Table:
    """A database's joins judged by simulated DRAM traffic (host/bench/judge.py): per join, the whole model's
    bytes per inference with it joined and with its minis (the joins judged before it as kept)."""
    now = f", {len(judged_now)} judged now" if judged_now else ""
    table = Table(title=f"joins judged in {record.get('geometry', '?')}'s caches: the model's DRAM KB per inference "
                        f"(LL {record.get('cache', '?')}, {record.get('target', '?')} build{now}; baseline "
                        f"{record.get('baseline_bytes', 0) / 1e3:.0f} KB, "
                        f"kept {record.get('final_bytes', 0) / 1e3:.0f} KB; "
                        "each join judged with the flips kept before it)", title_justify="left")
    table.add_column("join")
    table.add_column("joined", justify="right")
    table.add_column("as minis", justify="right")
    table.add_column("joined − minis", justify="right")
    table.add_column("built")
    for name, j in sorted(record.get("joins", {}).items()):
        joined, minis = j["joined_bytes"], j["minis_bytes"]
        table.add_row(name, f"{joined / 1e3:.1f}", f"{minis / 1e3:.1f}", f"{(joined - minis) / 1e3:+.1f}",
                      "joined" if joined < minis else "[yellow]minis[/yellow]" if joined > minis else "either")
    return table


def _short(nodes, funcs) -> str:
    names = [f"{funcs[n]}:{n}" for n in nodes or ()]
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:2])} … (+{len(names) - 2})"


def bench_result_table(result: dict) -> Table:
    table = Table(title=f"bench {result['model']} on {result['device']} ({result['device_kind']})",
                  title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("median_ms", "mean_ms", "min_ms", "max_ms", "std_ms", "load_ms"):
        if key in result:
            table.add_row(key.replace("_", " "), f"{result[key]:.3f}")
    table.add_row("samples", str(len(result.get("samples_ms", []))))
    table.add_row("threads", str(result.get("threads", "")))
    table.add_row("cores", ",".join(map(str, result.get("cores", []))) or "any")
    freqs = result.get("cpu_freq_khz") or {}
    if freqs:
        table.add_row("cpu MHz", " ".join(f"{int(v) // 1000}" for v in freqs.values()))
    temps = result.get("thermal_c") or {}
    if temps:
        table.add_row("thermal °C", " ".join(f"{float(v):.0f}" for v in temps.values()))
    return table


def per_kernel_table(result: dict) -> Table:
    """`agoc bench --per-kernel`: each kernel's time per run, its GFLOP/s and its share of the FMA peak measured
    on as many threads; slowest first."""
    peak = result.get("peak") or {}
    total = sum(k.get("median_ms") or 0.0 for k in result["kernels"]) or 1.0
    title = (f"{len(result['kernels'])} kernels, slowest first; peak {peak.get('gflops', 0):.0f} GFLOP/s "
             f"({peak.get('isa', '?')} FMA, {peak.get('threads', '?')} thread(s), measured by the runner)")
    table = Table(title=title, title_justify="left")
    for column in ("kernel", "calls", "ms per run", "share", "GFLOP/s", "of peak", "GB/s args"):
        table.add_column(column, justify="left" if column == "kernel" else "right")
    for k in sorted(result["kernels"], key=lambda k: -(k.get("median_ms") or 0.0)):
        fraction = k.get("peak_fraction")
        table.add_row(k["name"], f"{k.get('calls_per_run', 0):g}", f"{k.get('median_ms') or 0:.4f}",
                      f"{100 * (k.get('median_ms') or 0) / total:.1f}%",
                      "—" if k.get("gflops") is None else f"{k['gflops']:.1f}",
                      "—" if fraction is None else f"{100 * fraction:.1f}%",
                      "—" if k.get("gbytes_s") is None else f"{k['gbytes_s']:.1f}")
    return table


def against_table(model: str, result, name: str = "agoc") -> Table:
    """`agoc bench OUT --against ...`: medians per cache regime and each other member's ms ÷ the artifact's
    (``name``: how the artifact is called; above 1: it is faster)."""
    others = [m for m in ("onnxruntime", *result.builds) if any(m in v for v in result.median_ms.values())]
    table = Table(title=f"{model}: {name} beside {', '.join(others) or 'nothing'} on this machine, {result.threads} "
                  f"thread(s), {result.rounds} rounds × {result.calls} calls, separate processes", title_justify="left")
    table.add_column("caches")
    for member in (name, *others):
        table.add_column(f"{member} ms", justify="right")
    for member in others:
        table.add_column("speed-up" if others == ["onnxruntime"] else f"{member} ÷ {name}", justify="right")
    for regime, medians in result.median_ms.items():
        versus = result.versus.get(regime) or ({"onnxruntime": result.speedup[regime]} if regime in result.speedup
                                               else {})
        why = "; ".join(result.failures.get(regime, {}).values())[:60]
        cells = [f"[{'green' if versus[m] >= 1 else 'yellow'}]{versus[m]:.2f}×[/]" if m in versus else why or "—"
                 for m in others]
        table.add_row(regime, *(f"{medians[e]:.3f}" if e in medians else "—" for e in ("agoc", *others)), *cells)
    busy = {f"{engine} {n}/{result.rounds} {regime}" for regime, counts in result.disturbed.items()
            for engine, n in counts.items()}
    if busy:
        table.caption = (f"[yellow]rounds timed while other programs kept this machine's cores busy: "
                         f"{', '.join(sorted(busy))} — those times are too slow; time again on an idle machine[/]")
    return table


def tune_status_table(summary: dict, db_dir) -> Table:
    settings = summary["session"]["settings"]
    latency = settings.get("scheduler") == "latency"
    title = (
        f"tuning database {db_dir}: partition {settings['partition']['method']}, {settings['trials']} trials"
        f"{' (latency scheduler: trials/first batch)' if latency else ''}, "
        f"intensive {'on' if settings['intensive'] else 'off'}, reformer {'on' if settings['reformer'] else 'off'}; "
        f"estimated model latency {summary['estimate_ms']:.3f} ms"
        + (f" (not counting {summary['unscheduled']} kernel(s) without a verified schedule, built on an untuned "
           "schedule)" if summary.get("unscheduled") else "")
    )
    table = Table(title=title, title_justify="left")
    for col, just in (("kernel", "left"), ("phase", "left"), ("calls", "right"), ("trials", "right"),
                      ("best verified ms", "right"), ("rejected", "right"), ("status", "left")):
        table.add_column(col, justify=just)
    for r in summary["tasks"]:
        best = "" if r["best_ms"] is None else f"{r['best_ms']:.4f}"
        table.add_row(r["task"], r["phase"], str(r["calls"]), f"{r['trials']}/{r['budget']}", best,
                      str(r["rejected"]), r["status"] + (" (search failed)" if r.get("search_error") else "")
                      + (" (space exhausted)" if r.get("exhausted") else "")
                      + (f" (at {r['at_roof']:.0%} of the roof)" if r.get("at_roof") else "")
                      + (f" ({r['handed_back']} trials to its minis)" if r.get("handed_back") else "")
                      + (f" (seeded from {r['seeded_from']} kernel(s) like it)" if r.get("seeded_from") else "")
                      + _join_note(r))
    if summary.get("phases"):
        table.caption, table.caption_justify = phases_line(summary["phases"][-1]), "left"
    return table


def phases_line(run: dict) -> str:
    """Where the last session run's time went (toolchain/tune/phases.py): seconds and share per phase."""
    wall = run.get("wall_s") or 0.0
    parts = [f"{name} {secs:.0f} s ({secs / wall:.0%})" for name, secs in run["seconds"].items() if secs and wall]
    per = f", {run['s_per_trial']:.2f} s/trial" if run.get("s_per_trial") else ""
    line = f"last run: {wall:.0f} s for {run.get('trials', 0)} trials{per}: " + ", ".join(parts)
    return line + (f". {disturbed_note(run)}" if run.get("disturbed") else "")


def disturbed_note(run: dict) -> str:
    """What a session's candidates timed while other programs held the cores mean (toolchain/timing.py)."""
    return (f"{run['disturbed']} candidate(s) could be timed only while other programs kept this machine's cores "
            f"busy (their threads waited {run.get('waited', 0):.0%} of the time): those times are too slow and "
            "may have kept a worse schedule; tune again on an idle machine")


def tune_compare_table(comparison: dict, db_dir, other) -> Table:
    """The kernels two databases both tuned (toolchain.tune.db.compare), slowest ratio first."""
    rows, geomean = comparison["kernels"], comparison["geomean"]
    title = (f"{len(rows)} kernels tuned in both" + (f", geometric mean {geomean:.2f}×" if geomean is not None else "")
             + f" (model estimates {comparison['estimate_ms']:.3f} ÷ {comparison['other_estimate_ms']:.3f} ms)")
    table = Table(title=title, title_justify="left", caption=f"ms: {db_dir}; other ms: {other}",
                  caption_justify="left")
    for col, just in (("kernel", "left"), ("phase", "left"), ("ms", "right"), ("other ms", "right"),
                      ("ratio", "right"), ("trials", "right")):
        table.add_column(col, justify=just)
    for r in rows:
        table.add_row(r["task"], r["phase"], f"{r['ms']:.4f}", f"{r['other_ms']:.4f}", f"{r['ratio']:.2f}×",
                      f"{r['trials']} / {r['other_trials']}")
    return table


def _join_note(row: dict) -> str:
    """What compile --db builds for a joined row, and on which measurement."""
    if row.get("build") is None:
        return ""
    paired = row.get("paired")
    timed = f" (timed together: {1 / paired['ratio']:.2f}× its minis' time)" if paired else ""
    return f" → built {'joined' if row['build'] == 'joined' else 'as its minis'}{timed}"


def rpc_report_table(report: dict) -> Table:
    """What each device of an RPC tuning run did (sessions, measurements, losses)."""
    table = Table(
        title=f"devices (tracker {report.get('tracker')}, key {report.get('key')}): "
              f"{report.get('retried', 0)} candidates retried after a device failure, {report.get('failed', 0)} failed",
        title_justify="left",
    )
    for col, just in (("device", "left"), ("measured", "right"), ("paired", "right"), ("sessions", "right"),
                      ("lost sessions", "right"), ("runner restarts", "right"), ("state", "left")):
        table.add_column(col, justify=just)
    for name, d in report.get("devices", {}).items():
        table.add_row(name, str(d.get("measured", 0)), str(d.get("paired", 0)), str(d.get("sessions", "")),
                      str(d.get("failed", "")),
                      str(d.get("restarts", "")), str(d.get("state", "")))
    return table


def tracker_table(summary: dict, where: str) -> Table:
    """`agoc tracker status`: registered servers and the queue per key."""
    table = Table(title=f"RPC tracker {where}", title_justify="left")
    for col, just in (("key", "left"), ("servers", "right"), ("free", "right"), ("pending requests", "right"),
                      ("addresses", "left")):
        table.add_column(col, justify=just)
    queue = summary.get("queue_info", {})
    servers: dict[str, list[str]] = {}
    for s in summary.get("server_info", []):
        k = s.get("key", "").split(":", 1)[-1]
        addr = s.get("addr") or ["?", "?"]
        servers.setdefault(k, []).append(f"{addr[0]}:{addr[1]}")
    for k in sorted(set(servers) | set(queue)):
        q = queue.get(k, {})
        table.add_row(k, str(len(servers.get(k, []))), str(q.get("free", 0)), str(q.get("pending", 0)),
                      ", ".join(servers.get(k, [])))
    return table
