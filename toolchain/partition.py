"""The partition stage: which ``call_tir`` ops become one kernel, by the methods of :data:`METHODS` —
TVM's ``FuseOps`` (``stock``) or AGO's weighted acyclic clustering over epilogue units (``ago``); the
rules it adds to AGO (epilogue units, edges kept apart, --keep-inside) are in docs/partitioning.md."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from toolchain import cluster as clustering
from toolchain.dag import Graph
from toolchain.opgraph import OpGraph, op_graph
from toolchain.quotient import check_partition, partition_stats
from toolchain.settings import PartitionSettings
from toolchain.tune.tiles import CHAIN_RECOMPUTE, chain_share
from toolchain.weights import WeightModel, load_model, op_weights

#: Subgraphs lighter than this (weight units = predicted tuning trials) are "trivial" in the stats:
#: a lone elementwise or layout op predicted to need a handful of trials.
TRIVIAL_CUT = 5.0
_MARK = "__agoc__"


@dataclass(frozen=True)
class KeepApart:
    """An edge rule: an op of class ``consumer`` never shares a subgraph with the op feeding it when that
    input comes from a ``source`` op, directly or through single-input ``through`` ops only."""

    consumers: frozenset[str]  # OpNode.op_class values
    sources: frozenset[str]  # OpNode.kind values
    through: frozenset[str]  # OpNode.kind values
    why: str


#: Edges AGO's clustering keeps as subgraph boundaries (rules as a table; the reason goes into --explain).
KEEP_APART: tuple[KeepApart, ...] = (
    KeepApart(
        consumers=frozenset({"conv", "depthwise_conv", "pointwise_conv"}),
        sources=frozenset({"transpose"}),
        through=frozenset({"reshape", "split", "strided_slice", "squeeze", "expand_dims"}),
        why=("a conv reading a channel permutation (ShuffleNet's channel shuffle) in its own kernel "
             "re-gathers it inside its tiles; the producer's kernel writes it once (as stock TVM's do)"),
    ),
)


#: why an edge into or out of an extern op (:data:`toolchain.opgraph.EXTERN_RULES`) stays a boundary
EXTERN_APART = "an extern op stays in main as written, a subgraph of its own"


def kept_apart(graph: OpGraph, rules: tuple[KeepApart, ...] = KEEP_APART) -> dict[tuple[str, str], str]:
    """The edges (producer id, consumer id) the rules keep between subgraphs, with the reason; every edge
    of an extern op too."""
    node, producers = graph.by_id, graph.producers
    found: dict[tuple[str, str], str] = {}
    for a, b in graph.edges:
        if node[a].is_extern or node[b].is_extern:
            found[(a, b)] = EXTERN_APART
            continue
        for rule in rules:
            if node[b].op_class not in rule.consumers:
                continue
            x = a
            while node[x].kind in rule.through and len(producers[x]) == 1:
                x = producers[x][0]
            if node[x].kind in rule.sources:
                found[(a, b)] = rule.why
                break
    return found


@dataclass(frozen=True)
class PartitionPlan:
    method: str
    groups: tuple[tuple[str, ...], ...]
    weights: dict = field(hash=False)  # node id -> weight
    threshold: float | None = None
    decisions: tuple = ()  # clustering decisions (ago), for --explain
    seconds: float = 0.0
    units: tuple[tuple[str, ...], ...] = ()  # ops kept together before clustering (ago: epilogue units)
    settings: PartitionSettings = PartitionSettings()  # what it was made with

    def group_weight(self, group) -> float:
        return sum(self.weights[n] for n in group)


def _unique_callees(mod):
    """A copy of ``mod`` where every call_tir calls its own PrimFunc, named ``<func>__agoc__<node id>``.

    FuseOps deduplicates structurally equal group functions, so a group's
    body cannot say which call site it stands for; with one callee per call
    site no two groups are equal, and a group's members can be read from the
    names of the PrimFuncs it calls. The PrimFuncs keep their attributes, so
    FuseOps groups exactly as it does on the original module.
    """
    import tvm
    from tvm import relax

    main = mod["main"]
    if not main.body.blocks:  # nothing computed: the model returns inputs or constants
        return mod
    functions = {gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}
    builder = relax.BlockBuilder(tvm.ir.IRModule(functions, attrs=mod.attrs))
    bindings = []
    for b in main.body.blocks[0].bindings:
        v = b.value
        if isinstance(b, relax.VarBinding) and _is_call_tir(v):
            gv, *rest = v.args
            copy = mod[gv].with_attr("agoc_node", b.var.name)  # distinct, or add_func would dedup it
            own = builder.add_func(copy, f"{gv.name_hint}{_MARK}{b.var.name}")
            b = relax.VarBinding(b.var, relax.Call(v.op, [own, *rest], v.attrs, v.ty_args))
        bindings.append(b)
    out = builder.get()
    out["main"] = relax.Function(
        main.params, relax.SeqExpr([relax.DataflowBlock(bindings)], main.body.body), main.ret_ty, main.is_pure,
        main.attrs,
    )
    return relax.transform.Normalize()(out)


def _is_call_tir(value) -> bool:
    return getattr(getattr(value, "op", None), "name", None) == "relax.call_tir"


def _members(func, relax) -> tuple[str, ...]:
    names = []
    for b in func.body.blocks[0].bindings:
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.args[0] if v.args else None, relax.GlobalVar):
            name = v.args[0].name_hint
            if _MARK in name:
                names.append(name.split(_MARK, 1)[1])
    return tuple(names)


def stock_groups(mod, spec, extern: frozenset[str] = frozenset()) -> tuple[tuple[str, ...], ...]:
    """The groups TVM's FuseOps forms, as op-graph node ids, in main's call order; each of the ``extern``
    nodes (bindings that stay in main, :data:`toolchain.opgraph.EXTERN_RULES`) a group of its own."""
    from tvm import relax

    with spec.tvm():
        fused = relax.transform.FuseOps()(_unique_callees(mod))
    groups: list[tuple[str, ...]] = []
    for binding in (b for block in fused["main"].body.blocks for b in block.bindings):
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):  # a grouped function
            members = _members(fused[value.op], relax)
        elif _is_call_tir(value) and _MARK in value.args[0].name_hint:  # an op FuseOps left alone
            members = (value.args[0].name_hint.split(_MARK, 1)[1],)
        elif binding.var.name in extern:  # a binding that is not a kernel (a packed call, a match_cast)
            members = (binding.var.name,)
        else:
            members = ()
        if members:
            groups.append(members)
    return tuple(groups)


def plan_stock(mod, spec, graph: OpGraph, model: WeightModel | None = None,
               settings: PartitionSettings = PartitionSettings("stock")) -> PartitionPlan:
    started = time.perf_counter()
    groups = stock_groups(mod, spec, graph.extern_ids)
    return PartitionPlan("stock", groups, op_weights(graph, model), seconds=time.perf_counter() - started,
                         settings=settings)


#: op kinds that join an epilogue unit whatever their shape: a slice read by nothing else (a padded conv's real
#: channels, toolchain/padding.py, computed in its register block's tile: docs/partitioning.md)
SLICES = frozenset({"strided_slice"})


def epilogue_units(graph: OpGraph) -> tuple[tuple[str, ...], ...]:
    """Each complex op with the elementwise ops that follow it (TVM's conventional fusion): an op joins
    the unit of a complex op when it reduces over nothing, its output has the shape of the unit's last
    op (or it is one of :data:`SLICES` in a chain), and either every producer it has is in the unit (a
    diamond: hard-swish ``x · relu6(x + 3) / 6`` reads the conv's biased output twice) or one producer is
    the unit's last op and has no other consumer (a chain: bias, ReLU6, a residual add with its skip from
    outside). The unit is then cut to its longest prefix whose only op read outside it (or a model output)
    is its last. Only units of two or more ops are returned.

    Joining never creates a cycle: within a unit only its last op is read outside it, and it is the
    unit's last in topological order, so no path leaves the unit and comes back."""
    consumers, producers = graph.consumers, graph.producers
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    claimed: set[str] = set()
    units = []
    for head in (n for n in graph.nodes if n.is_complex):
        unit, inside = [head.id], {head.id}
        for n in graph.nodes[position[head.id] + 1:]:
            chain = unit[-1] in producers[n.id] and consumers[unit[-1]] == (n.id,)
            sliced = chain and n.kind in SLICES  # a padded conv's real channels (toolchain/padding.py)
            if n.reduces or n.is_extern or n.id in claimed or (n.shape != graph.by_id[unit[-1]].shape and not sliced):
                continue
            diamond = bool(producers[n.id]) and all(p in inside for p in producers[n.id])
            if diamond or chain:
                unit.append(n.id)
                inside.add(n.id)
        keep = 1
        for end in range(2, len(unit) + 1):
            prefix = set(unit[:end])
            read_outside = [m for m in unit[:end] if not consumers[m] or any(c not in prefix for c in consumers[m])]
            if read_outside == [unit[end - 1]]:
                keep = end
        unit = unit[:keep]
        claimed.update(unit)
        if len(unit) > 1:
            units.append(tuple(unit))
    return tuple(units)


@dataclass(frozen=True)
class Prologue:
    """A rule: an op of kind ``kinds`` that reads no op (a model input or a constant), with at most
    ``max_channels`` in its output's last dim, joins the unit of the one op it feeds when that op's class is
    one of ``consumers``; the edge between them is then no boundary."""

    kinds: frozenset[str]  # OpNode.kind values
    consumers: frozenset[str]  # OpNode.op_class values
    max_channels: int
    why: str


#: Data movement read inside the kernel of its consumer (rules as a table; the reason goes into --explain).
PROLOGUES: tuple[Prologue, ...] = (
    Prologue(
        kinds=frozenset({"transpose"}),
        consumers=frozenset({"conv", "pointwise_conv"}),
        max_channels=4,
        why=("the model input's NCHW → NHWC transpose read in place by the stem conv: a few channels are "
             "loaded one scalar at a time in either layout, so the copy kernel (1-2 % of MobileNet-V2 @224) "
             "goes (docs/partitioning.md)"),
    ),
)


def prologue_units(graph: OpGraph, units, rules: tuple[Prologue, ...] = PROLOGUES
                   ) -> tuple[tuple[tuple[str, ...], ...], tuple]:
    """``units`` with each op a :data:`PROLOGUES` rule takes prepended to its consumer's unit (a unit of its own
    if the consumer had none), and one decision per join. No cycle: the op reads no other op and feeds the unit
    only."""
    node, consumers, producers = graph.by_id, graph.consumers, graph.producers
    unit_of = {m: tuple(u) for u in units for m in u}
    joined: dict[tuple[str, ...], tuple[str, ...]] = {}
    notes = []
    for n in graph.nodes:
        if producers[n.id] or len(consumers[n.id]) != 1 or n.is_extern or not n.shape:
            continue
        (c,) = consumers[n.id]
        rule = next((r for r in rules if n.kind in r.kinds and node[c].op_class in r.consumers
                     and n.shape[-1] <= r.max_channels), None)
        if rule is None or unit_of.get(c, (c,))[0] != c:
            continue
        unit = unit_of.get(c, (c,))
        joined[unit] = (n.id, *joined.get(unit, unit))
        notes.append(clustering.Decision("unit", (n.id,), (c,), rule.why))
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    out = [joined.pop(tuple(u), tuple(u)) for u in units] + list(joined.values())
    return tuple(sorted(out, key=lambda u: position[u[0]])), tuple(notes)


def kernel_units(graph: OpGraph) -> tuple[tuple[tuple[str, ...], ...], tuple]:
    """The units every AGO partition starts from: :func:`epilogue_units` with their :func:`prologue_units`."""
    return prologue_units(graph, epilogue_units(graph))


#: op classes that can be the downstream op D of an intensive pair: D tiled along dims on which it does
#: not reuse its input recomputes nothing of the upstream op (:mod:`toolchain.tune.intensive`)
INTENSIVE_DOWNSTREAM = frozenset({"depthwise_conv", "pointwise_conv", "matmul"})
#: three complex ops a locality unit may chain (head, depthwise, pointwise; toolchain.tune.pairs.find_pair)
CHAINS = frozenset((head, "depthwise_conv", "pointwise_conv") for head in ("pointwise_conv", "conv"))
#: bytes per element of the tensors the zoo and the supported ONNX subset compute in (float32)
ELEMENT_BYTES = 4


def tensor_bytes(node) -> int:
    """Bytes of ``node``'s (first) output."""
    return ELEMENT_BYTES * math.prod(node.shape)


def locality_units(graph: OpGraph, units, min_bytes: int, cores: int = 1,
                   layout: str = "NHWC") -> tuple[tuple[tuple[str, ...], ...], tuple]:
    """Join pairs of ``units`` (or lone complex ops) where a complex op feeds an intensive-fusion
    downstream op (:data:`INTENSIVE_DOWNSTREAM`) through a tensor of at least ``min_bytes``: the pair
    starts clustering as one hyper node, so that tensor is never a subgraph boundary, and the intensive
    schedule keeps it to one tile in cache (a phone's L2 cannot hold it whole between two kernels).

    The producer's last op must have that downstream op as its only consumer (then joining them makes
    no cycle: a path out of the producer passes through the pair). The largest tensors go first; a
    unit joins one pair at most, except that two pairs through one depthwise conv make a chain (a conv
    into it, it into a pointwise conv: :data:`CHAINS`, which intensive fusion computes in one row tile of
    at most ``min_bytes``, a tile per one of ``cores``) where the head computes at most
    :data:`~toolchain.tune.tiles.CHAIN_RECOMPUTE` of its rows twice (NHWC only). Returns the units (the given
    ones, with each pair's or chain's replaced by their union, members in graph order) and one decision per
    pair or declined chain saying why."""
    node, consumers = graph.by_id, graph.consumers
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    unit_of = {m: tuple(u) for u in units for m in u}
    for n in graph.nodes:
        if n.is_complex and n.id not in unit_of:
            unit_of[n.id] = (n.id,)
    found = []
    for n in graph.nodes:
        if not n.is_complex or next(m for m in unit_of[n.id] if node[m].is_complex) != n.id:  # once per unit
            continue
        tail = unit_of[n.id][-1]
        (d, *more) = consumers[tail] or ("",)
        if more or not d or node[d].op_class not in INTENSIVE_DOWNSTREAM:
            continue
        size = tensor_bytes(node[tail])
        if size >= min_bytes:
            found.append((-size, position[tail], unit_of[n.id], unit_of[d]))

    def cls(unit) -> str:
        return next(node[m].op_class for m in unit if node[m].is_complex)

    chain_of: dict[tuple[str, ...], tuple] = {}  # a joined unit → its pair or chain (units, upstream first)
    notes = []
    for minus_size, _, up, down in sorted(found):
        first, second = chain_of.get(up, (up,)), chain_of.get(down, (down,))
        if first[-1] != up or second[0] != down or (len(first) + len(second) > 2 and (
                layout != "NHWC" or tuple(map(cls, first + second)) not in CHAINS)):
            continue
        share = _chain_share(graph, first + second, min_bytes, cores) if len(first) + len(second) > 2 else 0.0
        if share > CHAIN_RECOMPUTE:
            notes.append(clustering.Decision(
                "declined", up, down, f"not chained: its head would compute {share:.2f} of its rows twice in "
                f"{min_bytes / 1024:g} KiB row tiles (more than {CHAIN_RECOMPUTE:g})"))
            continue
        for unit in first + second:
            chain_of[unit] = first + second
        notes.append(clustering.Decision(
            "unit", up, down,
            f"kept together: the {-minus_size / 1024:.0f} KiB tensor between them stays inside one subgraph "
            f"(at least {min_bytes / 1024:g} KiB: --keep-inside)"))
    joined = {tuple(sorted(sum(c, ()), key=position.__getitem__)) for c in chain_of.values()}
    rest = [tuple(u) for u in units if tuple(u) not in chain_of]
    return tuple(sorted(rest + list(joined), key=lambda u: position[u[0]])), tuple(notes)


def _chain_share(graph: OpGraph, chain, budget: int, cores: int) -> float:
    """The share of its rows a chain's head would compute twice (:func:`toolchain.tune.tiles.chain_share`), from
    the depthwise conv's NHWC shapes: its output rows, its window and the (padded) input rows it reads."""
    node = graph.by_id
    dw = next(node[m] for m in chain[1] if node[m].is_complex)
    _, h, w, c = dw.shape
    conv = next(b for b in dw.blocks if b.reduce_extents)
    pad = next((b for b in dw.blocks if not b.reduce_extents and len(b.spatial_extents) == 4), None)
    _, h_in, w_in, c_in = pad.spatial_extents if pad else next(node[m] for m in chain[0] if node[m].is_complex).shape
    return chain_share(h, w * c * 4, h_in, w_in * c_in * 4, conv.reduce_extents[0], budget, cores)


def plan_ago(graph: OpGraph, settings: PartitionSettings = PartitionSettings(),
             model: WeightModel | None = None, cores: int = 1, layout: str = "NHWC") -> PartitionPlan:
    """AGO's clustering over epilogue units at ``settings.td``; with a locality unit (bytes), complex-op
    pairs joined by a tensor at least that large start as one unit too (:func:`locality_units`)."""
    started = time.perf_counter()
    weights = op_weights(graph, model or load_model())
    g = Graph(tuple(n.id for n in graph.nodes), graph.edges, weights, graph.complex_ids)
    units, notes = kernel_units(graph)
    if settings.locality_unit:
        units, more = locality_units(graph, units, settings.locality_unit, cores, layout)
        notes += more
    unit_of = {m: i for i, u in enumerate(units) for m in u}
    boundaries = {(a, b): why for (a, b), why in kept_apart(graph).items()
                  if a not in unit_of or unit_of[a] != unit_of.get(b)}
    result = clustering.cluster(g, settings.td, units=units, boundaries=boundaries)
    return PartitionPlan(
        "ago", result.groups, weights, settings.td, notes + tuple(result.decisions),
        seconds=time.perf_counter() - started, units=units, settings=settings,
    )


def plan(settings: PartitionSettings, mod, spec, graph: OpGraph | None = None) -> PartitionPlan:
    """The plan ``settings`` ask for (:class:`SettingsError` for an unknown method)."""
    settings.validate()
    graph = graph or op_graph(mod)
    if settings.method == "stock":
        return plan_stock(mod, spec, graph, settings=settings)
    return plan_ago(graph, settings, cores=spec.num_cores, layout=spec.layout)


def check(graph: OpGraph, plan_: PartitionPlan) -> None:
    """Raise :class:`toolchain.dag.PartitionError` if the plan is not an acyclic partition of ``graph``."""
    g = Graph(tuple(n.id for n in graph.nodes), graph.edges, plan_.weights, graph.complex_ids)
    check_partition(g, plan_.groups)


@dataclass(frozen=True)
class Chain:
    """Two complex ops in one subgraph, the second fed by the first through simple ops of that subgraph only."""

    group: int
    ops: tuple[str, ...]  # node ids, first and last complex
    kinds: tuple[str, ...]  # OpNode.kind of each, e.g. ("matmul", "transpose", "reshape", "matmul")

    @property
    def pair(self) -> str:
        return f"{self.kinds[0]}→{self.kinds[-1]}"


def chains(graph: OpGraph, groups) -> list[Chain]:
    """Every complex→…→complex path that stays inside one subgraph (the fusions AGO's partition makes
    possible: pw→dw, dw→pw, matmul→reshape→transpose→matmul ...)."""
    node, consumers = graph.by_id, graph.consumers
    group_of = {m: i for i, g in enumerate(groups) for m in g}
    found = []
    for start in graph.nodes:
        if not start.is_complex:
            continue
        paths = [(start.id,)]
        while paths:
            path = paths.pop()
            for nxt in consumers[path[-1]]:
                if group_of[nxt] != group_of[start.id]:
                    continue  # the path leaves the subgraph
                if node[nxt].is_complex:
                    ops = (*path, nxt)
                    found.append(Chain(group_of[start.id], ops, tuple(node[o].kind for o in ops)))
                else:
                    paths.append((*path, nxt))
    return found


def stats(graph: OpGraph, plan_: PartitionPlan, trivial_cut: float = TRIVIAL_CUT) -> dict:
    """AGO's partition statistics (subgraphs, trivial, mean/median weight, Jain index, ...), and how many
    pairs of complex ops each subgraph chains (``chains``: {"pointwise_conv→depthwise_conv": n, ...})."""
    g = Graph(tuple(n.id for n in graph.nodes), graph.edges, plan_.weights, graph.complex_ids)
    result = partition_stats(g, plan_.groups, trivial_cut)
    pairs: dict[str, set] = {}
    for c in chains(graph, plan_.groups):
        pairs.setdefault(c.pair, set()).add((c.ops[0], c.ops[-1]))
    counts = {pair: len(ends) for pair, ends in sorted(pairs.items(), key=lambda kv: (-len(kv[1]), kv[0]))}
    return {**result, "chains": counts, "seconds": round(plan_.seconds, 3)}
