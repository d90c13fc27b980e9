"""The aggregation rules are tables; Algorithms 1 and 2 follow them."""

from __future__ import annotations

from toolchain.cuda import rules

EW, BC, RED = rules.EW, rules.BC, rules.RED


def test_table1_rows():
    find = lambda p, c: rules.find(rules.AGGREGATION_RULES, p, c)  # noqa: E731
    assert find(EW, EW).name == "1" and find(BC, EW).name == "2" and find(BC, BC).name == "3"
    assert find(EW, RED).name == "4" and find(BC, RED).name == "5"
    assert find("matmul", EW).merged("matmul", EW) == "matmul"
    assert find(EW, "conv").merged(EW, "conv") == "conv"
    # what Table 1 deliberately leaves out: a reduction's consumers, reshapes, element-wise -> broadcast
    assert find(RED, EW) is None and find(RED, RED) is None
    assert find("reshape", EW) is None and find(EW, "reshape") is None
    assert find(EW, BC) is None


def test_table2_rows_start_from_a_reduction():
    assert [r.name for r in rules.STITCH_RULES] == ["7", "8"]
    assert all(r.producer == (RED,) and r.result == RED for r in rules.STITCH_RULES)
    assert rules.find(rules.STITCH_RULES, RED, BC).name == "7"


def test_every_rule_says_where_it_comes_from():
    for r in rules.ALL_RULES:
        assert r.source.startswith(("APOLLO Table", "agoc:"))
    for _, why in rules.DISABLED_RULES:
        assert why.startswith("feedback")


def test_priorities_group_the_matmul_rows():
    names = [tuple(r.name for r in g) for g in rules.priority_groups(rules.AGGREGATION_RULES)]
    assert names[:5] == [("1",), ("2",), ("3",), ("4",), ("5",)]
    assert ("6-matmul", "6-matmul", "6-matmul-bias") in names
