"""Row-tiled register blocks for a fused pointwise (or spatial) → depthwise pair or an inverted residual chain (NHWC):
the last conv's output rows in parallel tiles, every conv before it computed in the tile (the rows its window reads)
with a register block of its own, each conv's epilogue fused into its accumulators' write-back. Why:
docs/tuning-internals.md (Row blocks)."""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.tune import microkernel
from toolchain.tune.pairs import _writer_of, as_int, block_infos, data_shape, find_pair

#: bytes of the intermediates one tile computes (every conv's rows but the last's) where no tile cache is given
TILE_BYTES = 512 << 10
#: the most of the first conv's rows a tile may compute again (the window's halo rows two tiles share)
MAX_RECOMPUTE = 0.25
#: the pairs and chains the row blocks take (``IntensivePair.kind``): the first conv pointwise or spatial (a stem)
KINDS = ("pw->dw", "pw->dw->pw", "conv->dw", "conv->dw->pw")


@dataclass(frozen=True)
class Stage:
    """One conv of the row pipeline: its block, the elementwise blocks that follow it (its epilogue, fused into the
    accumulators' write-back) and the blocks over another domain after those: the next conv's padding (inlined into
    its loads) or, after the last conv, a slice of its channels and what follows that (computed in the block's tile
    from the accumulators: a padded conv's real channels, toolchain/padding.py)."""

    conv: str
    epilogue: tuple[str, ...]
    after: tuple[str, ...]
    extents: tuple[int, ...]  # the conv's output (1, H, W, C)
    depthwise: bool


@dataclass(frozen=True)
class RowPlan:
    stages: tuple[Stage, ...]
    inputs: tuple[str, ...]  # what computes the first conv's input from the parameters (its padding, a layout
    # transpose): inlined into its loads
    rows: int  # the last conv's output rows a tile computes
    recompute: float  # the share of the first conv's rows computed twice
    between: int  # bytes of the first conv's output: what two kernels would write out and read back


def _output_extents(infos) -> dict[str, tuple[int, ...]]:
    return {info.name: tuple(as_int(iv.dom.extent) for iv in info.block.iter_vars
                             if int(iv.iter_type) == 0) for info in infos}


def _split_chain(names: tuple[str, ...], extents: dict, conv_extents: tuple[int, ...]):
    """(elementwise blocks over the conv's output domain, the rest), program order; None where an elementwise block
    follows a padding."""
    elementwise = [n for n in names if extents.get(n) == conv_extents]
    rest = [n for n in names if n not in elementwise]
    if rest and elementwise and names.index(rest[0]) < names.index(elementwise[-1]):
        return None
    return tuple(elementwise), tuple(rest)


def plan(func, cores: int, budget: int = 0) -> RowPlan | None:
    """The stages of ``func``'s pair or chain and the rows of a tile, or None where the row blocks do not apply: not
    a pointwise / spatial → depthwise pair or such a pair into a pointwise conv in NHWC, channels no vector divides, or
    no row tile keeps its intermediates within ``budget`` (:data:`TILE_BYTES` when 0) and its recompute within
    :data:`MAX_RECOMPUTE` while giving every core a tile."""
    budget = budget or TILE_BYTES
    pair = find_pair(func, budget, cores)
    if pair is None or pair.kind not in KINDS or pair.layout != "NHWC":
        return None
    infos = block_infos(func)
    extents = _output_extents(infos)
    convs = ([pair.head] if pair.head else []) + [pair.upstream]
    betweens = ([pair.head_chain] if pair.head else []) + [pair.chain]
    dw = pair.upstream if pair.head else pair.downstream
    stages = []
    for conv, between in zip(convs + [pair.downstream], betweens + [pair.epilogue]):
        split = _split_chain(between, extents, extents[conv])
        if split is None:
            return None
        stages.append(Stage(conv, *split, extents[conv], conv == dw))
    last = extents[pair.downstream]
    inputs = _input_blocks(infos, convs[0])
    window, stride = _window(func, pair, dw)
    out_rows = last[1]
    mid = extents[pair.head if pair.head else pair.upstream]  # the first conv's output (1, H, W, C)

    def cost(rows: int) -> tuple[int, float]:  # (bytes of a tile's intermediates, the share computed twice)
        first_rows = stride * rows + window - stride  # the depthwise conv computes ``rows`` rows of its output
        nbytes = (first_rows * (mid[2] + window - 1) * mid[3] + (rows * last[2] * mid[3] if pair.head else 0)) * 4
        return nbytes, (window - stride) / (stride * rows)

    fits = [r for r in range(1, out_rows + 1) if out_rows % r == 0 and (out_rows // r) % cores == 0
            and cost(r)[0] <= budget and cost(r)[1] <= MAX_RECOMPUTE]
    if not fits or any(e % 4 for e in (mid[3], last[3])):
        return None
    rows = max(fits)
    return RowPlan(tuple(stages), inputs, rows, round(cost(rows)[1], 3), 4 * mid[1] * mid[2] * mid[3])


def _input_blocks(infos, conv: str) -> tuple[str, ...]:
    """The elementwise blocks between the parameters and ``conv``'s data input, each read by the next one only
    (its padding, the model's layout transpose before a stem), nearest first, up to one another block reads too."""
    found: list[str] = []
    writer = _writer_of(infos, next(info for info in infos if info.name == conv).data_buf)
    while writer is not None:
        block = infos[writer]
        if block.kind != "simple" or len(block.consumers) != 1 or len(block.producers) > 1:
            break
        found.append(block.name)
        writer = block.producers[0] if block.producers else None
    return tuple(found)


def _window(func, pair, block: str) -> tuple[int, int]:
    """(window rows, stride) of the NHWC depthwise conv ``block`` of ``pair``."""
    info = next(i for i in block_infos(func) if i.name == block)
    window = next(as_int(iv.dom.extent) for iv in info.block.iter_vars if int(iv.iter_type) == 2)
    out_rows = as_int(info.block.iter_vars[1].dom.extent)
    padded = data_shape(func, pair, block)[1]  # its input's rows, padded
    return window, max(1, (padded - window) // max(1, out_rows - 1)) if out_rows > 1 else 1


def row_blocks(func, target, cores: int, budget: int = 0):
    """``func`` scheduled with its row blocks (module doc), not yet postprocessed: [(schedule, "rows×…" of the last
    conv's block)], or [] where they do not apply."""
    from tvm import s_tir

    found = plan(func, cores, budget)
    if found is None:
        return []
    unit = microkernel.unit_of(target)
    try:
        sch = s_tir.Schedule(microkernel.own_module(func))
        shape = schedule(sch, found, unit)
    except Exception:  # noqa: BLE001 - a structure TVM refuses here: no row blocks
        return []
    return [(sch, "row " + "×".join(map(str, shape)))]


def _block(extents: tuple[int, ...], unit, depthwise: bool) -> tuple[int, int, int] | None:
    """(rows, vectors, lanes) of a conv's block over one image row (``extents``: 1, H, W, C)."""
    gain = microkernel.MASKED_GAIN_ROW if depthwise else microkernel.MASKED_GAIN
    return microkernel.block_for(extents[3], extents[2], unit, perfect=True, gain=gain)


def schedule(sch, found: RowPlan, unit) -> tuple[int, int, int]:
    """Apply ``found`` to ``sch`` in place; the last conv's block (rows, vectors, lanes)."""
    *firsts, last = found.stages
    # input copies and paddings inlined into the loads that read them (a padded copy per tile measured slower:
    # docs/tuning-internals.md, Row blocks), a slice into what follows it
    for name in found.inputs + tuple(p for s in firsts for p in s.after) + last.after[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    backs = {}  # conv → its accumulators' write-back, the epilogue inlined into it (before any tiling: no predicate)
    for stage in found.stages:
        for name in stage.epilogue[:-1]:
            sch.compute_inline(sch.get_sblock(name))
        backs[stage.conv] = sch.cache_write(sch.get_sblock(stage.conv), 0, "global")
        if stage.epilogue:
            sch.reverse_compute_inline(sch.get_sblock(stage.epilogue[-1]))
    shape = _block(last.extents, unit, last.depthwise)
    if shape is None:
        raise ValueError("no block for the last conv")
    n, y, *rest = sch.get_loops(sch.get_sblock(last.conv))
    tile_loop, y_in = sch.split(y, [None, found.rows])
    tile = sch.fuse(n, tile_loop)
    inits, tiles = {}, {}
    inits[last.conv], tiles[last.conv] = _register(sch, backs[last.conv], shape, [y_in], rest, last.depthwise)
    if last.after:
        final = sch.get_sblock(last.after[-1])
        domain = tuple(int(iv.dom.extent) for iv in sch.get(final).iter_vars)
        if domain[:-1] == last.extents[:-1] and last.extents[3] == shape[1] * shape[2]:
            # a slice of the channels (and what follows it) read from the accumulators in their tile: one tile of
            # the channels, so that its vector loop needs no bounds test
            sch.reverse_compute_at(final, tiles[last.conv], preserve_unit_loops=True)
            sch.compute_inline(backs[last.conv])
            *_, channels = sch.get_loops(final)
            width = microkernel.dividing_lanes(int(sch.get(channels).extent), shape[2])
            if width > 1:
                sch.vectorize(sch.split(channels, [None, width])[1])
        else:  # over another domain (a layout transpose): a pass over the tile's rows
            sch.reverse_compute_at(final, tile, preserve_unit_loops=True)
    for stage in reversed(firsts):  # producers last to first, each computed in the tile
        sch.compute_at(backs[stage.conv], tile, preserve_unit_loops=True)
        sch.compute_at(sch.get_sblock(stage.conv), tile, preserve_unit_loops=True)
    for stage in firsts:
        b = _block(stage.extents, unit, stage.depthwise)
        if b is None:
            raise ValueError(f"no block for {stage.conv}")
        _, _, y_rows, *rest = sch.get_loops(sch.get_sblock(stage.conv))  # the tile, the conv's batch, its rows
        inits[stage.conv], _ = _register(sch, backs[stage.conv], b, [y_rows], rest, stage.depthwise)
    sch.parallel(tile)  # before the reductions are split into init and update: parallel needs whole blocks
    for conv, loop in inits.items():
        sch.decompose_reduction(sch.get_sblock(conv), loop)
    return shape


def _register(sch, back, shape: tuple[int, int, int], outer: list, rest: list, depthwise: bool):
    """A conv's register block inside the tile: its columns split by the block's rows, its channels by vectors ×
    lanes, the reduction between; the accumulators (``back``: their write-back) per (column, channel) tile. Returns
    (the reduction's outer loop: its init is split off there once the tile loop is parallel; the channel tile loop)."""
    rows, vectors, lanes = shape
    x, f, *reduce = rest
    xo, xi = sch.split(x, [None, rows])
    fo, fj, fv = sch.split(f, [None, vectors, lanes])
    sch.reorder(*outer, xo, fo, *reduce, xi, fj, fv)
    sch.reverse_compute_at(back, fo, preserve_unit_loops=True)
    window = [lp for lp in reduce if int(sch.get(lp).extent) > 1] if depthwise else []
    for loop in [*window, xi, fj]:
        sch.unroll(loop)
    sch.vectorize(fv)
    *_, last = sch.get_loops(back)
    sch.vectorize(sch.split(last, [None, lanes])[1])
    return reduce[0], fo
