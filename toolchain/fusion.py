"""Build any acyclic partition: outline each group of ``call_tir`` bindings into a
``Primitive`` Relax function, then let ``FuseTIR`` make one PrimFunc per group.

This is what removes stock FuseOps' one-conv-per-kernel limit: a group may
hold several complex ops, several outputs, any structure. The outlined
functions look exactly like FuseOps' own (constants lifted to parameters,
one dataflow block ending in ``R.output``), so ``FuseTIR`` treats them the
same way: intermediates become local buffers of the fused PrimFunc.

The groups must form an acyclic partition of ``op_graph(mod)`` (checked by
the caller with :func:`toolchain.cluster.check_partition`); they are emitted
in the given order, which must be a topological order of the quotient graph.
A group of an extern op (:data:`toolchain.opgraph.EXTERN_RULES`) stays in
``main`` as written.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolchain.errors import BuildError
from toolchain.opgraph import extern_reason


def _used_vars(expr, relax) -> list:
    found: list = []

    def visit(e):
        if isinstance(e, relax.Var) and not any(e.same_as(f) for f in found):
            found.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return found


def _rebuild(value, subst, relax):
    """Re-create a call_tir / TupleGetItem binding value with vars (and lifted constants) substituted."""
    if isinstance(value, relax.TupleGetItem):
        return relax.TupleGetItem(subst(value.tuple_value), value.index)
    gv, args, *rest = value.args
    fields = [subst(a) for a in args.fields]
    return relax.Call(value.op, [gv, relax.Tuple(fields), *rest], value.attrs, value.ty_args)


def _group_name(bindings, mod, relax, used: set[str], index: int) -> str:
    prims = [b.value.args[0].name_hint for b in bindings if isinstance(b.value, relax.Call)]
    base = "fused_" + "_".join(prims) if prims else f"group{index}"
    if len(base) > 120:
        base = base[:100] + f"_etc{len(prims)}"
    name, n = base, 1
    while name in used or any(gv.name_hint == name for gv in mod.get_global_vars()):
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def outline_groups(mod, groups: Sequence[Sequence[str]]):
    """Return ``mod`` with ``main`` calling one ``Primitive`` function per group (before FuseTIR)."""
    import tvm
    from tvm import relax

    main = mod["main"]
    if not main.body.blocks:  # nothing computed: the model returns inputs or constants
        return mod
    if len(main.body.blocks) != 1 or not isinstance(main.body.blocks[0], relax.DataflowBlock):
        raise BuildError("expected a legalized main with a single dataflow block")
    all_bindings = list(main.body.blocks[0].bindings)
    glue = [b for b in all_bindings if _is_glue(b, relax)]
    bindings = [b for b in all_bindings if not _is_glue(b, relax)]
    group_of_node = {node: gi for gi, members in enumerate(groups) for node in members}
    extern = {b.var.name for b in bindings if isinstance(b, relax.MatchCast) or extern_reason(b.value, mod)}

    # each binding's group: call_tir by its var name; TupleGetItem follows its tuple's producer
    binding_group: list[int] = []
    group_of_var: dict = {}
    for b in bindings:
        if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in group_of_var:
            gi = group_of_var[b.value.tuple_value]
        else:
            gi = group_of_node[b.var.name]
        binding_group.append(gi)
        group_of_var[b.var] = gi

    # vars read outside their own group (by another group or by main's result) are group outputs
    escaping: set = set()
    for b, gi in zip(bindings, binding_group):
        for v in _used_vars(b.value, relax):
            if v in group_of_var and group_of_var[v] != gi:
                escaping.add(v.name)
    result = main.body.body
    result_names = _result_names(result, relax)
    for expr in [result] + [b.value for b in glue]:
        for v in _used_vars(expr, relax):
            if v in group_of_var:
                escaping.add(v.name)

    builder = relax.BlockBuilder(mod)
    main_subst: dict[str, object] = {}  # old var name -> new var in main
    for p in main.params:
        main_subst[p.name] = p
    main_bindings = []
    used_names: set[str] = set()
    for gi in range(len(groups)):
        members = [b for b, g in zip(bindings, binding_group) if g == gi]
        if not members:
            continue
        if members[0].var.name in extern:  # stays as written (main binds the original vars it reads)
            main_bindings.extend(members)
            main_subst.update({b.var.name: b.var for b in members})
            continue
        params, args = [], []
        inner: dict[str, object] = {}
        lifted: dict[int, object] = {}

        def subst(expr, inner=inner, params=params, args=args, lifted=lifted):
            if isinstance(expr, tvm.ir.Constant):
                key = id(expr)
                if key not in lifted:
                    param = relax.Var(f"param_{len(lifted)}", expr.ty)
                    lifted[key] = param
                    params.append(param)
                    args.append(expr)
                return lifted[key]
            if isinstance(expr, relax.Var):
                if expr.name in inner:
                    return inner[expr.name]
                param = relax.Var(expr.name, expr.ty)  # an input of the group
                inner[expr.name] = param
                params.append(param)
                args.append(main_subst[expr.name])
                return param
            return expr

        outputs = [b.var for b in members if b.var.name in escaping]
        if not outputs:
            raise BuildError(f"group {gi} has no output used outside it; partition is not a cover of main")
        new_bindings = []
        for b in members:
            value = _rebuild(b.value, subst, relax)
            single_output = len(outputs) == 1 and b.var.same_as(outputs[0])
            var = (relax.Var if single_output else relax.DataflowVar)(b.var.name, b.var.ty)
            inner[b.var.name] = var
            new_bindings.append(relax.VarBinding(var, value))
        if len(outputs) == 1:
            body, ret_ty = inner[outputs[0].name], outputs[0].ty
        else:
            tuple_var = relax.Var("gv", relax.TupleType([o.ty for o in outputs]))
            new_bindings.append(relax.VarBinding(tuple_var, relax.Tuple([inner[o.name] for o in outputs])))
            body, ret_ty = tuple_var, tuple_var.ty
        func = relax.Function(
            params, relax.SeqExpr([relax.DataflowBlock(new_bindings)], body), ret_ty, is_pure=True
        ).with_attr("Primitive", True)
        name = _group_name(members, mod, relax, used_names, gi)
        gvar = builder.add_func(func, name)

        call = relax.Call(gvar, args)
        if len(outputs) == 1:
            var = out = outputs[0]  # main binds the original vars: an extern binding reads them as written
            main_bindings.append(relax.VarBinding(var, call))
            main_subst[out.name] = var
        else:
            tvar = relax.DataflowVar(f"{name}_out", ret_ty)
            main_bindings.append(relax.VarBinding(tvar, call))
            for i, out in enumerate(outputs):
                var = out
                main_bindings.append(relax.VarBinding(var, relax.TupleGetItem(tvar, i)))
                main_subst[out.name] = var

    for b in glue:  # main's result glue, after every group: a tuple of outputs or an alias
        value = _substitute_result(b.value, main_subst, relax)
        var = (relax.Var if b.var.name in result_names else relax.DataflowVar)(b.var.name, b.var.ty)
        main_bindings.append(relax.VarBinding(var, value))
        main_subst[b.var.name] = var
    new_result = _substitute_result(result, main_subst, relax)
    new_main = relax.Function(
        main.params, relax.SeqExpr([relax.DataflowBlock(main_bindings)], new_result), main.ret_ty, main.is_pure,
        main.attrs,
    )
    out_mod = builder.get()
    out_mod["main"] = new_main
    return relax.transform.Normalize()(out_mod)


def _is_glue(binding, relax) -> bool:
    """main's result glue: a tuple of outputs, an alias or a constant (not a match_cast's checked var)."""
    import tvm

    return isinstance(binding, relax.VarBinding) and isinstance(binding.value, (relax.Tuple, relax.Var, tvm.ir.Constant))


def _result_names(result, relax) -> set[str]:
    return {v.name for v in _used_vars(result, relax)}


def _substitute_result(result, subst, relax):
    import tvm

    if isinstance(result, relax.Var):
        return subst.get(result.name, result)  # a param is itself
    if isinstance(result, (tvm.ir.Constant, relax.ShapeExpr)):  # a constant, or a static shape (ONNX Shape)
        return result
    if isinstance(result, relax.Tuple):
        return relax.Tuple([_substitute_result(f, subst, relax) for f in result.fields])
    raise BuildError(f"unsupported main result expression {type(result).__name__}")


def fuse_groups(mod, groups: Sequence[Sequence[str]], spec):
    """Outline the groups and run FuseTIR (+ dead code elimination of the unfused PrimFuncs)."""
    import tvm
    from tvm import relax

    try:
        outlined = outline_groups(mod, groups)
        with spec.tvm():
            return tvm.transform.Sequential([relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])(
                outlined
            )
    except BuildError:
        raise
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        raise BuildError(f"fusing the partition failed: {(lines[-1] if lines else type(exc).__name__)[:300]}") from exc
