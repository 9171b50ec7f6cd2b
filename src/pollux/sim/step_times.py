"""A simulated job's true step time on a placement (SPEC §7), split from :class:`pollux.sim.job.SimJob`.

This is what the job really runs at, as the simulator's ground truth: its application's profile for
the placement and local batch, times the speed calibration factor, with the compute part slowed by
slow nodes (balanced or not). What the job's agent has *measured* of it, and the models fitted to
that, are another concern (:mod:`pollux.sim.measurements`): the policy never sees this directly.

On a typed cluster each GPU type has its own profile and a placement that spans types runs at the
slowest type's step time (BSP waits for the slowest replica); the lookup also says which type set
the step, since the job's measurements are kept per type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pollux.goodput import BatchLimits
from pollux.sim.balance import balanced_compute_time
from pollux.sim.profiles import AppProfile
from pollux.sim.type_context import TypeContext

__all__ = ["StepTime", "TrueStepTimes"]


@dataclass(frozen=True)
class StepTime:
    """One optimiser step on a placement: its time, the synchronisation part of it, whether a slow
    node was involved, and the index of the GPU type that set it (the job's type from then on)."""

    step: float
    sync: float
    slowed: bool
    run_type: int


class TrueStepTimes:
    """The true step times of one job: its profile(s), its nodes' speeds, whether it balances its
    local batches, its speed factor, and caches of the lookups (the profiles interpolate, which is
    the simulator's hot spot)."""

    def __init__(self, profile: AppProfile, typed: TypeContext | None, speeds: np.ndarray,
                 balance: bool, factor: float, limits: BatchLimits) -> None:
        """``limits`` are the application's batch limits: balancing keeps each replica's share of the
        local batch within their local bounds."""
        self.profile = profile
        self.typed = typed
        self.speeds = speeds
        self.balance = balance
        self.factor = factor
        self.limits = limits
        self._typed_cache: dict[tuple[bytes, float], tuple[float, float, int]] = {}
        self._step_cache: dict[tuple[bytes, int], tuple[float, float, bool]] = {}

    def of(self, row: np.ndarray, local_bsz: int, run_type: int) -> StepTime:
        """The step of placement ``row`` (GPUs per node) at local batch ``local_bsz``.

        The profile's step time, with the compute part (``step − sync``) slowed by the nodes' speed
        factors: the slowest replica's without balancing, the balanced shares' with it
        (:func:`pollux.sim.balance.balanced_compute_time`). ``run_type`` is the job's type so far,
        kept when no lookup can name one; each lookup made here may replace it, the last one winning.
        """
        step, sync, run_type = self._profile_step(row, local_bsz, run_type)
        speeds = self.speeds[row > 0]
        if not math.isfinite(step) or speeds.size == 0 or float(speeds.min()) >= 1.0:
            return StepTime(step, sync, False, run_type)
        key = (row.tobytes(), local_bsz)
        hit = self._step_cache.get(key)
        if hit is not None:
            return StepTime(hit[0], hit[1], hit[2], run_type)
        per_replica = np.repeat(speeds, row[row > 0])
        compute = step - sync
        m = float(local_bsz)
        if self.balance and per_replica.size > 1:
            half_step, half_sync, run_type = self._profile_step(row, m / 2, run_type)
            lo, hi = self.limits.min_local_bsz, self.limits.max_local_bsz
            compute = balanced_compute_time(per_replica, compute, half_step - half_sync, m,
                                            float(lo or 1), float(hi or m))
        else:
            compute = compute / float(per_replica.min())
        out = (sync + compute, sync, True)
        self._step_cache[key] = out
        return StepTime(out[0], out[1], out[2], run_type)

    def _profile_step(self, row: np.ndarray, m: float, run_type: int) -> tuple[float, float, int]:
        """(step, sync, type) of ``row`` at local batch ``m`` from the true profile(s), times the speed
        factor; ``type`` is ``run_type`` on an untyped cluster.

        Untyped: the application's profile. Typed: each type the row touches is looked up for the whole
        placement on that type's profile; the slowest type sets the step (BSP waits for it). A type
        whose profile cannot interpolate that placement (e.g. more nodes than it was measured on) is
        estimated from another type's step for the placement, scaled by the two types' 1-GPU step
        ratio at ``m``; a type with no profile for the application cannot run it (NaN).
        """
        if self.typed is None:
            step, sync = self.profile.step_time(row, m)
        else:
            key = (row.tobytes(), float(m))
            hit = self._typed_cache.get(key)
            if hit is None:
                hit = self._typed_lookup(row, float(m), run_type)
                self._typed_cache[key] = hit
            step, sync, run_type = hit
        if self.factor != 1.0:
            step, sync = step * self.factor, sync * self.factor
        return step, sync, run_type

    def _typed_lookup(self, row: np.ndarray, m: float, run_type: int) -> tuple[float, float, int]:
        assert self.typed is not None
        used = np.unique(self.typed.node_type[row > 0])
        profs = [self.typed.profiles.get(self.typed.type_names[int(i)]) for i in used]
        if not profs or any(p is None for p in profs):
            return math.nan, math.nan, int(used[0]) if used.size else run_type
        vals = [p.step_time(row, m) for p in profs if p is not None]
        if len(vals) > 1 or not math.isfinite(vals[0][0]):
            ref = next((v for v in vals if math.isfinite(v[0])), None)
            ref_i = next((k for k, v in enumerate(vals) if math.isfinite(v[0])), None)
            if ref is None:
                others = [p for t, p in self.typed.profiles.items() if p not in profs]
                ref_p = next((p for p in others if math.isfinite(p.step_time(row, m)[0])), None)
                if ref_p is None:
                    return math.nan, math.nan, int(used[0])
                ref, one_ref = ref_p.step_time(row, m), ref_p.step_time((1,), m)[0]
            else:
                one_ref = profs[ref_i].step_time((1,), m)[0]  # type: ignore[union-attr, index]
            for k, p in enumerate(profs):
                if not math.isfinite(vals[k][0]) and p is not None:
                    ratio = p.step_time((1,), m)[0] / one_ref
                    vals[k] = (ref[0] * ratio, ref[1] * ratio)
        k = int(np.argmax([v[0] if math.isfinite(v[0]) else math.inf for v in vals]))
        return vals[k][0], vals[k][1], int(used[k])
