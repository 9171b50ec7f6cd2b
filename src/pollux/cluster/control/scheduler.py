"""One round of the live scheduling loop (SPEC §9), as pure logic over the job store.

Every interval the service builds the policy's inputs from the stored jobs and hints (a job without
hints has no model yet, so the policy assumes it scales linearly, SPEC priors), runs the configured
policy (``pollux`` by default; ``tiresias`` and ``fifo`` also selectable) on the cluster it is
given, and reports the allocations that changed with the policy's new state. A round writes
nothing: the controller writes its result, the policy state and every changed allocation, with one
call in one transaction (:meth:`pollux.cluster.state.store.JobStore.apply_round`, from
:meth:`pollux.cluster.control.controller.Controller.run_round`).

One job's numbers never stop scheduling for everyone: :func:`job_view` clamps replica counts to
what the cluster could ever give (so no policy sees ``min_replicas: 1e20``), and when the policy
raises, the round is retried without the jobs that make it raise on their own: such a job is first
tried without its hints (it is then scheduled as a job without a model yet), and left out of the
round only if it still makes the policy raise. Either way the error is logged once per job and
hints, and reported in :attr:`RoundResult.excluded`; a job left out holds no GPUs this round.

No clock is read to make a decision: ``now`` is passed in. ``duration_s`` is measured with
``time.perf_counter`` for reporting only.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pollux.cluster.backends.launcher import gpus_per_replica
from pollux.cluster.control.outlook import OutlookCache
from pollux.cluster.control.parsed_hints import HintsMemo, ParsedHints, hints_text, parse_hints
from pollux.cluster.control.policy_worker import PROCESS_MIN_JOBS, OffloadedPolicy, PolicyWorker
from pollux.cluster.state.lifecycle import SCHEDULED_STATES
from pollux.cluster.state.records import JobOutlook
from pollux.cluster.state.store import JobRecord, JobStore
from pollux.policy.base import (
    Allocation,
    Cluster,
    JobView,
    Policy,
    PolicyState,
    check_allocation,
    fixed_shape,
    state_objective,
)
from pollux.policy.registry import make_policy, policy_info

logger = logging.getLogger("pollux.cluster")

__all__ = ["SCHEDULED_STATES", "RoundResult", "Scheduler", "job_view", "schedule_once"]

#: Upper bound on a job's replicas when its spec leaves ``max_replicas`` open.
DEFAULT_MAX_REPLICAS = 64
#: Bound on any replica count a policy sees when the cluster's size is not known.
REPLICA_BOUND = 2**16


def job_view(job: JobRecord, hints: Mapping[str, Any] | None, now: float,
             total_gpus: int | None = None, gpu_types: Sequence[str] | None = None,
             parsed: ParsedHints | None = None) -> JobView:
    """What a policy may know about a stored job.

    ``hints`` None (the job has reported none) leaves ``model``/``limits`` None, which the policies
    read as "no model yet": linear scaling. ``max_replicas`` None in the spec becomes 64, or the
    cluster's ``total_gpus`` when that is smaller. ``fixed`` is (max(min_replicas, 1), initial batch)
    for the rigid baselines. Replica counts are clamped to ``total_gpus + 1`` (a job whose minimum
    exceeds the cluster still never fits), and a job whose replicas hold G > 1 GPU slots each asks
    for at least G. Raises what :func:`hints_to_model` raises for hints that do not validate.

    ``gpu_types`` (given for a type-aware policy: the cluster's types) fills ``type_models`` /
    ``type_limits``: the job's model on each type it has reported (hints v2 ``gpu_type``/``types``),
    and on a type it has not run on yet its current model — the best guess until it runs there,
    so that the policy may still choose the type (a type absent from ``type_models`` could not run
    the job at all). ``parsed``: those hints already parsed (:class:`.parsed_hints.HintsMemo`, with
    the same ``gpu_types``), so that a round does not validate unchanged hints again.
    """
    spec = job.spec
    total = None if total_gpus is None else max(int(total_gpus), 0)
    bound = REPLICA_BOUND if total is None else total + 1   # above the cluster: "can never fit" stays so
    cap = DEFAULT_MAX_REPLICAS if total is None else min(DEFAULT_MAX_REPLICAS, max(total, 1))
    # A replica holding G GPU slots needs at least G slots allocated (the launcher forms slots // G).
    per = gpus_per_replica(job.spec)   # the launcher's rule, so the two can never disagree
    min_replicas = min(max(int(spec.min_replicas), per if per > 1 else 0), bound)
    max_replicas = cap if spec.max_replicas is None else min(int(spec.max_replicas), bound)
    max_replicas = max(max_replicas, min_replicas, 1)
    if parsed is None and hints is not None:
        parsed = parse_hints(hints, gpu_types)
    return JobView(
        id=job.id,
        submit_time=float(job.submit_time),
        age_s=max(float(now) - float(job.submit_time), 0.0),
        restarts=int(job.restarts),
        attained_service=float(job.attained_service),
        allocation=dict(job.allocation),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        preemptible=bool(spec.preemptible),
        model=None if parsed is None else parsed.model,
        limits=None if parsed is None else parsed.limits,
        max_replicas_seen=0 if parsed is None else parsed.max_replicas_seen,
        fixed=fixed_shape(min_replicas, spec.init_batch_size),
        type_models=None if parsed is None else parsed.type_models,
        type_limits=None if parsed is None else parsed.type_limits,
    )


@dataclass(frozen=True)
class RoundResult:
    """The outcome of one round.

    ``allocation`` is the new full allocation (jobs without GPUs omitted). ``changed`` holds only
    the jobs whose allocation differs from the stored one; a job losing all GPUs maps to ``{}``.
    ``previous`` is the stored allocation the round started from. ``excluded`` maps each job left
    out of the round (it gets no GPUs) to the error that made it so. ``policy_state`` is the state
    the policy left, for the store to save with the allocations.
    """

    now: float
    policy: str
    allocation: Allocation
    changed: dict[str, dict[str, int]]
    previous: Allocation = field(default_factory=dict)
    duration_s: float = 0.0
    num_jobs: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    policy_state: PolicyState | None = None
    #: What the round expects of each job it scheduled, on its new allocation.
    outlook: dict[str, JobOutlook] = field(default_factory=dict)
    #: The objective the policy reached (:func:`pollux.policy.base.state_objective`); None: it keeps none.
    objective: float | None = None


def _clean(row: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted((str(n), int(g)) for n, g in row.items() if int(g) > 0))


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _cluster_text(cluster: Cluster) -> str:
    return json.dumps([list(cluster.nodes), list(cluster.gpus), list(cluster.types)], default=repr)


def _decide(policy: Policy, views: Sequence[JobView], cluster: Cluster, previous: Allocation,
            state: PolicyState | None, now: float, rng: np.random.Generator) -> tuple[Allocation, Any]:
    # The views' allocation is the one the policy reads; ``previous`` (the same stored allocation,
    # cleaned) stays in the signature for the callers.
    return policy.decide(list(views), cluster, state, float(now), rng)


class _Isolation:
    """Which jobs a round schedules without their hints or leaves out, and why (see the module doc).

    Remembered per job with a fingerprint of its hints and the cluster, so a job that keeps sending
    the same bad hints costs one isolation, and its error is logged once. Good hints are parsed once
    per body too (:class:`.parsed_hints.HintsMemo`).
    """

    def __init__(self) -> None:
        self.notes: dict[str, tuple[str, str, str]] = {}   # job → (fingerprint, "bare" | "out", why)
        self.parsed = HintsMemo()

    def note(self, job_id: str, fingerprint: str, action: str, why: str) -> None:
        if self.notes.get(job_id, ("", "", ""))[:2] != (fingerprint, action):
            what = "scheduled without its hints" if action == "bare" else "left out of scheduling"
            logger.error("job %s: %s: %s", job_id, what, why)
        self.notes[job_id] = (fingerprint, action, why)

    def views(self, jobs: Sequence[JobRecord], store: JobStore, cluster: Cluster, now: float,
              excluded: dict[str, str], type_aware: bool = False) -> tuple[list[JobView], dict[str, str]]:
        views, prints = [], {}
        types = cluster.type_names if type_aware else None
        stored = store.hints_of(j.id for j in jobs)   # one query for the round, not one per job
        where = _cluster_text(cluster)
        for j in jobs:
            hints = stored.get(j.id)
            text = hints_text(hints)
            fp = prints[j.id] = f"{text}|{where}"
            known = self.notes.get(j.id)
            if known is not None and known[0] == fp:
                if known[1] == "out":
                    excluded[j.id] = known[2]
                    continue
                hints = None
            try:
                parsed = None if hints is None else self.parsed.parse(j.id, text, hints, types)
                views.append(job_view(j, hints, now, cluster.total_gpus, types, parsed))
                continue
            except Exception as exc:
                why = _why(exc)
            try:
                views.append(job_view(j, None, now, cluster.total_gpus))
                self.note(j.id, fp, "bare", why)
            except Exception as exc:
                self.note(j.id, fp, "out", _why(exc))
                excluded[j.id] = _why(exc)
        self.notes = {k: v for k, v in self.notes.items() if k in prints}
        self.parsed.keep_only(prints)
        return views, prints

    def isolate(self, policy: Policy, views: Sequence[JobView], cluster: Cluster, previous: Allocation,
                state: PolicyState | None, now: float, prints: Mapping[str, str],
                excluded: dict[str, str]) -> list[JobView]:
        """The views with each job that makes the policy raise on its own replaced (without hints)
        or left out."""
        keep = []
        for v in views:
            try:
                _decide(policy, [v], cluster, previous, copy.deepcopy(state), now, np.random.default_rng(0))
                keep.append(v)
                continue
            except Exception as exc:
                why = _why(exc)
            if v.model is not None or v.limits is not None:
                bare = replace(v, model=None, limits=None, max_replicas_seen=0)
                try:
                    _decide(policy, [bare], cluster, previous, copy.deepcopy(state), now,
                            np.random.default_rng(0))
                    keep.append(bare)
                    self.note(v.id, prints[v.id], "bare", why)
                    continue
                except Exception:
                    pass
            self.note(v.id, prints[v.id], "out", why)
            excluded[v.id] = why
        return keep


def _type_aware(policy: Policy) -> bool:
    """Whether ``policy`` reads per-type models: its registry entry says; a policy outside the
    registry (tests, plug-ins) may say so itself with a ``type_aware`` attribute."""
    try:
        return policy_info(policy.name).type_aware
    except ValueError:
        return bool(getattr(policy, "type_aware", False))


def schedule_once(store: JobStore, cluster: Cluster, policy: Policy, now: float,
                  rng: np.random.Generator, isolation: _Isolation | None = None,
                  outlooks: OutlookCache | None = None) -> RoundResult:
    """Run one scheduling round on ``cluster``; reads the store, writes nothing.

    ``outlooks`` keeps the jobs' outlooks between rounds (only changed jobs are recomputed). A job
    whose view cannot be built or that makes the policy raise on its own is scheduled without
    its hints or left out (``RoundResult.excluded``); ``isolation`` remembers such jobs between rounds.
    """
    start = time.perf_counter()
    isolation = _Isolation() if isolation is None else isolation
    jobs = store.list_jobs(SCHEDULED_STATES)
    excluded: dict[str, str] = {}
    views, prints = isolation.views(jobs, store, cluster, now, excluded, type_aware=_type_aware(policy))
    previous: Allocation = {j.id: _clean(j.allocation) for j in jobs if _clean(j.allocation)}
    state = store.load_policy_state(policy.name)
    try:
        new_alloc, new_state = _decide(policy, views, cluster, previous, state, now, rng)
    except Exception:
        if not views:
            raise
        views = isolation.isolate(policy, views, cluster, previous, state, now, prints, excluded)
        new_alloc, new_state = _decide(policy, views, cluster, previous, state, now, rng)
    ids = {j.id for j in jobs}
    allowed = {v.id for v in views}
    allocation: Allocation = {}
    for jid, row in new_alloc.items():
        row = _clean(row)
        if jid in allowed and row:
            allocation[jid] = row
    check_allocation(allocation, cluster)
    changed = {jid: allocation.get(jid, {}) for jid in sorted(ids)
               if allocation.get(jid, {}) != previous.get(jid, {})}
    duration_s = time.perf_counter() - start
    outlook = (OutlookCache() if outlooks is None else outlooks).round(views, allocation, now, prints)
    return RoundResult(now=float(now), policy=policy.name, allocation=allocation, changed=changed,
                       previous=previous, duration_s=duration_s, num_jobs=len(jobs),
                       excluded=excluded, policy_state=new_state, outlook=outlook,
                       objective=state_objective(new_state))


class Scheduler:
    """The scheduling loop's state between rounds: the store it reads, the policy, a seeded
    generator, and which jobs it schedules without their hints or leaves out. It keeps no copy of
    the cluster: each round is given the nodes the controller has just read from the backend."""

    def __init__(self, store: JobStore, policy_name: str = "pollux", interval_s: float = 60.0,
                 seed: int = 0, process_min_jobs: int | None = PROCESS_MIN_JOBS,
                 **policy_options: Any) -> None:
        """``process_min_jobs``: rounds with at least this many jobs are decided in a process of their
        own (:mod:`.policy_worker`), so that the API does not wait for them; None decides every
        round in this process."""
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s!r}")
        if process_min_jobs is not None and process_min_jobs < 1:
            raise ValueError(f"process_min_jobs: must be >= 1 or None, got {process_min_jobs!r}")
        self.store = store
        self.policy = make_policy(policy_name, **policy_options)
        self._made = self.policy
        self.interval_s = float(interval_s)
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.last_result: RoundResult | None = None
        self._isolation = _Isolation()
        self._outlooks = OutlookCache()
        self.process_min_jobs = process_min_jobs
        self.worker = None if process_min_jobs is None else PolicyWorker(policy_name, policy_options)

    def close(self) -> None:
        """Stop the policy's worker process, if one was started (the next large round starts another)."""
        if self.worker is not None:
            self.worker.close()

    @property
    def policy_name(self) -> str:
        return self.policy.name

    def forget_outlooks(self) -> None:
        """Drop the outlooks kept from the last round: the next round computes every job's anew."""
        self._outlooks = OutlookCache()

    def views(self, now: float, total_gpus: int) -> list[JobView]:
        """Every scheduled job as a policy would see it on a cluster of ``total_gpus`` GPUs: what an
        autoscaling rule reads (on the largest cluster the fleet may grow to, as in the simulator).
        A job whose hints do not validate is seen without them, as a round would schedule it."""
        jobs = self.store.list_jobs(SCHEDULED_STATES)
        stored = self.store.hints_of(j.id for j in jobs)
        memo = self._isolation.parsed   # the round's memo: hints parsed once per body
        out = []
        for j in jobs:
            hints = stored.get(j.id)
            try:
                parsed = None if hints is None else memo.parse(j.id, hints_text(hints), hints, None)
                out.append(job_view(j, hints, now, total_gpus, None, parsed))
            except Exception:
                out.append(job_view(j, None, now, total_gpus))
        return out

    def decide(self, now: float, cluster: Cluster) -> RoundResult:
        """One round on ``cluster`` at ``now``; writes nothing (see :func:`schedule_once`)."""
        policy: Policy = self.policy
        if self.worker is not None and self.process_min_jobs is not None and policy is self._made:
            # The worker runs a policy made as this one was; a policy put in its place (tests,
            # plug-ins) decides here.
            policy = OffloadedPolicy(policy, self.worker, self.process_min_jobs)
        result = schedule_once(self.store, cluster, policy, now, self.rng, self._isolation, self._outlooks)
        self.last_result = result
        return result
