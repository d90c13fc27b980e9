"""AGO partitioning on abstract DAGs: Cluster (Alg. 1), plan checking, Split / Join, statistics."""

import math
import random
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolchain.cluster import DECISION_KINDS, Decision, cluster, join, split
from toolchain.dag import Graph, PartitionError, stages
from toolchain.errors import AgocError
from toolchain.quotient import check_partition, partition_stats, quotient_order


def chain(weights: dict, complex_ops=()) -> Graph:
    names = tuple(weights)
    return Graph(names, tuple(zip(names, names[1:])), weights, frozenset(complex_ops))


# AGO Fig. 9: conv1 → conv2 → conv3 and conv1 → conv3.
def fig9(w1=1.0, w2=100.0, w3=1.0) -> Graph:
    return Graph(
        nodes=("conv1", "conv2", "conv3"),
        edges=(("conv1", "conv2"), ("conv2", "conv3"), ("conv1", "conv3")),
        weights={"conv1": w1, "conv2": w2, "conv3": w3},
        complex=frozenset({"conv1", "conv2", "conv3"}),
    )


# ----------------------------------------------------------------------------- stages


def test_stage_is_the_longest_path_from_a_root():
    assert stages(("conv1", "conv2", "conv3"), (("conv1", "conv2"), ("conv2", "conv3"), ("conv1", "conv3"))) == {
        "conv1": 1,
        "conv2": 2,
        "conv3": 3,
    }
    assert stages("abcd", [("a", "d"), ("b", "c"), ("c", "d"), ("b", "c")]) == {"a": 1, "b": 1, "c": 2, "d": 3}


def test_stages_reject_a_cycle():
    with pytest.raises(PartitionError, match="cycle"):
        stages("ab", [("a", "b"), ("b", "a")])


# ----------------------------------------------------------------------------- Cluster on tiny graphs


def test_chain_of_four_merges_the_lightest_affix_under_a_strict_threshold():
    g = chain({"a": 5.0, "b": 3.0, "c": 4.0, "d": 6.0})
    # d (heaviest) + c = 10 is not < 10; then a + b = 8 merges; {a,b} + c = 12 and c + d = 10 are too heavy.
    p = cluster(g, 10)
    assert p.groups == (("a", "b"), ("c",), ("d",))
    assert [(d.kind, d.nodes, d.partner, d.reason) for d in p.decisions] == [
        ("declined", ("d",), ("c",), "weight 6.0 + 4.0 = 10.0 >= threshold 10.0"),
        ("merged", ("a",), ("b",), "weight 5.0 + 3.0 = 8.0 < threshold 10.0 (stages 1 and 2)"),
        ("declined", ("a", "b"), ("c",), "weight 8.0 + 4.0 = 12.0 >= threshold 10.0"),
        ("declined", ("c",), ("d",), "weight 4.0 + 6.0 = 10.0 >= threshold 10.0"),
    ]
    assert cluster(g, 11).groups == (("a", "b"), ("c", "d"))
    assert cluster(g, 19).groups == (("a", "b", "c", "d"),)
    assert cluster(g, 0).groups == (("a",), ("b",), ("c",), ("d",))


def test_fig9_never_groups_conv1_with_conv3_without_conv2():
    p = cluster(fig9(), 50)
    assert p.groups == (("conv1",), ("conv2",), ("conv3",))
    assert Decision(
        "excluded", ("conv1",), ("conv3",), "not an affix (stage 1 vs 3): merging could create a cycle"
    ) in p.decisions
    assert cluster(fig9(), 1000).groups == (("conv1", "conv2", "conv3"),)


@given(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100), st.floats(0, 400))
@settings(max_examples=60, deadline=None)
def test_fig9_any_weights(w1, w2, w3, threshold):
    for group in cluster(fig9(w1, w2, w3), threshold).groups:
        if "conv1" in group and "conv3" in group:
            assert "conv2" in group


def test_heaviest_first_with_ties_to_the_earliest_op():
    # Equal weights: a (earliest) is picked first and takes b; {a, b} + c = 3 is not < 2.5.
    p = cluster(chain(dict.fromkeys("abc", 1.0)), 2.5)
    assert p.groups == (("a", "b"), ("c",))
    assert p.decisions[0] == Decision(
        "merged", ("a",), ("b",), "weight 1.0 + 1.0 = 2.0 < threshold 2.5 (stages 1 and 2)"
    )


def test_lightest_partner_wins_and_ties_go_to_the_earliest_op():
    # x feeds p and q; both are affixes of x (stage 2).
    g = Graph(("x", "p", "q"), (("x", "p"), ("x", "q")), {"x": 10.0, "p": 2.0, "q": 1.0})
    assert cluster(g, 12).groups == (("x", "q"), ("p",))
    g = Graph(("x", "p", "q"), (("x", "p"), ("x", "q")), {"x": 10.0, "p": 1.0, "q": 1.0})
    assert cluster(g, 12).groups == (("x", "p"), ("q",))


def test_isolated_op_is_declined_with_no_affix_neighbour():
    g = Graph(("a", "b"), (), {"a": 1.0, "b": 2.0})
    p = cluster(g, 100)
    assert p.groups == (("a",), ("b",))
    assert [d.reason for d in p.decisions] == ["no affix neighbour (stage ±1)"] * 2


def test_complex_limit_keeps_two_convs_apart_and_says_why():
    g = chain({"c1": 10.0, "r1": 1.0, "c2": 10.0, "add": 1.0}, complex_ops={"c1", "c2"})
    p = cluster(g, 100, max_complex=1)
    assert p.groups == (("c1", "r1"), ("c2", "add"))
    assert Decision("excluded", ("c1", "r1"), ("c2",), "would hold 2 complex ops (limit 1)") in p.decisions
    assert Decision(
        "declined", ("c1", "r1"), (), "every affix neighbour would exceed the complex-op limit 1"
    ) in p.decisions
    assert cluster(g, 100).groups == (("c1", "r1", "c2", "add"),)


def test_groups_come_in_quotient_topological_order():
    # Diamond a → {b, c} → d. The heaviest, c, takes a (lightest affix, earliest of a and d); {a, c} + b
    # is too heavy; b then takes d (lighter than {a, c}). {a, c} feeds {b, d}.
    g = Graph(
        ("a", "b", "c", "d"),
        (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")),
        {"a": 1.0, "b": 1.0, "c": 5.0, "d": 1.0},
    )
    p = cluster(g, 6.5)
    check_partition(g, p.groups)
    positions = {name: i for i, name in enumerate(g.nodes)}
    assert all(list(group) == sorted(group, key=positions.get) for group in p.groups)
    assert quotient_order(g, p.groups) == tuple(range(len(p.groups)))
    assert p.groups == (("a", "c"), ("b", "d"))


def test_every_decision_kind_is_documented():
    g = chain({"c1": 10.0, "r1": 1.0, "c2": 10.0, "add": 1.0}, complex_ops={"c1", "c2"})
    kinds = {d.kind for d in cluster(g, 100, max_complex=1).decisions + cluster(fig9(), 50).decisions
             + cluster(g, 100, units=[("c1", "r1")]).decisions}
    assert kinds == set(DECISION_KINDS)
    assert str(cluster(fig9(), 50).decisions[0]) == (
        "declined: conv2 + conv1: weight 100.0 + 1.0 = 101.0 >= threshold 50.0"
    )


# ----------------------------------------------------------------------------- bad graphs and plans


def test_graph_rejects_a_backward_edge_an_unknown_op_and_a_negative_weight():
    with pytest.raises(PartitionError, match="edge b → a goes backwards"):
        Graph(("a", "b"), (("b", "a"),), {"a": 1, "b": 1})
    with pytest.raises(PartitionError, match="edge a → z names op 'z', which is not in the graph"):
        Graph(("a", "b"), (("a", "z"),), {"a": 1, "b": 1})
    with pytest.raises(PartitionError, match="op 'b' has weight -1.0"):
        Graph(("a", "b"), (), {"a": 1, "b": -1})
    with pytest.raises(PartitionError, match="op 'b' has no weight"):
        Graph(("a", "b"), (), {"a": 1})
    assert issubclass(PartitionError, AgocError)


def test_cyclic_hand_written_plan_is_rejected_naming_the_path():
    plan = [("conv1", "conv3"), ("conv2",)]
    assert quotient_has_cycle(fig9(), plan)
    with pytest.raises(PartitionError) as error:
        check_partition(fig9(), plan)
    assert str(error.value).startswith(
        "subgraphs 0 and 1 form a cycle: conv1 (subgraph 0) → conv2 (subgraph 1) → conv3 (subgraph 0);"
    )


def test_cycle_through_three_subgraphs_shows_where_the_walk_jumps_inside_one():
    g = Graph(tuple("abcdef"), (("a", "b"), ("c", "d"), ("e", "f")), dict.fromkeys("abcdef", 1.0))
    expected = (
        r"subgraphs 0, 1 and 2 form a cycle: a \(subgraph 0\) → b \(subgraph 1\) … "
        r"c \(subgraph 1\) → d \(subgraph 2\) … e \(subgraph 2\) → f \(subgraph 0\)"
    )
    with pytest.raises(PartitionError, match=expected):
        check_partition(g, [("a", "f"), ("b", "c"), ("d", "e")])


def test_plan_with_an_op_twice_missing_or_unknown_is_rejected():
    g = fig9()
    with pytest.raises(PartitionError, match="op 'conv2' is in subgraphs 0 and 1"):
        check_partition(g, [("conv1", "conv2"), ("conv2", "conv3")])
    with pytest.raises(PartitionError, match="op 'conv3' is in no subgraph"):
        check_partition(g, [("conv1",), ("conv2",)])
    with pytest.raises(PartitionError, match="op 'relu' in subgraph 1 is not in the graph"):
        check_partition(g, [("conv1", "conv2", "conv3"), ("relu",)])
    with pytest.raises(PartitionError, match="subgraph 1 is empty"):
        check_partition(g, [("conv1", "conv2", "conv3"), ()])
    check_partition(g, [("conv1", "conv2"), ("conv3",)])  # a valid plan passes


# ----------------------------------------------------------------------------- Split / Join and statistics


def test_split_gives_one_complex_op_per_mini_and_join_restores_the_subgraph():
    g = chain({"c1": 10.0, "r1": 1.0, "c2": 10.0, "add": 1.0}, complex_ops={"c1", "c2"})
    minis = split(g, ("c1", "r1", "c2", "add"), 100)
    assert minis == (("c1", "r1"), ("c2", "add"))
    assert join(g, minis) == ("c1", "r1", "c2", "add")
    with pytest.raises(PartitionError, match="op 'r1' is in mini-subgraphs 0 and 1"):
        join(g, [("c1", "r1"), ("r1", "c2")])


def test_stats_of_a_known_partition():
    g = Graph(tuple("abcd"), (("a", "b"), ("b", "c"), ("c", "d")), {"a": 1.0, "b": 3.0, "c": 2.0, "d": 2.0},
              frozenset({"a", "b"}))
    stats = partition_stats(g, [("a", "b"), ("c",), ("d",)], trivial_cut=3)
    # weights 4, 2, 2: Jain = 8² / (3 · (16 + 4 + 4)) = 64 / 72
    assert stats == {
        "subgraphs": 3,
        "trivial": 2,
        "mean_weight": pytest.approx(8 / 3),
        "median_weight": 2.0,
        "jain": pytest.approx(64 / 72),
        "max_complex_ops": 2,
        "acyclic": True,
    }
    assert partition_stats(g, [("a",), ("b",), ("c",), ("d",)], 0)["jain"] < 1
    assert partition_stats(chain(dict.fromkeys("ab", 2.0)), [("a",), ("b",)], 0)["jain"] == 1.0
    assert partition_stats(fig9(), [("conv1", "conv3"), ("conv2",)], 0)["acyclic"] is False


# ----------------------------------------------------------------------------- properties on random DAGs


@st.composite
def dags(draw, max_nodes=40):
    n = draw(st.integers(1, max_nodes))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = tuple((f"op{min(i, j)}", f"op{max(i, j)}") for i, j in pairs if i != j)
    weight = st.one_of(st.integers(0, 20).map(float), st.floats(0, 100, allow_nan=False))
    weights = {f"op{i}": draw(weight) for i in range(n)}
    complex_ops = frozenset(f"op{i}" for i, flag in enumerate(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
                            if flag)
    return Graph(tuple(f"op{i}" for i in range(n)), edges, weights, complex_ops)


thresholds = st.one_of(st.floats(0, 600, allow_nan=False), st.just(math.inf))


def reach_masks(g: Graph) -> dict[str, int]:
    """Bitmask of the ops reachable from each op by a path of one edge or more (brute force)."""
    index = {name: i for i, name in enumerate(g.nodes)}
    succ = {name: [b for a, b in g.edges if a == name] for name in g.nodes}
    reach = {}
    for name in reversed(g.nodes):
        mask = 0
        for b in succ[name]:
            mask |= (1 << index[b]) | reach[b]
        reach[name] = mask
    return reach


def assert_definition_1(g: Graph, groups) -> None:
    """No two groups with a path from one to the other and back (AGO Definition 1)."""
    index = {name: i for i, name in enumerate(g.nodes)}
    reach = reach_masks(g)
    masks = [sum(1 << index[x] for x in group) for group in groups]
    out = [0] * len(groups)
    for gi, group in enumerate(groups):
        for x in group:
            out[gi] |= reach[x]
    for i in range(len(groups)):
        for j in range(i + 1, len(groups)):
            assert not (out[i] & masks[j] and out[j] & masks[i]), f"groups {groups[i]} and {groups[j]} form a cycle"


def quotient_has_cycle(g: Graph, groups) -> bool:
    """Depth-first search with three colours on the group graph (independent of the module's Kahn)."""
    group_of = {x: i for i, group in enumerate(groups) for x in group}
    succ = {i: {group_of[b] for a, b in g.edges if group_of[a] == i and group_of[b] != i} for i in range(len(groups))}
    colour = dict.fromkeys(succ, "white")

    def visit(i) -> bool:
        colour[i] = "grey"
        for j in succ[i]:
            if colour[j] == "grey" or (colour[j] == "white" and visit(j)):
                return True
        colour[i] = "black"
        return False

    return any(colour[i] == "white" and visit(i) for i in succ)


def assert_connected(g: Graph, group) -> None:
    members = set(group)
    adjacent = {x: set() for x in members}
    for a, b in g.edges:
        if a in members and b in members:
            adjacent[a].add(b)
            adjacent[b].add(a)
    seen, todo = {group[0]}, deque([group[0]])
    while todo:
        for y in adjacent[todo.popleft()] - seen:
            seen.add(y)
            todo.append(y)
    assert seen == members, f"group {group} is not connected"


def assert_valid(g: Graph, groups, threshold, max_complex=None) -> None:
    members = [x for group in groups for x in group]
    assert sorted(members) == sorted(g.nodes)
    assert len(members) == len(set(members))
    assert_definition_1(g, groups)
    assert not quotient_has_cycle(g, groups)
    position = {name: i for i, name in enumerate(g.nodes)}
    for group in groups:
        assert list(group) == sorted(group, key=position.get)
        assert_connected(g, group)
        if len(group) > 1:
            assert math.fsum(g.weights[x] for x in group) < threshold
        if max_complex is not None and len(group) > 1:
            assert sum(x in g.complex for x in group) <= max_complex
    # groups come in a topological order of the quotient
    group_of = {x: i for i, group in enumerate(groups) for x in group}
    assert all(group_of[a] <= group_of[b] for a, b in g.edges)


@given(dags(), thresholds)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_cluster_gives_a_valid_acyclic_partition(g, threshold):
    p = cluster(g, threshold, check=True)
    assert_valid(g, p.groups, threshold)
    check_partition(g, p.groups)
    assert not quotient_has_cycle(g, p.groups)
    assert cluster(g, threshold) == p  # deterministic
    assert all(d.reason and d.kind in DECISION_KINDS for d in p.decisions)
    merges = sum(d.kind == "merged" for d in p.decisions)
    assert merges == len(g.nodes) - len(p.groups)


@given(dags())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_without_a_threshold_each_connected_component_becomes_one_group(g):
    # A candidate that is not a root always has an affix: its longest-path predecessor at stage - 1. So the
    # survivors are roots, and roots are never adjacent.
    groups = cluster(g, math.inf).groups
    for group in groups:
        assert_connected(g, group)
    group_of = {x: i for i, group in enumerate(groups) for x in group}
    assert all(group_of[a] == group_of[b] for a, b in g.edges)


@given(dags(), thresholds)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_cluster_with_one_complex_op_per_group(g, threshold):
    p = cluster(g, threshold, max_complex=1, check=True)
    assert_valid(g, p.groups, threshold, max_complex=1)
    assert all(sum(x in g.complex for x in group) <= 1 for group in p.groups)


@given(dags(), thresholds, st.floats(0, 200, allow_nan=False))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_split_then_join_is_the_identity(g, threshold, mini_threshold):
    for group in cluster(g, threshold).groups:
        minis = split(g, group, mini_threshold)
        assert join(g, minis) == group
        assert all(sum(x in g.complex for x in mini) <= 1 for mini in minis)
        assert sorted(x for mini in minis for x in mini) == sorted(group)
        assert_definition_1(g, [*minis, *(other for other in cluster(g, threshold).groups if other != group)])


def sole_consumer_chains(g: Graph, picks) -> list[tuple[str, ...]]:
    """Units like the epilogue rule's: chains along edges a → b where b is a's only consumer."""
    consumers = {x: {b for a, b in g.edges if a == x} for x in g.nodes}
    head = {}
    units: dict[str, list[str]] = {}
    for (a, b), keep in zip(sorted({e for e in g.edges}, key=lambda e: g.nodes.index(e[1])), picks):
        if keep and consumers[a] == {b} and b not in head and units.get(head.get(a, a), [a])[-1] == a:
            h = head.setdefault(a, a)
            units.setdefault(h, [a]).append(b)
            head[b] = h
    return [tuple(u) for u in units.values()]


@given(dags(), thresholds, st.lists(st.booleans(), min_size=120, max_size=120))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_units_stay_whole_and_the_partition_stays_acyclic(g, threshold, picks):
    units = sole_consumer_chains(g, picks)
    p = cluster(g, threshold, check=True, units=units)
    check_partition(g, p.groups)
    assert not quotient_has_cycle(g, p.groups)
    group_of = {x: i for i, group in enumerate(p.groups) for x in group}
    for unit in units:
        assert len({group_of[x] for x in unit}) == 1
    for group in p.groups:  # a group of more than one unit / op is under the threshold
        if tuple(group) not in units and len(group) > 1:
            assert math.fsum(g.weights[x] for x in group) < threshold
    assert sum(d.kind == "unit" for d in p.decisions) == len(units)
    for group in p.groups:
        minis = split(g, group, threshold, units)
        assert join(g, minis) == group
        mini_of = {x: i for i, mini in enumerate(minis) for x in mini}
        for unit in (u for u in units if u[0] in group):
            assert len({mini_of[x] for x in unit}) == 1
        for mini in minis:  # one complex op, unless a unit brought more
            assert sum(x in g.complex for x in mini) <= 1 or any(set(u) == set(mini) for u in units)


def test_a_kept_apart_edge_stays_a_boundary_and_the_reason_is_recorded():
    g = chain({"t": 1.0, "r": 1.0, "c": 10.0, "add": 1.0}, complex_ops={"c"})
    assert cluster(g, 100).groups == (("t", "r", "c", "add"),)
    p = cluster(g, 100, boundaries={("r", "c"): "permuted input"})
    assert p.groups == (("t", "r"), ("c", "add"))
    assert Decision("excluded", ("c", "add"), ("r",), "keeps r → c apart: permuted input") in p.decisions
    assert any(d.kind == "declined" and "kept-apart" in d.reason for d in p.decisions)


def test_kept_apart_edges_naming_unknown_ops_or_inside_a_unit_are_rejected():
    g = chain({"a": 1.0, "b": 1.0, "c": 1.0})
    with pytest.raises(PartitionError, match="'x'"):
        cluster(g, 10.0, boundaries={("a", "x"): "why"})
    with pytest.raises(PartitionError, match="keeps apart"):
        cluster(g, 10.0, units=[("a", "b")], boundaries={("a", "b"): "why"})


@given(dags(), thresholds, st.lists(st.booleans(), min_size=120, max_size=120))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_group_holds_both_ends_of_a_kept_apart_edge(g, threshold, picks):
    apart = {e: "rule" for e, keep in zip(dict.fromkeys(g.edges), picks) if keep}
    p = cluster(g, threshold, check=True, boundaries=apart)
    check_partition(g, p.groups)
    assert not quotient_has_cycle(g, p.groups)
    group_of = {x: i for i, group in enumerate(p.groups) for x in group}
    assert all(group_of[a] != group_of[b] for a, b in apart)


def test_a_cyclic_unit_is_rejected():
    g = chain({"a": 1.0, "b": 1.0, "c": 1.0})
    with pytest.raises(PartitionError, match="cycle"):
        cluster(g, 10.0, units=[("a", "c")])


@given(dags(max_nodes=12))
@settings(max_examples=100, deadline=None)
def test_stages_equal_a_brute_force_longest_path(g):
    succ = {x: [b for a, b in g.edges if a == x] for x in g.nodes}
    pred = {x: [a for a, b in g.edges if b == x] for x in g.nodes}

    def longest(x):
        return 1 + max((longest(p) for p in pred[x]), default=0)

    got = stages(g.nodes, g.edges)
    assert got == {x: longest(x) for x in g.nodes}
    assert all(got[a] < got[b] for a in g.nodes for b in succ[a])


@given(dags(max_nodes=15), st.data())
@settings(max_examples=150, deadline=None)
def test_hand_written_plans_are_rejected_exactly_when_the_quotient_has_a_cycle(g, data):
    labels = data.draw(st.lists(st.integers(0, 4), min_size=len(g.nodes), max_size=len(g.nodes)))
    groups = [tuple(x for x, label in zip(g.nodes, labels) if label == k) for k in range(5)]
    groups = [group for group in groups if group]
    cyclic = quotient_has_cycle(g, groups)
    assert partition_stats(g, groups, 0)["acyclic"] is not cyclic
    if cyclic:
        with pytest.raises(PartitionError, match=r"subgraphs [0-9, and]+ form a cycle: \S+ \(subgraph \d\) → "):
            check_partition(g, groups)
    else:
        check_partition(g, groups)
        order = quotient_order(g, groups)
        rank = {x: order.index(i) for i, group in enumerate(groups) for x in group}
        assert all(rank[a] <= rank[b] for a, b in g.edges)


def test_a_quotient_cycle_need_not_break_definition_1_pairwise():
    # a → b, c → d, e → f in subgraphs {a, f}, {b, c}, {d, e}: no two subgraphs reach each other through
    # paths of G, yet executed as units they wait on each other in a ring. We reject it.
    g = Graph(tuple("abcdef"), (("a", "b"), ("c", "d"), ("e", "f")), dict.fromkeys("abcdef", 1.0))
    plan = [("a", "f"), ("b", "c"), ("d", "e")]
    assert_definition_1(g, plan)
    assert quotient_has_cycle(g, plan)
    assert not partition_stats(g, plan, 0)["acyclic"]


def test_a_thousand_op_graph_clusters_into_a_valid_partition():
    rng = random.Random(7)
    n = 1000
    edges = set()
    while len(edges) < 1500:
        i = rng.randrange(n - 1)
        edges.add((f"op{i}", f"op{min(n - 1, i + rng.randint(1, 6))}"))
    g = Graph(tuple(f"op{i}" for i in range(n)), tuple(sorted(edges)),
              {f"op{i}": rng.uniform(1, 100) for i in range(n)},
              frozenset(f"op{i}" for i in range(n) if rng.random() < 0.3))
    for max_complex in (None, 1):
        p = cluster(g, 1000, max_complex=max_complex)
        check_partition(g, p.groups)
        assert len(p.groups) < n
