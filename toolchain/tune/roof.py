"""A tuning session's compute roof (``agoc tune --roof``): a register-blocked matmul timed where the candidates run,
and the share of it a kernel's best time reaches. Why and the figures: docs/tuning.md (Stopping at the roof)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from toolchain import roofline
from toolchain.tune import adapter
from toolchain.tune.events import Events, Roof

#: a kernel this many times the roof's rate has the probe timed again, at most REPROBES times a session
REPROBE_ABOVE, REPROBES = 1.1, 2


@dataclass
class RoofMeter:
    """The roof of one session: measured once at its start (:meth:`start`), raised as kernels come in above it."""

    spec: object
    settings: object  # TuneSettings: its roof_share
    measure: object = None  # adapter.Measure: where candidates run (None: this machine)
    rate: float | None = None  # the probe's multiply-adds per ms (None: not measured)
    probe: tuple | None = None  # (the probe's schedule, its description) once measured
    probes: int = 0  # times the probe was timed again (:meth:`raise_for`)
    costs: dict = field(default_factory=dict)  # kernel name -> roofline.Cost, counted when first needed
    above: dict = field(default_factory=dict)  # kernel name -> its rate, for kernels that ran above the probe

    def start(self, on_event: Events) -> None:
        """Time :data:`roofline.ROOF_PROBE` with its register block, twice, the faster kept: a session's first
        measurement may run at half the rate (said; a probe that does not build or run leaves the rate None)."""
        if self.settings.roof_share <= 0:
            return
        from toolchain.targets import DTYPES
        from toolchain.tune.untuned import block_schedule

        dtype = DTYPES[getattr(self.spec, "precision", "fp32")]
        sch, shape = block_schedule(roofline.roof_probe(dtype), self.spec)
        name = (f"a {'×'.join(map(str, roofline.ROOF_PROBE))} {'' if dtype == 'float32' else dtype + ' '}matmul"
                + (f" in {shape} register blocks" if shape else ""))
        rate = max((r for r in (self.time(sch) for _ in range(2)) if r), default=None) if sch is not None else None
        if rate is None:
            on_event(Roof(gflops=None, share=self.settings.roof_share, probe=name,
                          reason="it has no register block here" if sch is None else "it did not build or run"))
            return
        self.rate, self.probe = rate, (sch, name)
        on_event(Roof(gflops=roofline.gflops(rate), share=self.settings.roof_share, probe=name))

    def time(self, sch) -> float | None:
        """The probe's multiply-adds per ms, timed like a candidate (None: it did not build or run)."""
        secs = adapter.measure_schedule(sch, self.spec, self.settings, self.measure)
        if not secs or min(secs) <= 0:
            return None
        return math.prod(roofline.ROOF_PROBE) / (statistics.median(secs) * 1e3)  # its multiply-adds

    def cost(self, name: str, func) -> roofline.Cost:
        if name not in self.costs:
            self.costs[name] = roofline.cost(func)
        return self.costs[name]

    def roof(self, name: str | None = None) -> float | None:
        """The roof kernel ``name`` is judged against: the faster of the probe and every *other* kernel that ran
        above it (judged against its own rate, a kernel that raised the roof would reach it, and stop however far
        from the peak it is)."""
        if self.rate is None:
            return None
        return max([self.rate] + [r for n, r in self.above.items() if n != name])

    def share(self, name: str, func, best_ms: float | None) -> float | None:
        """The share of the roof kernel ``name`` (``func``) reaches at ``best_ms`` (None: no roof or no time)."""
        return roofline.roof_share(self.cost(name, func), best_ms, self.roof(name)) if self.rate is not None else None

    def reached(self, name: str, func, best_ms: float | None) -> bool:
        """Whether kernel ``name`` is within the roof's share of it: not where it runs well above the roof (above the
        probe and every other kernel, how far it is from the target's peak is not known: it is searched on)."""
        share = self.share(name, func, best_ms)
        return share is not None and 0 < self.settings.roof_share <= share <= REPROBE_ABOVE

    def raise_for(self, name: str, func, best_ms: float | None, on_event: Events) -> None:
        """A kernel measured well above the roof: the probe timed once more (at most :data:`REPROBES` times: a probe
        timed while the machine was slow for a moment sets the roof too low), then the roof the faster of the
        probe and the kernel — for the other kernels (:meth:`roof`)."""
        share = self.share(name, func, best_ms)
        if share is None or share <= REPROBE_ABOVE:
            return
        kernel = self.roof(name) * share
        if self.probes < REPROBES and self.probe is not None:
            self.probes += 1
            self.rate = max(self.time(self.probe[0]) or 0.0, self.rate)
            on_event(Roof(gflops=roofline.gflops(max(self.roof(), kernel)), share=self.settings.roof_share,
                          probe=self.probe[1], reason=f"timed again: {name} ran {share:.0%} of it"))
        if kernel > self.rate:
            self.above[name] = kernel  # its best: it only gets faster
