"""AGO graph partitioning (§IV-B, Algorithm 1 "Cluster") and the reformer's Split / Join (§V).

Works on an abstract DAG (:class:`Graph`: op ids, edges, op weights, which ops
are complex); building that graph from a Relax module and weighing the ops
(AGO Eq. 1) happens elsewhere. No TVM here.

    cluster(graph, Td)      ─▶ Partition(groups, decisions)   acyclic, every multi-op group < Td
    split(graph, S, Td)     ─▶ mini-subgraphs of S, each with at most one complex op
    join(graph, minis)      ─▶ S again (join(split(S)) == S)
    check_partition(graph, groups)   raises PartitionError naming ops / subgraphs / a cycle witness

Terms (AGO Definitions 2 and 3). The *stage* of a node is the number of nodes
on the longest path from a root to it (roots have stage 1). The *affix set* of
v is its neighbours in the undirected graph whose stage is exactly
stage(v) ± 1. Contracting v with an affix u never creates a cycle (Theorem 1):
if u is at stage(v) + 1 and adjacent, the edge is v → u and any other path
v ⇝ u would have at least two edges and put u at stage(v) + 2 or later.

Choices the paper leaves open, made here:

* Hyper nodes. A merged group is a node of the *quotient* graph (member edges
  between two groups become one edge, edges inside a group vanish). Stages and
  adjacency are always those of the current quotient graph; stages are
  recomputed after every merge (incrementally: only the merged node's
  descendants can change, and propagation stops where a stage stays the same —
  equal to a full recomputation, which ``check=True`` verifies).
* Weight of a hyper node = sum of its members' weights, computed with
  ``math.fsum`` over the members (exact, so independent of merge order; the
  same number :func:`partition_stats` reports).
* "Heaviest" candidate: largest weight; ties go to the hyper node whose first
  member comes earliest in ``Graph.nodes`` (the given topological order).
* Partner: the lightest affix neighbour (same tie rule). With ``max_complex``,
  neighbours that would push the merged complex-op count above the limit are
  ruled out first. Only the lightest remaining partner is tested against the
  threshold: every other one is at least as heavy, so it could not pass either.
* Threshold is strict: merge iff w_v + w_u < Td. An op that alone weighs Td or
  more stays a subgraph of its own (Cluster never splits an op).
* After a merge the new hyper node is a candidate and the partner leaves the
  candidate set (it no longer exists). A declined v leaves the candidate set,
  but a later candidate may still absorb it as a partner; the result is a new
  hyper node, which is a candidate again.
* Consequence (tested): with Td = ∞ and no complex limit every weakly
  connected component becomes one group — a candidate that is not a root
  always has an affix (its longest-path predecessor), so only roots survive,
  and roots are never adjacent.
* Output order: groups in a topological order of the quotient DAG, ties by
  first member position; members of a group in the graph's node order.
* Acyclic means the quotient graph has no cycle. That is stronger than AGO
  Definition 1 read literally (no two groups with paths both ways in G): with
  a → b, c → d, e → f and groups {a, f}, {b, c}, {d, e} no pair reaches the
  other, yet run as units the three wait on each other in a ring.
  :func:`check_partition` rejects such plans; a cycle witness walks real edges
  and writes "…" where it has to jump between two ops of one subgraph.
* Kept-apart edges (``boundaries``): the caller may name edges whose two ops
  must never share a group, each with a reason. A partner whose merge would
  take such an edge inside one hyper node is ruled out like one over the
  complex-op limit, and the reason is recorded. Units may not hold one.
* Subgraphs are numbered from 0 (their index in ``groups``) in error messages.
* ``Graph.nodes`` must be a topological order (checked: every edge goes
  forward), duplicate edges are ignored, weight entries for unknown ops are
  ignored.

Every step records why (design §6.4): the merge or decline of the chosen v,
and the neighbours of v ruled out at that step — not an affix (could create a
cycle) or over the complex-op limit.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from toolchain.errors import AgocError


class PartitionError(AgocError):
    """A graph or a partition plan is malformed (op in two subgraphs, missing op, cyclic plan)."""


# What a Decision's kind means (the vocabulary `agoc partition --explain` prints).
DECISION_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "merged": "the chosen hyper node and its partner became one hyper node",
        "declined": "the chosen hyper node left the candidate set without merging",
        "excluded": "a neighbour of the chosen hyper node was ruled out as its partner",
        "unit": "ops given as one unit before clustering (a complex op and its elementwise epilogue; with "
                "--keep-inside, two such joined by a large tensor)",
    }
)


@dataclass(frozen=True)
class Graph:
    """An operator DAG: ``nodes`` in a topological order, ``edges`` (producer, consumer)."""

    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    weights: Mapping[str, float] = field(hash=False)
    complex: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        nodes = tuple(self.nodes)
        edges = tuple((a, b) for a, b in self.edges)
        position: dict[str, int] = {}
        for index, node in enumerate(nodes):
            if node in position:
                raise PartitionError(f"op {node!r} is listed twice in the graph")
            position[node] = index
        for a, b in edges:
            for end in (a, b):
                if end not in position:
                    raise PartitionError(f"edge {a} → {b} names op {end!r}, which is not in the graph")
            if position[a] >= position[b]:
                raise PartitionError(
                    f"edge {a} → {b} goes backwards in the node order: "
                    "list the nodes in a topological order of an acyclic graph"
                )
        weights = {}
        for node in nodes:
            if node not in self.weights:
                raise PartitionError(f"op {node!r} has no weight")
            weight = float(self.weights[node])
            if not (math.isfinite(weight) and weight >= 0):
                raise PartitionError(f"op {node!r} has weight {weight}; weights must be finite and >= 0")
            weights[node] = weight
        complex_ops = frozenset(self.complex)
        unknown = sorted(complex_ops - position.keys())
        if unknown:
            raise PartitionError(f"complex op {unknown[0]!r} is not in the graph")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "weights", MappingProxyType(weights))
        object.__setattr__(self, "complex", complex_ops)

    @cached_property
    def position(self) -> Mapping[str, int]:
        return MappingProxyType({node: index for index, node in enumerate(self.nodes)})

    @cached_property
    def succ(self) -> tuple[tuple[int, ...], ...]:
        """Successor positions of each node position (duplicates removed, edge order kept)."""
        out: list[dict[int, None]] = [{} for _ in self.nodes]
        for a, b in self.edges:
            out[self.position[a]][self.position[b]] = None
        return tuple(tuple(s) for s in out)

    @cached_property
    def unique_edges(self) -> tuple[tuple[int, int], ...]:
        """Edges as (producer, consumer) positions, duplicates removed, first-seen order."""
        return tuple(dict.fromkeys((self.position[a], self.position[b]) for a, b in self.edges))


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


# ----------------------------------------------------------------------------- stages


def stages(nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Topological stage of each node (AGO Definition 2): nodes on the longest path from a root."""
    nodes = tuple(nodes)
    succ: dict[str, dict[str, None]] = {node: {} for node in nodes}
    for a, b in edges:
        for end in (a, b):
            if end not in succ:
                raise PartitionError(f"edge {a} → {b} names op {end!r}, which is not in the graph")
        succ[a][b] = None
    indegree = dict.fromkeys(nodes, 0)
    for node in nodes:
        for b in succ[node]:
            indegree[b] += 1
    stage = dict.fromkeys(nodes, 1)
    ready = deque(node for node in nodes if indegree[node] == 0)
    done = 0
    while ready:
        node = ready.popleft()
        done += 1
        for b in succ[node]:
            stage[b] = max(stage[b], stage[node] + 1)
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    if done != len(nodes):
        stuck = [node for node in nodes if indegree[node] > 0]
        raise PartitionError(f"the graph has a cycle through {', '.join(map(repr, stuck[:5]))}")
    return stage


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


# ----------------------------------------------------------------------------- checking plans


def _group_of(graph: Graph, groups: Iterable[Iterable[str]], what: str = "subgraph") -> list[int]:
    """Index of each node's group (by node position); raises on unknown, duplicate, missing ops."""
    owner: list[int | None] = [None] * len(graph.nodes)
    for index, group in enumerate(groups):
        members = list(group)
        if not members:
            raise PartitionError(f"{what} {index} is empty; drop it or give it ops")
        for node in members:
            pos = graph.position.get(node)
            if pos is None:
                raise PartitionError(f"op {node!r} in {what} {index} is not in the graph")
            if owner[pos] == index:
                raise PartitionError(f"op {node!r} appears twice in {what} {index}")
            if owner[pos] is not None:
                raise PartitionError(f"op {node!r} is in {what}s {owner[pos]} and {index}; keep it in one")
            owner[pos] = index
    missing = [graph.nodes[i] for i, g in enumerate(owner) if g is None]
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        verb = "is" if len(missing) == 1 else "are"
        raise PartitionError(f"op{'s' if len(missing) > 1 else ''} {shown} {verb} in no {what}; "
                             f"every op must be in exactly one")
    return owner  # type: ignore[return-value]


def _quotient_edges(graph: Graph, owner: list[int], n: int) -> list[dict[int, tuple[int, int]]]:
    """For each group: successor group -> the first node edge (positions) that crosses to it."""
    succ: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
    for a, b in graph.unique_edges:
        ga, gb = owner[a], owner[b]
        if ga != gb:
            succ[ga].setdefault(gb, (a, b))
    return succ


def _topological(n: int, succ: list[dict[int, tuple[int, int]]], key: list[int]) -> list[int]:
    """Kahn's order of the groups, ties by key; shorter than n when there is a cycle."""
    indegree = [0] * n
    for s in succ:
        for b in s:
            indegree[b] += 1
    ready = [(key[g], g) for g in range(n) if indegree[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for b in succ[g]:
            indegree[b] -= 1
            if indegree[b] == 0:
                heapq.heappush(ready, (key[b], b))
    return order


def _shortest_cycle(n: int, succ: list[dict[int, tuple[int, int]]], order: list[int]) -> list[int]:
    """A shortest cycle (as groups g0, g1, …, g0 minus the repeat) through the lowest-numbered group on one."""
    left = sorted(set(range(n)) - set(order))
    inside = set(left)
    for start in left:
        parent = {start: None}
        frontier = deque([start])
        while frontier:
            g = frontier.popleft()
            for b in sorted(succ[g]):
                if b == start:
                    path = [g]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1]
                if b in inside and b not in parent:
                    parent[b] = g
                    frontier.append(b)
    raise AssertionError("Kahn left groups over but no cycle was found")


def _path_inside(graph: Graph, owner: list[int], start: int, goals: set[int]) -> list[int] | None:
    """Shortest node path start ⇝ some goal using only edges inside start's group."""
    parent = {start: None}
    frontier = deque([start])
    while frontier:
        x = frontier.popleft()
        if x in goals:
            path = [x]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])
            return path[::-1]
        for y in graph.succ[x]:
            if owner[y] == owner[start] and y not in parent:
                parent[y] = x
                frontier.append(y)
    return None


def _walk(graph: Graph, owner: list[int], crossing: list[list[tuple[int, int]]], first: tuple[int, int]):
    """Node walk around a group cycle from the crossing edge ``first``; None where it jumps inside a group."""
    walk: list[int | None] = list(first)
    for edges in crossing[1:]:
        inside = _path_inside(graph, owner, walk[-1], {a for a, _ in edges})
        if inside is None:
            walk += [None, *edges[0]]
        else:
            walk += inside[1:] + [next(b for a, b in edges if a == inside[-1])]
    return walk


def _witness(graph: Graph, owner: list[int], cycle: list[int]) -> str:
    """A node-level walk around the group cycle, with as few jumps ('…': two ops of one subgraph) as found."""
    best = None
    for turn in range(len(cycle)):
        groups = cycle[turn:] + cycle[:turn]
        crossing = [
            [(a, b) for a, b in graph.unique_edges if owner[a] == g and owner[b] == groups[(i + 1) % len(groups)]]
            for i, g in enumerate(groups)
        ]
        for first in crossing[0][:16]:
            walk = _walk(graph, owner, crossing, first)
            key = (walk.count(None), len(walk))
            if best is None or key < best[0]:
                best = (key, walk)
    walk = best[1]
    parts = []
    for x in walk:
        parts.append("…" if x is None else f"{graph.nodes[x]} (subgraph {owner[x]})")
    text = ""
    for i, part in enumerate(parts):
        if i == 0:
            text = part
        elif part == "…" or parts[i - 1] == "…":
            text += f" {part}"
        else:
            text += f" → {part}"
    return text


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _cycle_message(graph: Graph, owner: list[int], cycle: list[int]) -> str:
    walk = _witness(graph, owner, cycle)
    note = " (… joins two ops of one subgraph)" if "…" in walk else ""
    return (
        f"subgraphs {_and([str(g) for g in sorted(cycle)])} form a cycle: {walk}{note}; "
        "a path may not leave a subgraph and re-enter it — merge them or move ops"
    )


def _raise_cycle(graph: Graph, owner: list[int], succ, order: list[int]) -> None:
    cycle = _shortest_cycle(len(succ), succ, order)
    raise PartitionError(_cycle_message(graph, owner, cycle))


def _analyse(graph: Graph, groups) -> tuple[list[list[str]], list[int], list, list[int]]:
    groups = [list(g) for g in groups]
    owner = _group_of(graph, groups)
    succ = _quotient_edges(graph, owner, len(groups))
    first = [min(graph.position[x] for x in g) for g in groups]
    order = _topological(len(groups), succ, first)
    return groups, owner, succ, order


def check_partition(graph: Graph, groups: Iterable[Iterable[str]]) -> None:
    """Raise PartitionError unless ``groups`` cover every op exactly once and the quotient is acyclic."""
    groups, owner, succ, order = _analyse(graph, groups)
    if len(order) != len(groups):
        _raise_cycle(graph, owner, succ, order)


def is_acyclic(graph: Graph, groups: Iterable[Iterable[str]]) -> bool:
    """Whether the quotient of a valid cover is acyclic (AGO Definition 1); raises on an invalid cover."""
    groups, _, _, order = _analyse(graph, groups)
    return len(order) == len(groups)


def quotient_order(graph: Graph, groups: Iterable[Iterable[str]]) -> tuple[int, ...]:
    """Indices of ``groups`` in a topological order of the quotient DAG, ties by first member position."""
    groups, owner, succ, order = _analyse(graph, groups)
    if len(order) != len(groups):
        _raise_cycle(graph, owner, succ, order)
    return tuple(order)


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


# ----------------------------------------------------------------------------- statistics


def group_weight(graph: Graph, group: Iterable[str]) -> float:
    return math.fsum(graph.weights[node] for node in group)


def partition_stats(graph: Graph, groups: Iterable[Iterable[str]], trivial_cut: float) -> dict:
    """Summary of a partition (a valid cover; raises PartitionError otherwise)."""
    groups, _, _, order = _analyse(graph, groups)
    weights = [group_weight(graph, g) for g in groups]
    n = len(weights)
    squares = math.fsum(w * w for w in weights)
    return {
        "subgraphs": n,
        "trivial": sum(1 for w in weights if w < trivial_cut),
        "mean_weight": math.fsum(weights) / n if n else 0.0,
        "median_weight": float(statistics.median(weights)) if n else 0.0,
        "jain": math.fsum(weights) ** 2 / (n * squares) if squares > 0 else 1.0,
        "max_complex_ops": max((sum(1 for x in g if x in graph.complex) for g in groups), default=0),
        "acyclic": len(order) == n,
    }
