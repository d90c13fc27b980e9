"""Build any acyclic partition: outline each group of ``call_tir`` bindings into a ``Primitive`` Relax
function shaped like FuseOps' own, then ``FuseTIR`` makes one PrimFunc per group, whatever it holds
(groups in a topological order of the quotient, checked by the caller; see docs/partitioning.md)."""

from __future__ import annotations

from collections.abc import Sequence

from toolchain.concat import InPlace
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


def _call_args(value, relax) -> list:
    """The arguments of a ``call_tir`` binding value ([] for anything else)."""
    if isinstance(value, relax.Call) and len(value.args) > 1 and isinstance(value.args[1], relax.Tuple):
        return list(value.args[1].fields)
    return []


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


def outline_groups(mod, groups: Sequence[Sequence[str]], concat_in_place: bool = True):
    """Return ``mod`` with ``main`` calling one ``Primitive`` function per group (before FuseTIR); a concatenation
    that is only a group's result written in place (toolchain/concat.py) unless ``concat_in_place`` is False."""
    from tvm import relax

    main = mod["main"]
    if not main.body.blocks:  # nothing computed: the model returns inputs or constants
        return mod
    if len(main.body.blocks) != 1 or not isinstance(main.body.blocks[0], relax.DataflowBlock):
        raise BuildError("expected a legalized main with a single dataflow block")
    all_bindings = list(main.body.blocks[0].bindings)
    glue = [b for b in all_bindings if _is_glue(b, relax)]
    bindings = [b for b in all_bindings if not _is_glue(b, relax)]
    extern = {b.var.name for b in bindings if isinstance(b, relax.MatchCast) or extern_reason(b.value, mod)}
    binding_group, group_of_var = _binding_groups(bindings, groups, relax)
    escaping = _escaping(bindings, binding_group, group_of_var, [main.body.body] + [b.value for b in glue], relax)

    builder = relax.BlockBuilder(mod)
    concats = InPlace(mod, builder) if concat_in_place else None
    main_subst: dict[str, object] = {p.name: p for p in main.params}  # old var name -> new var in main
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
        outputs = [b.var for b in members if b.var.name in escaping]
        if not outputs:
            raise BuildError(f"group {gi} has no output used outside it; partition is not a cover of main")
        name = _group_name(members, mod, relax, used_names, gi)
        main_bindings += _outline(members, outputs, name, builder, main_subst, relax, concats)
    return _with_main(builder.get(), main, main_bindings, glue, main_subst, relax)


def _binding_groups(bindings, groups, relax) -> tuple[list[int], dict]:
    """Each binding's group (call_tir by its var name; a TupleGetItem follows its tuple's producer), and
    the group of each bound var."""
    group_of_node = {node: gi for gi, members in enumerate(groups) for node in members}
    binding_group: list[int] = []
    group_of_var: dict = {}
    for b in bindings:
        if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in group_of_var:
            gi = group_of_var[b.value.tuple_value]
        else:
            gi = group_of_node[b.var.name]
        binding_group.append(gi)
        group_of_var[b.var] = gi
    return binding_group, group_of_var


def _escaping(bindings, binding_group, group_of_var, main_reads, relax) -> set[str]:
    """Names of the vars read outside their own group (by another group, or by ``main_reads``: main's
    result and its glue): the groups' outputs."""
    escaping: set = set()
    for b, gi in zip(bindings, binding_group):
        for v in _used_vars(b.value, relax):
            if v in group_of_var and group_of_var[v] != gi:
                escaping.add(v.name)
    for expr in main_reads:
        for v in _used_vars(expr, relax):
            if v in group_of_var:
                escaping.add(v.name)
    return escaping


class _Lifter:
    """One group's substitution: constants lifted to parameters, vars bound outside the group become
    parameters (main's vars the call's arguments), vars bound inside map to their new vars (``inner``)."""

    def __init__(self, main_subst: dict, relax):
        import tvm

        self.main_subst, self.relax, self.constant = main_subst, relax, tvm.ir.Constant
        self.params: list = []
        self.args: list = []
        self.inner: dict[str, object] = {}
        self.lifted: dict[int, object] = {}

    def __call__(self, expr):
        relax = self.relax
        if isinstance(expr, self.constant):
            key = id(expr)
            if key not in self.lifted:
                param = relax.Var(f"param_{len(self.lifted)}", expr.ty)
                self.lifted[key] = param
                self.params.append(param)
                self.args.append(expr)
            return self.lifted[key]
        if isinstance(expr, relax.Var):
            if expr.name in self.inner:
                return self.inner[expr.name]
            param = relax.Var(expr.name, expr.ty)  # an input of the group
            self.inner[expr.name] = param
            self.params.append(param)
            self.args.append(self.main_subst[expr.name])
            return param
        return expr


def _outline(members, outputs, name: str, builder, main_subst: dict, relax, concats=None) -> list:
    """Outline one group's bindings into a ``Primitive`` function named ``name``; main's bindings that call it. A
    concatenation that only leaves the group is written in place (``concats``, toolchain/concat.py)."""
    lift = _Lifter(main_subst, relax)
    new_bindings = []
    mine = {b.var.name for b in members}
    read = {v.name for b in members for v in _used_vars(b.value, relax)}
    for b in members:
        value = _rebuild(b.value, lift, relax)
        if concats is not None and b.var.name not in read and any(b.var.same_as(o) for o in outputs):
            value = concats.rewrite(value, [getattr(a, "name", None) in mine for a in _call_args(b.value, relax)])
        single_output = len(outputs) == 1 and b.var.same_as(outputs[0])
        var = (relax.Var if single_output else relax.DataflowVar)(b.var.name, b.var.ty)
        lift.inner[b.var.name] = var
        new_bindings.append(relax.VarBinding(var, value))
    if len(outputs) == 1:
        body, ret_ty = lift.inner[outputs[0].name], outputs[0].ty
    else:
        tuple_var = relax.Var("gv", relax.TupleType([o.ty for o in outputs]))
        new_bindings.append(relax.VarBinding(tuple_var, relax.Tuple([lift.inner[o.name] for o in outputs])))
        body, ret_ty = tuple_var, tuple_var.ty
    func = relax.Function(
        lift.params, relax.SeqExpr([relax.DataflowBlock(new_bindings)], body), ret_ty, is_pure=True
    ).with_attr("Primitive", True)
    call = relax.Call(builder.add_func(func, name), lift.args)
    if len(outputs) == 1:  # main binds the original vars: an extern binding reads them as written
        main_subst[outputs[0].name] = outputs[0]
        return [relax.VarBinding(outputs[0], call)]
    tvar = relax.DataflowVar(f"{name}_out", ret_ty)
    calls = [relax.VarBinding(tvar, call)]
    for i, out in enumerate(outputs):
        calls.append(relax.VarBinding(out, relax.TupleGetItem(tvar, i)))
        main_subst[out.name] = out
    return calls


def _with_main(out_mod, main, main_bindings: list, glue, main_subst: dict, relax):
    """``out_mod`` with the new ``main``: the groups' calls, then main's result glue, then its result."""
    result = main.body.body
    result_names = _result_names(result, relax)
    for b in glue:  # main's result glue, after every group: a tuple of outputs or an alias
        value = _substitute_result(b.value, main_subst, relax)
        var = (relax.Var if b.var.name in result_names else relax.DataflowVar)(b.var.name, b.var.ty)
        main_bindings.append(relax.VarBinding(var, value))
        main_subst[b.var.name] = var
    new_result = _substitute_result(result, main_subst, relax)
    out_mod["main"] = relax.Function(
        main.params, relax.SeqExpr([relax.DataflowBlock(main_bindings)], new_result), main.ret_ty, main.is_pure,
        main.attrs,
    )
    return relax.transform.Normalize()(out_mod)


def _is_glue(binding, relax) -> bool:
    """main's result glue: a tuple of outputs, an alias or a constant (not a match_cast's checked var)."""
    import tvm

    return isinstance(binding, relax.VarBinding) and isinstance(binding.value,
                                                                (relax.Tuple, relax.Var, tvm.ir.Constant))


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


def fuse_groups(mod, groups: Sequence[Sequence[str]], spec, concat_in_place: bool = True):
    """Outline the groups and run FuseTIR (+ dead code elimination of the unfused PrimFuncs)."""
    import tvm
    from tvm import relax

    try:
        outlined = outline_groups(mod, groups, concat_in_place)
        with spec.tvm():
            return tvm.transform.Sequential([relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])(
                outlined
            )
    except BuildError:
        raise
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        raise BuildError(f"fusing the partition failed: {(lines[-1] if lines else type(exc).__name__)[:300]}") from exc
