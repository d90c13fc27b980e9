"""AGO's reformer layer (§V) on partition plans: split every subgraph into mini-subgraphs (at most one
op with a reduction each, by Cluster) and join them back exactly: ``join_plan(split_plan(P)) == P``.
Why one reducing op rather than AGO's one complex op: docs/partitioning.md (The reformer)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolchain import cluster as clustering
from toolchain.dag import Graph
from toolchain.opgraph import OpGraph
from toolchain.partition import PartitionPlan


@dataclass(frozen=True)
class SplitPlan:
    plan: PartitionPlan  # groups = mini-subgraphs
    parent_of: tuple[int, ...]  # parent subgraph index of every mini
    parent: PartitionPlan  # the plan that was split


def _graph(graph: OpGraph, plan: PartitionPlan) -> Graph:
    # "complex" for the split's one-per-mini limit: every op with a reduction (docs/partitioning.md, The reformer)
    return Graph(tuple(n.id for n in graph.nodes), graph.edges, plan.weights, graph.reducing_ids)


def split_plan(graph: OpGraph, plan: PartitionPlan, threshold: float | None = None) -> SplitPlan:
    """Split each subgraph of ``plan`` with Cluster, at most one reducing op per mini."""
    g = _graph(graph, plan)
    td = threshold if threshold is not None else (plan.threshold or float("inf"))
    minis: list[tuple[str, ...]] = []
    parent_of: list[int] = []
    for index, group in enumerate(plan.groups):
        for mini in clustering.split(g, group, td, plan.units):
            minis.append(mini)
            parent_of.append(index)
    mini_plan = replace(plan, method=f"{plan.method}-split", groups=tuple(minis), decisions=())
    return SplitPlan(mini_plan, tuple(parent_of), plan)


def join_plan(graph: OpGraph, split: SplitPlan) -> PartitionPlan:
    """The parent plan again: each parent's minis joined (members back in graph order)."""
    g = _graph(graph, split.parent)
    groups = []
    for index in range(len(split.parent.groups)):
        minis = [m for m, p in zip(split.plan.groups, split.parent_of) if p == index]
        groups.append(clustering.join(g, minis))
    return replace(split.parent, groups=tuple(groups))
