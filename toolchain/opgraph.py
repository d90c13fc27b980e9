"""The operator graph of a legalized Relax module: what AGO partitions.

After :func:`toolchain.build.legalize`, ``main`` is one dataflow block of
``call_tir`` bindings (plus ``TupleGetItem`` on multi-output ops such as
``split``). Each ``call_tir`` is a node; a tensor passed from one binding to
another is an edge. ``TupleGetItem`` bindings are not nodes: they alias
their producer, and go wherever it goes. ``Tuple`` and var-to-var bindings
(main's result glue) are not nodes either; they stay in ``main``.

Every node carries its PrimFunc's loop nests (the extent and kind of every
block iter var) and a class from :data:`OP_CLASSES`:

complex  conv, depthwise_conv, pointwise_conv, matmul, dense
simple   everything else (elementwise, broadcast, reductions like mean,
         layout ops)
extern   a binding that stays in ``main`` as written, never fused
         (:data:`EXTERN_RULES`: packed calls, opaque kernels, shape glue)

Depthwise / pointwise are told apart from plain conv by the reduction
extents of the conv block: a depthwise conv reduces over one input channel
per group with as many groups as output channels; a pointwise conv has a
1×1 window (and reduces over several channels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

#: PrimFunc name prefix (as LegalizeOps names them) → op class. First match wins.
OP_CLASSES: tuple[tuple[str, str], ...] = (
    ("conv2d_transpose", "conv"),
    ("conv2d", "conv"),
    ("conv1d", "conv"),
    ("conv3d", "conv"),
    ("batch_matmul", "matmul"),
    ("matmul", "matmul"),
    ("dense", "dense"),
)
COMPLEX_CLASSES = frozenset({"conv", "depthwise_conv", "pointwise_conv", "matmul", "dense"})
#: the class of a binding that is not a kernel agoc fuses (:data:`EXTERN_RULES`)
EXTERN = "extern"
#: ``op_pattern`` of a PrimFunc TVM never fuses (``kOpaque``: sort, scan, a call into a library)
OPAQUE_PATTERN = 8


def _not_call_tir(value, mod) -> bool:
    return not (hasattr(value, "op") and getattr(value.op, "name", None) == "relax.call_tir")


def _opaque_kernel(value, mod) -> bool:
    """An opaque kernel that is no loop nest to fuse: a library call (sort, top-k, scan) in a block that
    writes nothing TVM can see. (TVM marks some plain loop nests opaque too, e.g. a gather; those fuse.)"""
    from tvm import s_tir

    func = mod[value.args[0]]
    if func.attrs is None or int(func.attrs.get("op_pattern", 0)) < OPAQUE_PATTERN:
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - no root block: not a loop nest TVM's schedules can take
        return True
    return any(not sch.get(b).writes for b in blocks)


def _symbolic_output(value, mod) -> bool:
    shapes = [getattr(ty.shape, "values", None) for ty in _tensor_types(value.ty_args[0])]
    return any(dims is None or not all(hasattr(d, "value") for d in dims) for dims in shapes)


#: Bindings of a legalized ``main`` that stay there as written (op class :data:`EXTERN`), first match
#: wins: (test of the binding's value and the module, why). Such a binding is its own subgraph.
EXTERN_RULES: tuple[tuple[object, str], ...] = (
    (_not_call_tir, "runs outside the kernels (a packed function, a shape computation)"),
    (_opaque_kernel, "an opaque kernel (sort, scan, a library call) is never fused"),
    (_symbolic_output, "its output shape is known only at run time"),
)


def extern_reason(value, mod) -> str | None:
    """Why a binding's value stays in ``main`` unfused (:data:`EXTERN_RULES`), or None for a fusible kernel."""
    return next((why for test, why in EXTERN_RULES if test(value, mod)), None)


def _tensor_types(ty) -> list:
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return [t for f in fields for t in _tensor_types(f)]
    return [ty] if type(ty).__name__ == "TensorType" else []


@dataclass(frozen=True)
class BlockNest:
    """One block of a PrimFunc: its iter vars as (name, extent, kind) with kind 'S' (spatial) or 'R' (reduce)."""

    block: str
    iters: tuple[tuple[str, int, str], ...]

    @property
    def reduce_extents(self) -> tuple[int, ...]:
        return tuple(e for _, e, k in self.iters if k == "R")

    @property
    def spatial_extents(self) -> tuple[int, ...]:
        return tuple(e for _, e, k in self.iters if k == "S")


@dataclass(frozen=True)
class OpNode:
    id: str  # the Relax var the op binds (unique in main)
    func: str  # the PrimFunc's global name
    op_class: str  # from OP_CLASSES, refined for convs; "simple" otherwise
    blocks: tuple[BlockNest, ...]
    shape: tuple[int, ...]  # output shape (first output for multi-output ops)

    @property
    def is_complex(self) -> bool:
        return self.op_class in COMPLEX_CLASSES

    @property
    def is_extern(self) -> bool:
        return self.op_class == EXTERN

    @property
    def kind(self) -> str:
        """The op's name without LegalizeOps' numbering (``reshape12`` → ``reshape``); complex ops: their class."""
        return self.op_class if self.is_complex else op_base(self.func)

    @property
    def reduces(self) -> bool:
        """Has a reduction loop: every complex op, and the simple reductions (pooling, mean, softmax, norms)."""
        return self.is_complex or any(b.reduce_extents for b in self.blocks)


@dataclass(frozen=True)
class OpGraph:
    nodes: tuple[OpNode, ...]  # in binding order, which is topological
    edges: tuple[tuple[str, str], ...]  # (producer id, consumer id), deduplicated, in binding order

    def node(self, node_id: str) -> OpNode:
        return self.by_id[node_id]

    @cached_property
    def by_id(self) -> dict[str, OpNode]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def producers(self) -> dict[str, tuple[str, ...]]:
        """Each node id's producers, in edge order."""
        return self._ends(1, 0)

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        """Each node id's consumers, in edge order."""
        return self._ends(0, 1)

    def _ends(self, key: int, value: int) -> dict[str, tuple[str, ...]]:
        ends: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for edge in self.edges:
            ends[edge[key]].append(edge[value])
        return {k: tuple(v) for k, v in ends.items()}

    @property
    def extern_ids(self) -> frozenset[str]:
        return frozenset(n.id for n in self.nodes if n.is_extern)

    @property
    def complex_ids(self) -> frozenset[str]:
        return frozenset(n.id for n in self.nodes if n.is_complex)

    @property
    def reducing_ids(self) -> frozenset[str]:
        """Ops with a reduction loop (:attr:`OpNode.reduces`): TVM's FuseOps never puts a simple one after a
        conv in one kernel."""
        return frozenset(n.id for n in self.nodes if n.reduces)


def _int(expr) -> int:
    return int(expr.value) if hasattr(expr, "value") else int(expr)


def block_nests(func) -> tuple[BlockNest, ...]:
    """Every non-root block of a PrimFunc with its iter var extents, in program order."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    nests: list[BlockNest] = []

    def walk(parent):
        for rv in sch.get_child_blocks(parent):
            block = sch.get(rv)
            iters = tuple(
                (iv.var.name, _int(iv.dom.extent), "R" if int(iv.iter_type) == 2 else "S") for iv in block.iter_vars
            )
            nests.append(BlockNest(block.name_hint, iters))
            walk(rv)

    walk(sch.get_sblock("root"))
    return tuple(nests)


def op_base(func_name: str) -> str:
    """A PrimFunc name without the number LegalizeOps appends to repeated ops."""
    return re.sub(r"\d+$", "", func_name)


def classify(func_name: str, blocks: tuple[BlockNest, ...], shape: tuple[int, ...]) -> str:
    base = op_base(func_name)
    op_class = next((cls for prefix, cls in OP_CLASSES if base.startswith(prefix)), "simple")
    if op_class != "conv":
        return op_class
    reducing = [b for b in blocks if b.reduce_extents]
    if not reducing:
        return op_class
    main = max(reducing, key=lambda b: len(b.iters))
    red = main.reduce_extents  # (rc, ry, rx) for conv2d NCHW; (ry, rx, rc) for NHWC
    if len(red) < 3 or len(shape) != 4:
        return op_class
    if main.block.lower().endswith("nhwc"):
        (ry, rx, rc), channels = red[-3:], shape[3]
    else:
        (rc, ry, rx), channels = red[:3], shape[1]
    if rc == 1 and channels > 1:
        return "depthwise_conv"
    if ry == 1 and rx == 1 and rc > 1:
        return "pointwise_conv"
    return op_class


def _shape_of(var) -> tuple[int, ...]:
    ty = var.ty
    fields = getattr(ty, "fields", None)
    if fields:  # tuple output: report the first field
        ty = fields[0]
    shape = getattr(ty, "shape", None)
    if shape is None:
        return ()
    try:
        return tuple(_int(d) for d in shape)
    except (TypeError, ValueError):
        return ()


def _op_node(binding, cast: bool, mod, nests: dict) -> tuple[OpNode, object]:
    """The node of one op binding, and the expression whose vars it reads (its edges' sources)."""
    from tvm import relax

    value = binding.value
    shape = _shape_of(binding.var)
    if cast or extern_reason(value, mod) is not None:
        func, blocks, op_class, read = type(value).__name__, (), EXTERN, value
    else:
        gv = value.args[0]
        if gv.name_hint not in nests:
            nests[gv.name_hint] = block_nests(mod[gv])
        func, blocks, read = gv.name_hint, nests[gv.name_hint], relax.Tuple(list(value.args[1:]))
        op_class = classify(func, blocks, shape)
    return OpNode(binding.var.name, func, op_class, blocks, shape), read


def _sources(expr, ty, producer: dict, sym_producer: dict) -> list[str]:
    """The node ids ``expr`` reads, in order: its vars' producers, then the match_casts that first
    carried a symbolic dim of ``ty`` (a shape only a match_cast knows)."""
    from tvm import relax

    found: list[str] = []

    def visit(e):
        if isinstance(e, relax.Var) and e in producer and producer[e] not in found:
            found.append(producer[e])

    relax.analysis.post_order_visit(expr, visit)
    for v in relax.analysis.tir_vars_in_type(ty):
        if sym_producer.get(v) is not None and sym_producer[v] not in found:
            found.append(sym_producer[v])
    return found


def op_graph(mod) -> OpGraph:
    """Build the :class:`OpGraph` of ``mod['main']`` (a legalized module)."""
    import tvm
    from tvm import relax

    main = mod["main"]
    producer: dict = {}  # relax var -> node id that produces it
    sym_producer: dict = {}  # symbolic shape var -> node id whose output first carries it (a match_cast)
    for p in main.params:
        sym_producer.update({v: None for v in relax.analysis.tir_vars_in_type(p.ty)})
    nodes: list[OpNode] = []
    edges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    nests: dict[str, tuple[BlockNest, ...]] = {}  # PrimFunc name -> its block nests, computed once
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            cast = isinstance(binding, relax.MatchCast)  # its value is a var: a shape check, not glue
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in producer and not cast:
                producer[binding.var] = producer[value.tuple_value]
                continue
            if isinstance(value, (relax.Tuple, relax.Var, tvm.ir.Constant)) and not cast:
                continue  # result glue (main's output tuple, aliases): stays in main, not an op
            node, read = _op_node(binding, cast, mod, nests)
            nodes.append(node)
            for src in _sources(read, binding.var.ty, producer, sym_producer):
                if (src, node.id) not in seen:
                    seen.add((src, node.id))
                    edges.append((src, node.id))
            producer[binding.var] = node.id
            for v in relax.analysis.tir_vars_in_type(binding.var.ty):
                sym_producer.setdefault(v, node.id)
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("binding names in main are not unique")
    return OpGraph(tuple(nodes), tuple(edges))
