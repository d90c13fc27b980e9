"""APOLLO's op typing (§3.3, Definitions 1–4) from the legalized PrimFuncs.

Every ``call_tir`` op of a legalized module is a primitive op. For each block
of its PrimFunc and each input it loads, the dataflow relation ``I_k → O`` is
read per loop dimension ``l`` from the block's iter vars: the input's trip
count ``e_i`` along ``l`` is the iter var's extent if the input's indices use
it, else 1; the output's ``e_o`` likewise. Per dimension the function is

=============  ================================  example
bijective      e_i = e_o                          ``add(x, y)`` same shapes
injective      e_i = 1, e_o ≠ 1                   bias broadcast over rows
surjective     e_i ≠ 1, e_o = 1                   ``sum`` over the last axis
general        anything else (see below)          ``matmul``, ``conv2d``
=============  ================================  ============================

A relation is *general* when an index is not a plain iter var or a constant
(``h*2 + rh``, ``i // 64``: convs, reshapes, gathers), when the input's iter
vars appear in another order than the output's (a transpose), or when it is
injective along one dimension and surjective along another (a contraction:
in APOLLO's positional alignment those dimensions do not line up). Then,
per op (Definitions 1–4): all relations bijective → element-wise; some
injective, the rest bijective → broadcast; some surjective, the rest
bijective/injective → reduction; any general → opaque, with a detail naming
the opaque kind Table 1 cares about (matmul, conv, transpose, or reshape/
gather/other).

A PrimFunc with several blocks is a compound op that LegalizeOps left closed
(``softmax``, ``mean`` = sum + divide); it is opened at block level: its
blocks are typed one by one and aggregated in program order with the same
rules (Table 1 + Table 2). If no rule joins them it is opaque.

Each type also carries its *row form* (APOLLO's canonical y-reduce form,
FusionStitching's block locality): the non-unit spatial extents of the output
and, for reductions over the innermost dims, the reduced extent. Memory
stitching only joins groups whose row forms agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.opgraph import op_base

ELEMENTWISE, BROADCAST, REDUCTION, OPAQUE = "element-wise", "broadcast", "reduction", "opaque"
KINDS = (ELEMENTWISE, BROADCAST, REDUCTION, OPAQUE)

#: opaque details by PrimFunc name prefix (first match wins); Table 1 has rows for matmul, conv, transpose
OPAQUE_DETAILS: tuple[tuple[str, str], ...] = (
    ("batch_matmul", "matmul"),
    ("matmul", "matmul"),
    ("dense", "matmul"),
    ("conv", "conv"),
    ("transpose", "transpose"),
    ("permute_dims", "transpose"),
    ("reshape", "reshape"),
    ("take", "gather"),
)


@dataclass(frozen=True)
class Relation:
    """One input's dataflow relation to the output of one block."""

    param: int  # index of the loaded buffer among the PrimFunc's params (-1: an intermediate)
    kind: str  # bijective | injective | surjective | general
    broadcast_dims: tuple[int, ...]  # output dims (positions among non-unit output dims) the input does not vary along
    why: str = ""


@dataclass(frozen=True)
class OpType:
    kind: str  # one of KINDS
    detail: str  # the label the rules match on: element-wise/broadcast/reduction, or matmul/conv/transpose/opaque
    out_extents: tuple[int, ...]  # non-unit extents of the (last block's) output
    reduce_extent: int  # product of the reduced extents (row reductions), 0 if none
    row_form: bool  # reductions: reduce dims innermost (y-reduce); others: True
    relations: tuple[Relation, ...]
    reason: str
    rows: tuple[int, ...] = ()  # reductions: the non-unit extents of the reduced output (one row each)

    @property
    def label(self) -> str:
        return self.detail if self.kind == OPAQUE else self.kind

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "out_extents": list(self.out_extents),
            "reduce_extent": self.reduce_extent,
            "row_form": self.row_form,
            "rows": list(self.rows),
            "reason": self.reason,
        }


def _is_var(expr, tirx) -> bool:
    return isinstance(expr, tirx.Var)


def _buffer(region):
    """The buffer of a block read/write region (``TensorRegion.source`` in TVM 0.27)."""
    return region.source if hasattr(region, "source") else region.buffer


def _indices(region, tirx):
    """A buffer region's per-dim index (its min) when every dim is a single point, else None."""
    out = []
    for rng in region.region:
        ext = rng.extent
        if not (isinstance(ext, tirx.IntImm) and int(ext.value) == 1):
            return None
        out.append(rng.min)
    return out


def _access_vars(load_indices, out_indices, extents: dict, tirx) -> tuple[list, list, str]:
    """(output loop vars, input loop vars, "") of one access, constant indices left out; or why an index
    is neither a loop variable nor a constant."""
    out_vars = []
    for idx in out_indices:
        if _is_var(idx, tirx):
            out_vars.append(idx)
        elif not isinstance(idx, tirx.IntImm):
            return [], [], "output index is not a plain loop variable"
    in_vars = []
    for idx in load_indices:
        if _is_var(idx, tirx):
            if idx not in extents:
                return [], [], f"index {idx} is not a loop variable"
            in_vars.append(idx)
        elif not isinstance(idx, tirx.IntImm):
            return [], [], f"index {idx} is a computed expression"
    return out_vars, in_vars, ""


def relation(load_indices, out_indices, extents: dict, tirx) -> tuple[str, tuple[int, ...], str]:
    """Classify one input access against the output access (both index lists of one block)."""
    out_vars, in_vars, why = _access_vars(load_indices, out_indices, extents, tirx)
    if why:
        return "general", (), why
    shared = [v for v in in_vars if any(v.same_as(o) for o in out_vars)]
    in_order = [next(i for i, o in enumerate(out_vars) if o.same_as(v)) for v in shared]
    if in_order != sorted(in_order) or len(set(in_order)) != len(in_order):
        return "general", (), "input dims are permuted relative to the output (transpose)"
    injective, surjective = [], []
    nonunit_out = [o for o in out_vars if extents.get(o, 1) > 1]
    for pos, o in enumerate(nonunit_out):
        if not any(o.same_as(v) for v in in_vars):
            injective.append(pos)
    for v in in_vars:
        if extents[v] > 1 and not any(v.same_as(o) for o in out_vars):
            surjective.append(v)
    if injective and surjective:
        return "general", (), "broadcast along one dim and reduced along another (a contraction)"
    if surjective:
        # y-reduce (APOLLO's canonical form, FusionStitching's row locality): reduced dims innermost in memory
        pos = {id(v): i for i, v in enumerate(load_indices)}
        kept = [pos[id(v)] for v in in_vars if extents[v] > 1 and not any(v.same_as(s) for s in surjective)]
        red = [pos[id(v)] for v in surjective]
        inner = not kept or max(kept) < min(red)
        return "surjective", (), "" if inner else "reduced dims are not innermost (x-reduce)"
    if injective:
        return "injective", tuple(injective), ""
    return "bijective", (), ""


def _param_index(buffer, params) -> int:
    for i, p in enumerate(params):
        if buffer.same_as(p) or (getattr(buffer, "data", None) is not None
                                 and buffer.data.same_as(getattr(p, "data", None))):
            return i
    return -1


def type_block(block, param_of: list) -> OpType:
    """Type one block (Definitions 1–4) from its loads, its store and its iter vars."""
    from tvm import tirx

    extents = {iv.var: int(iv.dom.extent) for iv in block.iter_vars}
    kinds = {iv.var: ("R" if int(iv.iter_type) == 2 else "S") for iv in block.iter_vars}
    if len(block.writes) != 1:
        return OpType(OPAQUE, "opaque", (), 0, False, (), f"block {block.name_hint} writes {len(block.writes)} buffers")
    written = _buffer(block.writes[0])
    out_indices = _indices(block.writes[0], tirx)
    if out_indices is None:
        return OpType(OPAQUE, "opaque", (), 0, False, (), f"block {block.name_hint} writes a region per iteration")
    rels = []
    for read in block.reads:
        if _buffer(read).same_as(written):
            continue  # a reduction's accumulator
        indices = _indices(read, tirx)
        if indices is None:
            rels.append(Relation(_param_index(_buffer(read), param_of), "general", (),
                                 "reads a region per iteration (gather/window)"))
            continue
        kind, bdims, why = relation(indices, out_indices, extents, tirx)
        rels.append(Relation(_param_index(_buffer(read), param_of), kind, bdims, why))
    out_ext = tuple(extents[i] for i in out_indices if _is_var(i, tirx) and extents[i] > 1)
    red = [v for v, k in kinds.items() if k == "R" and extents[v] > 1]
    order = [iv.var for iv in block.iter_vars if extents[iv.var] > 1]
    row_form = True
    reduce_extent = 0
    if red:
        reduce_extent = math.prod(extents[v] for v in red)
        first_red = min(order.index(v) for v in red)
        row_form = all(kinds[v] == "R" for v in order[first_red:])
        row_form = row_form and not any(r.kind == "surjective" and r.why for r in rels)
    kinds_seen = {r.kind for r in rels}
    if "general" in kinds_seen:
        why = next(r.why for r in rels if r.kind == "general")
        kind, reason = OPAQUE, f"general relation: {why}"
    elif "surjective" in kinds_seen or red:
        kind, reason = REDUCTION, "a surjective relation (reduced dims)"
    elif "injective" in kinds_seen:
        kind, reason = BROADCAST, "an injective relation (broadcast dims), the rest bijective"
    else:
        kind, reason = ELEMENTWISE, "every relation bijective"
    rows = out_ext if kind == REDUCTION else ()
    return OpType(kind, kind, out_ext, reduce_extent, row_form, tuple(rels), reason, rows)


def opaque_detail(func_name: str, relations) -> str:
    base = op_base(func_name)
    for prefix, detail in OPAQUE_DETAILS:
        if base.startswith(prefix):
            return detail
    if relations and all("transpose" in r.why for r in relations if r.kind == "general"):
        return "transpose"
    return "opaque"


def type_func(func_name: str, func) -> OpType:
    """Type a legalized PrimFunc: one block directly; several blocks by aggregating them with the rules."""
    from tvm import s_tir

    from toolchain.cuda import rules

    param_of = list(func.params)  # in TVM 0.27 a PrimFunc's params are its buffers
    sch = s_tir.Schedule(func)
    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    if not blocks:
        return OpType(OPAQUE, "opaque", (), 0, False, (), "no blocks")
    types = [type_block(b, param_of) for b in blocks]
    if any(len(sch.get_child_blocks(sch.get_sblock(b.name_hint))) for b in blocks):
        return OpType(OPAQUE, "opaque", (), 0, False, (), "nested blocks")
    result = types[0]
    for nxt in types[1:]:
        rule = rules.find(rules.ALL_RULES, result.label, nxt.label)
        if rule is None:
            result = None
            break
        result = _combine(result, nxt, rule.result)
    if result is None:
        kinds = "+".join(t.label for t in types)
        return OpType(OPAQUE, opaque_detail(func_name, ()), (), 0, False, (),
                      f"compound op ({kinds}) no rule aggregates")
    if result.kind == OPAQUE:
        return OpType(OPAQUE, opaque_detail(func_name, result.relations), result.out_extents, 0, False,
                      result.relations, result.reason)
    if len(types) > 1:
        detail = " → ".join(t.label for t in types)
        return OpType(result.kind, result.kind, result.out_extents, result.reduce_extent, result.row_form,
                      result.relations, f"compound op opened at block level ({detail})", result.rows)
    return result


def _combine(p: OpType, c: OpType, kind: str) -> OpType:
    row_form = p.row_form and c.row_form
    reduce_extent = p.reduce_extent or c.reduce_extent
    rows = p.rows or c.rows
    if p.reduce_extent and c.reduce_extent and (p.reduce_extent, p.rows) != (c.reduce_extent, c.rows):
        row_form = False
    return OpType(kind, kind, c.out_extents, reduce_extent, row_form, p.relations + c.relations, "", rows)


def op_types(mod, graph) -> dict[str, OpType]:
    """The type of every op of ``graph`` (an :class:`toolchain.opgraph.OpGraph` of ``mod``), by op id."""
    cache: dict[str, OpType] = {}
    out = {}
    for node in graph.nodes:
        if node.func not in cache:
            cache[node.func] = type_func(node.func, mod[node.func])
        out[node.id] = cache[node.func]
    return out
