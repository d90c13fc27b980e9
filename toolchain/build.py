"""Relax module → fused kernels → a shared library.

The stock TVM CPU pipeline (``relax.backend.cpu_generic``) split into the
stages agoc needs to see between: ``legalize`` (every op a ``call_tir`` of a
PrimFunc — where partitioning reads the graph), ``fuse`` (group ``call_tir``s
and make one PrimFunc per group), then ``build_library`` (dataflow lowering,
memory planning, codegen, link with the target's compiler).
"""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from pathlib import Path

from toolchain import constfold, fastmath, padding, relayout, roofline, winograd
from toolchain.errors import BuildError
from toolchain.targets import Compiler, TargetSpec


@dataclass(frozen=True)
class KernelInfo:
    """One fused kernel (PrimFunc) of the built model, how often the graph calls it, and the bytes of the
    weights (constants) those calls pass it, all calls together."""

    name: str
    calls: int
    weight_bytes: int = 0
    task: str | None = None  # built with a tuning database: the task of its schedule (tuned or not)
    schedule: str | None = None  # "tuned" (a database's), or what an untuned one got (toolchain.tune.untuned.RULES)
    flops: int = 0  # floating-point operations of one call (TVM's count of its PrimFunc; a multiply-add is two)
    arg_bytes: int = 0  # bytes of its arguments (what one call reads and writes at least)

    def to_json(self) -> dict:
        return {"name": self.name, "calls": self.calls, "weight_bytes": self.weight_bytes,
                **({"task": self.task} if self.task else {}), **({"schedule": self.schedule} if self.schedule else {}),
                **({"flops": self.flops, "arg_bytes": self.arg_bytes} if self.flops or self.arg_bytes else {})}


def error_line(exc: BaseException, limit: int = 300) -> str:
    """The line of an exception worth showing: TVM puts the message last, after its traceback."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def lower_and_compile(mod, target, backend, what: str, tir_pipeline: str = "default"):
    """``tvm.compile`` of an already fused (and scheduled) module with only the backend's lowering
    passes (``backend``: a ``tvm.relax.backend.<x>.pipeline`` module; the default pipeline would fuse
    again) and the named TIR pipeline. Raises BuildError naming ``what``."""
    import tvm

    lower = tvm.transform.Sequential(backend.dataflow_lower_passes(target) + backend.finalize_passes(target))
    try:
        with target:
            return tvm.compile(mod, target, relax_pipeline=lower, tir_pipeline=tir_pipeline)
    except Exception as exc:
        raise BuildError(f"TVM code generation failed{what}: {error_line(exc)}") from exc


#: ``relax.transform.ConvertLayout``'s table for ``spec.layout == "NHWC"``: the ops that carry a
#: layout and the layout each computes in. The ops between them follow their input's layout
#: (elementwise, pools, reductions, concatenate, split); one that cannot (ShuffleNet's
#: channel-shuffle reshape) gets transposes, which :func:`toolchain.relayout.sink_transposes` then moves
#: past it and cancels. (Naming ``relax.nn.max_pool2d`` here fails TVM 0.27's
#: ``NoDesiredLayout`` check; it follows its input anyway.) A transposed conv stays in NCHW: TVM 0.27
#: legalizes it in no other layout (left to follow its input, a U-Net's up-sampling conv was not lowered).
NHWC_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "OHWI"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


def has_layout_ops(mod) -> bool:
    """Does ``mod`` hold an op :data:`NHWC_LAYOUTS` puts in another layout than NCHW? Without one, a layout
    change has nothing to do (and ``ConvertLayout`` only risks failing on the ops it passes through)."""
    from tvm import relax

    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and NHWC_LAYOUTS.get(getattr(expr.op, "name", None), ["NCHW"])[0] != "NCHW":
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def legalize(mod, spec: TargetSpec):
    """High-level Relax ops → ``call_tir`` of PrimFuncs, constants folded; in ``spec.layout``, output channels
    padded where ``spec.pad_channels`` (toolchain/padding.py), transcendental ops as polynomials where
    ``spec.fast_math`` (toolchain/fastmath.py), in float16 where ``spec.precision`` says (toolchain/targets.py)."""
    import tvm
    from tvm import relax

    nhwc = spec.layout == "NHWC" and has_layout_ops(mod)
    passes = [
        *([relax.transform.EliminateCommonSubexpr()] if nhwc else []),  # an input read twice: one transpose
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),  # drop var-to-var aliases: every binding is a call_tir
    ]
    try:
        with spec.tvm():
            padded = []
            if spec.pad_channels:  # before the layout changes: the pass reads NCHW convs, OIHW weights
                mod, padded = padding.pad_output_channels(mod, lanes=fp_lanes(spec) if nhwc else 0)
            if nhwc:  # convs to NHWC, then the transposes ConvertLayout leaves around reshapes moved away
                mod = relayout.follow_layout(mod)
                converted = relax.transform.ConvertLayout(NHWC_LAYOUTS)(mod)
                mod = relayout.sink_transposes(relax.transform.Normalize()(converted))
            fast = getattr(spec, "fast_math", False) and fastmath.count_fast(mod) > 0
            if fast:  # after the layout change: a call_tir has no layout rule
                mod = fastmath.fast_math(mod)
            if getattr(spec, "precision", "fp32") == "fp16":  # convs, matmuls and what follows them; edges cast
                mod = relax.transform.ToMixedPrecision(out_dtype="float16")(relax.transform.ConvertToDataflow()(mod))
            mod = constfold.fold_layout_constants(mod)
            convs = 0
            if nhwc and getattr(spec, "winograd", False) and getattr(spec, "precision", "fp32") == "fp32":
                from toolchain.tune.winograd import tile_rows

                target = spec.tvm()  # weights folded to constants: transformed here, once
                mod, convs = winograd.rewrite(mod, lambda conv: tile_rows(conv, target))
            out = tvm.transform.Sequential(passes)(mod)
    except Exception as exc:
        raise BuildError(f"legalizing the model failed: {error_line(exc)} (rerun with --debug)") from exc
    out = unique_binding_names(out)  # ConvertLayout, padding and the importer itself re-use binding names
    out = out.with_attr(fastmath.APPLIED_ATTR, 1) if fast else out
    out = out.with_attr(winograd.APPLIED_ATTR, convs) if convs else out
    return out.with_attr(padding.APPLIED_ATTR, json.dumps([d.to_json() for d in padded])) if padded else out


def fp_lanes(spec: TargetSpec) -> int:
    """Lanes of one vector register of ``spec``'s target in the kernels' float type (float16: twice float32's): what
    an NHWC kernel vectorises its channels in (NCHW vectorises its rows: no narrow channels padded there)."""
    from toolchain.tune.intensive import vector_lanes

    lanes = vector_lanes(spec.tvm())
    return lanes * 2 if getattr(spec, "precision", "fp32") == "fp16" else lanes


def unique_binding_names(mod):
    """``mod`` with every binding of ``main`` named uniquely (``ConvertLayout`` re-uses names; the op
    graph and the partition name ops by their bindings). A repeated name gets the first free ``_N``."""
    from tvm import relax

    used: set[str] = {p.name for p in mod["main"].params}

    def fresh(name: str) -> str:
        out, n = name, 1
        while out in used:
            out, n = f"{name}_{n}", n + 1
        used.add(out)
        return out

    @relax.expr_functor.mutator
    class Rename(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            kind = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            var = kind(fresh(binding.var.name), binding.var.ty)
            self.builder_.emit_normalized(relax.VarBinding(var, value))
            self.set_var_remap(binding.var, var)

    out = type(mod)(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    gv = mod.get_global_var("main")
    out[gv] = Rename().visit_expr(mod["main"])
    return out


def fuse_stock(mod, spec: TargetSpec):
    """TVM's own grouping: ``FuseOps`` (at most one conv/matmul per group) then ``FuseTIR``."""
    import tvm
    from tvm import relax

    try:
        with spec.tvm():
            return tvm.transform.Sequential([relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
    except Exception as exc:
        raise BuildError(f"fusing the model failed: {error_line(exc)} (rerun with --debug)") from exc


def kernel_calls(func) -> list[tuple[str, list]]:
    """(kernel name, arguments) of every ``call_tir`` of a PrimFunc in the Relax function ``func``, in order."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    out: list[tuple[str, list]] = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and isinstance(expr.args[0], relax.GlobalVar):
            args = expr.args[1].fields if isinstance(expr.args[1], relax.Tuple) else [expr.args[1]]
            out.append((expr.args[0].name_hint, list(args)))

    relax.analysis.post_order_visit(func, visit)
    return out


def is_weight(shape, dtype) -> bool:
    """A constant whose layout a schedule may rewrite (:func:`mark_weights`): floating-point, with at
    least two dimensions longer than 1 (a conv or matmul weight; not a bias, scale or index)."""
    return sum(1 for d in shape if int(d) > 1) >= 2 and "float" in str(dtype)


def mark_weights(mod, attr: str = "layout_free_buffers"):
    """Mark every kernel's weight parameters layout-free (``layout_free_buffers``): the parameters
    ``main`` passes a constant at every call. MetaSchedule's ``RewriteLayout`` postprocessor may then
    store such a weight in the order its schedule reads it (Ansor's layout rewrite); what the kernel
    would do first on every call is done once at build time by :func:`prepack_weights`.

    Only floating-point tensors with two or more dimensions longer than 1 count (:func:`is_weight`). A
    0-d or integer constant is an index (BERT's ``take`` of the [CLS] row), nothing to store in another
    order, and ``RewriteLayout`` fails a TVM check on such a buffer read as an index. A vector — a bias
    or per-channel scale, 1-D or broadcast as ``(1, 1, 1, C)`` as every NHWC conv's bias is — is read in
    order whatever the schedule, and rewriting it miscompiles: MobileViT's QKV kernel (matmul, bias,
    split into three) had its bias inlined into the three split blocks and rewritten for the first
    block's reads, so the second and third read the first third of the bias — every one of its five
    best candidates wrong (caught by the numeric check; the kernel was left untuned). The static check
    :func:`toolchain.tune.schedule_check.partial_weight_reads` rejects such a schedule before it is measured.

    TVM's own ``AttachAttrLayoutFreeBuffers`` does the same but renames every kernel it marks. With
    another ``attr`` the same parameters are marked under that name (:mod:`toolchain.prefetch`)."""
    import tvm
    from tvm import tirx

    constant: dict[str, set[int]] = {}
    for name, args in kernel_calls(mod["main"]):
        here = {i for i, a in enumerate(args)
                if isinstance(a, tvm.ir.Constant) and is_weight(a.value.shape, a.value.dtype)}
        constant[name] = constant[name] & here if name in constant else here
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and constant.get(gv.name_hint):
            out[gv] = func.with_attr(attr, sorted(constant[gv.name_hint]))
    return out


def prepack_weights(mod, spec: TargetSpec):
    """After scheduling: a kernel whose schedule rewrote a weight's layout (see :func:`mark_weights`)
    carries the rewrite as a first block; split it into a kernel of its own and fold it on the
    constant weight now, so the model stores the weight rewritten and the kernel reads it directly.
    The rewrite kernels, called only by the folded calls, are dropped (not built into the library)."""
    import tvm
    from tvm import relax

    try:
        with spec.tvm():
            return tvm.transform.Sequential(
                [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant(),
                 relax.transform.DeadCodeElimination()]
            )(mod)
    except Exception as exc:
        raise BuildError(f"pre-packing the weights failed: {error_line(exc)} (rerun with --debug)") from exc


def kernels(mod) -> list[KernelInfo]:
    """The PrimFuncs of a fused module with their call counts from ``main``, in call order."""
    from tvm import relax, tirx

    counts: collections.Counter[str] = collections.Counter()
    weights: collections.Counter[str] = collections.Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            bound = _bound_constants(func)  # pre-packing folds a weight into a binding: the call passes its var
            for name, args in kernel_calls(func):
                counts[name] += 1
                weights[name] += sum(_constant_bytes(bound.get(a, a)) for a in args)
    prims = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    return [KernelInfo(name, n, weights[name], **_work(prims[name])) for name, n in counts.items() if name in prims]


def _work(func) -> dict:
    """{flops, arg_bytes} of one call of a PrimFunc; 0 flops where TVM cannot count them."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        flops = int(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - a kernel TVM's counter does not follow (e.g. data-dependent loops)
        flops = 0
    return {"flops": flops, "arg_bytes": roofline.arg_bytes(func)}


def _bound_constants(func) -> dict:
    """The vars of ``func`` (a Relax function) bound to a constant, to that constant: directly, through
    another such var, or as an item of a bound tuple of constants (what pre-packing's folding leaves)."""
    import tvm
    from tvm import relax

    body = func.body
    bound: dict = {}
    for block in body.blocks if isinstance(body, relax.SeqExpr) else []:
        for b in block.bindings:
            value = b.value if isinstance(b, relax.VarBinding) else None
            if isinstance(value, relax.TupleGetItem) and isinstance(bound.get(value.tuple_value), relax.Tuple):
                value = bound[value.tuple_value].fields[value.index]
            value = bound.get(value, value) if isinstance(value, relax.Var) else value
            if isinstance(value, tvm.ir.Constant) or (
                    isinstance(value, relax.Tuple) and all(isinstance(f, tvm.ir.Constant) for f in value.fields)):
                bound[b.var] = value
    return bound


def _constant_bytes(arg) -> int:
    """Bytes of ``arg`` if it is a constant tensor (a weight bound into the model), else 0."""
    import math

    import tvm

    value = getattr(arg, "value", None) if isinstance(arg, tvm.ir.Constant) else None
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):  # not a tensor
        return 0
    dtype = tvm.runtime.DataType(str(value.dtype))
    return math.prod(int(d) for d in value.shape) * dtype.bits * dtype.lanes // 8


def built_kernels(mod, spec: TargetSpec) -> list[KernelInfo]:
    """The kernels the built library calls: :func:`kernels` after the lowering's own
    ``RewriteDataflowReshape``, which turns a kernel that only reshapes into a view (no call)."""
    from tvm import relax

    with spec.tvm():
        return kernels(relax.transform.RewriteDataflowReshape()(mod))


def build_library(mod, spec: TargetSpec, compiler: Compiler, path: Path) -> Path:
    """Lower the fused module to a Relax VM executable and link it into ``path`` (a .so); with
    ``spec.weight_prefetch``, TIR lowered by :mod:`toolchain.prefetch`'s pipeline."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from toolchain import prefetch

    pipeline = "default"
    if spec.weight_prefetch:  # the weights marked again: pre-packing dropped TVM's mark from the kernels it packed
        mod, pipeline = mark_weights(mod, prefetch.WEIGHTS_ATTR), prefetch.register()
    executable = lower_and_compile(mod, spec.tvm(), cpu, f" for {spec.preset}", pipeline)
    try:
        if compiler.kind == "host":
            executable.export_library(str(path))
        else:
            from tvm.support import cc

            executable.export_library(
                str(path), fcompile=cc.cross_compiler(compiler.path, options=list(compiler.options))
            )
    except Exception as exc:
        if "No space left on device" in str(exc):  # the linker's own words, after its command line
            raise BuildError(f"no space left on the device holding {path.parent}; free some disk space or give "
                             "-o a directory elsewhere") from exc
        raise BuildError(f"linking with {compiler.path} failed: {error_line(exc)}") from exc
    return path
