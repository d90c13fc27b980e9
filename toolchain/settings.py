"""The partition knobs as one frozen record, validated once and written as the same JSON into manifest.json
and session.json; ``--keep-inside`` split into its two meanings (a locality unit, a tile cache cap)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from toolchain.errors import AgocError
from toolchain.weights import default_threshold

#: --partition choices: "stock" is TVM's own FuseOps + FuseTIR; "ago" is AGO's clustering built by fuse_groups.
PARTITION_METHODS = ("ago", "stock")
#: Default clustering threshold Td. Fitted weights are in tuning trials (Eq. 1 fitted to budgets), so
#: Td is the most trials one subgraph should need to stabilise; the weight fit file may override it
#: (key "default_threshold"), since Td and the weights only make sense together.
DEFAULT_TD_TRIALS = 48.0  # three 16-candidate search batches
DEFAULT_THRESHOLD = default_threshold(DEFAULT_TD_TRIALS)


class SettingsError(AgocError):
    """A knob is out of range or unknown (the message names the flag and a valid value)."""


@dataclass(frozen=True)
class PartitionSettings:
    """How ops are grouped into kernels."""

    method: str = "ago"  # PARTITION_METHODS
    threshold: float | None = None  # AGO's Td (None: DEFAULT_THRESHOLD, shipped with the weight fit)
    locality_unit: int = 0  # ago: complex-op pairs joined by a tensor of at least this many bytes start as one
    # unit (partition.locality_units); 0: AGO's clustering alone

    @property
    def td(self) -> float:
        """The threshold the clustering uses."""
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold

    def validate(self) -> PartitionSettings:
        """This record, or :class:`SettingsError` naming the flag to fix."""
        if self.method not in PARTITION_METHODS:
            raise SettingsError(f"unknown --partition '{self.method}'; choose ago or stock")
        if self.threshold is not None and not self.threshold > 0:  # NaN included
            raise SettingsError(f"--threshold must be a positive weight (got {self.threshold}); the default is "
                                f"{DEFAULT_THRESHOLD:g}")
        if self.locality_unit < 0:
            raise SettingsError("--keep-inside must be 0 (off) or a size in KiB")
        return self

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> PartitionSettings:
        unknown = sorted(set(d) - {f.name for f in fields(PartitionSettings)})
        if unknown:
            raise SettingsError(f"partition settings {', '.join(unknown)} are not known to this agoc; upgrade agoc")
        return PartitionSettings(**d)


def keep_inside(kib: int) -> tuple[int, int]:
    """``--keep-inside KIB``: (the partition's locality unit, the intensive tile cache cap), both in bytes —
    the one flag sets both, so a pair kept inside one kernel is also tiled to keep its tensor in cache."""
    if kib < 0:
        raise SettingsError("--keep-inside must be 0 (off) or a size in KiB")
    return kib * 1024, kib * 1024
