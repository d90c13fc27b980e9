"""A tuning database used at compile time, read only: the partition to build (a join built as its minis
where they are faster) and the verified schedules applied to the kernels."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from toolchain import build
from toolchain.tune.applied import apply_records
from toolchain.tune.db import TuneDB
from toolchain.tune.pairing import TRAFFIC, check_rule, choose, choose_by
from toolchain.tune.plan import group_kernels, kernel_hash, task_hash
from toolchain.tune.settings import TuningError

log = logging.getLogger("agoc.tuning")


def unfuse_slower(plan, db_dir: Path, joins: str = "latency", builds: dict[str, str] | None = None,
                  traffic: dict | None = None):
    """The partition to build with ``db_dir``'s schedules: ``plan`` (an AGO plan), except that a
    subgraph whose joined kernel measured slower than its mini-subgraphs together (verified
    latencies, one call each), or has no verified schedule while they all do, is built as those
    minis — fusing must pay for itself, on measurement. ``joins`` names another rule of
    :data:`toolchain.tune.pairing.JOIN_RULES` (e.g. ``traffic:a76``: the database's traffic judgements decide);
    ``builds`` ({join task: "joined" | "minis"}) overrules it for the joins it names (host/bench/judge.py's trial
    builds); ``traffic``, a geometry's judgement made for this build, is read instead of the database's.
    Returns (plan, one record per subgraph unfused: its ops, both latencies, and why). A database without
    the session's layout changes nothing; one made for another partition of the same ops (another threshold, an
    older agoc's rules) is built with that partition, the kernels it tuned."""
    try:
        check_rule(joins)
    except ValueError as exc:
        raise TuningError(str(exc)) from None
    db = TuneDB(db_dir)
    layout = db.layout
    tuned = tuple(tuple(g) for g in layout.get("groups", plan.groups))
    if tuned != tuple(tuple(g) for g in plan.groups):
        if sorted(m for g in tuned for m in g) != sorted(m for g in plan.groups for m in g):
            log.warning("the tuning database was made for another graph: nothing unfused")
            return plan, []
        # the same ops cut otherwise (another threshold, or an agoc whose partition rules have changed since):
        # its kernels as they were tuned, not joins it never measured
        log.warning("the tuning database was made for another partition of this model: built as it was tuned")
        plan = replace(plan, groups=tuned)
    if not layout.get("split_of"):
        return plan, []
    verified = db.verified
    if joins.startswith(TRAFFIC):
        traffic = (db.traffic.get(joins[len(TRAFFIC):], {}) if traffic is None else traffic).get("joins", {})
    groups: list = []
    unfused: list[dict] = []
    for index, group in enumerate(plan.groups):
        name = layout["group_tasks"][index]
        minis = [tuple(m) for m in layout["split_of"].get(str(index), [])]
        try:
            if name in (builds or {}):
                choice = replace(choose(name, layout.get("minis", {}).get(name, []), verified), build=builds[name],
                                 reason=f"built {builds[name]} on request")
            else:
                choice = choose_by(joins, name, layout.get("minis", {}).get(name, []), verified, traffic)
        except ValueError as exc:
            raise TuningError(f"{exc} in {db_dir}: `agoc compile --db {db_dir} --joins {joins[len(TRAFFIC):]}` "
                              "judges the joins first") from None
        if minis and choice.build == "minis":
            groups.extend(minis)
            unfused.append({"ops": list(group), "joined_ms": choice.joined_ms, "minis_ms": choice.minis_ms,
                            "minis": len(minis), "paired": choice.paired, "reason": choice.reason,
                            **({"joined_bytes": choice.joined_bytes, "minis_bytes": choice.minis_bytes}
                               if choice.joined_bytes is not None else {})})
            continue
        groups.append(tuple(group))
    return replace(plan, groups=tuple(groups)), unfused


def apply_verified(fused_mod, db_dir: Path, spec):
    """Schedule the fused module's kernels with the verified records of ``db_dir`` (others stay default);
    a database tuned with ``prepack`` also gets its rewritten weights folded (build.prepack_weights).
    Returns (module, how many kernels got a schedule, each kernel's name → the task it is in ``db_dir``)."""
    db = TuneDB(db_dir)
    if db.session is None:
        raise TuningError(f"{db_dir} is not a tuning database; create one with `agoc tune`")
    prepack = db.settings.prepack
    if prepack:  # the kernels as the session tuned them (same structural hash)
        fused_mod = build.mark_weights(fused_mod)
    verified = db.verified
    by_hash = {task_hash(t.name): t.name for t in db.tasks}
    kernels: list = []
    tasks: dict[str, str] = {}
    seen: set[str] = set()
    for name, func in group_kernels(fused_mod):
        digest = kernel_hash(func)
        if digest in by_hash:
            tasks[name] = by_hash[digest]
        if digest in seen:
            continue
        seen.add(digest)
        entry = verified.get(by_hash.get(digest, ""))
        if not entry or entry.get("status") != "verified":
            continue
        kernels.append((func, entry["trace"], entry["latency_ms"]))
    out = apply_records(fused_mod, kernels, spec)
    return (build.prepack_weights(out, spec) if prepack else out), len(kernels), tasks
