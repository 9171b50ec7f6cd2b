"""Launches in flight: from a job's allocation to a running group of replicas, without waiting.

A launch (:class:`~pollux.cluster.backends.launcher.Launch`) begins when the controller finds a job
with GPUs and no run: it checks the placement can hold the job's replicas, creates their actors and
asks rank 0 for a rendezvous port. Each later tick moves it one step from answers already there
(rendezvous, then every replica's start), until all have started (a running
:class:`~pollux.cluster.control.records.Group`), or it fails (counted like a failed run: back to
pending with a back-off, or failed after ``max_retries``), or the job no longer wants it (cancelled
or re-allocated: what started is stopped). A launch waits, counting nothing, while runs still
stopping hold what it needs on its nodes.

:class:`Launches` sees the control loop only as a :class:`LaunchLoop`: the store and backend it
shares, the nodes, the runs, and the few things it asks of the loop.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any, Protocol

from pollux import contract
from pollux.cluster.backends import gputypes, launcher
from pollux.cluster.backends.api import Backend, NodeInfo, ReplicaHandle
from pollux.cluster.backends.launcher import Launch, LaunchError, replica_command
from pollux.cluster.control.records import ControllerConfig, Group, still_wanted
from pollux.cluster.state.lifecycle import SCHEDULED_STATES, JobState
from pollux.cluster.state.records import JobRecord
from pollux.cluster.state.store import JobStore
from pollux.policy.base import Cluster

logger = logging.getLogger("pollux.cluster")

__all__ = ["LaunchLoop", "Launches"]


class LaunchLoop(Protocol):
    """What launches read from, and ask of, the control loop."""

    store: JobStore
    backend: Backend
    config: ControllerConfig
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    #: The alive nodes, those held after a loss among them.
    nodes: list[NodeInfo]
    held_nodes: dict[str, float]
    #: The nodes as the last round's policy saw them (GPU types).
    cluster: Cluster
    #: The running (or stopping) groups by job; a launch that completes adds one.
    groups: dict[str, Group]

    def request_round(self) -> None:
        """Run a scheduling round at the next tick."""
        ...

    def request_stop(self, group: Group, reason: str, grace_s: float | None = None) -> None:
        """Ask a run's replicas to exit."""
        ...

    def grace(self, job: JobRecord) -> float:
        """How long the job's replicas get to exit when stopped."""
        ...

    def back_off(self, job_id: str, failures: int) -> float:
        """Hold the job's next launch back after a failure; returns the delay."""
        ...


class Launches:
    """The launches in flight (at most one per job) and the jobs waiting for room on their nodes."""

    def __init__(self, loop: LaunchLoop) -> None:
        self.loop = loop
        self.store = loop.store
        self.backend = loop.backend
        self.config = loop.config
        self.in_flight: dict[str, Launch] = {}
        #: Jobs whose launch waits for runs still stopping → why (logged when it changes).
        self.waiting: dict[str, str] = {}

    def forget_waiting(self, active: dict[str, JobRecord]) -> None:
        """Drop the waiting notes of jobs no longer active (before a round)."""
        self.waiting = {k: w for k, w in self.waiting.items() if k in active}

    def begin(self, job: JobRecord, placement: dict[str, int], now: float) -> None:
        """Begin a launch: check it can be placed, create the actors, ask rank 0 for a rendezvous."""
        alive = {n.name: n for n in self.loop.nodes if n.name not in self.loop.held_nodes}
        moved = gputypes.type_mismatch(placement, alive, self.loop.cluster)
        if not set(placement) <= set(alive) or moved:
            self.loop.request_round()   # a node left, is held or changed GPU type: a round moves the job
            return
        restart = job.restarts
        spec = job.spec
        base_env = {contract.ENV_JOB_ID: job.id, contract.ENV_RESTARTS: str(restart), "PYTHONUNBUFFERED": "1",
                    contract.ENV_CHECKPOINT_DIR: str(self.config.checkpoint_dir / job.id)}
        if self.config.scheduler_url:
            base_env[contract.ENV_SCHEDULER_URL] = self.config.scheduler_url
        base_env.update(launcher.elastic_env(spec, getattr(self.backend, "address", None)))
        try:
            launches = launcher.build_launches(spec, placement,
                                               command=replica_command(spec, self.config.python),
                                               base_env=base_env, user=self.config.run_as, nodes=alive,
                                               log_root=self.config.log_dir / job.id / f"restart-{restart}")
            usage = launcher.launch_usage(placement, launches)
            reason = launcher.never_fits(usage, alive)
            if reason is not None:
                raise LaunchError(reason)
        except LaunchError as exc:
            self.count_failure(job, str(exc), now)
            return
        others = [g.usage for jid, g in self.loop.groups.items() if jid != job.id]
        others += [launcher.launch_usage(x.placement, x.launches)
                   for jid, x in self.in_flight.items() if jid != job.id]
        busy = launcher.busy_reason(usage, others, alive)
        if busy is not None:
            if self.waiting.get(job.id) != busy:
                logger.info("job %s: waiting to launch on %s (%s)", job.id, placement, busy)
            self.waiting[job.id] = busy
            return
        self.waiting.pop(job.id, None)
        handles: list[ReplicaHandle] = []
        try:
            launcher.prepare_checkpoint_dir(self.config.checkpoint_dir / job.id, self.config.run_as)
            token = self.store.issue_token(job.id)   # a fresh token per run; the store keeps its hash
            for s in launches:
                s.env[contract.ENV_JOB_TOKEN] = token
            handles = self.backend.create_actors(job.id, restart, launches, nodes=self.loop.nodes)
            rendezvous = self.backend.rendezvous_async(handles[0])
        except Exception as exc:
            self.backend.release(handles)
            self.count_failure(job, f"{type(exc).__name__}: {exc}", now)
            return
        self.in_flight[job.id] = Launch(job.id, restart, dict(placement), launches, handles,
                                        deadline=self.loop.monotonic() + self.config.launch_timeout_s,
                                        rendezvous=rendezvous)
        logger.info("job %s: launching restart %d, %s replica(s) per node", job.id, restart,
                    launcher.replicas_of(s.node for s in launches))

    def advance_all(self, active: dict[str, JobRecord], now: float) -> None:
        """Move every launch in flight one step, from answers already there (no waiting)."""
        if not self.in_flight:
            return
        ready = self.backend.ready([r for x in self.in_flight.values() for r in x.pending_refs], 0.0)
        mono = self.loop.monotonic()
        for jid, x in list(self.in_flight.items()):
            try:
                job = active.get(jid) or self.store.get_job(jid)
                self.advance(x, job, ready, mono, now)
            except Exception as exc:
                logger.exception("job %s: launch failed", jid)
                self._drop(x, self.store.get_job(jid), f"launch error: {exc}", now)

    def advance(self, x: Launch, job: JobRecord, ready: set[Any], mono: float, now: float) -> None:
        timeout = self.config.launch_timeout_s
        if x.starts is None:
            if not still_wanted(job, x.placement):
                self._drop(x, job, None, now)
            elif x.rendezvous in ready:
                try:
                    addr, port = self.backend.result(x.rendezvous)
                except Exception as exc:
                    self._drop(x, job, f"replica 0 on {x.launches[0].node} could not be placed: "
                                      f"{type(exc).__name__}: {exc}", now)
                    return
                for s in x.launches:
                    s.env.update({contract.ENV_MASTER_ADDR: str(addr), contract.ENV_MASTER_PORT: str(port)})
                x.starts = self.backend.start_async(x.handles, x.launches)
            elif mono > x.deadline:
                self._drop(x, job, f"replica 0 on {x.launches[0].node} was not placed within "
                                  f"{timeout:g} s", now)
            return
        errors = []
        for h, ref in zip(x.handles, x.starts, strict=True):
            if h.pid is not None or ref not in ready:
                continue
            try:
                res = self.backend.result(ref)
            except Exception as exc:
                res = {"error": f"{type(exc).__name__}: {exc}"}
            if "error" in res:
                errors.append(f"replica {h.rank} on {h.node}: {res['error']}")
            else:
                h.pid = int(res["pid"])
        complete = all(r in ready for r in x.starts)
        if errors:
            self._drop(x, job, errors[0], now)
        elif not complete and not still_wanted(job, x.placement):
            self._drop(x, job, None, now)
        elif not complete and mono > x.deadline:
            late = [h.rank for h in x.handles if h.pid is None]
            self._drop(x, job, f"replica(s) {late} did not start within {timeout:g} s", now)
        elif complete:
            self._done(x, job)

    def _done(self, x: Launch, job: JobRecord) -> None:
        self.in_flight.pop(x.job_id)
        t = self.loop.clock()
        for h, s in zip(x.handles, x.launches, strict=True):
            self.store.record_replica(x.job_id, x.restart, h.rank, h.node, h.pid, s.log_path, now=t)
        group = Group(x.job_id, x.restart, dict(x.placement), x.handles, started=t,
                      futures=dict(zip([h.rank for h in x.handles], self.backend.exit_futures(x.handles),
                                       strict=True)),
                      usage=launcher.launch_usage(x.placement, x.launches))
        self.loop.groups[x.job_id] = group
        job = self.store.get_job(x.job_id)
        if not still_wanted(job, x.placement):
            # Cancelled or re-allocated while its processes were starting: stop them now.
            logger.info("job %s: restart %d started after the job became %s; stopping it", x.job_id,
                        x.restart, job.state)
            if job.terminal:
                self.loop.request_stop(group, f"job {job.state}", self.loop.grace(job))
            return
        if job.state in (JobState.STARTING, JobState.RESCALING):
            self.store.transition(x.job_id, JobState.RUNNING, reason=f"restart {x.restart} on {x.placement}",
                                  now=t)
        logger.info("job %s: restart %d started, %d replica(s) on %s", x.job_id, x.restart, len(x.handles),
                    x.placement)

    def _drop(self, x: Launch, job: JobRecord, reason: str | None, now: float) -> None:
        """End a launch that failed (``reason``; counted) or that the job no longer wants (None):
        stop what it started (a cleanup group), release the other actors."""
        self.in_flight.pop(x.job_id, None)
        started = [h for h in x.handles if h.pid is not None]
        rest = [h for h in x.handles if h.pid is None]
        if x.starts is not None and rest:
            self.backend.signal(rest, signal.SIGKILL)  # a start that answers late must not leave a process
        self.backend.release(rest)
        if started:
            group = Group(x.job_id, x.restart, dict(x.placement), started, started=self.loop.clock(),
                          cleanup=True,
                          futures=dict(zip([h.rank for h in started], self.backend.exit_futures(started),
                                           strict=True)),
                          usage=launcher.launch_usage(x.placement, x.launches))
            self.loop.groups[x.job_id] = group
            for h in started:
                self.store.record_replica(x.job_id, x.restart, h.rank, h.node, h.pid,
                                          x.launches[h.rank].log_path)
            self.loop.request_stop(group, "launch failed" if reason else "launch abandoned",
                               0.0 if reason else self.loop.grace(job))
        if reason is None:
            logger.info("job %s: launch of restart %d abandoned (job %s, allocation %s)", x.job_id,
                        x.restart, job.state, job.allocation or "none")
        job = self.store.get_job(x.job_id)
        if job.terminal:
            return
        if reason is None:
            self.store.transition(x.job_id, None, restart=True)
        else:
            self.count_failure(job, reason, now, restart=True)

    def count_failure(self, job: JobRecord, reason: str, now: float, restart: bool = False) -> None:
        """A launch failure counts like a failed run: back to pending, or failed after max_retries.

        The failure, the state and (``restart``: the launch had created replicas) the restart are
        written in one transaction."""
        failures = job.failures + 1   # the controller is the only writer of failures
        reason = f"launch of restart {job.restarts} failed: {reason}"
        if failures > self.config.max_retries:
            self.store.transition(job.id, JobState.FAILED, now=now, failure=True, restart=restart,
                                  reason=f"{reason} (failure {failures}, retries exhausted)",
                                  expect=SCHEDULED_STATES)
            logger.error("job %s: failed: %s", job.id, reason)
        else:
            delay = self.loop.back_off(job.id, failures)
            state = None if job.state == JobState.PENDING else JobState.PENDING
            self.store.transition(job.id, state, reason=reason, now=now, failure=True, restart=restart,
                                  expect=SCHEDULED_STATES)
            logger.warning("job %s: %s; retrying in %.0f s (failure %d of at most %d)", job.id, reason, delay,
                           failures, self.config.max_retries)
        self.loop.request_round()
