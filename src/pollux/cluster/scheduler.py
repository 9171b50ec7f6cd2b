"""One round of the live scheduling loop (SPEC §9), as pure logic over the job store.

Every interval the service builds the policy's inputs from the stored jobs and hints (a job without
hints has no model yet, so the policy assumes it scales linearly, SPEC priors), runs the configured
policy (``pollux`` by default; ``tiresias`` and ``fifo`` also selectable), persists the policy's
state and reports only the allocations that changed. Applying them is the backend's job; for a
backend-less dry run :func:`apply_to_store` records them and the matching state transitions.

No clock is read to make a decision: ``now`` is passed in. ``duration_s`` is measured with
``time.perf_counter`` for reporting only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pollux.cluster.store import JobRecord, JobStore
from pollux.hints import hints_to_model
from pollux.policy.base import Allocation, Cluster, JobView, Policy, check_allocation
from pollux.policy.registry import make_policy

__all__ = ["SCHEDULED_STATES", "RoundResult", "Scheduler", "apply_to_store", "job_view", "schedule_once"]

#: Job states the scheduler allocates for; all others (terminal ones included) are ignored.
SCHEDULED_STATES = ("pending", "starting", "running", "rescaling")
#: Upper bound on a job's replicas when its spec leaves ``max_replicas`` open.
DEFAULT_MAX_REPLICAS = 64


def job_view(job: JobRecord, hints: Mapping[str, Any] | None, now: float,
             total_gpus: int | None = None) -> JobView:
    """What a policy may know about a stored job.

    ``hints`` None (the job has reported none) leaves ``model``/``limits`` None, which the policies
    read as "no model yet": linear scaling. ``max_replicas`` None in the spec becomes 64, or the
    cluster's ``total_gpus`` when that is smaller. ``fixed`` is (max(min_replicas, 1), initial batch)
    for the rigid baselines.
    """
    spec = job.spec
    cap = DEFAULT_MAX_REPLICAS if total_gpus is None else min(DEFAULT_MAX_REPLICAS, max(int(total_gpus), 1))
    max_replicas = cap if spec.max_replicas is None else int(spec.max_replicas)
    max_replicas = max(max_replicas, int(spec.min_replicas), 1)
    model = limits = None
    seen = 0
    if hints is not None:
        model, limits, seen = hints_to_model(hints)
    return JobView(
        id=job.id,
        submit_time=float(job.submit_time),
        age_s=max(float(now) - float(job.submit_time), 0.0),
        restarts=int(job.restarts),
        attained_service=float(job.attained_service),
        allocation=dict(job.allocation),
        min_replicas=int(spec.min_replicas),
        max_replicas=max_replicas,
        preemptible=bool(spec.preemptible),
        model=model,
        limits=limits,
        max_replicas_seen=int(seen),
        fixed=(max(int(spec.min_replicas), 1), int(spec.init_batch_size)),
    )


@dataclass(frozen=True)
class RoundResult:
    """The outcome of one round.

    ``allocation`` is the new full allocation (jobs without GPUs omitted). ``changed`` holds only
    the jobs whose allocation differs from the stored one; a job losing all GPUs maps to ``{}``.
    ``previous`` is the stored allocation the round started from.
    """

    now: float
    policy: str
    allocation: Allocation
    changed: dict[str, dict[str, int]]
    previous: Allocation = field(default_factory=dict)
    duration_s: float = 0.0
    num_jobs: int = 0


def _clean(row: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted((str(n), int(g)) for n, g in row.items() if int(g) > 0))


def schedule_once(store: JobStore, cluster: Cluster, policy: Policy, now: float,
                  rng: np.random.Generator) -> RoundResult:
    """Run one scheduling round; persists the policy state but writes no allocations."""
    start = time.perf_counter()
    jobs = store.list_jobs(SCHEDULED_STATES)
    views = [job_view(j, store.get_hints(j.id), now, cluster.total_gpus) for j in jobs]
    previous: Allocation = {j.id: _clean(j.allocation) for j in jobs if _clean(j.allocation)}
    state = store.load_policy_state(policy.name)
    new_alloc, new_state = policy.decide(views, cluster, {k: dict(v) for k, v in previous.items()},
                                         state, float(now), rng)
    ids = {j.id for j in jobs}
    allocation: Allocation = {}
    for jid, row in new_alloc.items():
        row = _clean(row)
        if jid in ids and row:
            allocation[jid] = row
    check_allocation(allocation, cluster)
    changed = {jid: allocation.get(jid, {}) for jid in sorted(ids)
               if allocation.get(jid, {}) != previous.get(jid, {})}
    store.save_policy_state(policy.name, new_state, now=now)
    return RoundResult(now=float(now), policy=policy.name, allocation=allocation, changed=changed,
                       previous=previous, duration_s=time.perf_counter() - start, num_jobs=len(jobs))


def apply_to_store(store: JobStore, result: RoundResult, now: float) -> None:
    """Record a round's changed allocations and state transitions, as a backend would (dry run).

    pending → starting when a job gets GPUs; running → rescaling when a running job's allocation
    changes to another non-zero one (a restart is counted); starting/rescaling/running → pending when
    it goes to zero. A starting or rescaling job re-allocated to other GPUs keeps its state and counts
    a restart.
    """
    for jid, row in result.changed.items():
        job = store.get_job(jid)
        if job.state not in SCHEDULED_STATES:
            continue
        had = bool(job.allocation)
        if not row:
            if job.state == "rescaling":
                store.transition(jid, "running", reason="rescaled to zero", now=now)
            if job.state != "pending":
                store.transition(jid, "pending", reason="preempted", now=now)
            elif had:
                store.set_allocation(jid, {}, now=now)
            continue
        if job.state == "pending":
            store.transition(jid, "starting", reason="allocated", now=now)
        elif job.state == "running":
            store.transition(jid, "rescaling", reason="re-allocated", now=now)
        if had:
            store.add_restart(jid)
        store.set_allocation(jid, row, now=now)


class Scheduler:
    """The scheduling loop's state between rounds: store, cluster, policy and a seeded generator."""

    def __init__(self, store: JobStore, cluster: Cluster, policy_name: str = "pollux",
                 interval_s: float = 60.0, seed: int = 0, **policy_options: Any) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s!r}")
        self.store = store
        self.cluster = cluster
        self.policy = make_policy(policy_name, **policy_options)
        self.interval_s = float(interval_s)
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.last_result: RoundResult | None = None

    @property
    def policy_name(self) -> str:
        return self.policy.name

    def run_round(self, now: float) -> RoundResult:
        result = schedule_once(self.store, self.cluster, self.policy, now, self.rng)
        self.last_result = result
        return result
