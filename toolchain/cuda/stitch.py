"""Partition a typed op graph: APOLLO's Algorithm 1 (aggregation, Table 1) then
Algorithm 2 (memory stitching, Table 2) with a shared-memory fit check.

Algorithm 1 starts with one micro-graph per op and, rule by rule in the
table's priority order, merges producer/consumer micro-graphs whose labels
match the rule until nothing changes; a merge that would create a cycle
(another path from ``G_p`` to ``G_c``) is declined. Reductions end up with
their element-wise/broadcast producers, never with their consumers.

Algorithm 2 then joins a reduction micro-graph with its consumers (rule 7)
and with following reductions (rule 8) when

* their *row form* agrees (APOLLO's ``consist_dim_and_param`` and identical
  canonical form): every reduction reduces the innermost dims (y-reduce) over
  the same rows and the same reduced extent ``C``, and every other op is a
  row scalar (its output is one value per row) or a full row (rows × C) read
  row-aligned (broadcast only along the columns). Then one thread block per
  row computes the whole group — FusionStitching's *block composition*
  (*warp composition* when ``C`` fits a warp) — and every value a thread needs
  from another thread is produced in the same block;
* the group's intermediates fit the shared-memory budget (default 48 KiB per
  block): full-row intermediates take ``C × 4`` bytes, row scalars 4 bytes,
  each reduction's cross-thread scratch ``threads / 32 × 4`` bytes. A group
  that would not fit is not stitched (APOLLO would spill to global memory;
  on a GPU that needs a grid-wide barrier, so agoc keeps two kernels).

Every declined merge is recorded with its reason. The result is an acyclic
partition in topological order, ready for :func:`toolchain.fusion.outline_groups`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from toolchain.cuda import rules as rules_mod
from toolchain.cuda.optype import BROADCAST, ELEMENTWISE, REDUCTION, OpType

#: shared memory a stitched group may use per thread block (the CUDA default without opt-in)
SHARED_BUDGET_BYTES = 48 * 1024
MAX_THREADS = 256
WARP = 32


@dataclass(frozen=True)
class RowForm:
    rows: tuple[int, ...]  # non-unit extents of the rows (one thread block each)
    cols: int  # reduced extent per row

    @property
    def threads(self) -> int:
        return threads_for(self.cols)

    @property
    def composition(self) -> str:
        return "warp" if self.threads <= WARP else "block"

    def to_json(self) -> dict:
        return {"rows": list(self.rows), "cols": self.cols, "threads": self.threads, "composition": self.composition}


def threads_for(cols: int) -> int:
    """Threads per block for a row of ``cols`` elements: a warp for short rows, up to 256."""
    t = WARP
    while t < cols and t < MAX_THREADS:
        t *= 2
    return t


@dataclass
class Group:
    gid: int
    members: list[str]
    label: str
    rules: list[str] = field(default_factory=list)  # rules applied to build it, in order

    @property
    def stitched(self) -> bool:
        return any(r in ("7", "8") for r in self.rules)


@dataclass(frozen=True)
class Decision:
    rule: str
    producer: tuple[str, ...]
    consumer: tuple[str, ...]
    merged: bool
    reason: str

    def to_json(self) -> dict:
        return {"rule": self.rule, "producer": list(self.producer), "consumer": list(self.consumer),
                "merged": self.merged, "reason": self.reason}


@dataclass(frozen=True)
class PlannedGroup:
    members: tuple[str, ...]
    label: str
    rules: tuple[str, ...]
    stitched: bool
    form: RowForm | None  # set for groups scheduled one row per thread block
    shared_bytes: int

    def to_json(self) -> dict:
        return {"ops": list(self.members), "label": self.label, "rules": list(self.rules), "stitched": self.stitched,
                "row_form": self.form.to_json() if self.form else None, "shared_bytes": self.shared_bytes}


@dataclass(frozen=True)
class Plan:
    groups: tuple[PlannedGroup, ...]  # topological order
    decisions: tuple[Decision, ...]  # every declined (and accepted) Table 2 merge, declined Table 1 merges
    budget_bytes: int

    @property
    def group_lists(self) -> list[list[str]]:
        return [list(g.members) for g in self.groups]

    def to_json(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "groups": [g.to_json() for g in self.groups],
                "decisions": [d.to_json() for d in self.decisions]}


class _State:
    """Micro-graphs over the op graph with quotient adjacency, for cycle checks."""

    def __init__(self, graph, types: dict[str, OpType], outputs: frozenset = frozenset()):
        self.graph = graph
        self.outputs = outputs  # ops whose result main returns
        self.types = types
        self.order = {n.id: i for i, n in enumerate(graph.nodes)}
        self.group_of = {n.id: i for i, n in enumerate(graph.nodes)}
        self.groups = {i: Group(i, [n.id], types[n.id].label) for i, n in enumerate(graph.nodes)}
        self.consumers: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
        self.producers: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
        for p, c in graph.edges:
            self.consumers[p].append(c)
            self.producers[c].append(p)

    def succ(self, gid: int) -> set[int]:
        return {self.group_of[c] for m in self.groups[gid].members for c in self.consumers[m]} - {gid}

    def acyclic(self, gp: int, gc: int) -> bool:
        """Merging gp and gc is safe iff gc is not reachable from gp except by a direct edge."""
        stack = [g for g in self.succ(gp) if g != gc]
        seen = set(stack)
        while stack:
            g = stack.pop()
            if g == gc:
                return False
            for nxt in self.succ(g):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return True

    def merge(self, gp: int, gc: int, label: str, rule: str) -> None:
        a, b = self.groups[gp], self.groups.pop(gc)
        a.members = sorted(a.members + b.members, key=self.order.__getitem__)
        a.label = label
        a.rules = a.rules + b.rules + [rule]
        for m in b.members:
            self.group_of[m] = gp

    def edges(self):
        for p, c in self.graph.edges:
            gp, gc = self.group_of[p], self.group_of[c]
            if gp != gc:
                yield gp, gc

    def members(self, gid: int) -> tuple[str, ...]:
        return tuple(self.groups[gid].members)

    def escaping(self, members: set[str]) -> list[str]:
        """Members whose result is needed outside ``members`` (the group's outputs)."""
        return [m for m in members
                if m in self.outputs or not self.consumers[m] or any(c not in members for c in self.consumers[m])]


#: labels whose groups dlight's Matmul rule must schedule: it inlines epilogues only into a single output
SINGLE_OUTPUT_LABELS = ("matmul", "conv")


def _fixed_point(state: _State, step) -> None:
    """Offer every edge between two live groups to ``step(gp, gc)`` (True: it merged them), pass after
    pass, until a whole pass merges nothing."""
    changed = True
    while changed:
        changed = False
        for gp, gc in list(state.edges()):
            if gp in state.groups and gc in state.groups and gp != gc:
                changed = step(gp, gc) or changed


def aggregate(state: _State, table=rules_mod.AGGREGATION_RULES, log: list | None = None) -> None:
    """Algorithm 1: apply the Table 1 rules, priority by priority, to a fixed point."""
    for prio in rules_mod.priority_groups(table):
        _fixed_point(state, functools.partial(_aggregate_step, state, prio, log))


def _aggregate_step(state: _State, prio, log: list | None, gp: int, gc: int) -> bool:
    """One Table 1 merge offer (``prio``'s rules) of producer group ``gp`` into consumer ``gc``."""

    def declined(rule, why: str) -> bool:
        if log is not None:
            log.append(Decision(rule.name, state.members(gp), state.members(gc), False, why))
        return False

    rule = rules_mod.find(prio, state.groups[gp].label, state.groups[gc].label)
    if rule is None:
        return False
    if not state.acyclic(gp, gc):
        return declined(rule, "another path joins them: merging would create a cycle")
    if rule.result == REDUCTION and any(_reduces_to_one(state.types[m]) for m in state.members(gc)):
        return declined(rule, "feedback: a reduction to one element (the loss) is a grid-wide "
                        "reduction of its own (FullReduction), which inlines nothing; its producers stay free "
                        "to stitch with their rows")
    merged_label = rule.merged(state.groups[gp].label, state.groups[gc].label)
    if merged_label in SINGLE_OUTPUT_LABELS:
        outs = state.escaping(set(state.members(gp)) | set(state.members(gc)))
        if len(outs) != 1:
            return declined(rule, f"feedback: the merged {merged_label} would have {len(outs)} "
                            "outputs; dlight's Matmul inlines epilogues into a single output only")
    state.merge(gp, gc, merged_label, rule.name)
    return True


def _reduces_to_one(t: OpType) -> bool:
    return t.kind == REDUCTION and not t.out_extents


def row_form(members, types: dict[str, OpType]) -> tuple[RowForm | None, str]:
    """The common row form of a set of ops, or None with the reason."""
    reds = [m for m in members if types[m].kind == REDUCTION]
    if not reds:
        return None, "no reduction"
    forms = {(types[m].rows, types[m].reduce_extent) for m in reds}
    if any(not types[m].row_form for m in reds):
        bad = next(m for m in reds if not types[m].row_form)
        return None, f"{bad} does not reduce the innermost dims (x-reduce): not the canonical y-reduce form"
    if len(forms) != 1:
        return None, f"reductions disagree on rows x reduced extent: {sorted(forms)}"
    rows, cols = forms.pop()
    if not rows:
        return None, "a reduction to one element: no rows to give blocks (FullReduction schedules it grid-wide)"
    for m in members:
        t = types[m]
        if t.kind == REDUCTION:
            continue
        if t.kind not in (ELEMENTWISE, BROADCAST):
            return None, f"{m} is {t.label}"
        if not fits(t.out_extents, rows, cols):
            return None, (f"{m}'s output {list(t.out_extents)} is neither a row scalar {list(rows)} "
                          f"nor a row {list(rows)}x{cols}")
    return RowForm(tuple(rows), int(cols)), ""


def fits(extents: tuple[int, ...], rows: tuple[int, ...], cols: int) -> bool:
    if tuple(extents) == tuple(rows):
        return True
    return tuple(extents[: len(rows)]) == tuple(rows) and math.prod(extents[len(rows):]) == cols and cols > 1


def is_row_scalar(extents, form: RowForm) -> bool:
    return tuple(extents) == form.rows


def row_aligned(state: _State, members: set[str], form: RowForm) -> str:
    """Every in-group read of a full row must be row-aligned (broadcast only along the columns)."""
    nrows = len(form.rows)
    for c in members:
        t = state.types[c]
        for rel in t.relations:
            if rel.kind == "injective" and any(d < nrows for d in rel.broadcast_dims):
                # only matters when the input is produced inside the group
                producers_inside = [p for p in state.producers[c] if p in members]
                if producers_inside:
                    return f"{c} broadcasts an input along a row dim: rows would need data from other thread blocks"
    return ""


def shared_bytes(state: _State, members: set[str], form: RowForm) -> int:
    """Shared memory per thread block: in-group intermediates, escaping reduction results read in-group, scratch."""
    total = 0
    for m in members:
        t = state.types[m]
        consumers = state.consumers[m]
        inside = [c for c in consumers if c in members]
        if not inside:
            continue
        total += 4 if is_row_scalar(t.out_extents, form) else 4 * form.cols
        if t.kind == REDUCTION:
            total += 4 * max(1, form.threads // WARP)
    return total


def stitch(state: _State, budget: int = SHARED_BUDGET_BYTES, log: list | None = None) -> None:
    """Algorithm 2: rules 7 then 8 (Table 2), with the row-form and shared-memory checks."""
    for rule in rules_mod.STITCH_RULES:
        _fixed_point(state, functools.partial(_stitch_step, state, rule, budget, log))


def _stitch_step(state: _State, rule, budget: int, log: list | None, gp: int, gc: int) -> bool:
    """One Table 2 merge offer (``rule``) of producer group ``gp`` into consumer ``gc``."""
    if not rule.matches(state.groups[gp].label, state.groups[gc].label):
        return False
    reason = _stitch_check(state, gp, gc, budget)
    if log is not None:
        log.append(Decision(rule.name, state.members(gp), state.members(gc), not reason,
                            reason or "row forms agree; fits"))
    if reason:
        return False
    state.merge(gp, gc, rule.result, rule.name)
    return True


def _stitch_check(state: _State, gp: int, gc: int, budget: int) -> str:
    if not state.acyclic(gp, gc):
        return "another path joins them: merging would create a cycle"
    members = set(state.members(gp)) | set(state.members(gc))
    form, why = row_form(members, state.types)
    if form is None:
        return why
    why = row_aligned(state, members, form)
    if why:
        return why
    used = shared_bytes(state, members, form)
    if used > budget:
        return f"shared memory {used} B > budget {budget} B per block"
    return ""


def _topological(state: _State) -> list[int]:
    indeg = {g: 0 for g in state.groups}
    succ = {g: state.succ(g) for g in state.groups}
    for outs in succ.values():
        for o in outs:
            indeg[o] += 1
    first = {g: min(state.order[m] for m in state.groups[g].members) for g in state.groups}
    ready = sorted((g for g, d in indeg.items() if d == 0), key=first.__getitem__)
    out = []
    while ready:
        g = ready.pop(0)
        out.append(g)
        for o in succ[g]:
            indeg[o] -= 1
            if indeg[o] == 0:
                ready.append(o)
                ready.sort(key=first.__getitem__)
    if len(out) != len(state.groups):
        raise AssertionError("partition has a cycle")  # cannot happen: every merge is checked
    return out


def plan(graph, types: dict[str, OpType], *, outputs=frozenset(), stitching: bool = True,
         budget: int = SHARED_BUDGET_BYTES, table=rules_mod.AGGREGATION_RULES) -> Plan:
    """Algorithm 1 (+ Algorithm 2 when ``stitching``) over ``graph`` → a :class:`Plan`.

    ``outputs``: ids of the ops whose results ``main`` returns (see :func:`main_outputs`).
    """
    state = _State(graph, types, frozenset(outputs))
    log: list[Decision] = []
    aggregate(state, table, log)
    if stitching:
        stitch(state, budget, log)
    groups = []
    for gid in _topological(state):
        g = state.groups[gid]
        members = set(g.members)
        form = None
        used = 0
        if g.label == REDUCTION:
            form, _ = row_form(members, types)
            if form is not None and row_aligned(state, members, form):
                form = None
            if form is not None:
                used = shared_bytes(state, members, form)
                if used > budget:
                    form, used = None, 0
        groups.append(PlannedGroup(tuple(g.members), g.label, tuple(g.rules), g.stitched, form, used))
    unique = list(dict.fromkeys(log))  # the fixed-point loops see a declined pair again on every pass
    return Plan(tuple(groups), tuple(unique), budget)


def peel_reductions(p: Plan, index: int, reason: str, consumers: dict, types: dict[str, OpType]) -> Plan:
    """Feedback that blames a group's reductions: they leave as one group each, and the element-wise /
    broadcast rest stays one group. Only where no member reads a reduction's output (peeling one from
    the middle would make a cycle); otherwise the whole group is split."""
    g = p.groups[index]
    reds = [m for m in g.members if types[m].kind == REDUCTION]
    rest = tuple(m for m in g.members if types[m].kind != REDUCTION)
    if (not reds or not rest or any(types[m].kind not in (ELEMENTWISE, BROADCAST) for m in rest)
            or any(c in g.members for r in reds for c in consumers.get(r, ()))):
        return split_group(p, index, reason)
    label = BROADCAST if any(types[m].kind == BROADCAST for m in rest) else ELEMENTWISE
    kept = PlannedGroup(rest, label if len(rest) > 1 else "unfused", g.rules, False, None, 0)
    singles = [PlannedGroup((m,), "unfused", (), False, None, 0) for m in reds]
    groups = p.groups[:index] + (kept, *singles) + p.groups[index + 1:]
    note = Decision("feedback", tuple(reds), rest, False, f"reductions peeled after code generation: {reason}")
    return Plan(groups, p.decisions + (note,), p.budget_bytes)


def split_group(p: Plan, index: int, reason: str) -> Plan:
    """Feedback from code generation: replace group ``index`` by one group per op (APOLLO §4's feedback loop)."""
    g = p.groups[index]
    singles = [PlannedGroup((m,), "unfused", (), False, None, 0) for m in g.members]
    groups = p.groups[:index] + tuple(singles) + p.groups[index + 1:]
    note = Decision("feedback", g.members, (), False, f"split after code generation failed: {reason}")
    return Plan(groups, p.decisions + (note,), p.budget_bytes)


def main_outputs(mod) -> frozenset:
    """Ids (binding names) of the ops whose results ``main`` returns, directly or through tuples/aliases."""
    from tvm import relax

    main = mod["main"]
    alias = {}
    for block in main.body.blocks:
        for b in block.bindings:
            alias[b.var.name] = b.value
    found: set[str] = set()

    def visit(expr):
        if isinstance(expr, relax.Var):
            value = alias.get(expr.name)
            if isinstance(value, (relax.Tuple, relax.Var)):
                visit(value)
            elif isinstance(value, relax.TupleGetItem):
                visit(value.tuple_value)
            else:
                found.add(expr.name)
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                visit(f)

    visit(main.body.body)
    return frozenset(found)
