"""A partition plan as a quotient graph: is it a valid, acyclic cover of the ops (else an error with a
cycle witness), its groups in a topological order, and its statistics."""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Iterable

from toolchain.dag import Graph, PartitionError


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


def quotient_order(graph: Graph, groups: Iterable[Iterable[str]]) -> tuple[int, ...]:
    """Indices of ``groups`` in a topological order of the quotient DAG, ties by first member position."""
    groups, owner, succ, order = _analyse(graph, groups)
    if len(order) != len(groups):
        _raise_cycle(graph, owner, succ, order)
    return tuple(order)


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
