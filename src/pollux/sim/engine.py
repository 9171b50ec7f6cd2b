"""The discrete-time cluster simulator (SPEC §7).

Each scheduling interval the policy decides an allocation from ``JobView``s; every job then advances
for one interval at the speed its *true* profile gives for its placement and batch. What a Pollux job
shows the policy is what a live agent would report: a throughput model fitted only to configurations
the job has actually run (with the exploration priors), never the profile itself.

Timing conventions (reference behaviour): the first decision is at t = 0, then every interval; a job
submitted between two rounds waits for the next; every allocation change costs a restart delay (30 s;
attained service still counts), and a first start pays it too but is not counted as a restart.

A :class:`RoundHook` (issue 37: an HPO study's trials) sees the jobs after every round and may stop
some of them and submit new ones; without one, a simulation runs exactly as it always has.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pollux.policy.base import Cluster, Policy, to_matrix
from pollux.policy.registry import ADAPTIVE, ELASTIC, RIGID, policy_info
from pollux.sim.balance import check_node_speed
from pollux.sim.batch_memo import BatchChoiceMemo
from pollux.sim.fit_memo import FitMemo
from pollux.sim.fleet import CloudFleet
from pollux.sim.job import (  # noqa: F401 (re-exported: SimJob used to live here)
    PROFILE_GPUS_PER_NODE,
    REMEASURE_TOLERANCE,
    SimJob,
    TypeContext,
    fixed_batch_config,
)
from pollux.sim.profiles import AppProfile
from pollux.sim.workload import WorkloadJob

__all__ = ["ADAPTIVE", "BALANCE_SUFFIX", "ELASTIC", "RIGID", "SIA_SLOWDOWN", "TYPE_SERIES", "JobResult",
           "RoundActions", "RoundHook", "SimConfig", "SimJob", "SimResult", "fixed_batch_config",
           "log_progress", "sia_slowdown", "simulate"]

#: Suffix of a run's policy label when its jobs balance their local batches (LB-BSP).
BALANCE_SUFFIX = "+lbbsp"
#: Sia's artifact calibration of simulated job speed (step times multiplied by these factors).
SIA_SLOWDOWN: tuple[tuple[str, float], ...] = (
    ("bert", 1.2), ("cifar10", 1.8), ("deepspeech2", 1.2), ("gpt_pmp", 1.0), ("imagenet", 1.2),
    ("ncf", 1.5), ("yolov3", 1.2),
)
#: Sia's factor for an application missing from :data:`SIA_SLOWDOWN`.
SIA_DEFAULT_SLOWDOWN = 1.2
#: Timeline series of the GPUs allocated on one GPU type: ``TYPE_SERIES + type`` (typed clusters).
TYPE_SERIES = "gpus:"


def sia_slowdown(applications: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``SimConfig.slowdown`` with Sia's factors for ``applications`` (1.2 for one it does not name)."""
    table = dict(SIA_SLOWDOWN)
    return tuple((a, table.get(a, SIA_DEFAULT_SLOWDOWN)) for a in sorted(set(applications)))


@dataclass(frozen=True)
class SimConfig:
    """Simulation settings. ``interference`` slows distributed jobs that share a node by that fraction.

    ``node_speed`` gives node ``i`` the speed factor ``node_speed[i]`` in (0, 1] (nodes past its end
    run at 1); ``balance`` makes every job split its batch into LB-BSP shares (see
    :mod:`pollux.sim.balance`). With every node at 1 both change nothing.

    ``cluster`` (issue 13): a :class:`pollux.policy.base.Cluster`, typed or not; None is the uniform
    untyped ``num_nodes`` × ``gpus_per_node`` cluster of before. ``slowdown``: ``(application,
    factor)`` pairs multiplying the true step times (:data:`SIA_SLOWDOWN` is Sia's calibration; an
    application not named runs at 1). ``bootstrap_s``: GPU-seconds charged per GPU type for the 1-GPU
    bootstrap profile of a job under a type-aware policy (on an untyped cluster: once).
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
    cluster: Cluster | None = None
    slowdown: tuple[tuple[str, float], ...] = ()
    bootstrap_s: float = 0.0
    #: Adaptive jobs run their initial batch on every GPU, the batch growing with the GPUs to its
    #: maximum, instead of the goodput-optimal batch (Or et al.'s autoscaling jobs, issue 36).
    batch_per_gpu: bool = False

    def __post_init__(self) -> None:
        check_node_speed(self.node_speed, self.node_count)
        for app, f in self.slowdown:
            if not (isinstance(f, int | float) and math.isfinite(f) and f > 0):
                raise ValueError(f"slowdown: factor of {app!r} must be a positive number, got {f!r}")
        if not (math.isfinite(self.bootstrap_s) and self.bootstrap_s >= 0):
            raise ValueError(f"bootstrap_s: must be >= 0, got {self.bootstrap_s}")
        if not self.interval > 0:
            raise ValueError(f"interval: must be > 0, got {self.interval}")
        if not 0 <= self.interference < 1:
            raise ValueError(f"interference: must be in [0, 1), got {self.interference}")
        if self.restart_delay < 0:
            raise ValueError(f"restart_delay: must be >= 0, got {self.restart_delay}")

    @property
    def node_count(self) -> int:
        """Nodes of the simulated cluster (``cluster``'s, else ``num_nodes``)."""
        return self.cluster.num_nodes if self.cluster is not None else self.num_nodes

    def make_cluster(self) -> Cluster:
        """The simulated cluster: ``cluster``, else the uniform untyped one."""
        return self.cluster if self.cluster is not None else Cluster.uniform(self.num_nodes,
                                                                             self.gpus_per_node)

    def slowdown_of(self, application: str) -> float:
        """The step-time factor of ``application`` (1 when ``slowdown`` does not name it)."""
        return dict(self.slowdown).get(application, 1.0)

    def speeds(self) -> np.ndarray:
        """Speed factor of every node (one per node; 1 past the end of ``node_speed``)."""
        out = np.ones(self.node_count, dtype=np.float64)
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
    #: Typed clusters: GPU-hours per GPU type (bootstrap included); empty on an untyped cluster.
    type_gpu_hours: dict[str, float] = field(default_factory=dict)
    #: GPU-hours of the per-type bootstrap profiles (type-aware policies on typed clusters).
    bootstrap_gpu_hours: float = 0.0
    #: A :class:`RoundHook` stopped the job before its last epoch (``completion`` is when it stopped).
    stopped: bool = False


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
    #: Seconds of every ``decide`` call, in round order (the policy-time distribution).
    decide_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RoundActions:
    """What a :class:`RoundHook` asks for after a round.

    ``stop``: names of running jobs to stop at the end of the round (their GPUs are free for the next
    one, the earliest a policy could give them out anyway); ``submit``: new jobs, each submitted no
    earlier than the round's start and scheduled from the next round on, as a submission from the
    workload would be.
    """

    stop: tuple[str, ...] = ()
    submit: tuple[WorkloadJob, ...] = ()


class RoundHook(Protocol):
    """Called after every round in which jobs ran, with the round's start and end and its active jobs.

    Why a hook rather than a second engine: an HPO study decides its next trials from the results of
    the earlier ones, so its workload cannot be given up front, and a pruner stops trials part-way.
    The jobs are the engine's own: read their progress (``epoch``, ``completion``, ``replicas``),
    never change them; changes go through the returned :class:`RoundActions`. A job that completed
    in the round is among them (``completion`` set) this once.
    """

    def after_round(self, start: float, end: float, jobs: Sequence[SimJob]) -> RoundActions: ...


def simulate(
    workload: Sequence[WorkloadJob],
    profiles: dict[str, AppProfile],
    policy: Policy,
    config: SimConfig = SimConfig(),
    workload_name: str = "workload",
    progress: Callable[[str], None] | None = None,
    typed_profiles: dict[str, dict[str, AppProfile]] | None = None,
    fleet: CloudFleet | None = None,
    hook: RoundHook | None = None,
) -> SimResult:
    """Run one workload under one policy to completion; deterministic for a given ``config.seed``.

    ``fleet`` runs it on a simulated cloud (:mod:`pollux.sim.fleet`): the cluster is the fleet's
    largest, the policy sees only its ready nodes each round, and its autoscaling rule sizes it after
    every round (the fleet's report holds the node-hours and the sizes); the timeline then has
    ``nodes_ready``, ``nodes_held`` and ``batch_size`` (the mean global batch of the running jobs,
    chosen for the round's allocation; 0 with none) too.

    On a typed ``config.cluster`` the true speeds come from ``typed_profiles`` (``{app: {type:
    profile}}``, :func:`pollux.sim.typed_profiles.load_typed_profiles`); ``profiles`` then only needs
    to hold the applications' untyped profiles where they exist (gradient statistics are shared).

    ``hook`` (:class:`RoundHook`) may stop running jobs and submit new ones after each round; the
    run ends when no job is left, so a hook that keeps submitting keeps it going (up to
    ``config.max_time``).
    """
    started = time.perf_counter()
    info = policy_info(policy.name)               # ValueError naming the choices if unknown
    kind = info.job_kind
    if fleet is not None and config.cluster is not None:
        raise ValueError("a cloud fleet brings its own cluster: leave SimConfig.cluster unset")
    cluster = config.make_cluster() if fleet is None else fleet.full
    typed = bool(cluster.types)
    if typed and typed_profiles is None:
        raise ValueError(f"workload {workload_name}: a typed cluster needs typed_profiles")
    known = set(profiles) | (set(typed_profiles) if typed and typed_profiles else set())
    node_type = cluster.type_index()
    contexts: dict[str, TypeContext] = {}

    def check_applications(specs: Sequence[WorkloadJob]) -> None:
        """A profile for every application of ``specs`` (and its type context on a typed cluster)."""
        missing = sorted({j.application for j in specs} - known)
        if missing:
            raise ValueError(f"workload {workload_name}: no profile for application(s) {', '.join(missing)}")
        if not (typed and typed_profiles is not None):
            return
        for app in sorted({j.application for j in specs} - set(contexts)):
            per_type = typed_profiles.get(app, {})
            if not any(t in per_type for t in cluster.type_names):
                raise ValueError(f"workload {workload_name}: application {app!r} has no profile for "
                                 f"any GPU type of the cluster ({', '.join(cluster.type_names)})")
            contexts[app] = TypeContext(per_type, cluster.type_names, node_type, info.type_aware,
                                        config.bootstrap_s)

    check_applications(workload)

    def base_profile(app: str) -> AppProfile:
        if app in profiles:
            return profiles[app]
        per_type = contexts[app].profiles
        return next(per_type[t] for t in cluster.type_names if t in per_type)

    # A type-aware policy's jobs are bootstrapped from a 1-GPU profile (as Sia does), on an untyped
    # cluster too: it is the one-type case.
    untyped_bootstrap = info.type_aware and not typed
    # Jobs that ran the same configurations ask for the same fit: made once (results unchanged).
    fit_memo = FitMemo()
    # Jobs with the same model, placement and limits choose the same batch: searched once.
    batch_memo = BatchChoiceMemo()

    def make_job(spec: WorkloadJob) -> SimJob:
        return SimJob(spec, base_profile(spec.application), kind, config, cluster.num_nodes,
                      contexts.get(spec.application), bootstrap=untyped_bootstrap, fit_memo=fit_memo,
                      batch_memo=batch_memo)

    jobs = [make_job(spec) for spec in sorted(workload, key=lambda j: (j.submit_time, j.name))]
    stopped: set[str] = set()
    rng = np.random.default_rng(config.seed)
    state = None
    timeline: dict[str, list[float]] = {"time": [], "allocated_gpus": [], "active_jobs": [],
                                        "running_jobs": [], "efficiency": []}
    if typed:
        timeline.update({f"{TYPE_SERIES}{t}": [] for t in cluster.type_names})
    if fleet is not None:
        timeline.update({"nodes_ready": [], "nodes_held": [], "batch_size": []})
    decide_time = 0.0
    decide_times: list[float] = []
    rounds = 0
    now = 0.0
    pending = list(jobs)          # not yet completed
    next_report = 0.0
    while pending:
        if now > config.max_time:
            raise RuntimeError(f"{policy.name} on {workload_name}: jobs still running after "
                               f"{config.max_time:.0f} s of simulated time")
        active = [j for j in pending if j.spec.submit_time <= now]
        if not active and fleet is None:
            # Nothing to schedule: jump to the round at or after the next submission.
            nxt = min(j.spec.submit_time for j in pending)
            now = math.ceil(nxt / config.interval) * config.interval
            continue
        if not active:
            # A cloud bills its nodes meanwhile: the rule sees an empty queue every round (and nodes
            # asked for before the queue emptied arrive as in any round).
            assert fleet is not None
            fleet.offered(now)
            fleet.after_round([], np.zeros(cluster.num_nodes, dtype=np.int64), now)
            now += config.interval
            continue
        views = [j.view(now, cluster) for j in active]
        offered = cluster if fleet is None else fleet.offered(now)
        t0 = time.perf_counter()
        alloc, state = policy.decide(views, offered, state, now, rng)
        decide_times.append(time.perf_counter() - t0)
        decide_time += decide_times[-1]
        rounds += 1
        ids = [j.name for j in active]
        mat = to_matrix(alloc, ids, cluster)
        if np.any(mat.sum(axis=0) > cluster.capacity()):
            raise RuntimeError(f"{policy.name}: allocation exceeds node capacity at t={now:.0f}")
        if fleet is not None:
            fleet.after_round(views, mat.sum(axis=0), now)
            timeline["nodes_ready"].append(fleet.report.ready[-1])
            timeline["nodes_held"].append(fleet.report.held[-1])
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
        if fleet is not None:
            batches = [j.batch for j in active if j.replicas > 0]
            timeline["batch_size"].append(float(np.mean(batches)) if batches else 0.0)
        if typed:
            by_type = np.bincount(node_type, weights=mat.sum(axis=0), minlength=len(cluster.type_names))
            for t, g in zip(cluster.type_names, by_type.tolist(), strict=True):
                timeline[f"{TYPE_SERIES}{t}"].append(g)
        for j, sd in zip(active, slow, strict=True):
            j.advance(now, config.interval, sd)
        if hook is not None:
            actions = hook.after_round(now, now + config.interval, active)
            added = _apply_actions(actions, active, jobs, stopped, now, config.interval)
            check_applications(added)
            new_jobs = [make_job(spec) for spec in added]
            jobs.extend(new_jobs)
            pending.extend(new_jobs)
        pending = [j for j in pending if j.completion is None]
        now += config.interval
        if progress is not None and now >= next_report:
            done = len(jobs) - len(pending)
            progress(f"{policy.name:9s} {workload_name}: t={now / 3600:6.2f} h  done {done}/{len(jobs)}"
                     f"  active {len(active)}  gpus {gpus}")
            next_report = now + 3600.0
    if fleet is not None:
        fleet.finish(max((j.completion or 0.0) for j in jobs))
    results = _job_results(jobs, timeline, cluster.type_names if typed else (), stopped)
    label = policy.name + (BALANCE_SUFFIX if config.balance else "")
    return SimResult(label, workload_name, config.seed, config, results, timeline,
                     time.perf_counter() - started, decide_time, rounds, decide_times)


def _apply_actions(actions: RoundActions, active: list[SimJob], jobs: list[SimJob], stopped: set[str],
                   start: float, interval: float) -> list[WorkloadJob]:
    """Stop the jobs ``actions`` names at the round's end; return its new jobs, checked.

    Errors name the hook's mistake: a job it may not stop (unknown, not running, already done) or a
    new job whose name is taken or that is submitted before the round it was decided in.
    """
    end = start + interval
    running = {j.name: j for j in active if j.completion is None}
    for name in actions.stop:
        job = running.get(name)
        if job is None:
            raise ValueError(f"round hook: cannot stop job {name!r} at t={end:.0f}: it is not running")
        job.completion = end
        stopped.add(name)
    names = {j.name for j in jobs}
    for spec in actions.submit:
        if spec.name in names:
            raise ValueError(f"round hook: job name {spec.name!r} is already taken")
        if not (math.isfinite(spec.submit_time) and spec.submit_time >= start):
            raise ValueError(f"round hook: job {spec.name!r} submitted at t={spec.submit_time}, before "
                             f"the round at t={start:.0f} that decided it")
        names.add(spec.name)
    return list(actions.submit)


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


def _job_results(jobs: list[SimJob], timeline: dict[str, list[float]],
                 type_names: Sequence[str] = (), stopped: set[str] | None = None) -> list[JobResult]:
    times = np.asarray(timeline["time"])
    counts = np.asarray(timeline["active_jobs"], dtype=np.float64)
    out = []
    for j in jobs:
        comp = j.completion
        lo = j.spec.submit_time
        hi = comp if comp is not None else (times[-1] if times.size else lo)
        sel = (times >= lo - 1e-9) & (times <= hi)
        mean_active = float(counts[sel].mean()) if np.any(sel) else 1.0
        held = j.gpu_time
        boot = float(held.bootstrap_gpu_s.sum())
        type_hours = {t: float(held.type_gpu_s[i] + held.bootstrap_gpu_s[i]) / 3600.0
                      for i, t in enumerate(type_names)}
        out.append(JobResult(
            name=j.name, application=j.spec.application, submit=j.spec.submit_time,
            completion=comp, jct=None if comp is None else comp - j.spec.submit_time,
            restarts=j.restarts, gpu_hours=(held.attained + boot if boot else held.attained) / 3600.0,
            fits=j.fits, epochs=j.epoch, active_jobs_mean=mean_active, batch_sizes=list(j.batch_sizes),
            type_gpu_hours=type_hours, bootstrap_gpu_hours=boot / 3600.0,
            stopped=stopped is not None and j.name in stopped,
        ))
    return out


def log_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
