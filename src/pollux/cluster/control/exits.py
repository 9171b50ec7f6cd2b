"""The replicas' exits, and what they mean for their job: succeeded, preempted, failed or moved.

Each running :class:`~pollux.cluster.control.records.Group` holds one exit reference per replica.
Every tick, :meth:`Exits.collect` records the exits already reported, from one backend ``ready`` call
over all groups, so a tick where nothing changed makes no round trip to any actor. :meth:`Exits.poll`
then reads one group's exits:

* a group asked to stop waits for its replicas (SIGKILL after the grace period; released regardless
  once killed ones stay silent), then ends: the job restarts on its new placement, or waits as
  pending when it has no GPUs left;
* every replica exited 0 → the job succeeded;
* a replica that preempted itself (``contract.PREEMPTED_EXIT_CODE``) → the whole run stops and
  restarts from its checkpoint, counting no failure;
* any other code → a failure: the run stops and restarts after a back-off, or, past
  ``max_retries``, the job fails with the reason.

A replica lost with its node holds that node (no launch there for a while), through the loop.
:class:`Exits` sees the control loop only as an :class:`ExitLoop`, as the launches and the runners
see it through their own protocols, so this module does not import the controller.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Protocol

from pollux import contract
from pollux.cluster.backends.api import Backend
from pollux.cluster.control.records import ControllerConfig, Group
from pollux.cluster.state.lifecycle import SCHEDULED_STATES, JobState
from pollux.cluster.state.records import JobRecord
from pollux.cluster.state.store import JobStore

logger = logging.getLogger("pollux.cluster")

__all__ = ["ExitLoop", "Exits"]

#: How long a group whose replicas got SIGKILL may stay silent before its actors are released anyway.
KILL_WAIT_S = 10.0


def node_of(group: Group, rank: int) -> str:
    """The node replica ``rank`` of the run was placed on ("?" if the run holds no such replica)."""
    return next((h.node for h in group.handles if h.rank == rank), "?")


class ExitLoop(Protocol):
    """What reading exits needs from, and asks of, the control loop."""

    store: JobStore
    backend: Backend
    config: ControllerConfig
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    #: The running (or stopping) groups by job; a group that ends leaves it.
    groups: dict[str, Group]

    def request_round(self) -> None:
        """Run a scheduling round at the next tick."""
        ...

    def request_stop(self, group: Group, reason: str, grace_s: float | None = None) -> None:
        """Ask a run's replicas to exit."""
        ...

    def account(self, group: Group, now: float) -> None:
        """Add the GPU time the run held since it was last accounted to its job."""
        ...

    def back_off(self, job_id: str, failures: int) -> float:
        """Hold the job's next launch back after a failure; returns the delay."""
        ...

    def hold_node(self, node: str) -> None:
        """No launch on ``node`` for a while: it lost a replica."""
        ...


class Exits:
    """Records the replicas' exits and acts on them; see the module docstring."""

    def __init__(self, loop: ExitLoop) -> None:
        self.loop = loop
        self.store = loop.store
        self.backend = loop.backend
        self.config = loop.config

    def collect(self, timeout_s: float = 0.0) -> None:
        """Record every exit already reported, from one ``ready`` call over all groups' exit references."""
        refs = {ref: (g, rank) for g in self.loop.groups.values() for rank, ref in g.futures.items()}
        for ref in self.backend.ready(list(refs), timeout_s):
            group, rank = refs[ref]
            status = self.backend.exit_status(ref)
            group.futures.pop(rank, None)
            group.exits[rank] = status.code
            if status.lost:
                self.loop.hold_node(node_of(group, rank))
            try:
                now = self.loop.clock()
                self.store.set_replica_exit(group.job_id, group.restart, rank, status.code, now=now)
            except KeyError:
                pass

    def poll(self, group: Group, job: JobRecord, now: float) -> None:
        """Act on the exits :meth:`collect` recorded (no backend call unless a signal is due)."""
        running = [h for h in group.handles if h.rank not in group.exits]
        if group.stopping:
            if running and group.stop_deadline is not None and self.loop.monotonic() > group.stop_deadline \
                    and not group.killed:
                logger.warning("job %s: %d replica(s) did not exit within the grace period; killing", job.id,
                               len(running))
                self.backend.signal(running, signal.SIGKILL)
                group.killed = True
                group.stop_deadline = self.loop.monotonic() + KILL_WAIT_S
            elif running and group.killed and group.stop_deadline is not None \
                    and self.loop.monotonic() > group.stop_deadline:
                running = []   # unreachable: release the actors regardless
            if not running:
                self._finish_stop(group, job, now)
            return
        failed = {r: c for r, c in group.exits.items() if c != 0}
        if not running and not failed:
            self.loop.account(group, now)
            self.end(group)
            self.store.transition(job.id, JobState.SUCCEEDED, reason="all replicas exited 0", now=now)
            logger.info("job %s: succeeded", job.id)
            self.loop.request_round()
            return
        if failed:
            self._fail(group, job, failed, now)

    def _fail(self, group: Group, job: JobRecord, failed: dict[int, int], now: float) -> None:
        """A replica exited non-zero: stop the run, then restart it (after a back-off) or fail the job."""
        rank, code = min(failed.items())
        if code == contract.PREEMPTED_EXIT_CODE:
            self.loop.request_stop(group, f"replica {rank} preempted itself (exit {code})")
            return
        failures = job.failures + 1   # the controller is the only writer of failures
        node = node_of(group, rank)
        reason = f"replica {rank} on {node} exited with code {code}"
        if failures > self.config.max_retries:
            self.loop.request_stop(group, reason, self.config.cancel_grace_s)
            group.stop_reason = "failed: " + reason
            self.store.transition(job.id, JobState.FAILED, reason=f"{reason} (failure {failures}, "
                                  f"retries exhausted)", now=now, failure=True, expect=SCHEDULED_STATES)
            logger.error("job %s: failed: %s", job.id, reason)
        else:
            self.store.transition(job.id, None, failure=True, expect=SCHEDULED_STATES)
            delay = self.loop.back_off(job.id, failures)
            logger.warning("job %s: %s; restarting from the last checkpoint in %.0f s (failure %d of at "
                           "most %d)", job.id, reason, delay, failures, self.config.max_retries)
            self.loop.request_stop(group, "failure: " + reason)

    def _finish_stop(self, group: Group, job: JobRecord, now: float) -> None:
        """Every replica of a stopping run is gone: the job restarts on its allocation, or waits."""
        self.end(group)
        if group.cleanup:
            return
        job = self.store.get_job(job.id)
        if job.terminal:
            return
        to_pending = not job.allocation and job.state in (JobState.RUNNING, JobState.RESCALING)
        self.store.transition(job.id, JobState.PENDING if to_pending else None, reason=group.stop_reason,
                              now=now, restart=True, expect=SCHEDULED_STATES)
        self.loop.request_round()

    def end(self, group: Group) -> None:
        """Release the run's actors and forget it."""
        self.backend.release(group.handles)
        self.loop.groups.pop(group.job_id, None)
