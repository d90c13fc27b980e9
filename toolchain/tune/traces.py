"""Schedules as trace JSON (as the database and verified.json hold them): plain values, a trace
replayed as far as it goes, block names mapped, the unroll depth it chose."""

from __future__ import annotations


def plain(obj):
    """A TVM JSON-ish object (trace JSON: Arrays, IntImm, FloatImm, String) as plain Python."""
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj
    if hasattr(obj, "items"):
        return {str(k): plain(v) for k, v in obj.items()}
    if hasattr(obj, "value") and type(obj).__name__ in ("IntImm", "FloatImm", "StringImm"):
        return obj.value
    if isinstance(obj, (list, tuple)) or type(obj).__name__ in ("Array", "List"):
        return [plain(x) for x in obj]
    return str(obj)


LOOKUPS = ("GetSBlock", "GetBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers")


def replay_tolerant(sch, trace_json, max_dropped: int = 8):
    """Replay ``trace_json`` on a copy of ``sch``: (the schedule, the trace JSON that replayed, the kinds
    of the steps left out). The first failing step is found by bisection over prefixes; a step without
    results is dropped and the rest tried again, one with results ends the trace there."""
    from tvm import s_tir

    def replays(trace) -> object | None:
        trial = sch.copy()
        try:
            s_tir.Trace.apply_json_to_schedule(trace, trial)
        except Exception:  # noqa: BLE001 - any failure to replay
            return None
        return trial

    insts, decisions = trace_json
    dropped: list[str] = []
    while True:
        done = replays([insts, decisions])
        if done is not None:
            return done, [insts, decisions], dropped
        lo, hi = 0, len(insts)  # prefix lo replays, prefix hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if replays(_prefix(insts, decisions, mid)) is not None:
                lo = mid
            else:
                hi = mid
        bad = lo  # the first step that fails
        kind = insts[bad][0]
        if insts[bad][3] or len(dropped) >= max_dropped:  # later steps may use its results: stop before it
            dropped.append(f"{kind} and the {len(insts) - bad - 1} steps after it")
            insts, decisions = _prefix(insts, decisions, bad)
            continue
        dropped.append(kind)
        insts = insts[:bad] + insts[bad + 1:]
        decisions = [[d[0] - (d[0] > bad), d[1]] for d in decisions if d[0] != bad]


def _prefix(insts, decisions, n: int):
    return [insts[:n], [d for d in decisions if int(d[0]) < n]]


def rename_blocks(trace_json, mapping: dict):
    """The search part of a trace JSON (up to ``EnterPostproc``) with its block names mapped.

    Postprocessing steps are left out: they depend on the whole function (e.g. the number of the
    root's child blocks), and MetaSchedule applies its postprocessors again to every seed it replays.
    """
    insts, decisions = trace_json
    out = []
    for inst in insts:
        if inst[0] == "EnterPostproc":
            break
        if inst[0] in ("GetSBlock", "GetBlock") and inst[2] and isinstance(inst[2][0], str):
            inst = [inst[0], inst[1], [mapping.get(inst[2][0], inst[2][0]), *inst[2][1:]], *inst[3:]]
        out.append(inst)
    return [out, [d for d in decisions if int(d[0]) < len(out)]]


def _unroll_annotation(trace_json):
    """Where a MetaSchedule trace sets its root's ``meta_schedule.unroll_explicit``: (the value it annotates —
    a random variable or a literal —, {random variable: (its SampleCategorical's index, its choices)}), or None."""
    insts, decisions = trace_json
    chosen = {int(d[0]) for d in decisions}
    sampled = {}
    for index, inst in enumerate(insts):
        if inst[0] == "SampleCategorical" and index in chosen and inst[3]:
            sampled[inst[3][0]] = (index, plain(inst[2][0]))
        if inst[0] == "Annotate" and inst[2] and inst[2][0] == "meta_schedule.unroll_explicit" and len(inst[1]) > 1:
            return inst[1][1], sampled
    return None


def unroll_of(trace_json) -> int | None:
    """The auto-unroll depth a MetaSchedule trace gives its kernel (the value of its root's
    ``meta_schedule.unroll_explicit`` annotation, a sampled categorical), or None."""
    found = _unroll_annotation(trace_json)
    if found is None:
        return None
    value, sampled = found
    if value in sampled:  # a sampled variable, else a literal
        index, choices = sampled[value]
        value = choices[int({int(d[0]): d[1] for d in trace_json[1]}[index])]
    return int(value) if isinstance(value, (int, float)) else None


def with_unroll_at_most(trace_json, limit: int):
    """The trace with its sampled auto-unroll depth (see :func:`unroll_of`) set to the largest choice not
    above ``limit``; unchanged when it samples none or already is."""
    found = _unroll_annotation(trace_json)
    if found is None or found[0] not in found[1]:
        return trace_json
    index, choices = found[1][found[0]]
    choices = [int(v) for v in choices]
    fits = [i for i, v in enumerate(choices) if v <= limit]
    if not fits or (unroll_of(trace_json) or 0) <= limit:
        return trace_json
    best = max(fits, key=lambda i: choices[i])
    insts, decisions = trace_json
    return [insts, [[d[0], best] if int(d[0]) == index else d for d in decisions]]
