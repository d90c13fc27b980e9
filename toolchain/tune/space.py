"""The search space of one kernel: intensive fusion where it applies, TVM's default space otherwise,
both with the static checks as a postprocessor. The choice and its reasons: docs/tuning-internals.md."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from toolchain import winograd
from toolchain.tune import intrinsics
from toolchain.tune import winograd as winograd_schedule
from toolchain.tune.intensive import Decide, block_exists, intensive_schedule, vector_lanes
from toolchain.tune.pairs import IntensivePair, find_pair
from toolchain.tune.race_check import parallel_races
from toolchain.tune.schedule_check import (
    _whole_set,
    dropped_blocks,
    execution_counts,
    out_of_bounds_writes,
    partial_weight_reads,
    weights_read_whole,
)


def postprocs(check: bool = True) -> list:
    """``Postproc.create("llvm")`` plus the dropped-iteration check."""
    from tvm.s_tir.meta_schedule.postproc import Postproc

    return list(Postproc.create("llvm")) + ([postproc_class()()] if check else [])


def _rest_rules(target, mod, kind: str = "MultiLevelTiling", write_fusion: bool = True):
    """The stock rule ``kind`` (MultiLevelTiling for complex blocks outside the pair, AutoInline for
    simple ones), initialised for ``target``; ``write_fusion=False``: MultiLevelTiling without its
    consumer fusion (see :func:`shared_consumer`)."""
    from tvm.s_tir import meta_schedule as ms

    stock = ms.schedule_rule.ScheduleRule.create("llvm") if write_fusion else _rules_without_write_fusion()
    rules = [r for r in stock if type(r).__name__ == kind]
    ctx = intrinsics.tune_context(mod=mod, target=target, space_generator="post-order-apply")
    for r in rules:
        r._initialize_with_tune_context(ctx)
    return rules


def schedule_fn(pair: IntensivePair, target, num_cores: int | None = None, decide: Decide | None = None,
                tile_cache: int = 0):
    """The function a ``ScheduleFn`` calls: intensive schedule, then MultiLevelTiling for other complex blocks
    (initialised for ``target``, a ``tvm.target.Target``); ``decide``: see :data:`Decide`.

    MultiLevelTiling's consumer fusion can fail on every sample where a block's consumer has other
    producers outside its tile (ShuffleNet's downsampling unit: the pair and a third conv into one
    concat, :func:`shared_consumer`); when the first schedule of such a kernel fails with it, the
    blocks outside the pair are tiled without it from then on (as the stock space does)."""
    state: dict = {}
    lanes = vector_lanes(target)

    def rules(key, mod, kind: str = "MultiLevelTiling", write_fusion: bool = True) -> list:
        if key not in state:  # initialised once, on the first schedule that needs them
            state[key] = _rest_rules(target, mod, kind, write_fusion)
        return state[key]

    def schedule(sch, write_fusion: bool):
        intensive_schedule(sch, pair, num_cores, decide, lanes, tile_cache)
        outside = _rest_simple(sch, pair)
        if outside:  # as the stock space does first: e.g. a third conv's bias + relu6, three passes otherwise
            sch = _inline_outside(sch, pair, outside, rules("inline", sch.mod, "AutoInline"))
        rest = rest_complex(sch, pair)
        if not rest:
            return [sch]
        return _tile_rest(sch, rest, rules(("rules", write_fusion), sch.mod, write_fusion=write_fusion))

    def apply(sch):
        if "write_fusion" not in state:  # decided on the first schedule, on a copy of it
            state["write_fusion"] = True
            if shared_consumer(sch.mod["main"]) is not None:
                try:
                    schedule(sch.copy(), True)
                except Exception:  # noqa: BLE001 - e.g. reverse-compute-at: tiled without it then
                    state["write_fusion"] = False
        return schedule(sch, state["write_fusion"])

    return apply


def _inline_outside(sch, pair: IntensivePair, outside: list[str], inline_rules: list):
    """AutoInline the simple blocks ``outside`` the pair, except into a block of the pair: moved into D's
    tile, it would leave the third conv's write fusion reaching into the tile (MultiLevelTiling then
    drops iterations)."""
    mine = set(pair.blocks)
    for name in outside:
        if block_exists(sch, name) and not any(
                sch.get(c).name_hint in mine for c in sch.get_consumers(sch.get_sblock(name))):
            for rule in inline_rules:
                (sch,) = rule.apply(sch, sch.get_sblock(name))
    return sch


def _tile_rest(sch, rest: list[str], tiling_rules: list) -> list:
    """Every schedule MultiLevelTiling gives the complex blocks ``rest`` outside the pair, block by block."""
    schs = [sch]
    for name in rest:
        nxt = []
        for s in schs:
            for rule in tiling_rules:
                nxt.extend(rule.apply(s, s.get_sblock(name)))
        schs = nxt or schs
    return schs


def _rest_simple(sch, pair: IntensivePair) -> list[str]:
    """Root-level elementwise / padding blocks not in the pair, consumers first: what the stock space's
    AutoInline would inline before tiling (a third conv's epilogue, written out in full otherwise)."""
    mine = set(pair.blocks)
    names = [sch.get(rv).name_hint for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    return [n for n in names[::-1] if n not in mine
            and not any(int(iv.iter_type) == 2 for iv in sch.get(sch.get_sblock(n)).iter_vars)]


def rest_complex(sch, pair: IntensivePair) -> list[str]:
    """Root-level reduction blocks not in the pair, consumers first (as PostOrderApply visits them)."""
    mine = set(pair.blocks)
    root = sch.get_sblock("root")
    names = []
    for rv in sch.get_child_blocks(root):
        b = sch.get(rv)
        if b.name_hint not in mine and any(int(iv.iter_type) == 2 for iv in b.iter_vars):
            names.append(b.name_hint)
    return names[::-1]


def shared_consumer(func) -> str | None:
    """Why TVM's stock space cannot schedule ``func``, or None: a reduction block (a conv, a matmul)
    whose consumer — past elementwise blocks, which the stock space inlines into it first — also
    reads another block's output (SqueezeNet's fire module: two convs into one concat).
    MultiLevelTiling's write fusion moves that consumer under the reduction's tile with
    ``reverse_compute_at``, which needs every producer there: the whole space generation fails."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))

    def reduces(rv) -> bool:
        return any(int(iv.iter_type) == 2 for iv in sch.get(rv).iter_vars)

    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if not reduces(block):
            continue
        todo, seen = list(sch.get_consumers(block)), set()
        while todo:
            consumer = todo.pop()
            name = sch.get(consumer).name_hint
            if name in seen:
                continue
            seen.add(name)
            if len(sch.get_producers(consumer)) > 1:
                return f"{sch.get(block).name_hint}'s consumer {name} has other producers"
            if not reduces(consumer):
                todo.extend(sch.get_consumers(consumer))
    return None


def _rules_without_write_fusion() -> list:
    """TVM's llvm schedule rules, with MultiLevelTiling's consumer fusion (``reuse_write``) off."""
    from tvm.s_tir import meta_schedule as ms

    rules = ms.schedule_rule.ScheduleRule.create("llvm")
    plain = ms.schedule_rule.MultiLevelTiling(structure="SSRSRS", max_innermost_factor=64)
    return [plain if type(r).__name__ == "MultiLevelTiling" else r for r in rules]


def space(pair: IntensivePair | None, target, num_cores: int | None = None, check: bool = True,
          write_fusion: bool = True, tile_cache: int = 0):
    """A ``SpaceGenerator``: the intensive ``ScheduleFn`` for ``pair``, or the stock space when None
    (``write_fusion=False``: with :func:`_rules_without_write_fusion`)."""
    from tvm.s_tir import meta_schedule as ms

    if pair is None:
        rules = "llvm" if write_fusion else _rules_without_write_fusion()
        return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs(check), mutator_probs="llvm")
    return ms.space_generator.ScheduleFn(
        schedule_fn(pair, target, num_cores, tile_cache=tile_cache), sch_rules=[], postprocs=postprocs(check),
        mutator_probs="llvm")


def block_space(func, target, check: bool = True):
    """(the register block's ``ScheduleFn``, its shape) for a matmul-like kernel (toolchain/tune/microkernel.py: a
    pointwise, depthwise or spatial conv, a matmul, a pool) whose block schedules here; None otherwise."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from toolchain.tune import microkernel

    kernel = microkernel.matmul_like(func)
    if kernel is None:
        return None
    unit = microkernel.unit_of(target).of(kernel.dtype)
    shape = microkernel.choose_block(kernel, unit)
    if shape is None:
        return None
    fn = microkernel.block_space_fn(kernel, shape, unit.window)
    try:
        fn(s_tir.Schedule(microkernel.own_module(func)))
    except Exception:  # noqa: BLE001 - a kernel the block's primitives refuse: the other spaces
        return None
    gen = ms.space_generator.ScheduleFn(fn, sch_rules=[], postprocs=postprocs(check), mutator_probs="llvm")
    return gen, "×".join(map(str, shape))


@dataclass(frozen=True)
class SpaceChoice:
    """What :func:`make_space_generator` chose, and why."""

    generator: object  # tvm.s_tir.meta_schedule.SpaceGenerator
    pair: IntensivePair | None
    kind: str  # "intensive" | "intensive+default" | "block+default" | "default" | "default-no-write-fusion" |
    # "winograd"
    reason: str


def dry_run(func, pair: IntensivePair, target, seeds=(1, 2, 3), num_cores: int | None = None) -> str | None:
    """Apply the space's whole schedule (:func:`schedule_fn`: the blocks outside the pair too) with a few
    random decisions; None when exact and U runs once, else why not."""
    import tvm
    from tvm import s_tir

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    whole = schedule_fn(pair, target, num_cores)
    for seed in seeds:
        try:
            (sch, *_) = whole(s_tir.Schedule(mod, seed=seed))
        except Exception as exc:  # noqa: BLE001
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            return f"schedule failed: {(lines[-1] if lines else type(exc).__name__)[:200]}"
        counts = {c.name: c for c in execution_counts(sch.mod)}
        bad = [c for c in counts.values() if c.dropped]
        if bad:
            return f"drops iterations of {bad[0].name}"
        u = counts.get(pair.upstream)
        if u is None or u.executed != u.needed:
            return f"recomputes {pair.upstream} ({u.ratio if u else '?'}x)"
    return None


def make_space_generator(func, target, intensive: bool = True, include_default: bool = False,
                         num_cores: int | None = None, check: bool = True, tile_cache: int = 0,
                         block: bool = True) -> SpaceChoice:
    """The search space for one fused PrimFunc on ``target`` (a ``tvm.target.Target``; see the module doc
    for the decision). The target matters: complex blocks outside the pair are tiled by MultiLevelTiling
    initialised for it. ``tile_cache``: see :func:`intensive_schedule`; ``block``: the register block of a kernel it
    takes beside the stock space (:func:`block_space`)."""
    from tvm.s_tir import meta_schedule as ms

    def stock(pair, reason: str) -> SpaceChoice:
        blocked = shared_consumer(func)  # the stock space then goes without consumer fusion
        gen = space(None, target, check=check, write_fusion=blocked is None)
        if blocked is None:
            return SpaceChoice(gen, pair, "default", reason)
        return SpaceChoice(gen, pair, "default-no-write-fusion", f"{reason}; {blocked}")

    if winograd.is_winograd(func):  # MetaSchedule's own space fails on its transforms: its schedule, tiles sampled
        gen = ms.space_generator.ScheduleFn(winograd_schedule.space_fn(target), sch_rules=[],
                                            postprocs=postprocs(check), mutator_probs="llvm")
        return SpaceChoice(gen, None, "winograd", "a Winograd conv: its matmul's register block, rows and vectors "
                           "sampled")
    blocked = block_space(func, target, check) if block else None
    if blocked is not None:  # a conv, matmul or pool: its register block beside the stock space
        union = ms.space_generator.SpaceGeneratorUnion(
            [blocked[0], stock(None, "").generator], sch_rules=[], postprocs=postprocs(check), mutator_probs="llvm")
        return SpaceChoice(union, None, "block+default", f"register block {blocked[1]}")
    if not intensive:
        return stock(None, "intensive fusion disabled")
    pair = find_pair(func, tile_cache, num_cores or 1)  # a chain where a tile cache keeps intermediates inside
    if pair is None:
        return stock(None, "no depthwise/pointwise/matmul fed by another complex op")
    why_not = dry_run(func, pair, target, num_cores=num_cores)
    if why_not:
        return stock(pair, f"{pair.kind}: {why_not}")
    gen = space(pair, target, num_cores, check, tile_cache=tile_cache)
    if include_default:
        union = ms.space_generator.SpaceGeneratorUnion(
            [gen, stock(pair, "").generator], sch_rules=[], postprocs=postprocs(check), mutator_probs="llvm",
        )
        return SpaceChoice(union, pair, "intensive+default", f"{pair.kind}, {pair.tiled}")
    return SpaceChoice(gen, pair, "intensive", f"{pair.kind}, {pair.tiled}")


# ----------------------------------------------------------------------------- the check as a postprocessor


#: process-wide tallies of :class:`RejectDroppedIterations` (its instances are cloned per thread)
STATS = {"applied": 0, "rejected": 0, "errors": 0}
_STATS_LOCK = threading.Lock()


def _tally(key: str) -> None:
    with _STATS_LOCK:
        STATS[key] += 1


def _make_postproc_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.postproc import PyPostproc

    @derived_object
    class RejectDroppedIterations(PyPostproc):
        """Reject a candidate in which some block runs fewer instances than its consumers read, in
        which a weight's rewritten copy is read only in part (:func:`partial_weight_reads`), in which a block
        writes outside its buffer (:func:`out_of_bounds_writes`), or in
        which a parallel loop writes a shared buffer independently of its variable (a data race,
        see :mod:`toolchain.tune.race_check`).

        Append it after ``Postproc.create("llvm")``. A candidate the counter
        cannot analyse is kept (and counted in ``STATS["errors"]``): the check
        is a filter for a known failure, not a verifier of arbitrary TIR.
        """

        def __init__(self, original=None):
            self.whole = _whole_set(original)  # the weights the unscheduled kernel reads whole (tune context)

        def _initialize_with_tune_context(self, context) -> None:
            mod = getattr(context, "mod", None)
            if mod is not None:
                try:
                    self.whole = weights_read_whole(mod)
                except Exception:  # noqa: BLE001 - unanalysable: judge every rewritten weight
                    self.whole = None

        def apply(self, sch) -> bool:
            _tally("applied")
            try:
                bad = (dropped_blocks(sch.mod) or partial_weight_reads(sch.mod, self.whole)
                       or out_of_bounds_writes(sch.mod))
                races = [] if bad else parallel_races(sch.mod)  # after the llvm postprocs: real parallel loops
            except Exception:  # noqa: BLE001 - unanalysable structure: keep the candidate
                _tally("errors")
                return True
            if bad or races:
                _tally("rejected")
                return False
            return True

        def clone(self):
            return RejectDroppedIterations(self.whole)

    return RejectDroppedIterations


_CLASS = None


def postproc_class():
    """:class:`RejectDroppedIterations`, built on first use: importing this module must not import tvm."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_postproc_class()
    return _CLASS


def __getattr__(name):
    if name == "RejectDroppedIterations":
        return postproc_class()
    raise AttributeError(name)
