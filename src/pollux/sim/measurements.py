"""What a simulated job's agent has measured, and the throughput models fitted to it (SPEC §7).

Split from :class:`pollux.sim.job.SimJob`. A Pollux job shows the policy what a live agent would
report: a throughput model fitted only to the configurations the job has actually run (with the
exploration priors), never its profile (the true step times, :mod:`pollux.sim.step_times`). For a
type-aware policy the configurations and fits are kept *per GPU type*, and bootstrapped at submission
from a short 1-GPU profile on every type the job has a profile for (as Sia does); a type-unaware
policy sees one model fitted from whatever the job ran, on any type. On an untyped cluster a
type-aware policy's adaptive jobs are bootstrapped the same way from their one profile.
"""

from __future__ import annotations

import math

import numpy as np

from pollux.goodput import BatchLimits
from pollux.goodput.records import ThroughputParams
from pollux.goodput.throughput_fit import ThroughputFit
from pollux.sim.fit_memo import FitMemo, fit_records
from pollux.sim.profiles import AppProfile
from pollux.sim.type_context import TypeContext

__all__ = ["BOOTSTRAP_POINTS", "REMEASURE_TOLERANCE", "Measurements", "bootstrap_records"]

#: A re-measured configuration whose step time moved by more than this fraction is refit.
REMEASURE_TOLERANCE = 0.01
#: Local batch sizes (geometric between the type's bounds) of the 1-GPU bootstrap profile.
BOOTSTRAP_POINTS = 3

#: A configuration run: (nodes, replicas, local batch m).
Config = tuple[int, int, int]
#: What was measured of it: (optimiser-step time, accumulation time).
Timing = tuple[float, float]


def bootstrap_records(prof: AppProfile, lim: BatchLimits, factor: float) -> dict[Config, Timing]:
    """A 1-GPU profile of ``prof``: step and accumulation times (times the speed ``factor``) at
    :data:`BOOTSTRAP_POINTS` local batches between the bounds of ``lim``. Empty when the profile
    cannot run any of them."""
    lo = float(lim.min_local_bsz)
    hi = float(lim.max_local_bsz or lo)
    recs = {}
    for m in sorted({round(float(x)) for x in np.geomspace(lo, max(hi, lo), BOOTSTRAP_POINTS)}):
        step, sync = prof.step_time((1,), m)
        if math.isfinite(step) and math.isfinite(sync):
            recs[(1, 1, m)] = (step * factor, (step - sync) * factor)
    return recs


class Measurements:
    """One job's observed configurations and its fitted throughput parameters: one set (a
    type-unaware policy) or one per GPU type index (``aware``), and how many fits were made.

    ``memo`` (the simulation's :class:`pollux.sim.fit_memo.FitMemo`) answers a fit another job of the
    same application already made; ``fits`` counts every fit asked for, remembered or not."""

    def __init__(self, aware: bool, memo: FitMemo | None = None) -> None:
        self.aware = aware
        self.memo = memo
        # Observed configurations: (nodes, replicas, m) -> (optimiser-step time, accumulation time).
        self.records: dict[Config, Timing] = {}
        self.params: ThroughputParams | None = None
        # Configurations last measured on a slow node: re-measured (and refit) when the speed changes.
        self._slowed: set[Config] = set()
        self.type_records: dict[int, dict[Config, Timing]] = {}
        self.type_params: dict[int, ThroughputParams] = {}
        self.fits = 0

    def params_for(self, run_type: int) -> ThroughputParams | None:
        """The parameters the policy sees for a job on type ``run_type``: that type's fit (type-aware;
        any type's while that one has none), else the job's one fit; None before any fit."""
        if not self.aware:
            return self.params
        params = self.type_params.get(run_type)
        if params is None and self.type_params:
            params = next(iter(self.type_params.values()))
        return params

    def observe(self, key: Config, step: float, sync: float, slowed: bool, run_type: int,
                adaptive: bool) -> None:
        """Record the configuration ``key`` just run; refit when it is new (what a live agent reports).

        A configuration already recorded is kept as it was, unless it ran on a slow node then or now
        and its step time moved by more than 1 %: a live agent measures its current speed, so the
        policy must see a job leave (or reach) a slow node. Type-aware measurements are kept for every
        job kind (rigid jobs of a type-aware policy need type models too); otherwise only an adaptive
        job (``adaptive``) measures.
        """
        if self.aware:
            recs = self.type_records.setdefault(run_type, {})
            old = recs.get(key)
            if old is None or abs(step - old[0]) > REMEASURE_TOLERANCE * old[0]:
                recs[key] = (step, step - sync)
                self._refit_type(run_type)
            return
        if not adaptive:
            return
        old = self.records.get(key)
        if old is not None and (not (slowed or key in self._slowed)
                                or abs(step - old[0]) <= REMEASURE_TOLERANCE * old[0]):
            return
        if slowed:
            self._slowed.add(key)
        else:
            self._slowed.discard(key)
        self.records[key] = (step, step - sync)
        self._refit_untyped()

    def bootstrap_typed(self, typed: TypeContext, type_limits: dict[int, BatchLimits],
                        factor: float) -> bool:
        """Sia's bootstrap: a short 1-GPU profile on every type the job has a profile for.

        Records 1-GPU step times at :data:`BOOTSTRAP_POINTS` local batches between the type's bounds
        (``type_limits``) and fits that type's throughput model from them (the priors pin what one
        GPU cannot show). True when some profile measured anything: the job then counts as having
        run on one GPU.
        """
        ran = False
        for i, t in enumerate(typed.type_names):
            prof = typed.profiles.get(t)
            if prof is None:
                continue
            recs = bootstrap_records(prof, type_limits[i], factor)
            if recs:
                ran = True
                self.type_records[i] = recs
                self._refit_type(i)
        return ran

    def bootstrap_untyped(self, prof: AppProfile, limits: BatchLimits, factor: float) -> bool:
        """The bootstrap on an untyped cluster: the same 1-GPU profile into the job's one model.
        True when the profile measured anything."""
        recs = bootstrap_records(prof, limits, factor)
        if not recs:
            return False
        self.records.update(recs)
        self._refit_untyped()
        return True

    def _refit_type(self, i: int) -> None:
        """Refit type ``i``'s throughput model from its records, warm-started from its last fit."""
        fit = self._fit(self.type_records[i], self.type_params.get(i))
        if fit.ok:
            self.type_params[i] = fit.params

    def _refit_untyped(self) -> None:
        """Refit the job's one throughput model from all its records (untyped cluster)."""
        # The full multi-start fit (the previous parameters are one start of several). Warm starts alone
        # with a looser tolerance were ~5x faster per fit but gave the policy worse models: workload-6
        # avg JCT 3118 s instead of 2495 s.
        fit = self._fit(self.records, self.params)
        if fit.ok:
            self.params = fit.params

    def _fit(self, records: dict[Config, Timing], previous: ThroughputParams | None) -> ThroughputFit:
        """One fit of ``records`` from ``previous``, through the memo when the simulation has one."""
        self.fits += 1
        if self.memo is not None:
            return self.memo.fit(records, previous)
        return fit_records(records, previous)
