"""Seeds of the intensive-fusion space, as its decisions: a join's minis' choices (register tiles, vector, unroll), or
for any kernel of that space each conv's register block (toolchain/tune/microkernel.py) in the widest tile the cache
holds. Why: docs/tuning-internals.md (Intensive fusion)."""

from __future__ import annotations

from toolchain.tune import microkernel
from toolchain.tune.adapter import workload_module
from toolchain.tune.intensive import vector_lanes
from toolchain.tune.pairs import IntensivePair, block_infos, data_shape, find_pair, tile_bounds
from toolchain.tune.space import dry_run, rest_complex, schedule_fn
from toolchain.tune.tiles import TILE_FACTOR_MAX, tile_units
from toolchain.tune.traces import plain, replay_tolerant, unroll_of
from toolchain.tune.transfer import divisors

#: Bytes of the intermediate one tile of D reads (U's output for the tile), one seed each. A phone
#: core's L2 is 256-512 KiB (host/bench/proxy.py's geometries): the tile's slice of the intermediate should
#: stay in it beside the weights and D's output tile (128 KiB), or may take most of the larger one
#: (512 KiB: fewer, larger tiles reuse U's weights more). The search moves the tile from there.
TILE_BYTES = (128 * 1024, 512 * 1024)
#: Tiles of a multiple of this many channels / rows are preferred where one fits: the register tile
#: inside (<= REGISTER_FACTOR_MAX) then divides them.
TILE_ALIGN = 8
#: How the seed's vector is chosen, a seed each (those that come out the same are one seed):
#: "widest": as wide as the space's cap allows; "mini": the register tile the loop's own mini chose.
VECTORS = ("widest", "mini")


def register_factor(extent: int, cap: int, wanted: int) -> int:
    """The inner factor of a register-tile split: the largest divisor of ``extent`` that is at most
    both ``cap`` and ``wanted`` (1 at least)."""
    return max(d for d in divisors(extent) if d <= max(1, min(cap, wanted)))


def tile_factors(kind: str, data_shape: tuple[int, ...], cores: int, budget: int = TILE_BYTES[0],
                 layout: str = "NCHW", lanes: int = 4) -> dict[int, int]:
    """D's tile: iterator of D → inner factor, for D of ``kind`` ("dw" | "pw" | "matmul") whose data
    input (the intermediate) has ``data_shape`` (``layout``: NCHW or NHWC, or (..., rows, K)); float32.

    dw (channel tiles, H and W whole): the most channels whose planes fit ``budget``; pw (H × W tiles,
    channels whole): whole rows if one fits, then the most rows that fit; matmul: the most rows that
    fit. Each keeps at least ``cores`` tiles where the extent allows, at most
    :data:`~toolchain.tune.intensive.TILE_FACTOR_MAX` per tiled dim, and a multiple of :data:`TILE_ALIGN`
    where one fits. An NHWC dw tile's channels are the vector inside it: a multiple of the target's
    ``lanes`` (and of TILE_ALIGN) where one fits, else the fewest whole vectors even over ``budget``
    (a tile narrower than a register leaves lanes idle in every instruction; one over budget spills
    part of the intermediate to the next cache level)."""

    def most(extent: int, unit_bytes: int, vector: int = 1) -> int:
        factors = [d for d in divisors(extent) if d <= TILE_FACTOR_MAX]
        fits = [d for d in factors if d * unit_bytes <= budget]
        spread = [d for d in fits if extent // d >= cores] or fits
        aligned = [d for d in spread if d % max(TILE_ALIGN, vector) == 0] or [d for d in spread if d % vector == 0]
        if not aligned and vector > 1:  # no whole vector fits the budget: the fewest whole vectors
            whole = [d for d in factors if d % vector == 0]
            aligned = [min([d for d in whole if extent // d >= cores] or whole)] if whole else []
        return max(aligned or spread or [1])

    units = tile_units(kind, data_shape, layout)
    if kind == "dw":
        ((f_it, (channels, plane, _)),) = units.items()
        return {f_it: most(channels, plane, lanes if layout == "NHWC" else 1)}
    if kind == "pw":
        (y_it, (h, row, _)), (x_it, (w, pixel, _)) = units.items()
        if w <= TILE_FACTOR_MAX and row <= budget:
            return {y_it: most(h, row), x_it: w}
        return {y_it: 1, x_it: most(w, pixel)}
    ((it, (rows, row, _)),) = units.items()
    return {it: most(rows, row)}


# ----------------------------------------------------------------------------- reading mini traces


def tile_decisions(trace_json, block: str) -> dict[int, list[int]]:
    """Loop index → the factors MetaSchedule's ``SamplePerfectTile`` chose for it, for the loops of
    ``block`` as the trace first looked them up (its iterators, in order, for a root-level block)."""
    chosen = {int(d[0]): d[1] for d in trace_json[1]}
    out: dict[int, list[int]] = {}
    for index, loop in _tile_samples(trace_json, block).items():
        if index in chosen:
            out.setdefault(loop, [int(x) for x in chosen[index]])
    return out


def _tile_samples(trace_json, block: str) -> dict[int, int]:
    """Instruction index of each ``SamplePerfectTile`` on a loop of ``block`` → that loop's index
    (in the block's first ``GetLoops``)."""
    block_rv, loop_index, out = None, {}, {}
    for index, (kind, inputs, attrs, outputs) in enumerate(trace_json[0]):
        if kind in ("GetSBlock", "GetBlock") and attrs and attrs[0] == block:
            block_rv = outputs[0]
        elif kind == "GetLoops" and block_rv is not None and inputs == [block_rv] and not loop_index:
            loop_index = {rv: i for i, rv in enumerate(outputs)}
        elif kind == "SamplePerfectTile" and inputs and inputs[0] in loop_index:
            out[index] = loop_index[inputs[0]]
    return out


class MiniChoices:
    """The ``decide`` callback (:data:`toolchain.tune.intensive.Decide`) that takes the seed's choices from
    the minis. ``parts``: (mini trace JSON, {mini block: joined block}) per mini."""

    def __init__(self, pair: IntensivePair, parts: list[tuple[object, dict]], tiles: dict[int, int],
                 vector: str = "widest", lanes: int = 4):
        if vector not in VECTORS:
            raise ValueError(f"vector: one of {VECTORS}, not {vector!r}")
        self.tiles, self.vector, self.lanes = tiles, vector, lanes
        self.factors: dict[str, dict[int, list[int]]] = {}  # joined block → its mini's loop factors
        self.unroll: int | None = None
        for trace_json, block_map in parts:
            for mini_block, joined_block in block_map.items():
                if joined_block in (pair.upstream, pair.downstream, pair.head):
                    self.factors[joined_block] = tile_decisions(trace_json, mini_block)
                    if joined_block == pair.downstream:
                        self.unroll = unroll_of(trace_json)

    def __call__(self, role: str, block: str, it: int, extent: int, cap: int) -> int | None:
        if role == "unroll":
            return self.unroll
        if role == "tile":
            return self.tiles.get(it)
        factors = self.factors.get(block, {}).get(it)
        if role == "vector" and (self.vector == "widest" or not factors):
            return register_factor(extent, cap, cap)  # the vector (NCHW W, NHWC channels, matmul columns)
        if not factors:
            return None
        # MultiLevelTiling's two innermost spatial levels (S2, S3 of "SSRSRS") are its register tile
        wanted = factors[-1] * (factors[-2] if len(factors) > 2 else 1)
        return register_factor(extent, cap, max(wanted, self.lanes) if role == "vector" else wanted)


# ----------------------------------------------------------------------------- the seed


def _rest_with_mini_decisions(trace_json, rest: list[str], parts: list[tuple[object, dict]]):
    """``trace_json`` with the ``SamplePerfectTile`` decisions of the complex blocks in ``rest`` (tiled
    by MultiLevelTiling, as in their minis) set to what their minis chose."""
    insts, decisions = trace_json
    decided = {int(d[0]): d for d in decisions}
    for joined_block in rest:
        mini = next(((t, mb) for t, m in parts for mb, jb in m.items() if jb == joined_block), None)
        wanted = tile_decisions(*mini) if mini else {}
        for index, loop in _tile_samples(trace_json, joined_block).items():
            factors = wanted.get(loop)
            if index in decided and factors and len(factors) == len(decided[index][1]):
                decided[index] = [index, factors]
    return [insts, [decided[k] for k in sorted(decided)]]


def intensive_seeds(joined_func, pair: IntensivePair, parts: list[tuple[object, dict]], target, num_cores: int,
                    tile_cache: int = 0) -> list:
    """The joined kernel scheduled in the intensive-fusion space with the minis' choices (module doc),
    one schedule per distinct tile of :data:`TILE_BYTES` and vector of :data:`VECTORS` (the same
    schedule reached twice is one seed), before postprocessing. With ``tile_cache`` (the space's cap on
    a tile's slice of the intermediate) only the budgets within it, or the cap itself."""
    import tvm_ffi

    shape = data_shape(joined_func, pair)
    if shape is None or not parts:
        return []
    tiles, lanes = [], vector_lanes(target)
    budgets = [b for b in TILE_BYTES if not tile_cache or b <= tile_cache] or [tile_cache]
    for budget in budgets:
        tile = tile_factors(pair.downstream_kind, shape, num_cores, budget, pair.layout, lanes)
        if tile not in tiles:
            tiles.append(tile)
    seeds, seen = [], set()
    for tile in tiles:
        for vector in VECTORS:
            sch = intensive_seed(joined_func, pair, parts, target, num_cores, tile, vector, tile_cache)
            if sch is not None and (key := tvm_ffi.structural_hash(sch.mod)) not in seen:
                seen.add(key)
                seeds.append(sch)
    return seeds


def intensive_seed(joined_func, pair: IntensivePair, parts: list[tuple[object, dict]], target, num_cores: int,
                   tile: dict[int, int] | None = None, vector: str = "widest", tile_cache: int = 0):
    """The joined kernel scheduled in the intensive-fusion space with the minis' choices and D's
    ``tile`` (default: :func:`tile_factors` at the first :data:`TILE_BYTES`) and ``vector`` (one of
    :data:`VECTORS`), before postprocessing;
    None when the minis give nothing to take or it does not apply."""
    from tvm import s_tir

    if tile is None:
        shape = data_shape(joined_func, pair)
        if shape is None:
            return None
        tile = tile_factors(pair.downstream_kind, shape, num_cores, layout=pair.layout, lanes=vector_lanes(target))
    choices = MiniChoices(pair, parts, tile, vector, vector_lanes(target))
    if not choices.factors:
        return None
    mod = workload_module(joined_func)
    try:
        designs = schedule_fn(pair, target, num_cores, choices, tile_cache)(s_tir.Schedule(mod))
    except Exception:  # noqa: BLE001 - the structure does not apply at these choices
        return None
    sch = designs[0]
    rest = rest_complex(sch, pair)
    if not rest:
        return sch
    trace_json = _rest_with_mini_decisions(plain(sch.trace.as_json()), rest, parts)
    replayed, _, dropped = replay_tolerant(s_tir.Schedule(mod), trace_json, max_dropped=0)
    return sch if dropped else replayed


# ----------------------------------------------------------------------------- the register blocks' seed

#: the auto-unroll depths of the register blocks' seeds, one seed each: the block's loops unrolled within the
#: reduction (64) or whole (512) — which is faster differs by kernel (docs/tuning-internals.md)
BLOCK_UNROLLS = (64, 512)


class BlockChoices:
    """The ``decide`` callback (:data:`toolchain.tune.intensive.Decide`) that shapes each block's register tile as
    the register block of a conv of its extents (:func:`toolchain.tune.microkernel.block_for`: rows × vectors ×
    lanes from the target's registers; other dims 1) and D's tile the widest the space allows (its cap from
    :func:`~toolchain.tune.pairs.tile_bounds`, else :func:`tile_factors`' at the first :data:`TILE_BYTES`)."""

    def __init__(self, func, pair: IntensivePair, target, num_cores: int, tile_cache: int = 0,
                 unroll: int = BLOCK_UNROLLS[0]):
        self.unit = microkernel.unit_of(target)
        self.vectors = {info.name: info.spatial[-1][1] for info in block_infos(func) if info.spatial}
        self.bounds = tile_bounds(func, pair, tile_cache, num_cores)
        shape = data_shape(func, pair)
        budget = min(TILE_BYTES[0], tile_cache or TILE_BYTES[0])
        self.tiles = tile_factors(pair.downstream_kind, shape, num_cores, budget, pair.layout,
                                  self.unit.lanes) if shape is not None else {}
        self.unroll = unroll
        self.rows: dict[str, int] = {}  # block → the extent its rows' split saw

    def shape(self, block: str) -> tuple[int, int, int] | None:
        channels = self.vectors.get(block)
        return microkernel.block_for(channels, self.rows.get(block, 1), self.unit, min_lanes=1) if channels else None

    def __call__(self, role: str, block: str, it: int, extent: int, cap: int) -> int | None:
        if role == "unroll":
            return self.unroll
        if role == "tile":
            return self.bounds[it][1] if it in self.bounds else self.tiles.get(it)
        if role == "other":
            return 1
        if role == "register":
            self.rows[block] = extent
        shape = self.shape(block)
        if shape is None:
            return None
        rows, vectors, lanes = shape
        return register_factor(extent, cap, rows if role == "register" else vectors * lanes)


def block_seeds(func, target, num_cores: int, tile_cache: int = 0) -> list:
    """``func`` in the intensive-fusion space (its pair or chain: :func:`~toolchain.tune.pairs.find_pair`) at
    :class:`BlockChoices`, one schedule per :data:`BLOCK_UNROLLS` depth, before postprocessing, each with D's block
    ("rows×vectors×lanes"); none where that space does not apply."""
    import tvm_ffi
    from tvm import s_tir

    pair = find_pair(func, tile_cache, num_cores)
    if pair is None or dry_run(func, pair, target, num_cores=num_cores) is not None:
        return []
    seeds, seen, choices = [], set(), BlockChoices(func, pair, target, num_cores, tile_cache)
    for unroll in BLOCK_UNROLLS:
        choices.unroll = unroll
        try:
            sch = schedule_fn(pair, target, num_cores, choices, tile_cache)(s_tir.Schedule(workload_module(func)))[0]
        except Exception:  # noqa: BLE001 - the structure does not apply at these choices
            continue
        if (key := tvm_ffi.structural_hash(sch.mod)) not in seen:
            seen.add(key)
            seeds.append((sch, "×".join(map(str, choices.shape(pair.downstream) or ()))))
    return seeds
