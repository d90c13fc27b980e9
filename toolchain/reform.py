"""AGO's reformer layer (§V) on partition plans: split every subgraph into
mini-subgraphs (AGO: at most one complex op each; here one reducing op, see below; by Cluster), and join them back.

One deviation from AGO, measured: a mini holds at most one op *with a reduction* —
a complex op, or a pooling / mean / softmax / norm op. AGO's minis bound the complex
ops only, so a conv and the max-pool after it stayed one mini, tuned directly with no
split to fall back on; MetaSchedule's stock space cannot put the pool inside the conv's
tile (its window overlaps tiles), and on SqueezeNet 1.1 at 112 that kernel ran 0.34 ms
in the model where TVM's separate conv and pool kernels took 0.19 ms. Split apart, the
pair is a join like any other, kept only when timed faster than its minis.

``split_plan`` gives a plan whose groups are the mini-subgraphs, in a
topological order (each parent's minis, parents in their own order: an edge
between minis of different parents follows the parents' order), plus which
parent each mini came from; ``join_plan`` inverts it exactly:
``join_plan(split_plan(P)) == P``. Both plans build like any other
(:func:`toolchain.fusion.fuse_groups`), which is what the tuner needs: tune the
minis first, then the joined subgraphs starting from their composed
schedules (the schedule composition lives with the tuner).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toolchain import cluster as clustering
from toolchain.opgraph import OpGraph
from toolchain.partition import PartitionPlan


@dataclass(frozen=True)
class SplitPlan:
    plan: PartitionPlan  # groups = mini-subgraphs
    parent_of: tuple[int, ...]  # parent subgraph index of every mini
    parent: PartitionPlan  # the plan that was split


def _graph(graph: OpGraph, plan: PartitionPlan) -> clustering.Graph:
    # "complex" for the split's one-per-mini limit: every op with a reduction (see the module doc)
    return clustering.Graph(tuple(n.id for n in graph.nodes), graph.edges, plan.weights, graph.reducing_ids)


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
