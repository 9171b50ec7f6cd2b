"""What a (re)started service finds on the cluster: the runs it adopts, and the replicas it stops.

The store says which run (restart) of each active job should be running and where its replicas
were; the backend says which replica actors are alive. A run whose replicas all live is adopted as
a :class:`~pollux.cluster.control.records.Group`; a run that lost some is stopped whole (the job
restarts from its checkpoint); every other actor of the service's namespace is an orphan and is
stopped. This module reads and writes only the store and the backend: the controller takes the
adopted groups into its loop (:meth:`pollux.cluster.control.controller.Controller.recover`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from pollux.cluster.backends import launcher
from pollux.cluster.backends.api import Backend, ReplicaHandle, parse_actor_name
from pollux.cluster.control.records import Group
from pollux.cluster.control.runners import adopted_placement
from pollux.cluster.state.lifecycle import ACTIVE_STATES, JobState
from pollux.cluster.state.records import JobRecord, ReplicaRecord
from pollux.cluster.state.store import JobStore

logger = logging.getLogger("pollux.cluster")

__all__ = ["Recovered", "recover_runs"]


@dataclass
class Recovered:
    """The runs adopted (by job id), those of them caught rescaling (to be stopped), and the number
    of orphaned actors stopped."""

    groups: dict[str, Group] = field(default_factory=dict)
    rescaling: list[str] = field(default_factory=list)
    orphans: int = 0


def recover_runs(store: JobStore, backend: Backend, clock: Callable[[], float]) -> Recovered:
    """Adopt every active job's live run, stop partial runs and orphans; see the module docstring."""
    names = set(backend.actor_names())
    recovered = Recovered()
    keep: set[str] = set()
    for job in store.list_jobs(ACTIVE_STATES):
        reps = store.replicas(job.id, job.restarts)
        if not reps:
            continue
        live = backend.find(job.id, job.restarts, [r.rank for r in reps], [r.node for r in reps])
        if len(live) < len(reps):
            _stop_partial_run(store, backend, job, live, reps, clock)
            continue
        for handle, replica in zip(live, reps, strict=True):
            handle.pid = replica.pid
        # The previous life of the service accounted this run's GPU time up to some point before it
        # died; count from now rather than twice.
        nodes = [r.node for r in reps]
        placement = adopted_placement(job, nodes, store)
        group = Group(job.id, job.restarts, placement, live, started=min(r.start_time for r in reps),
                      accounted=clock(),
                      usage=launcher.usage_of(placement, [(n, job.spec.resources) for n in nodes]))
        for replica in reps:
            if replica.exit_code is not None:
                group.exits[replica.rank] = int(replica.exit_code)
        running = [h for h in live if h.rank not in group.exits]
        group.futures = dict(zip([h.rank for h in running], backend.exit_futures(running), strict=True))
        recovered.groups[job.id] = group
        if job.state == JobState.RESCALING:
            recovered.rescaling.append(job.id)
        keep |= {f"{job.id}/{job.restarts}/{r.rank}" for r in reps}
        logger.info("job %s: adopted restart %d (%d replica(s))", job.id, job.restarts, len(live))
    orphans = sorted(names - keep)
    _stop_orphans(store, backend, orphans, clock)
    recovered.orphans = len(orphans)
    return recovered


def _stop_partial_run(store: JobStore, backend: Backend, job: JobRecord, live: list[ReplicaHandle],
                      reps: list[ReplicaRecord], clock: Callable[[], float]) -> None:
    """Part of the run is gone: stop the rest; the job restarts from its checkpoint."""
    backend.signal(live, signal.SIGKILL, timeout_s=5.0)   # their trees, then the actors
    backend.release(live)
    for replica in reps:
        if replica.exit_code is None:
            store.set_replica_exit(job.id, replica.restart, replica.rank, -int(signal.SIGKILL), now=clock())
    store.transition(job.id, None, restart=True)
    logger.warning("job %s: restart %d lost %d of %d replica(s) while the service was down", job.id,
                   job.restarts, len(reps) - len(live), len(reps))


def _stop_orphans(store: JobStore, backend: Backend, orphans: list[str], clock: Callable[[], float]) -> None:
    """Stop actors no active run owns; a launch cut short moves its job to a fresh restart number."""
    for name in orphans:
        logger.warning("stopping orphaned replica actor %s", name)
    backend.kill_by_names(orphans)
    active = {j.id: j.restarts for j in store.list_jobs(ACTIVE_STATES)}
    for job_id in {p[0] for p in map(parse_actor_name, orphans) if p and active.get(p[0]) == p[1]}:
        # a launch cut short: the next one gets fresh actor names
        store.transition(job_id, None, restart=True)
    for name in orphans:
        parsed = parse_actor_name(name)
        if parsed is None:
            continue
        try:
            store.set_replica_exit(parsed[0], parsed[1], parsed[2], -int(signal.SIGTERM), now=clock())
        except KeyError:
            pass
