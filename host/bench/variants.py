"""Building one variant of a case: its tuning budget and settings, tuning, compiling, verifying, and its
phone-cache proxy figures."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from host.bench.suites import Case, Settings, Suite, Variant

log = logging.getLogger(__name__)


def suite_threshold(suite: Suite) -> float:
    from toolchain.settings import DEFAULT_THRESHOLD

    return suite.threshold if suite.threshold is not None else DEFAULT_THRESHOLD


def partition_of(variant: Variant, suite: Suite):
    """(PartitionSettings, tile cache cap in bytes) of a variant at the suite's Td: its ``keep_inside`` sets
    both, as ``--keep-inside`` does."""
    from toolchain.settings import PartitionSettings

    return PartitionSettings(variant.partition, suite_threshold(suite), variant.keep_inside), variant.keep_inside


def tune_settings(variant: Variant, suite: Suite, settings: Settings, trials: int | None = None):
    from toolchain.tune import TuneSettings

    parts, tile_cache = partition_of(variant, suite)
    return TuneSettings(
    trials=settings.trials if trials is None else trials, partition=parts, tile_cache=tile_cache,
    intensive=variant.intensive, reformer=variant.reformer, seed=settings.seed, cold_weights=variant.cold_weights,
    scheduler=settings.scheduler, prepack=settings.prepack, transfer=settings.transfer,
    population=settings.population,
    )


def _case_model(case: Case, settings: Settings):
    """(ONNX model, target spec) of a case."""
    import models as zoo
    from toolchain.targets import resolve_target

    spec = resolve_target(settings.target, num_cores=settings.threads, layout=settings.layout,
                          pad_channels=settings.pad_channels, fast_math=settings.fast_math)
    return zoo.build(case.model, case.shape), spec


def _legalized(model, spec):
    """The legalized Relax module of ``model`` (what is partitioned and tuned)."""
    from toolchain import build, onnx_import

    return build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), spec)


#: Partitioning time is the median of this many runs of each partitioner on the case's op graph.
PARTITION_REPEATS = 5


def partition_figures(case: Case, suite: Suite, settings: Settings) -> dict:
    """The case's AGO and stock partitions as ``agoc partition --json`` reports them (subgraphs, trivial, Jain,
    complex chains, ...), with the partitioning time the median of :data:`PARTITION_REPEATS` runs; ``ops`` and
    ``graph_seconds``: the op graph both partition (extracted once, its time apart)."""
    from toolchain import partition
    from toolchain.opgraph import op_graph
    from toolchain.settings import PartitionSettings

    model, spec = _case_model(case, settings)
    mod = _legalized(model, spec)
    started = time.perf_counter()
    graph = op_graph(mod)
    figures: dict = {"ops": len(graph.nodes), "graph_seconds": round(time.perf_counter() - started, 3)}
    for method in ("ago", "stock"):
        method_settings = PartitionSettings(method, suite_threshold(suite))
        plans = [partition.plan(method_settings, mod, spec, graph) for _ in range(PARTITION_REPEATS)]
        partition.check(graph, plans[0])
        seconds = sorted(p.seconds for p in plans)[len(plans) // 2]
        figures[method] = {**partition.stats(graph, plans[0]), "seconds": round(seconds, 4)}
    return figures


#: With the latency scheduler, the equal budget is at least this many times the largest first pass
#: (a first batch per task) of the tuned variants: half of AGO's budget or more goes where it pays.
LATENCY_HEADROOM = 2
#: With the weight plan, the equal budget is at least this many times the largest plan's floors (a batch
#: per task, a split subgraph one per mini it brings and one for its join): a quarter of it or more is
#: spread by weight. At exactly the floors every AGO task gets one batch (MobileNet-V2 @112: 45 tasks,
#: 720 trials), and one batch of MetaSchedule is a draw (bench/JOURNAL.md).
WEIGHT_HEADROOM = 4 / 3


def equal_budget(case: Case, tuned: list[Variant], suite: Suite, settings: Settings) -> int:
    """The case's trial budget, the same for every tuned variant: the suite's, raised (in whole search
    batches) to :data:`WEIGHT_HEADROOM` × the largest plan's floors, since every task gets at least one
    batch and the stock partition of a large model has more kernels than the suite's budget has batches.
    With the latency scheduler: at least :data:`LATENCY_HEADROOM` × the largest first pass."""
    from toolchain.tune import TuneSettings, floor_trials

    model, spec = _case_model(case, settings)
    mod = _legalized(model, spec)
    batch = TuneSettings().per_iter
    if settings.scheduler == "latency":  # the first pass: a first batch per task
        headroom, floors = LATENCY_HEADROOM, [floor_trials(mod, spec, tune_settings(v, suite, settings))
                                              for v in tuned]
    else:  # a weight plan for no trials at all is its floors
        headroom, floors = WEIGHT_HEADROOM, [floor_trials(mod, spec, tune_settings(v, suite, settings, 0))
                                             for v in tuned]
    return max(settings.trials, -(-round(headroom * max(floors)) // batch) * batch)


def variant_db(case: Case, variant: Variant, work_dir: Path) -> Path:
    """The tuning database a tuned variant is built from: its own, or the one it shares (``db_of``)."""
    return work_dir / case.label / f"{variant.db_of or variant.name}.db"


def join_rule(variant: Variant) -> str:
    """The variant's ``joins`` as a rule of toolchain.tune.pairing.JOIN_RULES (a geometry: ``traffic:NAME``)."""
    from toolchain.tune import rule_for

    return rule_for(variant.joins)


def _judge(case: Case, variant: Variant, model, db: Path, on_event) -> dict:
    """The variant's joins judged in its geometry and kept in the suite's own database: its record."""
    from host.bench import judge

    started = time.perf_counter()
    judged = judge.keep_judgement(model, case.label, {}, db, variant.joins, on_stage=lambda stage: on_event(
        "stage", case=case.label, stage=f"{variant.name}: {stage}"))
    return {"rule": variant.joins, "cache": judged.get("cache"), "judged": len(judged.get("joins", {})),
            "baseline_bytes": judged.get("baseline_bytes"), "final_bytes": judged.get("final_bytes"),
            "seconds": round(time.perf_counter() - started, 1)}


def _tune(case: Case, variant: Variant, suite: Suite, settings: Settings, model, spec, db: Path, base: Path | None,
          on_event) -> dict:
    """Tune the variant into ``db`` (from ``base``'s records, when it has one): its tuning record."""
    from toolchain import onnx_import
    from toolchain.tune import TuneDB, tune_model

    mod = _legalized(model, spec)
    started = time.perf_counter()

    def tuning_event(event):  # a toolchain.tune.events record, forwarded whole
        on_event("tuning", case=case.label, variant=variant.name, event=event)

    summary = tune_model(mod, onnx_import.model_hash(model), spec,
                         tune_settings(variant, suite, settings), db, on_event=tuning_event, base=base)
    return {
        "trials": summary["trials"],  # the records of the session's kernels (db.status)
        "budget": settings.trials,
        "kernels": len([r for r in summary["tasks"] if r["phase"] != "mini"]),
        "verified": len([r for r in summary["tasks"] if r["status"] == "verified"]),
        "rejected_candidates": sum(r["rejected"] for r in summary["tasks"]),
        "estimate_ms": summary["estimate_ms"],  # the database's model estimate (verified latencies)
        **({"base": variant.base, "imported_records": sum(TuneDB(db).imported.values())} if base else {}),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _missing(db: Path, variant_name: str, how: str) -> dict | None:
    """A failed record when the database a variant needs (``variant_name``'s) was not made by this run."""
    if (db / "session.json").exists():
        return None
    return {"status": "failed", "reason": f"{how} {variant_name}'s tuning database, which this run has not made: "
            f"add --variants {variant_name}"}


def _databases(case: Case, variant: Variant, work_dir: Path) -> tuple[Path | None, Path | None, dict | None]:
    """(the variant's database, the one its tuning starts from, a failed record when one is missing)."""
    if variant.db_of:
        db = variant_db(case, variant, work_dir)
        return db, None, _missing(db, variant.db_of, "built from")
    if not variant.tuned:
        return None, None, None
    base = work_dir / case.label / f"{variant.base}.db" if variant.base else None
    return (work_dir / case.label / f"{variant.name}.db", base,
            _missing(base, variant.base, "starts from") if base is not None else None)


def compile_variant(case: Case, variant: Variant, suite: Suite, settings: Settings, work_dir: Path,
                    on_event) -> tuple[dict, Path | None]:
    """Compile (tuning first if the variant is tuned) + verify one TVM variant; (record, artifact dir or None)."""
    from host.devices import LocalDevice
    from toolchain.errors import AgocError, first_line
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler
    from toolchain.verify import verify_artifact

    out = work_dir / case.label / variant.name
    record: dict = {"status": "ok"}
    try:
        model, spec = _case_model(case, settings)
        db, base, missing = _databases(case, variant, work_dir)
        if missing:
            return missing, None
        if variant.db_of:
            record["tuning"] = {"db_of": variant.db_of}
            if variant.joins != "latency":
                record["joins"] = _judge(case, variant, model, db, on_event)
        elif variant.tuned:
            record["tuning"] = _tune(case, variant, suite, settings, model, spec, db, base, on_event)
        request = CompileRequest(model, case.label, spec, partition=partition_of(variant, suite)[0], db=db,
                                 joins=join_rule(variant), untuned=variant.untuned)
        artifact = compile_model(request, find_compiler(spec), out)
        if "joins" in record:  # the judged joins built as their minis
            record["joins"]["minis"] = len((artifact.manifest.partition_info or {}).get("unfused") or [])
        record["compile_s"] = artifact.manifest.compile_seconds
        record["kernels"] = len(artifact.manifest.kernels)
        report = verify_artifact(artifact, LocalDevice())
        record["verify"] = {
            "passed": report.passed,
            "max_abs": max(o.max_abs for o in report.outputs),
            "max_rel": max(o.max_rel for o in report.outputs),
        }
        if not report.passed:
            return {**record, "status": "wrong", "reason": "outputs differ from onnxruntime"}, None
    except AgocError as exc:
        return {"status": "failed", "reason": str(exc)}, None
    except Exception as exc:
        log.exception("%s %s", case.label, variant.name)
        return {"status": "failed", "reason": f"internal error: {type(exc).__name__}: {first_line(exc)}"}, None
    return record, out


def proxy_variant(case: Case, variant: Variant, suite: Suite, settings: Settings, work_dir: Path,
                   artifact_dir: Path) -> dict:
    """Phone-cache proxy figures of one compiled TVM variant (design §5).

    valgrind cannot run AVX-512 kernels: unless the artifact is already at AVX2 or below, the same
    kernels (same partition, same verified schedules) are rebuilt for ``host-avx2`` and verified.
    """
    import models as zoo
    from host.bench import proxy
    from host.devices import LocalDevice
    from toolchain.artifact import load_artifact
    from toolchain.errors import AgocError
    from toolchain.pipeline import CompileRequest, compile_model
    from toolchain.targets import find_compiler, resolve_target
    from toolchain.verify import verify_artifact

    try:
        geo = proxy.geometry(settings.proxy)
        artifact = load_artifact(artifact_dir)
        if proxy.has_avx512(artifact.manifest.target["tvm_target"]):
            spec = resolve_target("host-avx2", num_cores=settings.threads, layout=settings.layout,
                                  pad_channels=settings.pad_channels, fast_math=settings.fast_math)
            db = variant_db(case, variant, work_dir) if variant.tuned else None
            request = CompileRequest(zoo.build(case.model, case.shape), case.label, spec,
                                     partition=partition_of(variant, suite)[0], db=db, joins=join_rule(variant),
                                     untuned=variant.untuned)
            out_dir = work_dir / case.label / f"{variant.name}@{spec.preset}"
            artifact = compile_model(request, find_compiler(spec), out_dir)
            if not verify_artifact(artifact, LocalDevice()).passed:
                return {"status": "wrong", "reason": f"the {spec.preset} build differs from onnxruntime"}
        return {"status": "ok", **proxy.measure(artifact, geo)}
    except AgocError as exc:
        return {"status": "failed", "reason": str(exc)}


def proxy_baselines(suite: Suite) -> tuple[str, ...]:
    """What simulated traffic is compared with: the stock partition (untuned and tuned), then the suite's baselines."""
    return tuple(dict.fromkeys(("tvm-stock", "tvm-stock-tuned", *suite.baselines)))
