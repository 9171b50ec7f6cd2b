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

:class:`SimJob` holds what changes as the job runs (its placement, batch configuration, progress
through its epochs, restarts) and the policy's view of it. Each other concern has a module of its own:
the true step times (:mod:`pollux.sim.step_times`), what the agent measured and fitted
(:mod:`pollux.sim.measurements`), the batch configuration and its limits
(:mod:`pollux.sim.batch_config`), the GPU time charged (:mod:`pollux.sim.gpu_time`), Optimus's
oracle (:mod:`pollux.sim.oracle`) and the typed-cluster context (:mod:`pollux.sim.type_context`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.goodput.efficiency import gain_of
from pollux.policy.base import Cluster, JobView, fixed_shape
from pollux.policy.registry import ADAPTIVE, ELASTIC, RIGID, JobKind
from pollux.sim.batch_config import fixed_batch_config, job_limits, limits_on_type
from pollux.sim.batch_memo import BatchChoiceMemo
from pollux.sim.fit_memo import FitMemo
from pollux.sim.gpu_time import GpuTime
from pollux.sim.measurements import REMEASURE_TOLERANCE, Measurements
from pollux.sim.oracle import PROFILE_GPUS_PER_NODE, ElasticOracle
from pollux.sim.profiles import AppProfile
from pollux.sim.step_times import TrueStepTimes
from pollux.sim.type_context import TypeContext
from pollux.sim.workload import WorkloadJob

#: The per-type models last built: (type index, parameters) pairs, the statistics, the models by type.
TypeModelsMemo = tuple[list[tuple[int, ThroughputParams]], GradStats, dict[str, GoodputModel]]

# PROFILE_GPUS_PER_NODE, REMEASURE_TOLERANCE, TypeContext and fixed_batch_config are re-exported: they
# lived here before their concerns had modules of their own.
__all__ = ["PROFILE_GPUS_PER_NODE", "REMEASURE_TOLERANCE", "SimJob", "TypeContext", "fixed_batch_config"]


class SimJob:
    """One job's state and its simulated agent.

    The job holds what changes as it runs (placement, batch configuration, progress through its
    epochs, restarts) and builds the policy's view from it. What has reasons of its own to change
    lives in the parts it delegates to: the true step times (``true_steps``), what its agent measured
    and fitted (``measured``), the GPU time it is charged (``gpu_time``) and, for an elastic job,
    Optimus's oracle (``elastic_oracle``).
    """

    def __init__(self, spec: WorkloadJob, profile: AppProfile, kind: JobKind, config: Any,
                 num_nodes: int, typed: TypeContext | None = None, bootstrap: bool = False,
                 fit_memo: FitMemo | None = None, batch_memo: BatchChoiceMemo | None = None) -> None:
        """``config`` is the run's :class:`pollux.sim.engine.SimConfig`; ``typed`` is given on a typed
        cluster (None: every node runs ``profile``, as before types existed). ``bootstrap``: on an
        untyped cluster, bootstrap an adaptive job's model from a 1-GPU profile (a type-aware
        policy's one-type case; on a typed cluster ``typed.aware`` decides). ``fit_memo``: the
        simulation's memo of throughput fits (:mod:`pollux.sim.fit_memo`), shared by its jobs;
        ``batch_memo`` its memo of the agents' batch choices (:mod:`pollux.sim.batch_memo`; the job
        keeps one of its own when none is given)."""
        self.spec = spec
        self.name = spec.name
        self.profile = profile
        self.meta = profile.meta
        self.kind = kind
        self.row = np.zeros(num_nodes, dtype=np.int64)
        self._placed: list[tuple[int, int]] = []     # (node index, GPUs) of the row's non-empty nodes
        self._replicas = 0
        # The goodput models last built for the policy's view, by the inputs they came from (see
        # model() and _type_models()): the engine asks every round, the inputs change rarely.
        self._model_memo: tuple[ThroughputParams, GradStats, GoodputModel] | None = None
        self._type_memo: TypeModelsMemo | None = None
        #: Counts the changes to what the policy's view shows but the job's age: a new placement
        #: (apply) and a round run on GPUs (advance). The view last built, with the count and the
        #: cluster it was built for, serves the next round while neither changed (a queued job).
        self._changes = 0
        self._view_memo: tuple[int, Cluster, dict[str, Any]] | None = None
        self.typed = typed
        #: Speed calibration: step times are multiplied by this factor (Sia's per-application slowdown).
        self.factor = float(config.slowdown_of(spec.application))
        #: Or et al.'s jobs: the initial batch on every GPU (the batch grows with the GPUs).
        self.batch_per_gpu = bool(config.batch_per_gpu)
        #: Index (in ``typed.type_names``) of the type that set the last step time: the records' type.
        self.run_type = 0
        self.started = False
        self.restarts = 0
        self.delay_left = 0.0
        self.progress = 0.0
        self.iterations = 0.0
        self.epoch = 0
        self.completion: float | None = None
        self.batch = self.local_bsz = self.accum = 0
        self.batch_sizes: list[int] = []
        self.max_replicas_seen = 0
        self.infeasible = 0
        bounds = job_limits(spec, self.meta, kind, config.max_replicas)
        self.limits = bounds.batch
        self.max_replicas = bounds.max_replicas
        self.aware = typed is not None and typed.aware
        self.true_steps = TrueStepTimes(profile, typed, config.speeds()[:num_nodes], config.balance,
                                        self.factor, self.limits)
        self.measured = Measurements(self.aware, fit_memo)
        self.batch_memo = batch_memo if batch_memo is not None else BatchChoiceMemo()
        self.gpu_time = GpuTime(len(typed.type_names) if typed is not None else 0)
        self.elastic_oracle = ElasticOracle(profile, spec.batch_size) if kind == ELASTIC else None
        # Typed cluster: the batch limits on each type the job has a profile for (its memory bound).
        self.type_limits: dict[int, BatchLimits] = {}
        if typed is not None:
            fixed = spec.application == "ncf" and kind == ADAPTIVE
            for i, t in enumerate(typed.type_names):
                prof = typed.profiles.get(t)
                if prof is not None:
                    self.type_limits[i] = limits_on_type(self.limits, prof.meta, fixed)
            if self.aware:
                self.gpu_time.charge_bootstrap_typed(typed)
                if self.measured.bootstrap_typed(typed, self.type_limits, self.factor):
                    self.max_replicas_seen = 1   # a profile ran on one GPU
        elif bootstrap and kind == ADAPTIVE:
            self.gpu_time.charge_bootstrap_untyped(float(config.bootstrap_s))
            if self.measured.bootstrap_untyped(profile, self.limits, self.factor):
                self.max_replicas_seen = 1   # the profile ran on one GPU

    @property
    def records(self) -> dict[tuple[int, int, int], tuple[float, float]]:
        """The configurations the job ran and their measured times (for a type-unaware policy)."""
        return self.measured.records

    @property
    def fits(self) -> int:
        """How many throughput fits the job's agent has made (each result reports it)."""
        return self.measured.fits

    def _type_models(self) -> dict[str, GoodputModel]:
        assert self.typed is not None
        stats = self.grad_stats()
        fitted = list(self.measured.type_params.items())
        memo = self._type_memo
        if (memo is not None and memo[1] == stats and len(memo[0]) == len(fitted)
                and all(i == k and p is q for (i, p), (k, q) in zip(memo[0], fitted, strict=True))):
            return dict(memo[2])
        m0 = self.meta.init_batch_size
        models = {self.typed.type_names[i]: GoodputModel(p, stats, m0) for i, p in fitted}
        self._type_memo = (fitted, stats, models)
        return dict(models)

    def _cur_limits(self) -> BatchLimits:
        """Batch limits on the type this job runs on (type-aware jobs), else the application's."""
        return self.type_limits.get(self.run_type, self.limits) if self.aware else self.limits

    # ---- what the policy sees ---------------------------------------------------------------

    @property
    def replicas(self) -> int:
        return self._replicas

    @property
    def nodes(self) -> int:
        return len(self._placed)

    def grad_stats(self) -> GradStats:
        batch = self.batch if self.batch > 0 else self.meta.init_batch_size
        return self.profile.grad_stats(self.epoch, batch)

    def model(self) -> GoodputModel | None:
        params = self.measured.params_for(self.run_type)
        if params is None:
            return None
        stats = self.grad_stats()
        memo = self._model_memo
        if memo is not None and memo[0] is params and memo[1] == stats:
            return memo[2]
        model = GoodputModel(params, stats, self.meta.init_batch_size)
        self._model_memo = (params, stats, model)
        return model

    def view(self, now: float, cluster: Cluster) -> JobView:
        """What the policy sees of this job at ``now``.

        Every field but the age is a function of the job's state, which only :meth:`apply` (a new
        placement) and :meth:`advance` (a round on GPUs) change; so while neither has, the view of
        the last round is the answer with the new age. At 2,000 jobs on 64 GPUs most jobs queue for
        hours, and building their views afresh (models, limits per type) was 18 % of the run.
        Successive views share the same allocation and per-type dicts: views are read-only.
        """
        memo = self._view_memo
        if memo is None or memo[0] != self._changes or memo[1] is not cluster:
            memo = (self._changes, cluster, self._view_fields(cluster))
            self._view_memo = memo
        fields = memo[2]
        fields["age_s"] = now - self.spec.submit_time
        return JobView(**fields)

    def _build_view(self, age: float, cluster: Cluster) -> JobView:
        """The view built afresh, from the job's state alone (what :meth:`view` reuses)."""
        return JobView(age_s=age, **self._view_fields(cluster))

    def _view_fields(self, cluster: Cluster) -> dict[str, Any]:
        """Every field of the view but ``age_s``."""
        alloc = {cluster.nodes[i]: g for i, g in self._placed}
        oracle = self.elastic_oracle
        return dict(
            id=self.name, submit_time=self.spec.submit_time,
            restarts=self.restarts, attained_service=self.gpu_time.attained, allocation=alloc,
            min_replicas=0, max_replicas=self.max_replicas, preemptible=True,
            model=self.model() if self.kind == ADAPTIVE else None,
            limits=self.limits, max_replicas_seen=self.max_replicas_seen,
            fixed=fixed_shape(self.spec.num_replicas, self.spec.batch_size),
            oracle=oracle.tell(self.iterations, self.max_replicas) if oracle is not None else None,
            application=self.spec.application,
            type_models=self._type_models() if self.aware else None,
            type_limits=({self.typed.type_names[i]: lim for i, lim in self.type_limits.items()}
                         if self.aware and self.typed is not None else None),
        )

    # ---- the simulated agent ----------------------------------------------------------------

    def choose_batch(self) -> None:
        """Re-choose (M, m, s) for the current allocation (at re-allocations and epoch ends)."""
        r = self.replicas
        if r == 0:
            return
        m0 = self.meta.init_batch_size
        limits = self._cur_limits()
        if self.kind != ADAPTIVE:
            local_max = int(limits.max_local_bsz or 1) if self.aware else self.meta.max_local_bsz
            cfg = fixed_batch_config(self.spec.batch_size, r, m0, local_max)
        elif self.batch_per_gpu:
            top = int(limits.max_batch)
            cfg = fixed_batch_config(min(m0 * r, top), r, m0, int(limits.max_local))
        else:
            start_at_max = self.spec.application == "ncf"
            cfg = self.batch_memo.choose(self.model(), self.nodes, r, limits, m0, start_at_max)
        self.batch, self.local_bsz, self.accum = cfg
        if not self.batch_sizes or self.batch_sizes[-1] != self.batch:
            self.batch_sizes.append(self.batch)

    def observe(self, step: float, sync: float, slowed: bool = False) -> None:
        """Record the configuration just run, on the type it ran on; refit when it is new
        (:meth:`pollux.sim.measurements.Measurements.observe` says when a seen one is re-measured)."""
        key = (self.nodes, self.replicas, self.local_bsz)
        self.measured.observe(key, step, sync, slowed, self.run_type, adaptive=self.kind == ADAPTIVE)

    def apply(self, row: np.ndarray, restart_delay: float) -> None:
        if not row.any() and not self.row.any():
            return                          # still without GPUs: the common case, checked cheaply
        if np.array_equal(row, self.row):
            return
        self._changes += 1
        self.row = row.astype(np.int64).copy()
        self._placed = [(int(i), int(self.row[i])) for i in np.flatnonzero(self.row > 0)]
        self._replicas = int(self.row.sum())
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
        self._changes += 1
        self.gpu_time.hold(self.row, dt, self.typed)
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
            rate = gain_of(self.batch / m0, stats.sqr, stats.var) * rate_iter
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
        """(step, sync, slowed) of the current placement and local batch on this job's nodes
        (:meth:`pollux.sim.step_times.TrueStepTimes.of`); the type that set it is the job's type."""
        timing = self.true_steps.of(self.row, self.local_bsz, self.run_type)
        self.run_type = timing.run_type
        return timing.step, timing.sync, timing.slowed

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
        return gain_of(s, stats.sqr, stats.var) / s
