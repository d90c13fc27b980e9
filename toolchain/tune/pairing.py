"""Whether a joined kernel pays for itself, decided on its kept schedule and its minis' timed together
in turn on one runner (recorded latencies, minutes apart, do not settle it). Why: docs/tuning-internals.md."""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass

from toolchain.errors import first_line
from toolchain.tune.adapter import PAIR_ROUNDS, latency, records_of, time_together
from toolchain.tune.events import Events, Paired, Pairing, ignore
from toolchain.tune.traces import plain

log = logging.getLogger("agoc.tuning")

@dataclass(frozen=True)
class Choice:
    """What ``compile --db`` builds for one joined subgraph, and on which numbers."""

    build: str  # "joined" | "minis"
    joined_ms: float | None
    minis_ms: float | None
    paired: bool  # True: the numbers were measured together (see the module doc)
    reason: str = ""
    joined_bytes: int | None = None  # traffic rule: the model's simulated DRAM bytes with the join built ...
    minis_bytes: int | None = None  # ... and with its minis


#: How ``compile --db`` builds a subgraph the reformer split (``--joins``): rule → what decides.
JOIN_RULES = {
    "latency": "the joined kernel, unless it is slower than its minis together (timed together, see above)",
    "joined": "the joined kernel, whenever it has a verified schedule",
    "minis": "its mini-subgraphs, whenever they all have verified schedules",
    "traffic:GEOMETRY": "the way the whole model moves fewer simulated DRAM bytes in that phone's caches "
                        "(judged under valgrind on this machine, one join flipped at a time: host/bench/judge.py)",
}
TRAFFIC = "traffic:"


def _verified_ms(entry: dict) -> float | None:
    return entry.get("latency_ms") if entry.get("status") == "verified" else None


def minis_ms(minis: list[str], verified: dict) -> float | None:
    """The recorded (verified) latencies of a join's minis added up, one call each; None when it has no
    minis or one of them has no verified schedule."""
    parts = [_verified_ms(verified.get(mini, {})) for mini in minis]
    return math.fsum(parts) if parts and None not in parts else None


def pairing_key(joined: str, minis: list[str], verified: dict) -> dict:
    """The recorded latencies a pairing was made from: it is current while these are unchanged."""
    return {name: _verified_ms(verified.get(name, {})) for name in [joined, *minis]}


def current_pairing(joined: str, minis: list[str], verified: dict) -> dict | None:
    paired = verified.get(joined, {}).get("paired")
    if paired and paired.get("of") == pairing_key(joined, minis, verified):
        return paired
    return None


def choose(joined: str, minis: list[str], verified: dict) -> Choice:
    """Joined kernel or its minis: the minis when they are faster together (measured together when a
    current pairing exists, else the recorded latencies), when only they have verified schedules, or when neither
    has (untuned, minis get better schedules than a join)."""
    joined_ms = _verified_ms(verified.get(joined, {}))
    together = minis_ms(minis, verified)
    if together is None and joined_ms is None and minis:  # the budget reached neither: untuned, a join is a
        # random sample of its space, its minis the record library's schedules (toolchain.tune.untuned.split_untuned)
        status = verified.get(joined, {}).get("status", "untuned")
        return Choice("minis", None, None, False, f"neither it nor all its minis have a verified schedule ({status})")
    if together is None:
        return Choice("joined", joined_ms, None, False)
    if joined_ms is None:
        status = verified.get(joined, {}).get("status", "untuned")
        return Choice("minis", None, together, False, f"no verified schedule ({status})")
    paired = current_pairing(joined, minis, verified)
    if paired is not None:
        faster = paired["ratio"] >= 1.0  # the minis' time over the join's, round by round
        return Choice("joined" if faster else "minis", paired["joined_ms"], paired["minis_ms"], True,
                      "" if faster else "slower than its minis, timed together")
    if together < joined_ms:
        return Choice("minis", joined_ms, together, False, "slower than its minis")
    return Choice("joined", joined_ms, together, False)


def check_rule(rule: str) -> str:
    """``rule`` if it is one of :data:`JOIN_RULES` (``traffic:`` with any geometry name), else ValueError."""
    if rule in JOIN_RULES or (rule.startswith(TRAFFIC) and len(rule) > len(TRAFFIC)):
        return rule
    raise ValueError(f"unknown join rule '{rule}'; one of: {', '.join(JOIN_RULES)}")


def rule_for(joins: str) -> str:
    """``compile --joins`` / a suite variant's ``joins`` as a rule: a plain rule as it is, a geometry
    name as ``traffic:NAME``."""
    return joins if joins in JOIN_RULES else TRAFFIC + joins


def current_traffic(joined: str, minis: list[str], verified: dict, traffic: dict) -> dict | None:
    """The traffic judgement of ``joined`` (``traffic``: one geometry's joins, as host/bench/judge.py stores
    them) when it was made from the schedules kept now, else None."""
    record = traffic.get(joined)
    if record and record.get("of") == pairing_key(joined, minis, verified):
        return record
    return None


def choose_by(rule: str, joined: str, minis: list[str], verified: dict, traffic: dict | None = None) -> Choice:
    """:func:`choose` under a rule of :data:`JOIN_RULES`. Every rule builds the side that has verified
    schedules when only one has (as :func:`choose`). The traffic rule needs a current judgement
    (``traffic``: that geometry's joins); ValueError names the join when there is none."""
    by_latency = choose(joined, minis, verified)
    if rule == "latency" or by_latency.minis_ms is None or by_latency.joined_ms is None:
        return by_latency
    if rule in ("joined", "minis"):
        return Choice(rule, by_latency.joined_ms, by_latency.minis_ms, by_latency.paired,
                      "" if rule == "joined" else "--joins minis")
    record = current_traffic(joined, minis, verified, traffic or {})
    if record is None:
        raise ValueError(f"{joined} has no current traffic judgement for {rule[len(TRAFFIC):]}")
    joined_bytes, minis_bytes = record["joined_bytes"], record["minis_bytes"]  # the model's, per inference
    fewer = joined_bytes < minis_bytes or (joined_bytes == minis_bytes and by_latency.build == "joined")
    return Choice("joined" if fewer else "minis", by_latency.joined_ms, by_latency.minis_ms, by_latency.paired,
                  "" if fewer else f"the model moves no fewer simulated DRAM bytes with it joined "
                  f"({joined_bytes / 1e3:.0f} vs {minis_bytes / 1e3:.0f} KB per inference, "
                  f"{rule[len(TRAFFIC):]} at {record.get('cache', '?')})",
                  joined_bytes, minis_bytes)


def summarise(table: list[list[float]]) -> dict:
    """A pairing from :func:`time_together`'s rows (the joined kernel first, then its minis)."""
    joined = [row[0] for row in table]
    minis = [sum(row[1:]) for row in table]
    return {
        "joined_ms": statistics.median(joined),
        "minis_ms": statistics.median(minis),
        "ratio": statistics.median(m / j for m, j in zip(minis, joined)),  # > 1: the join is faster
        "rounds": len(table),
    }


def time_join(plan, joined: str, joined_trace, verified: dict, spec, settings, measure=None,
              rounds: int = PAIR_ROUNDS) -> dict:
    """``joined`` with ``joined_trace`` timed next to its minis' verified schedules: a pairing
    (:func:`summarise`) without its key. Raises like :func:`time_together`."""
    minis = [name for name, _ in plan.compositions[joined]]
    kernels = [(plan.funcs[joined], joined_trace)] + [(plan.funcs[m], verified[m]["trace"]) for m in minis]
    return summarise(time_together(kernels, spec, settings, measure, rounds))


def pair_joins(plan, verified: dict, spec, settings, measure=None, on_event: Events = ignore,
               rounds: int = PAIR_ROUNDS) -> int:
    """Time every joined kernel with a verified schedule next to its verified minis and store the
    pairing in ``verified`` (updated in place; the caller saves it). Pairings still current are kept.
    A pairing that cannot be measured is recorded as ``paired_error`` (the recorded latencies then
    decide). Returns how many were measured."""
    measured = 0
    for joined, parts in plan.compositions.items():
        minis = [name for name, _ in parts]
        if _verified_ms(verified.get(joined, {})) is None or minis_ms(minis, verified) is None:
            continue
        if current_pairing(joined, minis, verified) is not None:
            continue
        on_event(Pairing(task=joined, minis=len(minis)))
        try:
            paired = {**time_join(plan, joined, verified[joined]["trace"], verified, spec, settings, measure, rounds),
                      "of": pairing_key(joined, minis, verified)}
        except Exception as exc:  # noqa: BLE001 - a pairing is advice: without it the recorded latencies decide
            verified[joined] = {**verified[joined], "paired_error": first_line(exc)}
            on_event(Paired(task=joined, error=first_line(exc)))
            continue
        verified[joined] = {k: v for k, v in verified[joined].items() if k != "paired_error"}
        verified[joined]["paired"] = paired
        measured += 1
        on_event(Paired(task=joined, **{k: paired[k] for k in ("joined_ms", "minis_ms", "ratio")}))
    return measured


def first_batch_vs_minis(joined: str, plan, database, verified: dict, spec, settings,
                         measure=None) -> dict | None:
    """A join's best candidate so far timed next to its minis' verified schedules (a pairing, see
    :func:`toolchain.tune.pairing.time_join`), or None when a mini has none or the timing fails: the
    recorded latencies then decide whether the join yields its budget."""
    records = sorted(records_of(database, plan.funcs[joined]), key=latency)
    minis = [name for name, _ in plan.compositions.get(joined, [])]
    if not records or latency(records[0]) == math.inf or minis_ms(minis, verified) is None:
        return None
    try:
        return time_join(plan, joined, plain(records[0].trace.as_json()), verified, spec, settings, measure)
    except Exception as exc:  # noqa: BLE001 - advice only
        log.info("timing a join next to its minis failed: %s", first_line(exc))
        return None
