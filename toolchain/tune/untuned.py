"""Schedules for the kernels no tuning database covers (a compile without --db, or kernels a tune did not
reach): the record library's schedule of the nearest kernel like it, re-fitted, else a sample of the search
space; each passes the static checks, and the model's self-check guards the build. Why: docs/tuning.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from toolchain import build
from toolchain.errors import BuildError
from toolchain.opgraph import block_nests
from toolchain.tune import forked, intrinsics, microkernel, rowblock, rows
from toolchain.tune.adapter import passes_static_checks, postprocess, workload_module
from toolchain.tune.applied import apply_records
from toolchain.tune.plan import group_kernels
from toolchain.tune.settings import TuningError
from toolchain.tune.space import make_space_generator
from toolchain.tune.traces import plain, rename_blocks, with_unroll_at_most

log = logging.getLogger("agoc.tuning")

#: what a kernel without a tuned schedule gets (``--untuned``)
RULES = {
    "library": "the record library's schedule of the same kernel; else a register block (pointwise and depthwise "
               "convs, matmuls, pools) or a row schedule (layer norms, softmax); "
               "else the library's nearest kernel's, re-fitted to its loops; else a sample of the search space",
    "sampled": "a sample of the search space (parallel, vectorised loops; tiles drawn at random, seeded by the kernel)",
    "plain": "TVM's unscheduled loop nest: one core, no vectors (what a build without schedules runs)",
}
DEFAULT = "library"
#: the library's nearest records tried in turn before sampling
NEAREST = 3
#: kernels with more reductions than this (an AGO subgraph of a whole network's tail at a small input) are not
#: sampled at compile time: MetaSchedule's tiling of such a kernel takes minutes (`agoc tune` splits it first)
MAX_SAMPLED_REDUCTIONS = 6
#: the deepest auto-unroll a sampled schedule keeps: an intensive pw-pw kernel built in 48 s at 64, 0.8 s at 16
MAX_SAMPLED_UNROLL = 16
#: seconds one kernel's schedule may take to find (MetaSchedule's space of a matmul with fast-math activations
#: and a softmax did not come back in minutes; a kernel past it stays plain)
TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Fallback:
    """What one kernel without a tuned schedule was given."""

    kernel: str
    source: str  # "library" | "block" | "rows" | "sampled" | "plain"
    detail: str = ""  # the library record's name, or why plain

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "source": self.source, **({"detail": self.detail} if self.detail else {})}


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise TuningError(f"unknown --untuned '{rule}'; choose one of: {', '.join(RULES)}")
    return rule


def _is_scheduled(func) -> bool:
    attrs = func.attrs
    return attrs is not None and bool(attrs.get("tirx.is_scheduled", False))


def _seed_of(func, seed: int) -> int:
    """A sampling seed for ``func`` from its structure: the same kernel gets the same sample in any model."""
    import tvm_ffi

    return (tvm_ffi.structural_hash(func) + seed) % (2**31 - 1) or 1


def from_library(library, func, spec, entries=None):
    """The first of the library's nearest records (or of ``entries``) that re-fits to ``func`` and passes the static
    checks: (schedule, its name), or (None, "")."""
    for entry in library.nearest(func, NEAREST) if entries is None else entries:
        try:
            sch = library.fit(entry, func, spec)
        except Exception as exc:  # noqa: BLE001 - a record that does not carry over: the next one
            log.info("library record %s does not fit %s: %s", entry.name, func, exc)
            continue
        if sch is not None and passes_static_checks(sch, func):
            return sch, entry.name
    return None, ""


def sampled(func, spec, seed: int):
    """A sample of the space the search starts from (the intensive space where it applies; not the register block,
    which a sample falls back from), its unroll at most :data:`MAX_SAMPLED_UNROLL`, postprocessed and statically
    checked; None if no design of it is."""
    from tvm import s_tir

    target = spec.tvm()
    generator = make_space_generator(func, target, intensive=True, block=False).generator
    ctx = intrinsics.tune_context(mod=workload_module(func), target=target, space_generator=generator,
                                  rand_state=_seed_of(func, seed), num_threads=1)
    for design in ctx.generate_design_space():
        capped = with_unroll_at_most(rename_blocks(plain(design.trace.as_json()), {}), MAX_SAMPLED_UNROLL)
        sch = s_tir.Schedule(workload_module(func))
        s_tir.Trace.apply_json_to_schedule(capped, sch)
        sch = postprocess(sch, spec)
        if sch is not None and passes_static_checks(sch, func):
            return sch
    return None


#: reducing ops a subgraph compiled without a tuning database may hold and still be built as one kernel: a join's
#: untuned schedule is a random sample of its space, its minis' are the record library's (tuned) schedules
#: (docs/tuning.md, Untuned kernels)
MAX_UNTUNED_REDUCTIONS = 1


def split_untuned(graph, plan, limit: int = MAX_UNTUNED_REDUCTIONS, keep=frozenset()) -> tuple[object, list[dict]]:
    """``plan`` with every subgraph of more than ``limit`` reducing ops split into its mini-subgraphs as the tuner
    splits it (toolchain/reform.py), each scheduled on its own; (plan, one record per subgraph split). A pair kept
    together for the phone's cache (``--keep-inside``, an ARM target's default) is split too: one kernel only once
    tuned, untuned its sampled schedule ran 3× slower than its minis' (MobileNet-V2 @224) — except the groups of
    ``keep`` (indexes: :func:`row_block_groups`), whose row blocks are a schedule of their own."""
    from dataclasses import replace

    from toolchain import partition, reform

    reducing = graph.reducing_ids
    large = {i for i, group in enumerate(plan.groups) if len(reducing.intersection(group)) > limit} - set(keep)
    if not large:
        return plan, []
    split = reform.split_plan(graph, replace(plan, units=partition.kernel_units(graph)[0]) if plan.units else plan)
    groups: list = []
    records: list[dict] = []
    for index, group in enumerate(plan.groups):
        minis = [m for m, parent in zip(split.plan.groups, split.parent_of) if parent == index]
        if index not in large or len(minis) < 2:
            groups.append(group)
            continue
        groups.extend(minis)
        records.append({"ops": list(group), "minis": len(minis), "reason": (
            f"{len(reducing.intersection(group))} reducing ops and no tuning database: built as its minis, "
            "each scheduled from the record library (`agoc tune` measures the join)")})
    return replace(plan, groups=tuple(groups)), records


def row_block_groups(mod, graph, plan, spec, limit: int = MAX_UNTUNED_REDUCTIONS) -> frozenset[int]:
    """The subgraphs of ``plan`` with more than ``limit`` reducing ops that are a pair or chain the row blocks take
    (toolchain/tune/rowblock.py: a pointwise → depthwise pair, an inverted residual; NHWC) over a tensor larger than
    a row tile's budget (:data:`~toolchain.tune.rowblock.TILE_BYTES`): built untuned as one kernel, they keep in
    cache the tensor their minis would write out and read back (a smaller one stays in cache between two kernels,
    and the row tiles compute up to a quarter of their first conv's rows twice)."""
    from toolchain import fusion

    reducing = graph.reducing_ids
    large = [i for i, group in enumerate(plan.groups) if len(reducing.intersection(group)) > limit]
    if not large or plan.method != "ago":
        return frozenset()
    try:  # the kernels as they are scheduled: their weights marked
        kernels = [f for _, f in group_kernels(build.mark_weights(fusion.fuse_groups(mod, plan.groups, spec)))]
    except BuildError as exc:
        log.info("row blocks not considered: %s", exc)
        return frozenset()
    big = [i for i in large if (found := rowblock.plan(kernels[i], spec.num_cores)) is not None
           and found.between > rowblock.TILE_BYTES]
    # scheduled and checked here as the finder will (again, in its child): a join kept whole whose row blocks then
    # failed would fall back to a sample of its space
    return frozenset(i for i in big if _row_blocks(kernels[i], spec, None)[0] is not None)


def reductions(func) -> int:
    """How many blocks of ``func`` reduce (its convs, matmuls, pools, means)."""
    return sum(1 for b in block_nests(func) if b.reduce_extents)


def schedule_untuned(fused_mod, spec, rule: str = DEFAULT, library=None, seed: int = 0, prepack: bool = True):
    """``fused_mod`` with every kernel not yet scheduled given a schedule by ``rule`` (:data:`RULES`),
    its weights pre-packed as the schedules read them (``prepack``; where TVM fails to split a rewrite out,
    scheduled again with the weights as they are); (module, one :class:`Fallback` per kernel)."""
    check_rule(rule)
    todo = [name for name, func in group_kernels(fused_mod) if not _is_scheduled(func)]
    if rule == "plain" or not todo:
        return fused_mod, [Fallback(name, "plain", "--untuned plain") for name in todo if rule == "plain"]
    marked = build.mark_weights(fused_mod) if prepack else fused_mod  # a schedule may store a weight as it reads it
    if library is not None:  # read here, once: each kernel is scheduled in a forked child, which would read it again
        _ = library.entries
    by_name = dict(group_kernels(marked))
    kernels, out, done = [], [], {}
    for name in todo:
        func = by_name[name]
        key = _seed_of(func, 0)
        if key not in done:
            done[key] = _bounded(func, spec, rule, library, seed)
            if done[key][0] is not None:
                kernels.append((func, done[key][0], 1.0))
        out.append(Fallback(name, done[key][1].source, done[key][1].detail))
    if not kernels:
        return fused_mod, out
    scheduled = apply_records(marked, kernels, spec)
    if not prepack:
        return scheduled, out
    try:
        return build.prepack_weights(scheduled, spec), out
    except BuildError as exc:
        log.warning("the untuned kernels' weights could not be pre-packed (%s): scheduled with them as they are", exc)
        return schedule_untuned(fused_mod, spec, rule, library, seed, prepack=False)


def _own_record(func, spec, library):
    """The library's record of this very kernel (a tuned, measured schedule), replayed."""
    if library is None:
        return None, ""
    own = library.own(func)  # not nearest(): that loads every kernel like it to rank them
    return from_library(library, func, spec, [own]) if own is not None else (None, "")


def block_schedule(func, spec, spatial: bool = False):
    """The register block of a pointwise or depthwise conv, a matmul or a pool (toolchain/tune/microkernel.py;
    ``spatial``: the last resort's too), postprocessed and passing the static checks: (schedule, its shape), or
    (None, "")."""
    try:
        found = microkernel.register_block(func, spec.tvm(), spatial)
    except Exception as exc:  # noqa: BLE001 - a kernel the block's schedule does not fit: the next finder
        log.info("no register block for %s: %s", func, exc)
        return None, ""
    return _checked(found, func, spec)


def _checked(found: tuple, func, spec):
    """A hand-made schedule ``found`` (schedule or None, its detail) postprocessed and passing the static checks, or
    (None, "")."""
    sch, detail = found
    sch = postprocess(sch, spec) if sch is not None else None
    return (sch, detail) if sch is not None and passes_static_checks(sch, func) else (None, "")


def rows_schedule(func, spec, passes: bool = False):
    """A row kernel's schedule (a layer norm, a softmax: toolchain/tune/rows.py; ``passes``: else a kernel of
    spatial blocks as parallel passes), postprocessed and passing the static checks: (schedule, its shape), or
    (None, "")."""
    try:
        found = rows.row_schedule(func, spec.tvm())
        if found[0] is None and passes:
            found = rows.pass_schedule(func, spec.tvm())
    except Exception as exc:  # noqa: BLE001 - a kernel the row schedule does not fit: the next finder
        log.info("no row schedule for %s: %s", func, exc)
        return None, ""
    return _checked(found, func, spec)


def _rows(func, spec, _library):
    return rows_schedule(func, spec)


def _block(func, spec, _library):
    return block_schedule(func, spec)


def _row_blocks(func, spec, _library):
    try:
        found = rowblock.row_blocks(func, spec.tvm(), spec.num_cores)
    except Exception as exc:  # noqa: BLE001 - a kernel the row blocks do not fit: the next finder
        log.info("no row blocks for %s: %s", func, exc)
        return None, ""
    return _checked(found[0], func, spec) if found else (None, "")


def _nearest(func, spec, library):
    return from_library(library, func, spec) if library is not None else (None, "")


def _spatial_block(func, spec, _library):
    return block_schedule(func, spec, spatial=True)


#: where each rule looks for a kernel's schedule, in turn, before a sample: (finder, the source it is recorded as);
#: a spatial conv's block before the library's re-fitted records (a stem 2.7x faster: docs/tuning-internals.md)
ORDER = {"library": (("own", "library"), ("block", "block"), ("rowblock", "block"), ("spatial", "block"),
                     ("rows", "rows"), ("nearest", "library")),
         "sampled": (), "plain": ()}
FINDERS = {"own": _own_record, "block": _block, "rowblock": _row_blocks, "nearest": _nearest, "spatial": _spatial_block,
           "rows": _rows}


def _bounded(func, spec, rule: str, library, seed: int):
    """(trace JSON or None, :class:`Fallback`) of one kernel, found in a forked child given
    :data:`TIMEOUT_S` (some kernels' spaces take TVM minutes to generate)."""
    def found() -> dict:
        sch, fallback = _one(func, spec, rule, library, seed)
        return {"trace": plain(sch.trace.as_json()) if sch is not None else None, "source": fallback.source,
                "detail": fallback.detail}

    ok, value = forked.call(found, TIMEOUT_S)
    if not ok:
        log.warning("no schedule for an untuned kernel: %s", value)
        return None, Fallback("", "plain", f"scheduling it {value}")
    return value["trace"], Fallback("", value["source"], value["detail"])


def _one(func, spec, rule: str, library, seed: int):
    """(schedule or None, :class:`Fallback`) of one kernel: by ``rule``, in the order of :data:`ORDER`."""
    for finder, source in ORDER[rule]:
        sch, detail = FINDERS[finder](func, spec, library)
        if sch is not None:
            return sch, Fallback("", source, detail)
    count = reductions(func)
    if count > MAX_SAMPLED_REDUCTIONS:
        return None, Fallback("", "plain", f"{count} reductions: too large to sample at compile time")
    try:
        sch = sampled(func, spec, seed)
    except Exception as exc:  # noqa: BLE001 - a space TVM cannot sample here: the kernel stays plain
        log.info("no sample of %s: %s", func, exc)
        sch = None
    if sch is None:
        return None, Fallback("", "plain", "no sample of the space passed the checks")
    return sch, Fallback("", "sampled")
