"""Algorithm 1 + 2 on real training graphs: which reductions get stitched with their consumers, and why not."""

from __future__ import annotations

from toolchain.cuda import compile as cuda_compile
from toolchain.cuda import stitch, training

from .conftest import compiled


def _funcs(c, group):
    from toolchain.opgraph import op_graph

    graph = {n.id: n.func for n in op_graph(c.legalized).nodes}
    return [graph[m] for m in group.members]


def _acyclic_in_order(legalized, plan):
    from toolchain.opgraph import op_graph

    graph = op_graph(legalized)
    index = {m: i for i, g in enumerate(plan.groups) for m in g.members}
    assert sorted(index) == sorted(n.id for n in graph.nodes)  # a cover, each op once
    assert all(index[p] <= index[c] for p, c in graph.edges)  # topological: no edge goes back


def test_layernorm_forward_is_one_stitched_group():
    _, c = compiled("layernorm")
    stitched = [g for g in c.plan.groups if g.stitched]
    assert len(stitched) == 1
    (g,) = stitched
    funcs = _funcs(c, g)
    assert funcs.count("mean") == 2 and "subtract" in funcs and "tir_sqrt" in funcs  # both reductions + consumers
    assert {"7", "8"} <= set(g.rules)
    assert g.form.rows == (128,) and g.form.cols == 128 and g.form.composition == "block"
    assert 0 < g.shared_bytes <= stitch.SHARED_BUDGET_BYTES
    _acyclic_in_order(c.legalized, c.plan)


def test_bert_block_stitches_softmax_and_layernorm_with_gradients():
    _, c = compiled("bert-tiny-block")
    stitched = [_funcs(c, g) for g in c.plan.groups if g.stitched]
    row_groups = [_funcs(c, g) for g in c.plan.groups if g.form is not None]
    # softmax forward (a compound op: max, exp, sum, divide) with the 1/sqrt(d) scaling by rule 4: one row kernel
    assert any("softmax" in f and "divide" in f for f in row_groups)
    assert any("sum" in f and any(x.startswith("subtract") for x in f) for f in stitched)  # softmax backward
    assert any(f.count("mean") == 2 for f in stitched)  # LayerNorm forward
    assert any(sum(x.startswith("collapse_sum") for x in f) >= 2 for f in stitched)  # LayerNorm backward: 2 row sums
    _acyclic_in_order(c.legalized, c.plan)


def test_shared_memory_budget_declines_stitching():
    g = training.builtin("layernorm")
    legalized = cuda_compile.legalize(g.mod)
    _, _, tight = cuda_compile.plan_graph(legalized, budget=256)
    assert not any(grp.stitched for grp in tight.groups)
    reasons = [d.reason for d in tight.decisions if not d.merged]
    assert any(r.startswith("shared memory") and "> budget 256 B" in r for r in reasons)


def test_x_reduce_is_not_stitched_and_says_why():
    _, c = compiled("bias-gelu")  # d(bias) sums over rows: the reduced dim is outermost
    assert not any(g.stitched for g in c.plan.groups)
    assert all(g.form is None for g in c.plan.groups)
    _, c = compiled("bert-tiny-block")
    assert any("x-reduce" in d.reason for d in c.plan.decisions if not d.merged)


def test_plan_records_rules_and_reasons():
    _, c = compiled("bert-tiny-block")
    doc = c.plan.to_json()
    assert doc["budget_bytes"] == stitch.SHARED_BUDGET_BYTES
    assert all(d["reason"] for d in doc["decisions"])
    assert any("cycle" in d["reason"] for d in doc["decisions"])
