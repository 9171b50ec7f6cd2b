"""One simulated job and its agent (SPEC §7), split from :mod:`pollux.sim.engine`.

A job's true step time comes from its application's profile for the placement and local batch; on a
typed cluster (issue 13) from the profile of the GPU type its nodes have, and a job whose GPUs span
several types runs at the slowest type's step time (BSP waits for the slowest replica). For a
type-aware policy the job keeps its observed configurations and a fitted throughput model *per type*,
bootstrapped at submission from a short 1-GPU profile on every type it has a profile for (as Sia
does; the bootstrap is charged to its GPU-hours); a type-unaware policy sees one model fitted from
whatever the job ran, on any type. On an untyped cluster (the one-type case) a type-aware policy's
adaptive jobs are bootstrapped the same way from their one profile. A bootstrapped job counts as
having run on one GPU (its profile did), so the exploration cap lets its first allocation go past one
GPU — without that a job's first scale-up is always a restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel, GradStats, fit_throughput, gain, optimize
from pollux.goodput.model import accumulation_plan
from pollux.goodput.records import ThroughputParams
from pollux.policy.base import Cluster, JobView, Oracle, fixed_shape
from pollux.policy.placement import packed_shape
from pollux.policy.registry import ADAPTIVE, ELASTIC, RIGID, JobKind
from pollux.sim.balance import balanced_compute_time
from pollux.sim.profiles import AppProfile
from pollux.sim.workload import WorkloadJob

__all__ = ["PROFILE_GPUS_PER_NODE", "REMEASURE_TOLERANCE", "SimJob", "TypeContext", "fixed_batch_config"]

#: GPUs per node of the machines the profiles were measured on (the oracle's packed placements).
PROFILE_GPUS_PER_NODE = 4
#: A re-measured configuration whose step time moved by more than this fraction is refit.
REMEASURE_TOLERANCE = 0.01
#: Local batch sizes (geometric between the type's bounds) of the 1-GPU bootstrap profile.
BOOTSTRAP_POINTS = 3


@dataclass(frozen=True)
class TypeContext:
    """What a job on a typed cluster needs: its application's profile per GPU type (a type missing
    here cannot run the job), the type index of every node, whether the policy is type-aware, and
    the bootstrap cost in GPU-seconds per type."""

    profiles: dict[str, AppProfile]
    type_names: tuple[str, ...]
    node_type: np.ndarray = field(repr=False)
    aware: bool = False
    bootstrap_s: float = 0.0


def fixed_batch_config(batch: int, replicas: int, init_batch_size: int, max_local_bsz: int
                       ) -> tuple[int, int, int]:
    """(M, m, s) of a fixed global batch on ``replicas`` GPUs: accumulate when m would exceed the max.

    On one GPU a batch above M0 always accumulates at least once (as the Pollux agent would), so
    gradient statistics are measured from several micro-batches.
    """
    limits = BatchLimits(init_batch_size, max(init_batch_size, batch), 1, max_local_bsz, accumulation=True)
    total, m, s, _ = accumulation_plan(batch, replicas, limits)
    return int(total), int(m), int(s)


class SimJob:
    """One job's state and its simulated agent."""

    def __init__(self, spec: WorkloadJob, profile: AppProfile, kind: JobKind, config: Any,
                 num_nodes: int, typed: TypeContext | None = None, bootstrap: bool = False) -> None:
        """``config`` is the run's :class:`pollux.sim.engine.SimConfig`; ``typed`` is given on a typed
        cluster (None: every node runs ``profile``, as before types existed). ``bootstrap``: on an
        untyped cluster, bootstrap an adaptive job's model from a 1-GPU profile (a type-aware
        policy's one-type case; on a typed cluster ``typed.aware`` decides)."""
        self.spec = spec
        self.name = spec.name
        self.profile = profile
        self.meta = profile.meta
        self.kind = kind
        self.row = np.zeros(num_nodes, dtype=np.int64)
        self.speeds = config.speeds()[:num_nodes]
        self.balance = config.balance
        self.typed = typed
        #: Speed calibration: step times are multiplied by this factor (Sia's per-application slowdown).
        self.factor = float(config.slowdown_of(spec.application))
        self._typed_cache: dict[tuple[bytes, float], tuple[float, float, int]] = {}
        #: Index (in ``typed.type_names``) of the type that set the last step time: the records' type.
        self.run_type = 0
        # Configurations last measured on a slow node: re-measured (and refit) when the speed changes.
        self._slowed: set[tuple[int, int, int]] = set()
        self._step_cache: dict[tuple[bytes, int], tuple[float, float, bool]] = {}
        self.started = False
        self.restarts = 0
        self.delay_left = 0.0
        self.attained = 0.0
        self.progress = 0.0
        self.iterations = 0.0
        self.epoch = 0
        self.completion: float | None = None
        self.batch = self.local_bsz = self.accum = 0
        self.batch_sizes: list[int] = []
        self.max_replicas_seen = 0
        # Observed configurations: (nodes, replicas, m) -> (optimiser-step time, accumulation time).
        self.records: dict[tuple[int, int, int], tuple[float, float]] = {}
        self.params: ThroughputParams | None = None
        self.fits = 0
        self.infeasible = 0
        m0 = self.meta.init_batch_size
        if spec.application == "ncf" and kind == ADAPTIVE:
            # Reference setting: ncf under Pollux runs its maximum batch on one replica.
            top = self.meta.max_batch_size
            self.limits = BatchLimits(m0, top, top, top, accumulation=False)
            self.max_replicas = 1
        elif kind == ADAPTIVE:
            self.limits = self.meta.limits(accumulation=True)
            self.max_replicas = config.max_replicas
        else:
            self.limits = BatchLimits(m0, max(m0, spec.batch_size), self.meta.min_local_bsz,
                                      self.meta.max_local_bsz, accumulation=True)
            if kind == ELASTIC:
                cap = 1 if spec.application == "ncf" else spec.batch_size // self.meta.min_local_bsz
                self.max_replicas = max(1, min(cap, config.max_replicas))
            else:
                self.max_replicas = spec.num_replicas
        self._oracle_steps: np.ndarray | None = None
        self._total_iters = profile.iterations_to_finish(spec.batch_size) if kind == ELASTIC else 0.0
        # Typed cluster: GPU-seconds held per type; for type-aware policies, per-type records and fits.
        ntypes = len(typed.type_names) if typed is not None else 0
        self.type_gpu_s = np.zeros(ntypes, dtype=np.float64)
        self.bootstrap_gpu_s = np.zeros(ntypes, dtype=np.float64)
        self.type_records: dict[int, dict[tuple[int, int, int], tuple[float, float]]] = {}
        self.type_params: dict[int, ThroughputParams] = {}
        self.type_limits: dict[int, BatchLimits] = {}
        self.aware = typed is not None and typed.aware
        if typed is not None:
            for i, t in enumerate(typed.type_names):
                prof = typed.profiles.get(t)
                if prof is not None:
                    self.type_limits[i] = self._limits_on(prof.meta)
            if self.aware:
                self._bootstrap()
        elif bootstrap and kind == ADAPTIVE:
            self._bootstrap_untyped(float(config.bootstrap_s))

    def _limits_on(self, meta: Any) -> BatchLimits:
        """This job's batch limits on a type whose profile metadata is ``meta`` (its memory bound)."""
        if self.spec.application == "ncf" and self.kind == ADAPTIVE:
            return self.limits
        return replace(self.limits, max_local_bsz=float(max(meta.max_local_bsz, self.limits.min_local_bsz)))

    def _bootstrap_records(self, prof: AppProfile, lim: BatchLimits) -> dict[tuple[int, int, int],
                                                                         tuple[float, float]]:
        """A 1-GPU profile of ``prof``: step and accumulation times at :data:`BOOTSTRAP_POINTS`
        local batches between the bounds of ``lim``. A profile that measured anything counts as
        having run on one GPU (``max_replicas_seen`` ≥ 1, for the exploration cap)."""
        lo = float(lim.min_local_bsz)
        hi = float(lim.max_local_bsz or lo)
        recs = {}
        for m in sorted({round(float(x)) for x in np.geomspace(lo, max(hi, lo), BOOTSTRAP_POINTS)}):
            step, sync = prof.step_time((1,), m)
            if math.isfinite(step) and math.isfinite(sync):
                recs[(1, 1, m)] = (step * self.factor, (step - sync) * self.factor)
        if recs:
            self.max_replicas_seen = max(self.max_replicas_seen, 1)   # the profile ran on one GPU
        return recs

    def _bootstrap(self) -> None:
        """Sia's bootstrap: a short 1-GPU profile on every type the job has a profile for.

        Records 1-GPU step times at :data:`BOOTSTRAP_POINTS` local batches between the type's bounds
        and fits that type's throughput model from them (the priors pin what one GPU cannot show);
        ``bootstrap_s`` GPU-seconds per type are charged to the job's GPU-hours.
        """
        assert self.typed is not None
        for i, t in enumerate(self.typed.type_names):
            prof = self.typed.profiles.get(t)
            if prof is None:
                continue
            recs = self._bootstrap_records(prof, self.type_limits[i])
            self.bootstrap_gpu_s[i] += self.typed.bootstrap_s
            if recs:
                self.type_records[i] = recs
                self._refit(i)

    def _bootstrap_untyped(self, gpu_s: float) -> None:
        """The bootstrap on an untyped cluster: the same 1-GPU profile into the job's one model,
        ``gpu_s`` GPU-seconds charged to its GPU-hours."""
        self.bootstrap_gpu_s = np.array([gpu_s], dtype=np.float64)
        recs = self._bootstrap_records(self.profile, self.limits)
        if not recs:
            return
        self.records.update(recs)
        self._refit_untyped()

    def _refit(self, i: int) -> None:
        recs = self.type_records[i]
        keys = np.array(list(recs), dtype=np.float64)
        vals = np.array(list(recs.values()), dtype=np.float64)
        fit = fit_throughput(keys[:, 0], keys[:, 1], keys[:, 2], vals[:, 0], vals[:, 1],
                             previous=self.type_params.get(i))
        self.fits += 1
        if fit.ok:
            self.type_params[i] = fit.params

    def _type_models(self) -> dict[str, GoodputModel]:
        assert self.typed is not None
        stats = self.grad_stats()
        m0 = self.meta.init_batch_size
        return {self.typed.type_names[i]: GoodputModel(p, stats, m0) for i, p in self.type_params.items()}

    def _cur_limits(self) -> BatchLimits:
        """Batch limits on the type this job runs on (type-aware jobs), else the application's."""
        return self.type_limits.get(self.run_type, self.limits) if self.aware else self.limits

    # ---- what the policy sees ---------------------------------------------------------------

    @property
    def replicas(self) -> int:
        return int(self.row.sum())

    @property
    def nodes(self) -> int:
        return int(np.count_nonzero(self.row))

    def grad_stats(self) -> GradStats:
        batch = self.batch if self.batch > 0 else self.meta.init_batch_size
        return self.profile.grad_stats(self.epoch, batch)

    def model(self) -> GoodputModel | None:
        if self.aware:
            params = self.type_params.get(self.run_type)
            if params is None and self.type_params:
                params = next(iter(self.type_params.values()))
            return None if params is None else GoodputModel(params, self.grad_stats(),
                                                             self.meta.init_batch_size)
        if self.params is None:
            return None
        return GoodputModel(self.params, self.grad_stats(), self.meta.init_batch_size)

    def view(self, now: float, cluster: Cluster) -> JobView:
        alloc = {cluster.nodes[i]: int(g) for i, g in enumerate(self.row) if g > 0}
        return JobView(
            id=self.name, submit_time=self.spec.submit_time, age_s=now - self.spec.submit_time,
            restarts=self.restarts, attained_service=self.attained, allocation=alloc,
            min_replicas=0, max_replicas=self.max_replicas, preemptible=True,
            model=self.model() if self.kind == ADAPTIVE else None,
            limits=self.limits, max_replicas_seen=self.max_replicas_seen,
            fixed=fixed_shape(self.spec.num_replicas, self.spec.batch_size),
            oracle=self._oracle() if self.kind == ELASTIC else None,
            application=self.spec.application,
            type_models=self._type_models() if self.aware else None,
            type_limits=({self.typed.type_names[i]: lim for i, lim in self.type_limits.items()}
                         if self.aware and self.typed is not None else None),
        )

    def _oracle(self) -> Oracle:
        remaining = max(self._total_iters - self.iterations, 0.0)
        # The step-time table depends only on the fixed batch and the replica cap: build it once per cap.
        if self._oracle_steps is None or self._oracle_steps.size != self.max_replicas + 1:
            steps = np.full(self.max_replicas + 1, np.inf)
            for r in range(1, self.max_replicas + 1):
                placement = packed_shape(r, PROFILE_GPUS_PER_NODE)
                _, m, s = fixed_batch_config(self.spec.batch_size, r, self.meta.init_batch_size,
                                             self.meta.max_local_bsz)
                step, sync = self.profile.step_time(placement, m)
                if math.isfinite(step):
                    steps[r] = step + s * (step - sync)
            self._oracle_steps = steps
        return Oracle(remaining_iterations=remaining, step_time=self._oracle_steps)

    # ---- the simulated agent ----------------------------------------------------------------

    def choose_batch(self) -> None:
        """Re-choose (M, m, s) for the current allocation (at re-allocations and epoch ends)."""
        r = self.replicas
        if r == 0:
            return
        m0 = self.meta.init_batch_size
        cfg: tuple[int, int, int] | None = None
        limits = self._cur_limits()
        if self.kind != ADAPTIVE:
            local_max = int(limits.max_local_bsz or 1) if self.aware else self.meta.max_local_bsz
            cfg = fixed_batch_config(self.spec.batch_size, r, m0, local_max)
        else:
            model = self.model()
            if model is not None:
                plan = optimize(model, self.nodes, r, limits)
                if float(plan.goodput) > 0:
                    cfg = (int(plan.batch_size), int(plan.local_bsz), int(plan.accum_steps))
            if cfg is None:
                # (BatchLimits fills its optional bounds: both are numbers here.)
                top, local_top = limits.max_batch_size, limits.max_local_bsz
                assert top is not None and local_top is not None
                start = int(self.limits.init_batch_size if self.spec.application != "ncf" else top)
                cfg = fixed_batch_config(max(start, r * int(self.limits.min_local_bsz)), r, m0,
                                         int(local_top))
        self.batch, self.local_bsz, self.accum = cfg
        if not self.batch_sizes or self.batch_sizes[-1] != self.batch:
            self.batch_sizes.append(self.batch)

    def observe(self, step: float, sync: float, slowed: bool = False) -> None:
        """Record the configuration just run; refit when it is new (what a live agent reports).

        A configuration already recorded is kept as it was, unless it ran on a slow node then or now
        and its step time moved by more than 1 %: a live agent measures its current speed, so the
        policy must see a job leave (or reach) a slow node.
        """
        key = (self.nodes, self.replicas, self.local_bsz)
        if self.aware:
            # Per type, whatever the job kind (rigid jobs of a type-aware policy need type models too).
            recs = self.type_records.setdefault(self.run_type, {})
            old = recs.get(key)
            if old is None or abs(step - old[0]) > REMEASURE_TOLERANCE * old[0]:
                recs[key] = (step, step - sync)
                self._refit(self.run_type)
            return
        if self.kind != ADAPTIVE:
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

    def _refit_untyped(self) -> None:
        """Refit the job's one throughput model from all its records (untyped cluster)."""
        keys = np.array(list(self.records), dtype=np.float64)
        vals = np.array(list(self.records.values()), dtype=np.float64)
        # A fresh fit from the spec's starting point. Warm starts with a looser tolerance were ~5x faster
        # per fit but gave the policy worse models: workload-6 avg JCT 3118 s instead of 2495 s.
        fit = fit_throughput(keys[:, 0], keys[:, 1], keys[:, 2], vals[:, 0], vals[:, 1],
                             previous=self.params)
        self.fits += 1
        if fit.ok:
            self.params = fit.params

    def apply(self, row: np.ndarray, restart_delay: float) -> None:
        if np.array_equal(row, self.row):
            return
        self.row = row.astype(np.int64).copy()
        if self.typed is not None and self.replicas > 0:
            # The type the job runs on (a mixed placement: refined to the slowest type at each lookup).
            self.run_type = int(self.typed.node_type[np.argmax(self.row > 0)])
        if self.replicas > 0:
            if self.started:
                self.restarts += 1
            self.started = True
            self.delay_left = restart_delay
            self.max_replicas_seen = max(self.max_replicas_seen, self.replicas)
            self.choose_batch()

    def advance(self, now: float, dt: float, slowdown: float) -> None:
        """Run for ``dt`` seconds from ``now``; sets ``completion`` when the last epoch ends."""
        r = self.replicas
        if r == 0 or self.completion is not None:
            return
        self.attained += r * dt
        if self.typed is not None:
            self.type_gpu_s += np.bincount(self.typed.node_type, weights=self.row,
                                           minlength=self.type_gpu_s.size) * dt
        left = dt
        if self.delay_left > 0:
            used = min(self.delay_left, left)
            self.delay_left -= used
            left -= used
        epoch_ends = self.profile.epoch_ends
        m0 = self.meta.init_batch_size
        while left > 1e-9:
            step, sync, slowed = self.step_time()
            if not math.isfinite(step):
                self._infeasible(r)
                return
            self.observe(step, sync, slowed)
            t_iter = (step + self.accum * (step - sync)) / (1.0 - slowdown)
            stats = self.profile.grad_stats(self.epoch, self.batch)
            rate_iter = 1.0 / t_iter
            rate = float(gain(self.batch / m0, stats.sqr, stats.var)) * rate_iter
            target = epoch_ends[self.epoch]
            need = (target - self.progress) / rate
            if need <= left:
                self.progress = target
                self.iterations += need * rate_iter
                left -= need
                self.epoch += 1
                if self.epoch >= len(epoch_ends):
                    self.completion = now + (dt - left)
                    return
                self.choose_batch()
            else:
                self.progress += rate * left
                self.iterations += left * rate_iter
                left = 0.0

    def step_time(self) -> tuple[float, float, bool]:
        """(step, sync, slowed) of the current placement and local batch on this job's nodes.

        The profile's step time, with the compute part (``step − sync``) slowed by the nodes' speed
        factors: the slowest replica's without balancing, the balanced shares' with it
        (:func:`pollux.sim.balance.balanced_compute_time`). ``slowed`` says a slow node was involved.
        """
        step, sync = self._profile_step(self.row, self.local_bsz)
        speeds = self.speeds[self.row > 0]
        if not math.isfinite(step) or speeds.size == 0 or float(speeds.min()) >= 1.0:
            return step, sync, False
        key = (self.row.tobytes(), self.local_bsz)
        hit = self._step_cache.get(key)
        if hit is not None:
            return hit
        per_replica = np.repeat(speeds, self.row[self.row > 0])
        compute = step - sync
        m = float(self.local_bsz)
        if self.balance and per_replica.size > 1:
            half_step, half_sync = self._profile_step(self.row, m / 2)
            lo, hi = self.limits.min_local_bsz, self.limits.max_local_bsz
            compute = balanced_compute_time(per_replica, compute, half_step - half_sync, m,
                                            float(lo or 1), float(hi or m))
        else:
            compute = compute / float(per_replica.min())
        out = (sync + compute, sync, True)
        self._step_cache[key] = out
        return out

    def _profile_step(self, row: np.ndarray, m: float) -> tuple[float, float]:
        """(step, sync) of ``row`` at local batch ``m`` from the true profile(s), times the speed factor.

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
                hit = self._typed_lookup(row, float(m))
                self._typed_cache[key] = hit
            step, sync, self.run_type = hit
        if self.factor != 1.0:
            step, sync = step * self.factor, sync * self.factor
        return step, sync

    def _typed_lookup(self, row: np.ndarray, m: float) -> tuple[float, float, int]:
        assert self.typed is not None
        used = np.unique(self.typed.node_type[row > 0])
        profs = [self.typed.profiles.get(self.typed.type_names[int(i)]) for i in used]
        if not profs or any(p is None for p in profs):
            return math.nan, math.nan, int(used[0]) if used.size else self.run_type
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

    def _infeasible(self, replicas: int) -> None:
        """The profile cannot run this configuration: the job makes no progress this interval.

        An elastic job stops asking for this many replicas (as a live agent that failed to start
        would report), so the policy moves it; a rigid job cannot move, which is an error.
        """
        self.infeasible += 1
        if self.kind == RIGID:
            raise RuntimeError(f"job {self.name} ({self.spec.application}): the profile has no step time "
                               f"for placement {self.row.tolist()} with local batch {self.local_bsz}")
        self.max_replicas = max(1, min(self.max_replicas, replicas - 1))

    def efficiency(self) -> float:
        if self.replicas == 0 or self.batch == 0:
            return 0.0
        stats = self.profile.grad_stats(self.epoch, self.batch)
        s = self.batch / self.meta.init_batch_size
        return float(gain(s, stats.sqr, stats.var)) / s


