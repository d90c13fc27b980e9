"""Whether a joined kernel pays for itself, decided on measurements taken together.

A join is built as its mini-subgraphs when it is slower than they are together (``tuning.unfuse_slower``).
The verified latencies the tuner recorded cannot settle that on their own: each was measured when its
kernel was tuned, minutes apart, and on these shared 2-vCPU machines the same build runs at different
speeds from one minute — and one process — to the next (measured: one MobileNet-V2 build 2.1-3.2 ms
within one process, 2.0-3.4 ms between processes; a MobileNet-V2 join recorded at 0.048 ms while tuned
ran 0.035 ms next to its minis' 0.034). So once every kernel is tuned, each join's kept schedule and its
minis' kept schedules are built once and timed in turn by one runner — one worker process on this
machine, one device session over RPC (a farm's runner would spread them over its devices) — for a
few rounds, the order reversed every round; the decision reads
the median over rounds of the minis' sum divided by the join's time in the same round.

A pairing is stored with the join's verified entry (``verified.json``, key ``paired``) together with
the recorded latencies it paired; when the join or one of its minis gets a new schedule (a resumed
session) it no longer matches and is measured again.

Latency on this host is one rule of several (``compile --joins``, :data:`JOIN_RULES`): without a phone,
a join can also be judged by the memory traffic it moves in a simulated phone cache
(``host/judge.py``, stored per geometry in the database's ``traffic.json`` with the same key).
"""

from __future__ import annotations

import functools
import math
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: rounds of the join and its minis timed in turn (each round: every kernel once, one measurement)
PAIR_ROUNDS = 3


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
                        "(judged under valgrind on this machine, one join flipped at a time: host/judge.py)",
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
    current pairing exists, else the recorded latencies), or when only they have verified schedules."""
    joined_ms = _verified_ms(verified.get(joined, {}))
    together = minis_ms(minis, verified)
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
    """The traffic judgement of ``joined`` (``traffic``: one geometry's joins, as host/judge.py stores
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


def time_together(kernels: list[tuple[object, object]], spec, settings, measure=None,
                  rounds: int = PAIR_ROUNDS) -> list[list[float]]:
    """Build each (PrimFunc, trace JSON) once and time them all in turn, ``rounds`` times (the order
    reversed every other round), on one runner — one worker process here, one device session over
    RPC (``measure.together``): per round, each kernel's latency in ms.
    Raises RuntimeError naming the kernel when one does not build or run."""
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from toolchain.tuning import _builder, as_built, scheduled

    mods = [scheduled(func, trace).mod for func, trace in kernels]
    built = _builder(spec, measure, 1).build([BuilderInput(m, spec.tvm()) for m in mods])
    try:
        for i, b in enumerate(built):
            if b.error_msg:
                raise RuntimeError(f"kernel {i} does not build: {b.error_msg.strip().splitlines()[-1]}")
        paths = [b.artifact_path for b in built]
        together = getattr(measure, "together", None) or functools.partial(_rounds_on_runner, settings, measure)
        return together(paths, [as_built(m)["main"] for m in mods], rounds)  # the parameters as built
    finally:
        for b in built:  # the builder's files (each in a temporary directory of its own)
            if b.artifact_path:
                path = Path(b.artifact_path)
                path.unlink(missing_ok=True)
                try:
                    path.parent.rmdir()
                except OSError:
                    pass


def round_order(n: int, r: int) -> list[int]:
    """The order kernels are timed in round ``r``: as given, reversed every other round."""
    return list(range(n))[::-1] if r % 2 else list(range(n))


def _rounds_on_runner(settings, measure, paths: list[str], funcs: list, rounds: int) -> list[list[float]]:
    """:func:`time_together`'s rounds on MetaSchedule's runner (this machine's: one worker process)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from toolchain.tuning import _runner

    args = [ms.arg_info.ArgInfo.from_prim_func(func) for func in funcs]
    runner = _runner(settings, measure)
    table: list[list[float]] = []
    with tempfile.TemporaryDirectory(prefix="agoc-pair-") as tmp:
        for r in range(rounds):
            order = round_order(len(paths), r)
            inputs = []
            for i in order:  # a runner may delete what it ran: every round runs its own copy
                source = Path(paths[i])
                copy = Path(tmp) / f"r{r}-k{i}{''.join(source.suffixes)}"
                shutil.copyfile(source, copy)
                inputs.append(RunnerInput(str(copy), "cpu", args[i]))
            row = [0.0] * len(paths)
            for i, future in zip(order, runner.run(inputs)):
                result = future.result()
                if result.error_msg or not result.run_secs:
                    raise RuntimeError(f"kernel {i} failed to run: {(result.error_msg or 'no timing').strip()[-200:]}")
                secs = [float(getattr(x, "value", x)) for x in result.run_secs]
                row[i] = statistics.median(secs) * 1e3
            table.append(row)
    return table


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


def pair_joins(plan, verified: dict, spec, settings, measure=None, on_event=lambda kind, **info: None,
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
        on_event("pairing", task=joined, minis=len(minis))
        try:
            paired = {**time_join(plan, joined, verified[joined]["trace"], verified, spec, settings, measure, rounds),
                      "of": pairing_key(joined, minis, verified)}
        except Exception as exc:  # noqa: BLE001 - a pairing is advice: without it the recorded latencies decide
            from toolchain.errors import first_line

            verified[joined] = {**verified[joined], "paired_error": first_line(exc)}
            on_event("paired", task=joined, error=first_line(exc))
            continue
        verified[joined] = {k: v for k, v in verified[joined].items() if k != "paired_error"}
        verified[joined]["paired"] = paired
        measured += 1
        on_event("paired", task=joined, **{k: paired[k] for k in ("joined_ms", "minis_ms", "ratio")})
    return measured
