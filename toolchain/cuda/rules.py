"""APOLLO's aggregation rules as tables (Table 1: partition phase; Table 2: memory stitching).

A rule joins a producer micro-graph ``G_p`` and a consumer ``G_c`` joined by
an edge and names the type of the merged ``G_a``. Algorithm 1 tries the
Table 1 rules in the order given (the order is the priority); Algorithm 2
tries the Table 2 rules, which all start from a reduction. Rules not in the
tables are deliberately absent: e.g. a reduction followed by anything is
not joined in the partition phase (its consumers wait for memory stitching),
and reshapes join nothing (APOLLO removed that rule after its loop optimizer
could not schedule it).

``source`` says where a row comes from. The one agoc row ("6-matmul-bias")
lets a matmul take a broadcast epilogue (bias add): in APOLLO's terms a rule
learned from the downstream optimizer's feedback — TVM's dlight Matmul
schedule inlines broadcast epilogues, and without it every bias add of a
transformer would be a kernel of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

EW, BC, RED = "element-wise", "broadcast", "reduction"


@dataclass(frozen=True)
class Rule:
    name: str
    producer: tuple[str, ...]  # labels G_p may have
    consumer: tuple[str, ...]  # labels G_c may have
    result: str  # label of G_a ("=producer"/"=consumer" keep that side's label)
    source: str

    def matches(self, p: str, c: str) -> bool:
        return p in self.producer and c in self.consumer

    def merged(self, p: str, c: str) -> str:
        if self.result == "=producer":
            return p
        if self.result == "=consumer":
            return c
        return self.result

    def to_json(self) -> dict:
        return {"rule": self.name, "producer": "/".join(self.producer), "consumer": "/".join(self.consumer),
                "result": self.result, "source": self.source}


#: Table 1 (APOLLO §3.3), in priority order; the 6-matmul rows share a priority, as do the 6-conv rows.
AGGREGATION_RULES: tuple[Rule, ...] = (
    Rule("1", (EW,), (EW,), EW, "APOLLO Table 1"),
    Rule("2", (BC,), (EW,), BC, "APOLLO Table 1"),
    Rule("3", (BC,), (BC,), BC, "APOLLO Table 1"),
    Rule("4", (EW,), (RED,), RED, "APOLLO Table 1"),
    Rule("5", (BC,), (RED,), RED, "APOLLO Table 1"),
    Rule("6-matmul", ("matmul",), (EW,), "matmul", "APOLLO Table 1"),
    Rule("6-matmul", (EW,), ("matmul",), "matmul", "APOLLO Table 1"),
    Rule("6-matmul-bias", ("matmul",), (BC,), "matmul", "agoc: dlight's Matmul rule inlines broadcast epilogues"),
    Rule("6-conv", ("conv",), (EW,), "conv", "APOLLO Table 1"),
    Rule("6-conv", (EW,), ("conv",), "conv", "APOLLO Table 1"),
)

#: Table 1 rows agoc does not apply, with the downstream optimizer's feedback that removed them (APOLLO §3.3
#: removes rules the same way): dlight has no schedule for element-wise ops + a transpose in one PrimFunc;
#: its Fallback rule launches one kernel per block, more than without the merge.
DISABLED_RULES: tuple[tuple[Rule, str], ...] = (
    (Rule("6-transpose", (EW, BC), ("transpose",), "transpose", "APOLLO Table 1"),
     "feedback: dlight's Fallback schedules element-wise + transpose as one kernel per block"),
)

#: Table 2 (APOLLO §4.2): memory stitching, every rule starting from a reduction.
STITCH_RULES: tuple[Rule, ...] = (
    Rule("7", (RED,), (EW, BC), RED, "APOLLO Table 2"),
    Rule("8", (RED,), (RED,), RED, "APOLLO Table 2"),
)

ALL_RULES = AGGREGATION_RULES + STITCH_RULES


def find(rules, producer: str, consumer: str) -> Rule | None:
    """The first rule of ``rules`` joining ``producer`` → ``consumer`` (labels), or None."""
    return next((r for r in rules if r.matches(producer, consumer)), None)


def priority_groups(rules) -> list[tuple[Rule, ...]]:
    """Rules grouped by name in table order: Algorithm 1 runs each group to a fixed point before the next."""
    groups: list[list[Rule]] = []
    for rule in rules:
        if groups and _base(groups[-1][0].name) == _base(rule.name):
            groups[-1].append(rule)
        else:
            groups.append([rule])
    return [tuple(g) for g in groups]


def _base(name: str) -> str:
    # "6-matmul" and "6-matmul-bias" share a priority; "6-conv" rows share theirs
    parts = name.split("-")
    return "-".join(parts[:2])
