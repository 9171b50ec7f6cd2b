"""How a job of each kind follows a changed allocation while its replicas run.

The controller owns the lifecycle and asks the job's :class:`Runner` to *apply* a new allocation to
the running group. A runner sees the control loop only through :class:`RunControl`, the few things
it may ask of it (stop a run, account its GPU time, mark the job rescaling, read the allocation's
version, the clock), so that this module does not import the controller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from pollux.cluster.backends import launcher
from pollux.cluster.control.records import DEFAULT_KIND, ELASTIC_KIND, Group
from pollux.cluster.state.store import JobRecord, JobStore

logger = logging.getLogger("pollux.cluster")

__all__ = ["ElasticRunner", "RestartRunner", "RunControl", "Runner", "adopted_placement", "default_runners"]


class RunControl(Protocol):
    """What a runner may ask of the control loop."""

    #: The loop's clock for deadlines (monotonic seconds).
    monotonic: Callable[[], float]

    @property
    def resize_timeout_s(self) -> float:
        """How long an elastic job may take to apply a new allocation in place."""
        ...

    def request_stop(self, group: Group, reason: str, grace_s: float | None = None) -> None:
        """Ask the run's replicas to exit (SIGTERM, then SIGKILL after the grace period)."""
        ...

    def account(self, group: Group, now: float) -> None:
        """Add the GPU time the run held since it was last accounted to its job."""
        ...

    def mark_rescaling(self, job: JobRecord, now: float) -> None:
        """Record that a running job's replicas are stopping to move (running → rescaling)."""
        ...

    def allocation_version(self, job_id: str) -> tuple[int, dict[str, int], int]:
        """The job's current allocation version, the allocation, and the version it acknowledged."""
        ...


class Runner(Protocol):
    """How a job of one kind follows a changed allocation while its replicas run.

    :class:`RestartRunner` stops the group to relaunch it; :class:`ElasticRunner` tells the job's
    master the new placement and keeps the group. A new job kind adds a runner here and an entry in
    :func:`default_runners`.
    """

    def apply(self, control: RunControl, group: Group, job: JobRecord, desired: dict[str, int],
              now: float) -> None:
        ...


class RestartRunner:
    """Resize by restart: SIGTERM every replica (the agent checkpoints and exits 143), state
    running → rescaling; once all have exited the controller relaunches on ``desired`` (or leaves the
    job pending when ``desired`` is empty)."""

    def apply(self, control: RunControl, group: Group, job: JobRecord, desired: dict[str, int],
              now: float) -> None:
        control.request_stop(group, "re-allocated" if desired else "preempted")
        control.mark_rescaling(job, now)


class ElasticRunner:
    """Resize in place: the job's master reads its allocation from the service (``GET
    /v1/jobs/{id}/allocation``), moves its workers, and acknowledges the version (``PUT``). The store
    stays the one source of truth: the run's placement becomes the new allocation only when the
    acknowledged version is the current one. Not acknowledged within ``resize_timeout_s`` (the job
    ignores resizes, or is stuck), or preempted to no GPUs, the job is stopped and relaunched as a
    :class:`RestartRunner` would — the ordinary preemption path, which counts a restart."""

    def __init__(self, fallback: Runner | None = None) -> None:
        self.fallback = fallback or RestartRunner()

    def apply(self, control: RunControl, group: Group, job: JobRecord, desired: dict[str, int],
              now: float) -> None:
        if not desired:
            group.resize_target = None
            self.fallback.apply(control, group, job, desired, now)
            return
        version, allocation, applied = control.allocation_version(job.id)
        current = {n: int(g) for n, g in allocation.items() if int(g) > 0}
        if applied >= version and current == desired:
            control.account(group, now)      # GPU time on the old placement up to now
            group.placement = dict(desired)
            group.usage = launcher.usage_of(desired, [])
            group.resize_target = group.resize_deadline = None
            logger.info("job %s: resized in place to %s (allocation version %d)", job.id, desired, version)
            return
        mono = control.monotonic()
        if group.resize_target != desired:
            group.resize_target = dict(desired)
            group.resize_deadline = mono + control.resize_timeout_s
            logger.info("job %s: asked to resize in place to %s (allocation version %d)", job.id, desired,
                        version)
        elif group.resize_deadline is not None and mono >= group.resize_deadline:
            logger.warning("job %s: did not apply allocation version %d within %.0f s; stopping it to "
                           "relaunch", job.id, version, control.resize_timeout_s)
            group.resize_target = group.resize_deadline = None
            self.fallback.apply(control, group, job, desired, now)


def default_runners() -> dict[str, Runner]:
    """A runner per job kind (``pollux.contract.JOB_KINDS``)."""
    return {DEFAULT_KIND: RestartRunner(), ELASTIC_KIND: ElasticRunner()}


def adopted_placement(job: JobRecord, nodes: list[str], store: JobStore) -> dict[str, int]:
    """The placement a run adopted after a service restart holds: for an elastic job the allocation
    it last acknowledged (else its current one); for others, what its replicas' nodes show."""
    placement = {n: int(g) for n, g in job.allocation.items() if int(g) > 0}
    if job.spec.kind == ELASTIC_KIND:
        applied = [r for r in store.resizes(job.id) if r.applied is not None]
        return {n: int(g) for n, g in applied[-1].allocation.items() if int(g) > 0} if applied else placement
    per = launcher.gpus_per_replica(job.spec)
    if launcher.rank_nodes(placement, per) != nodes:
        placement = {n: k * per for n, k in launcher.replicas_of(nodes).items()}
    return placement
