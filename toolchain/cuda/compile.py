"""``agoc compile --target cuda``: a (training) graph → fused CUDA kernels, PTX, a manifest with kernel counts.

    graph ─legalize─▶ op graph ─optype─▶ types ─stitch.plan─▶ groups ─codegen.fused─▶ scheduled module
        ─build_cuda─▶ kernels.cu ─nvcc─▶ kernels.ptx          (and the stock pipeline, for the counts)

The artifact directory (schema ``agoc.cuda/1``; not runnable here — CUDA
kernels need a GPU, and ``agoc verify`` is for host/ARM artifacts)::

    OUT/
      manifest.json   graph, target, kernel counts fused vs stock, groups with their rules and row forms,
                      how each kernel was scheduled, declined merges, notes, nvcc result, versions
      kernels.cu      CUDA source of the fused module (TVM codegen)
      kernels.ptx     nvcc --ptx of it (when nvcc is on PATH)
      stock.cu        CUDA source of the stock TVM pipeline, for comparison
      fused.py        the fused, scheduled module as TVMScript
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from toolchain.artifact import staged_directory
from toolchain.cuda import codegen, optype, stitch

SCHEMA = "agoc.cuda/1"


@dataclass(frozen=True)
class Graph:
    """What the CUDA path compiles: a Relax module whose ``main`` is one dataflow block."""

    name: str
    mod: object
    training: bool
    description: str


@dataclass
class Compiled:
    legalized: object
    graph_ops: int
    plan: stitch.Plan
    fused: codegen.Scheduled
    fused_build: codegen.CudaBuild
    stock: codegen.Scheduled | None
    stock_build: codegen.CudaBuild | None


#: Constants above this many elements whose elements are all equal go back to being a broadcast.
UNIFORM_CONSTANT_LIMIT = 4096


def legalize(mod):
    from toolchain.build import legalize as _legalize

    return expand_uniform_constants(_legalize(mod, _HostSpec()))


def expand_uniform_constants(mod, limit: int = UNIFORM_CONSTANT_LIMIT):
    """Undo one fold: ``FoldConstant`` turns a training step's loss-gradient seed (a scalar broadcast
    to the output's shape) into a constant as large as the output, which every step then reads
    from memory and every executable carries (50 MB for bias+GELU at BERT-base sizes). A large
    constant whose elements are all equal becomes ``broadcast_to`` of its scalar again: a kernel
    the fusion merges into its consumers."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Expand(PyExprMutator):
        expanded = 0

        def visit_generic_const_(self, const):
            value = const.value.numpy()
            if value.size <= limit or not np.all(value == value.flat[0]):
                return const
            self.expanded += 1
            scalar = relax.const(value.flat[0], str(value.dtype))
            return self.builder_.emit(relax.op.broadcast_to(scalar, relax.ShapeExpr(list(value.shape))))

    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    expanded = 0
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            mutator_ = _Expand(mod)
            out[gv] = mutator_.visit_expr(func)
            expanded += mutator_.expanded
    if not expanded:
        return mod
    passes = [relax.transform.Normalize(), relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
              relax.transform.CanonicalizeBindings()]
    from toolchain.build import unique_binding_names

    with tvm.target.Target({"kind": "llvm"}):
        return unique_binding_names(tvm.transform.Sequential(passes)(out))


class _HostSpec:
    """LegalizeOps is target-independent here; a bare llvm context is enough."""

    preset = "legalize"
    layout = "NCHW"  # training graphs are fused as imported
    pad_channels = False  # ... and keep their channel counts (toolchain/padding.py is for inference kernels)

    def tvm(self):
        import tvm

        return tvm.target.Target({"kind": "llvm"})


def plan_graph(legalized, *, stitching: bool = True, budget: int = stitch.SHARED_BUDGET_BYTES):
    from toolchain.opgraph import op_graph

    graph = op_graph(legalized)
    types = optype.op_types(legalized, graph)
    return graph, types, stitch.plan(graph, types, outputs=stitch.main_outputs(legalized), stitching=stitching,
                                     budget=budget)


def compile_graph(graph: Graph, target: codegen.CudaTarget, *, with_stock: bool = True,
                  budget: int = stitch.SHARED_BUDGET_BYTES,
                  on_stage: Callable[[str], None] = lambda s: None) -> Compiled:
    on_stage("legalizing")
    legalized = legalize(graph.mod)
    on_stage("typing ops and aggregating (APOLLO Tables 1-2)")
    ops, _, plan = plan_graph(legalized, budget=budget)
    on_stage(f"scheduling {len(plan.groups)} groups for {target.arch}")
    fused = codegen.fused(legalized, plan, target)
    on_stage("generating CUDA (fused)")
    fused_build = codegen.build_cuda(fused.mod, target)
    stock = stock_build = None
    if with_stock:
        on_stage("generating CUDA (stock TVM pipeline)")
        stock = codegen.stock(legalized, target)
        stock_build = codegen.build_cuda(stock.mod, target)
    return Compiled(legalized, len(ops.nodes), fused.plan, fused, fused_build, stock, stock_build)


def kernel_report(c: Compiled) -> dict:
    """Kernel counts, fused vs stock: the numbers the README and the benchmark quote."""
    out = {"ops": c.graph_ops, "fused": c.fused_build.to_json()}
    groups = c.plan.groups
    out["fused"].update({
        "groups": len(groups),
        "stitched_groups": sum(1 for g in groups if g.stitched),
        "row_form_groups": sum(1 for g in groups if g.form is not None),
    })
    if c.stock_build is not None:
        out["stock"] = c.stock_build.to_json()
        out["launch_ratio_fused_over_stock"] = round(c.fused_build.launches / max(1, c.stock_build.launches), 3)
    return out


def write_artifact(graph: Graph, target: codegen.CudaTarget, c: Compiled, out_dir: Path, *,
                   ptx: bool = True, started: float | None = None, versions: dict | None = None) -> dict:
    """Write the artifact directory (assembled aside, moved into place at the end)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / "manifest.json").exists():
        from toolchain.errors import ArtifactError

        raise ArtifactError(f"-o {out_dir} exists and is not an agoc artifact; choose a new or empty directory")
    with staged_directory(out_dir) as staging:
        (staging / "kernels.cu").write_text(c.fused_build.source)
        (staging / "fused.py").write_text(c.fused.mod.script())
        if c.stock_build is not None:
            (staging / "stock.cu").write_text(c.stock_build.source)
        nvcc_record = {"nvcc": codegen.find_nvcc(), "ptx": None}
        if ptx and codegen.find_nvcc():
            path = codegen.nvcc_compile(staging / "kernels.cu", target.arch, staging / "kernels.ptx", "ptx")
            nvcc_record.update(ptx="kernels.ptx", entries=len(codegen.ptx_entries(path.read_text())))
        elif ptx:
            nvcc_record["skipped"] = "nvcc not on PATH: only the CUDA source was written"
        names = codegen._call_order(c.fused.mod)
        groups = []
        for name, g in zip(names, c.plan.groups):
            entry = g.to_json()
            entry.update(kernel=name, schedule=c.fused.schedules.get(name),
                         cuda_kernels=c.fused_build.kernels_per_func.get(name, 0))
            groups.append(entry)
        manifest = {
            "schema": SCHEMA,
            "graph": {"name": graph.name, "training": graph.training, "description": graph.description},
            "target": target.to_json(),
            "kernel_counts": kernel_report(c),
            "shared_budget_bytes": c.plan.budget_bytes,
            "groups": groups,
            "declined_merges": [d.to_json() for d in c.plan.decisions if not d.merged],
            "notes": c.fused.notes + ([f"stock: {n}" for n in c.stock.notes] if c.stock else []),
            "nvcc": nvcc_record,
            "versions": versions or {},
            "compile_seconds": round(time.perf_counter() - started, 3) if started else None,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def graph_from_source(proto, label: str, inputs, training: bool, builtin: str | None = None) -> Graph:
    """A built-in training graph (``builtin``), or an ONNX model (forward only, or with ``training``)."""
    from toolchain.cuda import training as tr

    if builtin is not None:
        g = tr.builtin(builtin)
        return Graph(g.name, g.mod, True, g.description)
    if training:
        g = tr.from_onnx(proto, inputs, label)
        return Graph(g.name, g.mod, True, g.description)
    from toolchain import onnx_import

    mod = onnx_import.to_relax(proto, inputs)
    return Graph(label, mod, False, f"{label} (ONNX): forward only")
