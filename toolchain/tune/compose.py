"""Seeds: a search starts from schedules already verified — a join's minis' composed onto it (side by
side, or in the intensive-fusion structure), or a sibling kernel's re-fitted to its loops."""

from __future__ import annotations

import logging
import math

from toolchain.tune import intensive_seed, pairs, rowblock, transfer
from toolchain.tune.adapter import Measure, commit_seed, postprocess, workload_module
from toolchain.tune.plan import TaskPlan
from toolchain.tune.settings import Task, TuneSettings
from toolchain.tune.space import dry_run
from toolchain.tune.traces import LOOKUPS, rename_blocks, replay_tolerant, unroll_of

log = logging.getLogger("agoc.tuning")


def compose_joined(joined_func, minis: list[tuple[object, dict]]):
    """Replay each mini's kept trace on the joined kernel (block names mapped); a Schedule, or None.

    ``minis`` holds (trace JSON, block map) pairs. A step that does not replay on the joined kernel
    (seen: a mini's ``reverse_compute_at`` of a residual add, whose other operand the joined kernel
    computes itself) is left out when nothing refers to its results, otherwise the trace stops
    there (:func:`replay_tolerant`); a mini of which nothing but lookups replays is skipped.
    """
    from tvm import s_tir

    sch = s_tir.Schedule(workload_module(joined_func))
    applied = 0
    for trace_json, block_map in minis:
        if not block_map:
            continue
        trial, kept, dropped = replay_tolerant(sch, rename_blocks(trace_json, block_map))
        if dropped:
            log.info("composition left out %d step(s) of a mini: %s", len(dropped), ", ".join(dropped))
        if not any(inst[0] not in LOOKUPS for inst in kept[0]):
            continue
        sch, applied = trial, applied + 1
    return sch if applied else None


def restore_unroll(sch, minis: list[tuple[object, dict]]) -> int:
    """Give each loop nest of a composed, postprocessed kernel its own mini's auto-unroll depth.

    MetaSchedule samples one unroll depth per kernel, as a root annotation; composed, the last mini's
    depth would rule every nest (measured on a MnasNet join of three convs: 0.19 ms with the right
    depths, 0.34 with the last mini's 512). Returns how many nests were changed."""
    nests: list = []  # (outermost loop, its For node, depth): the first mini to claim a nest sets it
    for trace_json, block_map in minis:
        depth = unroll_of(trace_json)
        if depth is None:
            continue
        for name in block_map.values():  # (a reduction block is split into _init / _update by postprocessing)
            for block in (name, f"{name}_init", f"{name}_update"):
                try:
                    loops = sch.get_loops(sch.get_sblock(block))
                except Exception:  # noqa: BLE001 - inlined, or renamed: nothing of its own
                    continue
                if loops and not any(sch.get(loops[0]).same_as(node) for _, node, _ in nests):
                    nests.append((loops[0], sch.get(loops[0]), depth))
    for outer, _, depth in nests:
        for ann in ("pragma_auto_unroll_max_step", "pragma_unroll_explicit"):  # (annotate keeps an existing value)
            if ann in sch.get(outer).annotations:
                sch.unannotate(outer, ann)
        if depth:
            sch.annotate(outer, "pragma_auto_unroll_max_step", depth)
            sch.annotate(outer, "pragma_unroll_explicit", 1)
    return len(nests)


def seed_joined(task: Task, plan: TaskPlan, database, spec, verified: dict, settings: TuneSettings,
                measure: "Measure | None" = None, limit: int | None = None) -> bool:
    """Compose the minis' verified schedules onto the joined kernel and, if the result passes the
    static checks and builds, measure it and commit it as the joined kernel's first record: the
    search then starts from it. Its latency is measured like any candidate's, never estimated.
    Nothing is composed while a mini with blocks of its own has no verified schedule: its blocks would stay TVM's
    unscheduled loops in the join, which `compile --db` would then build in place of the minis' untuned schedules
    (docs/tuning-internals.md, A tuning session); the join gets a batch of its own instead.
    ``limit``: records it may commit at most (each is a trial of the session's budget)."""
    named = plan.compositions.get(task.name, [])
    unmeasured = [name for name, mapping in named if mapping and verified.get(name, {}).get("status") != "verified"]
    if unmeasured:
        log.info("%s: not composed, %d of its minis have no verified schedule (%s)", task.name, len(unmeasured),
                 ", ".join(unmeasured))
        return False
    parts = [(verified[name]["trace"], mapping) for name, mapping in named if mapping]
    func = plan.funcs[task.name]
    sch = compose_joined(func, parts) if parts else None
    if sch is not None:
        sch = postprocess(sch, spec)
    if sch is not None:
        restore_unroll(sch, parts)
    left = math.inf if limit is None else limit
    committed = sch is not None and left > 0 and commit_seed(sch, func, database, spec, settings, measure)
    left -= committed
    if settings.intensive and settings.partition.method == "ago" and parts and left > 0:  # the join's own space
        for fused in intensive_composed(func, parts, spec, settings.tile_cache):
            if left > 0 and commit_seed(fused, func, database, spec, settings, measure):
                committed, left = True, left - 1
    return committed


def intensive_composed(func, parts: list[tuple[object, dict]], spec, tile_cache: int = 0) -> list:
    """The minis' schedules composed into the intensive-fusion structure of the joined kernel
    (toolchain/tune/intensive_seed.py), postprocessed, the nests outside the pair at their own minis'
    unroll depths; none where the join's space is not the intensive one or nothing composes.
    ``tile_cache``: the space's cap on a tile's slice of the intermediate (0: none)."""
    pair = pairs.find_pair(func, tile_cache, spec.num_cores)
    if pair is None or dry_run(func, pair, spec.tvm(), num_cores=spec.num_cores) is not None:
        return []
    inside = set(pair.blocks)
    out = []
    for sch in intensive_seed.intensive_seeds(func, pair, parts, spec.tvm(), spec.num_cores, tile_cache):
        sch = postprocess(sch, spec)
        if sch is not None:
            restore_unroll(sch, [(t, m) for t, m in parts if not inside & set(m.values())])
            out.append(sch)
    return out


def seed_from_siblings(task: Task, plan: TaskPlan, database, spec, verified: dict, settings: TuneSettings,
                       measure: "Measure | None" = None) -> list[str]:
    """Start ``task`` from the verified schedules of up to ``settings.transfer`` kernels with the same
    blocks (toolchain/tune/transfer.py), each re-fitted to its loops, measured and committed as a record;
    the names of the kernels whose schedules were committed."""
    import tvm_ffi

    func = plan.funcs[task.name]
    done = {name: plan.funcs[name] for name, v in verified.items()
            if v.get("status") == "verified" and v.get("trace") and name in plan.funcs and name != task.name}
    seeded, seen = [], set()
    for name in transfer.siblings(func, done, settings.transfer):
        sch = transfer.transfer_schedule(workload_module(plan.funcs[name]), rename_blocks(verified[name]["trace"], {}),
                                         workload_module(func))
        sch = postprocess(sch, spec) if sch is not None else None
        if sch is None:
            continue
        key = tvm_ffi.structural_hash(sch.mod)
        if key in seen:  # two siblings' schedules may land on the same one here
            continue
        seen.add(key)
        if commit_seed(sch, func, database, spec, settings, measure):
            seeded.append(name)
    return seeded


def seed_from_block(task: Task, plan: TaskPlan, database, spec, verified: dict, settings: TuneSettings,
                    measure: "Measure | None" = None) -> str:
    """Start ``task`` from its register block (a conv, a matmul, a pool: tune/microkernel.py), a fused kernel of the
    intensive space from its convs' register blocks (up to ``settings.transfer`` seeds: tune/intensive_seed.py), its
    row schedule (a layer norm, a softmax: tune/rows.py) or, with no reduction, its blocks as parallel passes (a
    reshape mini that no search reaches: with no record of it, its join could not be composed or timed against its
    minis), measured and committed as a record when it passes the static checks; the block's shape, or "" (none, or
    it failed)."""
    from toolchain.tune.untuned import block_schedule, rows_schedule

    if settings.transfer <= 0:
        return ""
    func = plan.funcs[task.name]
    sch, shape = block_schedule(func, spec, spatial=True)
    if sch is None and settings.intensive:
        found = intensive_blocks(func, spec, settings.tile_cache)[:settings.transfer]
        committed = [shape for sch, shape in found if commit_seed(sch, func, database, spec, settings, measure)]
        if committed:
            return f"fused {committed[0]}"
        sch, shape = rows_schedule(func, spec, passes=True)
    return shape if sch is not None and commit_seed(sch, func, database, spec, settings, measure) else ""


def intensive_blocks(func, spec, tile_cache: int = 0) -> list:
    """``func`` at its row blocks (tune/rowblock.py) and in the intensive-fusion space at its convs' register blocks
    (:func:`intensive_seed.block_seeds`), postprocessed, each with D's block; none where neither applies."""
    try:
        found = rowblock.row_blocks(func, spec.tvm(), spec.num_cores, tile_cache)
        found += intensive_seed.block_seeds(func, spec.tvm(), spec.num_cores, tile_cache)
    except Exception as exc:  # noqa: BLE001 - a kernel the structure does not fit: no seed from it
        log.info("no intensive block seed: %s", exc)
        return []
    return [(sch, shape) for sch, shape in ((postprocess(s, spec), shape) for s, shape in found) if sch is not None]


def seed_from_library(task: Task, plan: TaskPlan, database, spec, verified: dict, settings: TuneSettings,
                      measure: "Measure | None", library) -> list[str]:
    """Start ``task`` from the schedules a record library holds for kernels like it (re-fitted to its loops,
    measured and committed as records); the library's names of the kernels whose schedules were committed."""
    return library.seed(task, plan.funcs[task.name], database, spec, settings, measure)
