"""A model's tuning tasks: its kernels (identical ones once), the minis of every subgraph the reformer
splits and how they compose onto the join, each task's budget from AGO's weights."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from toolchain import build, fusion, partition, reform
from toolchain.concat import CONCAT_BLOCK, is_copy
from toolchain.opgraph import OpGraph, OpNode, block_nests, op_graph
from toolchain.tune import budget
from toolchain.tune.settings import Task, TuneSettings
from toolchain.weights import load_model, loop_term


def kernel_hash(func) -> str:
    """Identity of a kernel: identical PrimFuncs (whatever they are called) are one tuning task."""
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFF:012x}"


def task_name(kernel: str, func) -> str:
    return f"{kernel[:60]}-{kernel_hash(func)}"


def task_hash(name: str) -> str:
    """The :func:`kernel_hash` a :func:`task_name` ends with: the kernel's identity across partitions."""
    return name.rsplit("-", 1)[-1]


def group_kernels(fused_mod) -> list[tuple[str, object]]:
    """(kernel name, PrimFunc) of every call_tir in main, in call order (one per partition group)."""
    from tvm import relax

    out = []
    for block in fused_mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and v.op.name == "relax.call_tir":
                gv = v.args[0]
                out.append((gv.name_hint, fused_mod[gv]))
    return out


@dataclass(frozen=True)
class TaskPlan:
    tasks: tuple[Task, ...]
    funcs: dict = field(hash=False)  # task name -> PrimFunc
    compositions: dict = field(hash=False)  # joined task -> [(mini task, {mini block: joined block}), ...]
    groups: tuple = ()  # the partition's groups (op ids), in order
    group_tasks: tuple = ()  # the task of each group
    split_of: dict = field(default_factory=dict, hash=False)  # group index -> its mini-subgraphs (op ids)
    floor_trials: int = 0  # the trials that give every task its first batch (the budget reaches them all)


def block_names(func) -> list[str]:
    return [b.block for b in block_nests(func)]


def plan_tasks(mod, graph: OpGraph, spec, settings: TuneSettings) -> tuple[object, TaskPlan]:
    """Legalized module → (fused module, the tuning tasks)."""
    method = settings.partition.method
    mark = build.mark_weights if settings.prepack else (lambda m: m)
    plan = partition.plan(settings.partition, mod, spec, graph)
    fused = mark(build.fuse_stock(mod, spec) if method == "stock" else fusion.fuse_groups(mod, plan.groups, spec))
    kernels = group_kernels(fused)
    groups = plan.groups if method != "stock" else [()] * len(kernels)
    funcs, final, order, by_hash = _kernel_tasks(kernels, groups, plan.weights)
    if method == "stock":  # weights of FuseOps kernels: from their own loop nests
        model = load_model()
        for name, task in final.items():
            term = loop_term(OpNode(name, name, "simple", block_nests(funcs[name]), ()))
            final[name] = replace(task, weight=model.c * term + model.b)
    minis_of: dict[str, list] = {}
    split_of: dict[int, list] = {}
    if method == "ago" and settings.reformer:
        split = reform.split_plan(graph, plan, settings.partition.td)
        mini_kernels = group_kernels(mark(fusion.fuse_groups(mod, split.plan.groups, spec)))
        for parent_index, parent in enumerate(order):
            minis = [(k, g) for k, g, p in zip(mini_kernels, split.plan.groups, split.parent_of) if p == parent_index]
            if len(minis) >= 2:  # one reducing op: tuned directly
                minis_of.setdefault(parent, minis)
                split_of[parent_index] = [g for _, g in minis]
    floors = _floors(final, minis_of, set(by_hash))
    final = _with_budgets(final, floors, settings)
    tasks, compositions = _mini_tasks(final, minis_of, funcs, by_hash, graph, plan.weights, settings)
    # a kernel that is also one of a join's minis (an identical op group elsewhere, tuned once) goes with
    # the minis, before every join: a join is composed from its minis' verified schedules
    composed = {name for parts in compositions.values() for name, _ in parts}
    tasks.extend(sorted(final.values(), key=lambda t: t.phase != "kernel" or t.name not in composed))
    return fused, TaskPlan(tuple(tasks), funcs, compositions, tuple(plan.groups), tuple(order), split_of,
                           sum(floors) * settings.unit)


def _kernel_tasks(kernels: list, groups, weights_by_node: dict):
    """A task per distinct kernel: (funcs, {task: Task}, the task of each group, {hash: task})."""
    funcs: dict = {}
    final: dict[str, Task] = {}
    order: list[str] = []
    by_hash: dict[str, str] = {}
    for (kernel, func), group in zip(kernels, groups):
        name = by_hash.setdefault(kernel_hash(func), task_name(kernel, func))
        order.append(name)
        if name in final:
            final[name] = replace(final[name], calls=final[name].calls + 1)
            continue
        weight = sum(weights_by_node[n] for n in group) if group else 1.0
        funcs[name] = func
        final[name] = Task(name, "kernel", tuple(group), None, weight, 0)
    return funcs, final, order, by_hash


def _floors(final: dict[str, Task], minis_of: dict, charged: set) -> list[int]:
    """Each kernel's floor in batches (``charged``: structural hashes already counted): one, and a subgraph
    the reformer splits one per mini it brings and one for its join; a mini identical to a kernel or to an
    earlier join's mini is tuned once, there: it is not charged again."""

    def new_minis(minis: list) -> list:
        """The minis of a join not tuned as a kernel or as an earlier join's mini (joins in order)."""
        fresh = [h for h in dict.fromkeys(kernel_hash(func) for (_, func), _ in minis) if h not in charged]
        charged.update(fresh)
        return fresh
    return [len(new_minis(minis_of[n])) + 1 if n in minis_of else 1 for n in final]


def _with_budgets(final: dict[str, Task], floors: list[int], settings: TuneSettings) -> dict[str, Task]:
    """The kernels with their first-pass budgets, within the user's budget (:func:`budget.budgets`)."""
    weights = [t.weight * t.calls for t in final.values()]  # a kernel's share of the model's time: weight × calls
    first, cap = budget.first_pass(settings.trials, settings.scheduler), settings.trials
    budgets = budget.budgets(weights, first, settings.unit, floors, cap=cap)
    if settings.transfer and 0 in budgets:  # kernels the budget does not reach: a seed each kept back
        # (at most half the budget: the rest still searches)
        budgets = budget.budgets(weights, first, settings.unit, floors, cap=cap - min(budgets.count(0), cap // 2))
    return {n: replace(t, budget=b) for (n, t), b in zip(final.items(), budgets)}


def _mini_tasks(final: dict[str, Task], minis_of: dict, funcs: dict, by_hash: dict, graph: OpGraph,
                weights: dict, settings: TuneSettings) -> tuple[list[Task], dict]:
    """The mini tasks (each split subgraph's budget shared with its join, which ``final`` then holds as
    "joined") and every join's composition: {join: [(mini task, {mini block: joined block}), ...]}."""
    tasks: list[Task] = []
    compositions: dict = {}
    for parent, minis in minis_of.items():
        parent_task = final[parent]
        new = []
        for (kernel, func), mini in minis:
            name = by_hash.setdefault(kernel_hash(func), task_name(kernel, func))
            # every instance composes onto the joined kernel, even when identical minis share a task
            compositions.setdefault(parent, []).append(
                (name, map_blocks(graph, mini, parent_task.members, func, funcs[parent]))
            )
            if name in funcs:
                continue  # an identical mini (or kernel) elsewhere is tuned once
            funcs[name] = func
            new.append(Task(name, "mini", tuple(mini), parent, sum(weights[n] for n in mini), 0))
        mini_budgets, joined = budget.split_budget(parent_task.budget, [t.weight for t in new],
                                                   settings.split_fraction, settings.unit)
        tasks.extend(replace(t, budget=b) for t, b in zip(new, mini_budgets))
        final[parent] = replace(parent_task, phase="joined", budget=joined)
    return tasks, compositions


def first_pass_trials(mod, spec, settings: TuneSettings) -> int:
    """Trials of the session's plan (``mod``: a legalized module): every task's share of the budget
    ("weight"), or its first batch only ("latency")."""
    _, plan = plan_tasks(mod, op_graph(mod), spec, settings)
    return sum(t.budget for t in plan.tasks)


def floor_trials(mod, spec, settings: TuneSettings) -> int:
    """The trials that give every task of ``mod`` (a legalized module) its first batch: a budget under it
    leaves some kernels to seeds or, at compile time, untuned schedules (:func:`budget.reached`, :mod:`untuned`)."""
    _, plan = plan_tasks(mod, op_graph(mod), spec, settings)
    return plan.floor_trials


def map_blocks(graph: OpGraph, mini: tuple[str, ...], joined: tuple[str, ...], mini_func, joined_func) -> dict:
    """Mini kernel block name → joined kernel block name, op by op.

    FuseTIR lays out a group's blocks op after op in binding order, each op contributing its own
    PrimFunc's blocks (renamed on clashes), so the k-th block of an op in one kernel is the k-th
    block of the same op in the other.
    """
    mini_blocks, joined_blocks = block_names(mini_func), block_names(joined_func)
    mini_sizes, joined_sizes = _sizes(graph, mini, mini_blocks), _sizes(graph, joined, joined_blocks)
    if mini_sizes is None or joined_sizes is None:
        return {}  # layout differs from the assumption: no composition for this mini
    start, offset = {}, 0
    for n in joined:
        start[n] = offset
        offset += joined_sizes[n]
    mapping, offset = {}, 0
    for n in mini:
        mine, theirs = mini_blocks[offset:offset + mini_sizes[n]], joined_blocks[start[n]:start[n] + joined_sizes[n]]
        if any(is_copy(b) for b in mine + theirs):  # a concatenation's copies, input by
            # input, onto the same input's (none onto a concatenation the join reads, one select block)
            mapping.update({b: b for b in mine if b in theirs})
        else:
            mapping.update(zip(mine, theirs))
        offset += mini_sizes[n]
    return mapping


def _sizes(graph: OpGraph, members: tuple[str, ...], blocks: list[str]) -> dict | None:
    """Each member op's count of blocks in its kernel (``blocks``, program order): its own PrimFunc's, but for a
    concatenation written in place (toolchain/concat.py): its copies, the blocks named after its block that follow;
    None where they do not add up."""
    nodes = {n.id: n for n in graph.nodes}
    sizes, at = {}, 0
    for n in members:
        size = len(nodes[n].blocks)
        if [b.block for b in nodes[n].blocks] == [CONCAT_BLOCK]:
            copies = 0
            while at + copies < len(blocks) and is_copy(blocks[at + copies]):
                copies += 1
            size = copies or size
        sizes[n], at = size, at + size
    return sizes if at == len(blocks) else None
