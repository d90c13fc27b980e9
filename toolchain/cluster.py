"""AGO graph partitioning (§IV-B, Algorithm 1 "Cluster") and the reformer's Split / Join (§V) on an
abstract :class:`toolchain.dag.Graph`; every step records why. The choices the paper leaves open are
in docs/partitioning.md (Cluster, precisely)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from toolchain.dag import Graph, PartitionError, stages
from toolchain.quotient import check_partition, quotient_order

#: What a Decision's kind means (the vocabulary `agoc partition --explain` prints).
DECISION_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "merged": "the chosen hyper node and its partner became one hyper node",
        "declined": "the chosen hyper node left the candidate set without merging",
        "excluded": "a neighbour of the chosen hyper node was ruled out as its partner",
        "unit": "ops given as one unit before clustering (a complex op, its elementwise epilogue and a model "
                "input's layout transpose it reads; with --keep-inside, two such joined by a large tensor)",
    }
)


@dataclass(frozen=True)
class Decision:
    """One step of Cluster, with the reason: ``str(decision)`` is the explain line."""

    kind: str  # a key of DECISION_KINDS
    nodes: tuple[str, ...]  # members of the chosen hyper node v
    partner: tuple[str, ...]  # members of the partner u (empty when there is none)
    reason: str

    def __str__(self) -> str:
        who = _label(self.nodes) + (f" + {_label(self.partner)}" if self.partner else "")
        return f"{self.kind}: {who}: {self.reason}"


@dataclass(frozen=True)
class Partition:
    groups: tuple[tuple[str, ...], ...]  # quotient topological order; members in node order
    decisions: tuple[Decision, ...]


# ----------------------------------------------------------------------------- Cluster


class _Quotient:
    """Mutable working state of Cluster: the quotient graph of the current hyper nodes."""

    def __init__(self, graph: Graph) -> None:
        n = len(graph.nodes)
        self.graph = graph
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}
        self._names: dict[int, tuple[str, ...]] = {i: (node,) for i, node in enumerate(graph.nodes)}
        self.weight: dict[int, float] = {i: graph.weights[node] for i, node in enumerate(graph.nodes)}
        self.ncomplex: dict[int, int] = {i: int(node in graph.complex) for i, node in enumerate(graph.nodes)}
        self.succ: dict[int, set[int]] = {i: set(graph.succ[i]) for i in range(n)}
        self.pred: dict[int, set[int]] = {i: set() for i in range(n)}
        for a, b in graph.unique_edges:
            self.pred[b].add(a)
        by_name = stages(graph.nodes, graph.edges)
        self.stage: dict[int, int] = {i: by_name[node] for i, node in enumerate(graph.nodes)}
        self.next_id = n

    def first(self, h: int) -> int:
        return self.members[h][0]

    def names(self, h: int) -> tuple[str, ...]:
        if h not in self._names:
            self._names[h] = tuple(self.graph.nodes[i] for i in self.members[h])
        return self._names[h]

    def neighbours(self, h: int) -> list[int]:
        return sorted(self.succ[h] | self.pred[h], key=self.first)

    def merged_weight(self, v: int, u: int) -> float:
        weights, nodes = self.graph.weights, self.graph.nodes
        return math.fsum(weights[nodes[i]] for i in self.members[v] + self.members[u])

    def merge(self, v: int, u: int, weight: float) -> int:
        """Contract v and u (together weighing ``weight``) into a new hyper node; return its id."""
        h = self.next_id
        self.next_id += 1
        self.members[h] = sorted(self.members.pop(v) + self.members.pop(u))
        self._names.pop(v, None), self._names.pop(u, None)
        self.weight[h] = weight
        self.ncomplex[h] = self.ncomplex.pop(v) + self.ncomplex.pop(u)
        gone = {v, u}
        self.succ[h] = (self.succ.pop(v) | self.succ.pop(u)) - gone
        self.pred[h] = (self.pred.pop(v) | self.pred.pop(u)) - gone
        for x in self.succ[h]:
            self.pred[x] -= gone
            self.pred[x].add(h)
        for x in self.pred[h]:
            self.succ[x] -= gone
            self.succ[x].add(h)
        del self.weight[v], self.weight[u]
        old = min(self.stage.pop(v), self.stage.pop(u))
        self._restage(h, old)
        return h

    def _restage(self, h: int, old_stage: int) -> None:
        """Recompute stages of h and of its descendants whose stage can change.

        Old stages order the descendants topologically (edges among them are
        unchanged), so a heap on the old stage visits every node after all its
        changed predecessors; a node whose stage stays the same stops the wave.
        """
        stage, pred, succ = self.stage, self.pred, self.succ
        queue = [(old_stage, h)]  # nodes of one old stage have no edges between them: any tie order works
        queued = {h}
        while queue:
            _, x = heapq.heappop(queue)
            new = 1
            for p in pred[x]:
                if stage[p] >= new:
                    new = stage[p] + 1
            if x != h and new == stage[x]:
                continue
            stage[x] = new
            for s in succ[x]:
                if s not in queued:
                    queued.add(s)
                    heapq.heappush(queue, (stage[s], s))

    def full_stages(self) -> dict[int, int]:
        """Stages of the quotient from scratch (for check=True)."""
        ids = sorted(self.members, key=self.first)
        by_id = stages(ids, ((a, b) for a in ids for b in self.succ[a]))
        return dict(by_id)


def _num(x: float) -> str:
    """A weight for a human: one decimal, more digits only where one decimal would hide it."""
    if x != 0 and abs(x) < 0.1:
        return f"{x:.3g}"
    return f"{x:.1f}"


def _label(names: tuple[str, ...]) -> str:
    if len(names) == 1:
        return names[0]
    if len(names) <= 4:
        return "{" + ", ".join(names) + "}"
    return "{" + f"{names[0]}, {names[1]}, …, {names[-1]}" + f"}} ({len(names)} ops)"


@dataclass(frozen=True)
class _Step:
    """What Cluster decided for the chosen hyper node v: a partner to merge with, or none."""

    partner: int | None
    weight: float  # of v and partner together (0.0 without a partner)
    decisions: tuple[Decision, ...]


def _kept_apart(q: _Quotient, v: int, x: int, apart: Mapping[int, Mapping[int, str]]) -> str | None:
    """Why v and x may not merge (a kept-apart edge would fall inside the group), or None."""
    if not apart:
        return None
    inside = set(q.members[x])
    for m in q.members[v]:
        for other, why in apart.get(m, {}).items():
            if other in inside:
                a, b = sorted((m, other))
                return f"keeps {q.graph.nodes[a]} → {q.graph.nodes[b]} apart: {why}"
    return None


def _choose(q: _Quotient, v: int, threshold: float, max_complex: int | None,
            apart: Mapping[int, Mapping[int, str]] = MappingProxyType({})) -> _Step:
    """One iteration of Algorithm 1 for the chosen v (lines 6–11), with the reasons."""
    sv = q.stage[v]
    notes: list[Decision] = []
    eligible: list[int] = []
    affixes = 0
    over_limit = 0
    for x in q.neighbours(v):
        sx = q.stage[x]
        if abs(sx - sv) != 1:
            notes.append(
                Decision("excluded", q.names(v), q.names(x),
                         f"not an affix (stage {sv} vs {sx}): merging could create a cycle")
            )
            continue
        affixes += 1
        held = q.ncomplex[v] + q.ncomplex[x]
        if max_complex is not None and held > max_complex:
            notes.append(
                Decision("excluded", q.names(v), q.names(x),
                         f"would hold {held} complex ops (limit {max_complex})")
            )
            over_limit += 1
            continue
        why = _kept_apart(q, v, x, apart)
        if why:
            notes.append(Decision("excluded", q.names(v), q.names(x), why))
            continue
        eligible.append(x)
    if not affixes:
        notes.append(Decision("declined", q.names(v), (), "no affix neighbour (stage ±1)"))
        return _Step(None, 0.0, tuple(notes))
    if not eligible:
        reason = (f"every affix neighbour would exceed the complex-op limit {max_complex}" if over_limit == affixes
                  else "every affix neighbour is ruled out (complex-op limit or a kept-apart edge)")
        notes.append(Decision("declined", q.names(v), (), reason))
        return _Step(None, 0.0, tuple(notes))
    u = min(eligible, key=lambda x: (q.weight[x], q.first(x)))
    wv, wu = q.weight[v], q.weight[u]
    total = q.merged_weight(v, u)
    sums = f"weight {_num(wv)} + {_num(wu)} = {_num(total)}"
    if total < threshold:
        notes.append(
            Decision("merged", q.names(v), q.names(u),
                     f"{sums} < threshold {_num(threshold)} (stages {sv} and {q.stage[u]})")
        )
        return _Step(u, total, tuple(notes))
    notes.append(Decision("declined", q.names(v), q.names(u), f"{sums} >= threshold {_num(threshold)}"))
    return _Step(None, 0.0, tuple(notes))


def _seed_units(q: _Quotient, graph: Graph, units: Iterable[Iterable[str]]) -> list[Decision]:
    """Contract each unit (an acyclic set of ops that must stay together) into one hyper node.

    Members merge in node order: every prefix of an acyclic unit is acyclic too (a path leaving the
    prefix and coming back would have to pass through later ops only, so through no op of the
    prefix), so no intermediate quotient has a cycle."""
    units = [u for u in map(tuple, units) if len(u) > 1]
    if not units:
        return []
    covered = {m for u in units for m in u}
    check_partition(graph, units + [(n,) for n in graph.nodes if n not in covered])  # disjoint, acyclic
    notes = []
    for unit in units:
        order = sorted(graph.position[n] for n in unit)
        h = order[0]
        for i in order[1:]:
            h = q.merge(h, i, q.merged_weight(h, i))
        notes.append(Decision("unit", q.names(h), (), f"given as one unit (weight {_num(q.weight[h])})"))
    return notes


def _apart_table(graph: Graph, boundaries: Mapping[tuple[str, str], str],
                 units: Iterable[Iterable[str]]) -> dict[int, dict[int, str]]:
    """Kept-apart edges as position → {position: reason}, both ways; checked against the graph and the units."""
    apart: dict[int, dict[int, str]] = {}
    for (a, b), why in boundaries.items():
        for end in (a, b):
            if end not in graph.position:
                raise PartitionError(f"kept-apart edge {a} → {b} names op {end!r}, which is not in the graph")
        pa, pb = graph.position[a], graph.position[b]
        apart.setdefault(pa, {})[pb] = why
        apart.setdefault(pb, {})[pa] = why
    for unit in map(set, units):
        for (a, b) in boundaries:
            if a in unit and b in unit:
                raise PartitionError(f"a unit holds {a} and {b}, which an edge rule keeps apart")
    return apart


def cluster(graph: Graph, threshold: float, max_complex: int | None = None, *, check: bool = False,
            units: Iterable[Iterable[str]] = (),
            boundaries: Mapping[tuple[str, str], str] = MappingProxyType({})) -> Partition:
    """AGO Algorithm 1: greedy affix merging under the weight threshold; an acyclic partition.

    ``units`` are op sets that start as one hyper node each (the caller's conventional epilogue
    fusion: a conv with its bias and activation); every group is a union of units and single ops.
    ``max_complex`` limits complex ops per group (Split uses 1). ``boundaries`` maps (producer,
    consumer) pairs that must never share a group to the reason (recorded when it rules a partner out).
    ``check=True``
    verifies after every merge that the quotient is acyclic and the incremental
    stages equal a full recomputation (debug / tests; O(V+E) per merge).
    """
    if math.isnan(threshold):
        raise PartitionError("the weight threshold is NaN; give a number")
    if max_complex is not None and max_complex < 0:
        raise PartitionError(f"max_complex is {max_complex}; give a count >= 0 or None")
    units = [tuple(u) for u in units]
    apart = _apart_table(graph, boundaries, units)
    q = _Quotient(graph)
    decisions: list[Decision] = _seed_units(q, graph, units)
    candidates = set(q.members)
    heap = [(-q.weight[h], q.first(h), h) for h in candidates]
    heapq.heapify(heap)
    while candidates:
        _, _, v = heapq.heappop(heap)
        if v not in candidates:
            continue  # merged away since it was pushed
        step = _choose(q, v, threshold, max_complex, apart)
        decisions.extend(step.decisions)
        candidates.discard(v)
        if step.partner is None:
            continue
        candidates.discard(step.partner)
        h = q.merge(v, step.partner, step.weight)
        candidates.add(h)
        heapq.heappush(heap, (-q.weight[h], q.first(h), h))
        if check:
            _check_quotient(q)
    groups = [q.names(h) for h in q.members]
    order = quotient_order(graph, groups)
    return Partition(tuple(groups[i] for i in order), tuple(decisions))


def _check_quotient(q: _Quotient) -> None:
    full = q.full_stages()  # raises PartitionError on a cycle
    if full != q.stage:
        wrong = sorted(h for h in full if full[h] != q.stage[h])
        raise AssertionError(f"incremental stages differ from a full recomputation at {wrong}")


# ----------------------------------------------------------------------------- Split / Join


def induced(graph: Graph, members: Iterable[str]) -> Graph:
    """The subgraph on ``members`` (node order and edges kept where both ends are members)."""
    members = list(members)
    keep = set()
    for node in members:
        if node not in graph.position:
            raise PartitionError(f"op {node!r} is not in the graph")
        if node in keep:
            raise PartitionError(f"op {node!r} appears twice in the subgraph")
        keep.add(node)
    return Graph(
        nodes=tuple(node for node in graph.nodes if node in keep),
        edges=tuple((a, b) for a, b in graph.edges if a in keep and b in keep),
        weights={node: graph.weights[node] for node in keep},
        complex=graph.complex & keep,
    )


def split(graph: Graph, group: Iterable[str], threshold: float,
          units: Iterable[Iterable[str]] = ()) -> tuple[tuple[str, ...], ...]:
    """AGO's Split: Cluster on the subgraph ``group`` with at most one complex op per mini-subgraph
    (``units`` inside the group stay whole)."""
    group = tuple(group)
    inside = set(group)
    units = [u for u in units if set(u) <= inside]
    return cluster(induced(graph, group), threshold, max_complex=1, units=units).groups


def join(graph: Graph, minis: Iterable[Iterable[str]]) -> tuple[str, ...]:
    """AGO's Join: the union of mini-subgraphs, members in the graph's node order."""
    seen: dict[str, int] = {}
    for index, mini in enumerate(minis):
        for node in mini:
            if node not in graph.position:
                raise PartitionError(f"op {node!r} in mini-subgraph {index} is not in the graph")
            if node in seen:
                raise PartitionError(f"op {node!r} is in mini-subgraphs {seen[node]} and {index}")
            seen[node] = index
    return tuple(sorted(seen, key=graph.position.__getitem__))
