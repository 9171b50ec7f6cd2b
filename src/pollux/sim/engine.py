"""The discrete-time cluster simulator (SPEC §7).

Each scheduling interval the policy decides an allocation from ``JobView``s; every job then advances
for one interval at the speed its *true* profile gives for its placement and batch. What a Pollux job
shows the policy is what a live agent would report: a throughput model fitted only to configurations
the job has actually run (with the exploration priors), never the profile itself.

Timing conventions (reference behaviour): the first decision is at t = 0, then every interval; a job
submitted between two rounds waits for the next; every allocation change costs a restart delay (30 s;
attained service still counts), and a first start pays it too but is not counted as a restart.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel, GradStats, fit_throughput, gain, optimize
from pollux.goodput.model import accumulation_plan
from pollux.goodput.records import ThroughputParams
from pollux.policy.base import Cluster, JobView, Oracle, Policy, fixed_shape, to_matrix
from pollux.policy.placement import packed_shape
from pollux.policy.registry import ADAPTIVE, ELASTIC, RIGID, JobKind, policy_info
from pollux.sim.balance import balanced_compute_time, check_node_speed
from pollux.sim.profiles import AppProfile
from pollux.sim.workload import WorkloadJob

__all__ = ["ADAPTIVE", "BALANCE_SUFFIX", "ELASTIC", "RIGID", "JobResult", "SimConfig", "SimJob", "SimResult",
           "fixed_batch_config", "log_progress", "simulate"]

#: GPUs per node of the machines the profiles were measured on (the oracle's packed placements).
PROFILE_GPUS_PER_NODE = 4
#: Suffix of a run's policy label when its jobs balance their local batches (LB-BSP).
BALANCE_SUFFIX = "+lbbsp"
#: A re-measured configuration whose step time moved by more than this fraction is refit.
REMEASURE_TOLERANCE = 0.01


@dataclass(frozen=True)
class SimConfig:
    """Simulation settings. ``interference`` slows distributed jobs that share a node by that fraction.

    ``node_speed`` gives node ``i`` the speed factor ``node_speed[i]`` in (0, 1] (nodes past its end
    run at 1); ``balance`` makes every job split its batch into LB-BSP shares (see
    :mod:`pollux.sim.balance`). With every node at 1 both change nothing.
    """

    interval: float = 60.0
    restart_delay: float = 30.0
    interference: float = 0.0
    num_nodes: int = 16
    gpus_per_node: int = 4
    max_replicas: int = 64
    seed: int = 0
    max_time: float = 60 * 86400.0
    node_speed: tuple[float, ...] = ()
    balance: bool = False

    def __post_init__(self) -> None:
        check_node_speed(self.node_speed, self.num_nodes)
        if not self.interval > 0:
            raise ValueError(f"interval: must be > 0, got {self.interval}")
        if not 0 <= self.interference < 1:
            raise ValueError(f"interference: must be in [0, 1), got {self.interference}")
        if self.restart_delay < 0:
            raise ValueError(f"restart_delay: must be >= 0, got {self.restart_delay}")

    def speeds(self) -> np.ndarray:
        """Speed factor of every node (``num_nodes`` values; 1 past the end of ``node_speed``)."""
        out = np.ones(self.num_nodes, dtype=np.float64)
        out[:len(self.node_speed)] = self.node_speed
        return out


@dataclass
class JobResult:
    name: str
    application: str
    submit: float
    completion: float | None
    jct: float | None
    restarts: int
    gpu_hours: float
    fits: int
    epochs: int
    active_jobs_mean: float = 0.0
    rho: float | None = None
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class SimResult:
    policy: str
    workload: str
    seed: int
    config: SimConfig
    jobs: list[JobResult]
    timeline: dict[str, list[float]]
    wall_time_s: float
    decide_time_s: float
    rounds: int


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

    def __init__(self, spec: WorkloadJob, profile: AppProfile, kind: JobKind, config: SimConfig,
                 num_nodes: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.profile = profile
        self.meta = profile.meta
        self.kind = kind
        self.row = np.zeros(num_nodes, dtype=np.int64)
        self.speeds = config.speeds()[:num_nodes]
        self.balance = config.balance
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
        if self.kind != ADAPTIVE:
            cfg = fixed_batch_config(self.spec.batch_size, r, m0, self.meta.max_local_bsz)
        else:
            model = self.model()
            if model is not None:
                plan = optimize(model, self.nodes, r, self.limits)
                if float(plan.goodput) > 0:
                    cfg = (int(plan.batch_size), int(plan.local_bsz), int(plan.accum_steps))
            if cfg is None:
                # (BatchLimits fills its optional bounds: both are numbers here.)
                top, local_top = self.limits.max_batch_size, self.limits.max_local_bsz
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
        step, sync = self.profile.step_time(self.row, self.local_bsz)
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
            half_step, half_sync = self.profile.step_time(self.row, m / 2)
            lo, hi = self.limits.min_local_bsz, self.limits.max_local_bsz
            compute = balanced_compute_time(per_replica, compute, half_step - half_sync, m,
                                            float(lo or 1), float(hi or m))
        else:
            compute = compute / float(per_replica.min())
        out = (sync + compute, sync, True)
        self._step_cache[key] = out
        return out

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


def simulate(
    workload: Sequence[WorkloadJob],
    profiles: dict[str, AppProfile],
    policy: Policy,
    config: SimConfig = SimConfig(),
    workload_name: str = "workload",
    progress: Callable[[str], None] | None = None,
) -> SimResult:
    """Run one workload under one policy to completion; deterministic for a given ``config.seed``."""
    started = time.perf_counter()
    kind = policy_info(policy.name).job_kind      # ValueError naming the choices if unknown
    missing = sorted({j.application for j in workload} - set(profiles))
    if missing:
        raise ValueError(f"workload {workload_name}: no profile for application(s) {', '.join(missing)}")
    cluster = Cluster.uniform(config.num_nodes, config.gpus_per_node)
    jobs = [SimJob(spec, profiles[spec.application], kind, config, cluster.num_nodes)
            for spec in sorted(workload, key=lambda j: (j.submit_time, j.name))]
    rng = np.random.default_rng(config.seed)
    state = None
    timeline: dict[str, list[float]] = {"time": [], "allocated_gpus": [], "active_jobs": [],
                                        "running_jobs": [], "efficiency": []}
    decide_time = 0.0
    rounds = 0
    now = 0.0
    pending = list(jobs)          # not yet completed
    next_report = 0.0
    while pending:
        if now > config.max_time:
            raise RuntimeError(f"{policy.name} on {workload_name}: jobs still running after "
                               f"{config.max_time:.0f} s of simulated time")
        active = [j for j in pending if j.spec.submit_time <= now]
        if not active:
            # Nothing to schedule: jump to the round at or after the next submission.
            nxt = min(j.spec.submit_time for j in pending)
            now = math.ceil(nxt / config.interval) * config.interval
            continue
        views = [j.view(now, cluster) for j in active]
        t0 = time.perf_counter()
        alloc, state = policy.decide(views, cluster, state, now, rng)
        decide_time += time.perf_counter() - t0
        rounds += 1
        ids = [j.name for j in active]
        mat = to_matrix(alloc, ids, cluster)
        if np.any(mat.sum(axis=0) > cluster.capacity()):
            raise RuntimeError(f"{policy.name}: allocation exceeds node capacity at t={now:.0f}")
        for j, row in zip(active, mat, strict=True):
            j.apply(row, config.restart_delay)
        slow = _slowdowns(active, config.interference)
        gpus = int(mat.sum())
        eff_num = sum(j.efficiency() * j.replicas for j in active)
        timeline["time"].append(now)
        timeline["allocated_gpus"].append(gpus)
        timeline["active_jobs"].append(len(active))
        timeline["running_jobs"].append(sum(1 for j in active if j.replicas > 0))
        timeline["efficiency"].append(eff_num / gpus if gpus else 0.0)
        for j, sd in zip(active, slow, strict=True):
            j.advance(now, config.interval, sd)
        pending = [j for j in pending if j.completion is None]
        now += config.interval
        if progress is not None and now >= next_report:
            done = len(jobs) - len(pending)
            progress(f"{policy.name:9s} {workload_name}: t={now / 3600:6.2f} h  done {done}/{len(jobs)}"
                     f"  active {len(active)}  gpus {gpus}")
            next_report = now + 3600.0
    results = _job_results(jobs, timeline)
    label = policy.name + (BALANCE_SUFFIX if config.balance else "")
    return SimResult(label, workload_name, config.seed, config, results, timeline,
                     time.perf_counter() - started, decide_time, rounds)


def _slowdowns(active: list[SimJob], interference: float) -> list[float]:
    """Slowdown of each job: distributed jobs sharing a node with another distributed job."""
    if interference <= 0:
        return [0.0] * len(active)
    dist = [j for j in active if j.nodes > 1]
    if len(dist) < 2:
        return [0.0] * len(active)
    rows = np.array([j.row > 0 for j in dist])
    shared = rows.sum(axis=0) > 1
    hit = {id(j) for j, r in zip(dist, rows, strict=True) if np.any(r & shared)}
    return [interference if id(j) in hit else 0.0 for j in active]


def _job_results(jobs: list[SimJob], timeline: dict[str, list[float]]) -> list[JobResult]:
    times = np.asarray(timeline["time"])
    counts = np.asarray(timeline["active_jobs"], dtype=np.float64)
    out = []
    for j in jobs:
        comp = j.completion
        lo = j.spec.submit_time
        hi = comp if comp is not None else (times[-1] if times.size else lo)
        sel = (times >= lo - 1e-9) & (times <= hi)
        mean_active = float(counts[sel].mean()) if np.any(sel) else 1.0
        out.append(JobResult(
            name=j.name, application=j.spec.application, submit=j.spec.submit_time,
            completion=comp, jct=None if comp is None else comp - j.spec.submit_time,
            restarts=j.restarts, gpu_hours=j.attained / 3600.0, fits=j.fits, epochs=j.epoch,
            active_jobs_mean=mean_active, batch_sizes=list(j.batch_sizes),
        ))
    return out


def log_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
