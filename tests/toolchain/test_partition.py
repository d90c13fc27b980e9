"""Op graph, op weights, stock vs AGO partitions, the reformer, and building any partition."""

import math

import numpy as np
import pytest

import models
from toolchain import build, frontend, onnx_import, partition, reform
from toolchain.dag import PartitionError
from toolchain.fusion import fuse_groups
from toolchain.opgraph import op_graph
from toolchain.reference import run_onnxruntime
from toolchain.runtime import VMSession
from toolchain.samples import sample_inputs
from toolchain.settings import PartitionSettings
from toolchain.targets import find_compiler, resolve_target
from toolchain.weights import WeightModel, loop_term

#: The partition tests read the op graph of ONNX's own layout (op ids and kernels as in the model);
#: test_nhwc_* cover the default NHWC layout, whose graph adds the transposes at the model's edges.
SPEC = resolve_target("host", layout="NCHW")
NHWC = resolve_target("host")


_LEGALIZED: dict = {}


def legalized(name, shape=None, spec=SPEC):
    """(ONNX model, inputs, legalized module), built once per test process for each (name, shape, target):
    several tests read MobileNet-V2's, SqueezeNet's; none changes them (passes return new modules)."""
    key = (name, shape, id(spec))  # SPEC and NHWC: this module's two targets, alive as long as it is
    if key not in _LEGALIZED:
        model = models.build(name, shape)
        mod, inputs = frontend.prepare(model, spec)
        _LEGALIZED[key] = (model, inputs, mod)
    return _LEGALIZED[key]


@pytest.fixture(scope="module")
def dwsep():
    model, inputs, mod = legalized("tiny-dwsep")
    return model, inputs, mod, op_graph(mod)


def test_op_graph_of_a_pw_dw_pw_block(dwsep):
    _, _, _, graph = dwsep
    assert [(n.func, n.op_class) for n in graph.nodes] == [
        ("conv2d", "pointwise_conv"), ("add", "simple"), ("maximum", "simple"), ("minimum", "simple"),
        ("conv2d1", "depthwise_conv"), ("add", "simple"), ("maximum", "simple"), ("minimum", "simple"),
        ("conv2d2", "pointwise_conv"), ("add1", "simple"), ("add2", "simple"),
    ]
    ids = [n.id for n in graph.nodes]
    assert graph.edges == tuple(zip(ids, ids[1:]))  # a chain (the residual comes from the graph input)
    assert graph.complex_ids == {ids[0], ids[4], ids[8]}


def test_full_conv_and_matmul_are_classified():
    _, _, cnn = legalized("tiny-cnn")
    _, _, tf = legalized("tiny-transformer")
    assert [n.op_class for n in op_graph(cnn).nodes if n.is_complex] == ["conv", "matmul"]
    assert [n.op_class for n in op_graph(tf).nodes].count("matmul") == 6


def test_loop_term_is_eq1_over_every_block_skipping_unit_loops(dwsep):
    pw = dwsep[3].nodes[0]  # 1x8x16x16 input, 32 output channels, 1x1 window
    assert [b.block for b in pw.blocks] == ["pad_temp", "conv2d_nchw"]
    ln = math.log
    expected = ln(8) * ln(16) * ln(16) + ln(32) * ln(16) * ln(16) * ln(8)
    assert loop_term(pw) == pytest.approx(expected)
    assert WeightModel(2.0, 3.0, "test").weight(pw) == pytest.approx(2 * expected + 3)


def test_stock_groups_are_fusops_groups(dwsep):
    _, _, mod, graph = dwsep
    ids = [n.id for n in graph.nodes]
    assert partition.stock_groups(mod, SPEC) == (tuple(ids[0:4]), tuple(ids[4:8]), tuple(ids[8:11]))


def test_stock_groups_cover_repeated_identical_blocks():
    _, _, mod = legalized("mobilenet-v2", (1, 3, 56, 56))
    graph = op_graph(mod)
    plan = partition.plan(PartitionSettings("stock"), mod, SPEC, graph=graph)
    partition.check(graph, plan)  # every op exactly once, although FuseOps deduplicates equal kernels
    assert sum(len(g) for g in plan.groups) == len(graph.nodes)


def test_ago_plan_with_a_big_threshold_is_one_kernel_with_three_convs(dwsep, tmp_path):
    model, inputs, mod, graph = dwsep
    plan = partition.plan(PartitionSettings(threshold=1e9), mod, SPEC, graph=graph)
    assert plan.groups == (tuple(n.id for n in graph.nodes),)
    fused = fuse_groups(mod, plan.groups, SPEC)
    (kernel,) = build.kernels(fused)
    assert kernel.name.startswith("fused_conv2d_add_maximum_minimum_conv2d1")
    lib = build.build_library(fused, SPEC, find_compiler(SPEC), tmp_path / "one.so")
    feeds = sample_inputs(model, inputs)
    got = VMSession(lib, inputs, ["output"]).run(feeds)["output"]
    ref = run_onnxruntime(model, feeds)["output"]
    assert np.abs(got - ref).max() < 1e-4


def test_a_cyclic_plan_is_rejected_naming_the_ops(dwsep):
    _, _, _, graph = dwsep
    ids = [n.id for n in graph.nodes]
    weights = {i: 1.0 for i in ids}
    cyclic = partition.PartitionPlan("hand", ((ids[0], ids[4]), tuple(ids[1:4]), tuple(ids[5:])), weights)
    with pytest.raises(PartitionError, match=f"form a cycle: {ids[0]} .*{ids[1]}"):
        partition.check(graph, cyclic)
    twice = partition.PartitionPlan("hand", (tuple(ids[:5]), tuple(ids[4:])), weights)
    with pytest.raises(PartitionError, match=f"op '{ids[4]}' is in subgraphs 0 and 1"):
        partition.check(graph, twice)


ZOO = [s.name for s in models.registry.MODELS if s.family in ("cnn", "transformer")]
#: the fast suite's networks (the two with expected chains, CHAINS_EXPECTED); the others are a slow sweep
ZOO_FAST = ("mobilenet-v2", "mobilevit")


@pytest.fixture(scope="module", params=[n if n in ZOO_FAST else pytest.param(n, marks=pytest.mark.slow) for n in ZOO])
def zoo_plans(request):
    _, _, mod = legalized(request.param)  # default shape: 224 for CNNs and MobileViT, 128 tokens for BERT
    graph = op_graph(mod)
    ago, stock = (partition.plan(PartitionSettings(method), mod, SPEC, graph=graph) for method in ("ago", "stock"))
    return request.param, graph, ago, stock


def test_ago_partition_beats_stock_on_every_zoo_model(zoo_plans):
    name, graph, ago, stock = zoo_plans
    a, s = partition.stats(graph, ago), partition.stats(graph, stock)
    assert a["acyclic"] and s["acyclic"]
    assert a["subgraphs"] < s["subgraphs"], name
    assert a["trivial"] <= s["trivial"] and (s["trivial"] == 0 or a["trivial"] < s["trivial"]), name
    assert a["jain"] > s["jain"], name
    assert a["max_complex_ops"] >= 2 and s["max_complex_ops"] == 1


#: The fusions AGO's partition exists for (issue: "pw→dw and dw→pw chains ... matmul→reshape→transpose→matmul").
CHAINS_EXPECTED = {
    "mobilenet-v2": ("pointwise_conv→depthwise_conv", "depthwise_conv→pointwise_conv"),
    "mobilevit": ("matmul→matmul",),
}


def test_complex_chains_are_paths_inside_one_subgraph(dwsep):
    _, _, _, graph = dwsep
    ids = [n.id for n in graph.nodes]
    one = (tuple(ids),)
    (pw_dw, dw_pw) = partition.chains(graph, one)
    assert pw_dw.ops == tuple(ids[0:5])
    assert pw_dw.kinds == ("pointwise_conv", "add", "maximum", "minimum", "depthwise_conv")
    assert dw_pw.ops == tuple(ids[4:9]) and dw_pw.pair == "depthwise_conv→pointwise_conv"
    assert partition.chains(graph, (tuple(ids[:4]), tuple(ids[4:]))) == [
        partition.Chain(1, tuple(ids[4:9]), dw_pw.kinds)]  # the pw→dw path now crosses a subgraph boundary


def test_ago_subgraphs_chain_pw_dw_and_matmul_reshape_transpose_matmul(zoo_plans):
    name, graph, ago, stock = zoo_plans
    found = partition.chains(graph, ago.groups)
    assert partition.chains(graph, stock.groups) == []  # one complex op per stock kernel
    pairs = partition.stats(graph, ago)["chains"]
    for pair in CHAINS_EXPECTED.get(name, ()):
        assert pairs.get(pair, 0) >= 2, (name, pairs)
    if name == "mobilevit":  # attention: q/k/v out of a matmul, split into heads, into the next matmul
        layouts = [c.kinds for c in found if c.pair == "matmul→matmul" and {"reshape", "transpose"} <= set(c.kinds)]
        assert len(layouts) >= 3, found


def test_epilogue_units_are_a_conv_and_the_elementwise_ops_that_follow_it(dwsep):
    _, _, _, graph = dwsep
    ids = [n.id for n in graph.nodes]
    # pw + bias + relu6, dw + bias + relu6, pw + bias + residual add
    assert partition.epilogue_units(graph) == (tuple(ids[0:4]), tuple(ids[4:8]), tuple(ids[8:11]))


def _hard_swish_graph(branch: bool):
    """conv (+ bias) → hard-swish → 3×3 depthwise conv; with ``branch`` the conv's biased output also feeds
    a second 1×1 conv, so only the bias add is the conv's epilogue alone."""
    from models.builder import GraphBuilder

    g = GraphBuilder("hs", seed=0)
    x = g.conv(g.input("input", (1, 8, 8, 8)), 8, 16, 1, name="c")
    y = g.op("HardSwish", [x], "hs")
    y = g.conv(y, 16, 16, 3, name="dw", groups=16)
    if branch:
        y = g.add(y, g.conv(x, 16, 16, 1, name="c2"), name="sum")
    model = g.finish(g.op("Identity", [y], "o", outputs=["output"]), (1, 16, 8, 8))
    return op_graph(build.legalize(onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {})), NHWC))


def test_an_epilogue_unit_takes_a_diamond_whole_and_stops_where_its_middle_is_read_outside():
    graph = _hard_swish_graph(branch=False)
    kinds = {n.id: n.kind for n in graph.nodes}
    first = partition.epilogue_units(graph)[0]
    # hard-swish x · min(max(x + 3, 0), 6) / 6 reads the biased conv output twice: all of it joins the conv
    assert [kinds[x] for x in first] == ["pointwise_conv", "add", "add", "maximum", "minimum", "divide", "multiply"]
    graph = _hard_swish_graph(branch=True)
    kinds = {n.id: n.kind for n in graph.nodes}
    first = partition.epilogue_units(graph)[0]
    assert [kinds[x] for x in first] == ["pointwise_conv", "add"]  # its output is read by the other conv too


def test_a_padded_convs_slice_and_what_follows_it_are_its_epilogue():
    """A conv padded to whole vectors (24 → 32 at 16 lanes, toolchain/padding.py), sliced back, biased and added to
    a residual: the slice and both adds are the conv's unit (its register block computes them in its tile), not
    the next conv's, which they would otherwise join (MnasNet-B1 @224: 5-7 % slower)."""
    from models.builder import GraphBuilder
    from toolchain import padding

    g = GraphBuilder("narrow-residual", seed=0)
    x = g.input("input", (1, 24, 8, 8))
    y = g.add(g.conv(g.conv(x, 24, 48, 1, name="e", act="relu"), 48, 24, 1, name="p"), x, name="sum")
    model = g.finish(g.conv(y, 24, 48, 1, name="output"), (1, 48, 8, 8))
    mod = onnx_import.to_relax(model, onnx_import.resolve_inputs(model, {}))
    mod, done = padding.pad_output_channels(mod, lanes=16)
    assert [(d.channels, d.padded) for d in done] == [(24, 32)]
    graph = op_graph(build.legalize(mod, resolve_target("host", pad_channels=False)))
    kinds = {n.id: n.kind for n in graph.nodes}
    units = [[kinds[x] for x in unit] for unit in partition.epilogue_units(graph)]
    assert ["pointwise_conv", "strided_slice", "add", "add"] in units, units


def test_no_ago_subgraph_boundary_cuts_a_conv_from_its_epilogue(zoo_plans):
    name, graph, ago, _ = zoo_plans
    group_of = {x: i for i, group in enumerate(ago.groups) for x in group}
    for unit in partition.epilogue_units(graph):
        assert len({group_of[x] for x in unit}) == 1, (name, unit)
    mini_of = {x: i for i, group in enumerate(reform.split_plan(graph, ago).plan.groups) for x in group}
    assert all(len({mini_of[x] for x in unit}) == 1 for unit in ago.units)


def test_split_gives_single_complex_minis_and_join_restores_the_plan(zoo_plans):
    name, graph, ago, _ = zoo_plans
    split = reform.split_plan(graph, ago)
    assert graph.complex_ids < graph.reducing_ids  # pools, means, softmax, norms reduce too
    assert all(sum(n in graph.reducing_ids for n in mini) <= 1 for mini in split.plan.groups)
    partition.check(graph, split.plan)  # the minis form an acyclic partition too
    assert len(split.plan.groups) >= len(ago.groups)
    assert reform.join_plan(graph, split) == ago


def test_split_puts_a_pool_apart_from_the_conv_before_it():
    # SqueezeNet's AGO subgraphs hold a conv with the max-pool after it (one complex op): split, the pool
    # is a mini of its own, so the pair is a join (kept only if timed faster than the conv's and the
    # pool's kernels) rather than one kernel tuned with no alternative
    _, _, mod = legalized("squeezenet-1.1", (1, 3, 56, 56))
    graph = op_graph(mod)
    ago = partition.plan(PartitionSettings("ago"), mod, SPEC, graph=graph)
    split = reform.split_plan(graph, ago)
    func = {n.id: n.func for n in graph.nodes}
    pools = [x for group in ago.groups for x in group if func[x].startswith("max_pool2d")]
    with_conv = [x for x in pools if any(y in graph.complex_ids for y in next(g for g in ago.groups if x in g))]
    assert len(pools) == 3 and with_conv
    for pool in with_conv:
        mini = next(m for m in split.plan.groups if pool in m)
        assert not set(mini) & graph.complex_ids, [func[x] for x in mini]


def test_shufflenet_channel_shuffle_is_written_by_its_producer_not_read_inside_a_conv():
    # AGO's weights alone put the shuffle (concat → reshape → transpose → reshape → split) and the next
    # block's convs in one subgraph; the conv then re-gathers the permutation inside its tiles
    _, _, mod = legalized("shufflenet-v2", (1, 3, 56, 56))
    graph = op_graph(mod)
    apart = partition.kept_apart(graph)
    node = {n.id: n for n in graph.nodes}
    assert len(apart) >= 12 and all(node[b].is_complex for _, b in apart)
    assert {node[a].kind for a, _ in apart} <= {"split", "reshape"}
    ago = partition.plan(PartitionSettings("ago"), mod, SPEC, graph=graph)
    group_of = {x: i for i, group in enumerate(ago.groups) for x in group}
    assert all(group_of[a] != group_of[b] for a, b in apart)
    assert any("keeps" in d.reason and "channel shuffle" in d.reason for d in ago.decisions)
    for chain in partition.chains(graph, ago.groups):  # no complex → … → complex path inside a group permutes
        assert "transpose" not in chain.kinds, chain
    assert partition.stats(graph, ago)["max_complex_ops"] >= 2  # still multi-conv subgraphs
    assert not partition.kept_apart(op_graph(legalized("mobilenet-v2", (1, 3, 56, 56))[2]))


def test_partition_cli_json_explain_dot(cli, tmp_path):
    result = cli("partition", "zoo:tiny-dwsep", "--json", "--threshold", "20")
    assert result.exit_code == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    keys = {"subgraphs", "trivial", "mean_weight", "median_weight", "jain", "max_complex_ops", "acyclic", "seconds",
            "chains"}
    assert data["model"] == "tiny-dwsep" and set(data["ago"]) == keys and set(data["stock"]) == keys
    # NHWC (the default): the three conv kernels and the transposes of the model's input and output
    assert data["stock"]["subgraphs"] == 5 and data["stock"]["chains"] == {}

    result = cli("partition", "zoo:tiny-dwsep", "--threshold", "10", "--explain", "--dot", tmp_path / "g.dot")
    assert result.exit_code == 0, result.stderr
    assert "Jain" in result.stdout and "declined" in result.stdout and ">= threshold 10.0" in result.stdout
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith('digraph "tiny-dwsep"') and "subgraph cluster_0" in dot and "->" in dot

    result = cli("partition", "zoo:tiny-dwsep", "--threshold", "10", "--keep-inside", "32", "--explain")
    assert result.exit_code == 0, result.stderr
    assert "kept together: the 32 KiB tensor between them" in " ".join(result.stdout.split())
    result = cli("partition", "zoo:tiny-dwsep", "--keep-inside", "-1")
    assert result.exit_code == 1 and "--keep-inside must be 0 (off) or a size in KiB" in result.stderr
    # a cache geometry sets it: half an A55's 128 KiB L2 keeps the 128 KiB tensors of tiny-dwsep at 32 × 32 inside
    # (Td 1 merges nothing else), on host none, the flag over the geometry
    wide = ("partition", "zoo:tiny-dwsep@1x8x32x32", "--threshold", "1", "--json")
    for flags, most in ((("--geometry", "a55"), 3), ((), 1), (("--geometry", "a55", "--keep-inside", "0"), 1)):
        result = cli(*wide, *flags)
        assert result.exit_code == 0 and json.loads(result.stdout)["ago"]["max_complex_ops"] == most, flags
    result = cli("partition", "zoo:tiny-dwsep", "--geometry", "a99")
    assert result.exit_code == 1 and "unknown cache geometry 'a99'; choose one of: a76" in result.stderr


def test_partition_cli_png(cli, tmp_path):
    from tests.conftest import require_tool

    require_tool("dot")
    result = cli("partition", "zoo:tiny-cnn", "--png", tmp_path / "g.png")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_nhwc_graph_holds_the_same_convs_plus_edge_transposes_and_partitions_acyclically():
    """The default layout: every conv of MobileNet-V2 keeps its class (depthwise / pointwise read from
    NHWC loops), the model's input and output get a transpose each, and AGO still joins convs."""
    import collections

    _, _, nchw = legalized("mobilenet-v2", (1, 3, 56, 56))
    _, _, nhwc = legalized("mobilenet-v2", (1, 3, 56, 56), NHWC)
    g_nchw, g_nhwc = op_graph(nchw), op_graph(nhwc)

    def classes(g):
        return collections.Counter(n.op_class for n in g.nodes if n.op_class != "simple")

    assert classes(g_nhwc) == classes(g_nchw) and classes(g_nhwc)["depthwise_conv"] == 17
    assert [n.func for n in g_nhwc.nodes][0] == "transpose"  # NCHW input → NHWC
    assert sum(n.func.startswith("transpose") for n in g_nhwc.nodes) == 2  # and before the classifier
    plan = partition.plan(PartitionSettings("ago"), nhwc, NHWC, graph=g_nhwc)
    partition.check(g_nhwc, plan)
    assert partition.stats(g_nhwc, plan)["max_complex_ops"] >= 2


def test_keep_inside_joins_a_conv_chain_across_large_tensors_largest_first(dwsep):
    """--keep-inside: a conv feeding a depthwise / pointwise conv through a tensor of at least that many
    bytes starts clustering as one unit with it, whatever Td says; in NHWC the pw → dw and dw → pw pairs of
    tiny-dwsep share their depthwise conv and make one chain (intensive fusion computes it in one row tile) unless
    the tile the size allows would make the expand conv compute over a quarter of its rows twice; in NCHW (no row
    tiles of chains there) a unit joins one pair at most, the first of two equal tensors; smaller tensors join
    nothing."""
    _, _, mod = legalized("tiny-dwsep", spec=NHWC)
    graph = op_graph(mod)
    units = partition.epilogue_units(graph)
    expand, dw, project = (u for u in units if graph.by_id[u[0]].is_complex)
    size = partition.tensor_bytes(graph.by_id[expand[-1]])  # the expand conv's relu6 output, 16x16x32 floats
    assert size == 4 * 32 * 16 * 16 == partition.tensor_bytes(graph.by_id[dw[-1]])
    joined, notes = partition.locality_units(graph, units, size)
    assert expand + dw + project in joined
    first, second = notes
    assert first.kind == "unit" and first.nodes == expand and first.partner == dw
    assert second.nodes == dw and second.partner == project
    assert "the 32 KiB tensor between them stays inside one subgraph" in first.reason
    assert partition.locality_units(graph, units, size + 1) == (units, ())
    # row tiles of 9 KiB hold one row of the depthwise conv's output (2 KiB) and the 3 padded rows of the expand's
    # (2.25 KiB each) its window reads: on 16 cores, a tile each, the expand would compute 16 × 3 of its 18 rows, so
    # the pair stays a pair; on 2, each core's 8 tiles in order compute each row once (a line buffer) but the seam's
    joined, (pair, declined) = partition.locality_units(graph, units, 9 * 1024, cores=16)
    assert expand + dw in joined and project in joined and (pair.nodes, pair.partner) == (expand, dw)
    assert declined.kind == "declined" and declined.partner == project
    assert "not chained: its head would compute 1.67 of its rows twice in 9 KiB row tiles" in declined.reason
    assert expand + dw + project in partition.locality_units(graph, units, 9 * 1024, cores=2)[0]
    # a Td so small that AGO alone merges no two units: the chain still shares a subgraph, and the plan is checked
    alone = partition.plan_ago(graph, PartitionSettings(threshold=1.0))
    kept = partition.plan(PartitionSettings(threshold=1.0, locality_unit=size), mod, NHWC, graph=graph)
    assert expand in alone.groups and expand + dw + project in kept.groups
    assert kept.settings == PartitionSettings(threshold=1.0, locality_unit=size) and kept.threshold == 1.0
    partition.check(graph, kept)
    assert first in kept.decisions
    assert partition.CHAINS == {("pointwise_conv", "depthwise_conv", "pointwise_conv"),
                                ("conv", "depthwise_conv", "pointwise_conv")}
    _, _, _, nchw = dwsep
    ids = [n.id for n in nchw.nodes]
    joined, (note,) = partition.locality_units(nchw, partition.epilogue_units(nchw), size, layout="NCHW")
    assert joined == (tuple(ids[0:8]), tuple(ids[8:11])) and note.nodes == tuple(ids[0:4])


@pytest.mark.e2e
def test_keep_inside_on_mobilenet_v2_keeps_its_large_activations_inside_and_skips_shared_tensors():
    """MobileNet-V2 @112 (NHWC, what the suites run): at 256 KiB the 1.2 MB expand output at 56x56 and the
    441 KiB ones at 28x28 no longer cross a subgraph boundary (AGO alone cuts them: the two convs weigh
    more than Td together); SqueezeNet's squeeze conv feeds two expand convs, so it joins neither."""
    _, _, mod = legalized("mobilenet-v2", (1, 3, 112, 112), NHWC)
    graph = op_graph(mod)

    def crossing(plan):
        group_of = {x: i for i, g in enumerate(plan.groups) for x in g}
        return sorted(partition.tensor_bytes(graph.by_id[a]) // 1024 for a, b in graph.edges
                      if group_of[a] != group_of[b] and partition.tensor_bytes(graph.by_id[a]) >= 256 * 1024)

    plain = partition.plan(PartitionSettings("ago"), mod, NHWC, graph=graph)
    kept = partition.plan(PartitionSettings(locality_unit=256 * 1024), mod, NHWC, graph=graph)
    partition.check(graph, kept)
    assert 1176 in crossing(plain) and 1176 not in crossing(kept)
    assert len(crossing(kept)) < len(crossing(plain))
    assert len([d for d in kept.decisions if "--keep-inside" in d.reason]) == 7  # 4 pairs, 3 of them chained on

    _, _, mod = legalized("squeezenet-1.1", (1, 3, 56, 56), NHWC)
    graph = op_graph(mod)
    units = partition.epilogue_units(graph)
    shared = [u for u in units if graph.by_id[u[0]].op_class == "pointwise_conv" and len(graph.consumers[u[-1]]) == 2]
    assert shared  # the fire modules' squeeze convs
    joined, notes = partition.locality_units(graph, units, 1)
    assert all(u in joined for u in shared)  # left as they were, though their pw consumers could pair with them


def stem(channels: int, size: int = 18):
    """A model of one 3 × 3 stride-2 conv over ``channels`` input channels and a ReLU (an image model's stem)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((16, channels, 3, 3)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, size // 2, size // 2])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("channels, joined", [(3, True), (4, True), (8, False)])
def test_a_model_inputs_layout_transpose_is_read_by_the_stem_conv_when_its_channels_are_few(channels, joined,
                                                                                           tmp_path):
    """NHWC: the NCHW → NHWC transpose of a model input of at most PROLOGUES' channels (RGB, RGBA) starts in the
    stem conv's unit, so the conv reads the input in place (no copy kernel), the reason recorded; over more
    channels it stays a kernel of its own (KEEP_APART's gathers); either way the build matches onnxruntime."""
    from toolchain.pipeline import CompileRequest, compile_model

    model = stem(channels)
    mod, _ = frontend.prepare(model, NHWC)
    graph = op_graph(mod)
    plan = partition.plan(PartitionSettings("ago"), mod, NHWC, graph=graph)
    partition.check(graph, plan)
    kinds = [[graph.by_id[m].kind for m in group] for group in plan.groups]
    assert (["transpose", "conv"] == kinds[0][:2]) is joined, kinds
    assert any("stem conv" in d.reason for d in plan.decisions) is joined
    artifact = compile_model(CompileRequest(model, "stem", NHWC), find_compiler(NHWC), tmp_path / "out")
    names = [k["name"] for k in artifact.manifest.kernels]
    assert any(n.startswith("fused_transpose_conv2d") for n in names) is joined, names
    assert artifact.manifest.check["status"] == "passed"  # checked against onnxruntime before it was written
