"""The operator DAG that partitioning works on (op ids in a topological order, edges, weights, which ops
are complex) and its topological stages (AGO Definition 2). No TVM here."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from toolchain.errors import AgocError


class PartitionError(AgocError):
    """A graph or a partition plan is malformed (op in two subgraphs, missing op, cyclic plan)."""


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
