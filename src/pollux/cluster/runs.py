"""Records of the control loop (:mod:`pollux.cluster.controller`): its settings, and the runs it tracks.

Kept apart from the loop itself so that the loop's module holds behaviour only; the controller
re-exports both records.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pollux.cluster import launcher as lch
from pollux.cluster.backend_api import ReplicaHandle
from pollux.cluster.lifecycle import JobState
from pollux.cluster.store import JobRecord, JobStore

if TYPE_CHECKING:
    from pollux.cluster.controller import Controller

logger = logging.getLogger("pollux.cluster")

__all__ = ["DEFAULT_KIND", "ELASTIC_KIND", "ControllerConfig", "ElasticRunner", "Group", "RestartRunner",
           "Runner", "adopted_placement", "default_runners", "still_wanted"]

#: A job of this kind follows a new allocation by checkpoint, stop and relaunch (the default).
DEFAULT_KIND = "restart"
#: A job of this kind (a Litz job) has one process, its master, that moves its workers in place.
ELASTIC_KIND = "elastic"


@dataclass(frozen=True)
class ControllerConfig:
    """Timing and retry settings of the control loop, where replicas write, and as whom they run."""

    state_dir: Path
    scheduler_url: str | None = None
    interval_s: float = 60.0
    tick_s: float = 0.5
    stop_grace_s: float = 60.0
    cancel_grace_s: float = 2.0
    launch_timeout_s: float = 60.0
    max_retries: int = 3
    retry_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    python: str = sys.executable
    run_as: str | None = None
    #: How long a node whose replicas were *lost* (actor or node died) gets no new launch while the
    #: backend still lists it alive; a node the backend drops is forgotten at once.
    node_hold_s: float = 60.0
    #: How long an elastic job may take to apply a new allocation in place (acknowledged on
    #: ``PUT /v1/jobs/{id}/allocation``) before the service applies it by stop and relaunch.
    resize_timeout_s: float = 60.0

    @property
    def log_dir(self) -> Path:
        return Path(self.state_dir) / "logs"

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.state_dir) / "checkpoints"


@dataclass
class Group:
    """The replica processes of one run (restart) of a job, as the controller tracks them.

    ``futures`` maps each rank still running to the reference of its exit code. A ``cleanup`` group
    holds the processes of a failed launch: it is only stopped and released, the failure having been
    counted already.
    """

    job_id: str
    restart: int
    placement: dict[str, int]
    handles: list[ReplicaHandle]
    started: float
    exits: dict[int, int] = field(default_factory=dict)
    stop_reason: str | None = None
    stop_deadline: float | None = None
    stop_requested_at: float | None = None
    killed: bool = False
    accounted: float | None = None
    futures: dict[int, Any] = field(default_factory=dict)
    usage: lch.Usage = field(default_factory=dict)
    cleanup: bool = False
    #: An elastic run asked to move to this placement in place, and until when (monotonic) it may.
    resize_target: dict[str, int] | None = None
    resize_deadline: float | None = None

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None


def still_wanted(job: JobRecord, placement: dict[str, int]) -> bool:
    """Whether the store still wants this run: job active and allocated exactly ``placement``."""
    desired = {n: int(g) for n, g in job.allocation.items() if int(g) > 0}
    return not job.terminal and job.state != "pending" and desired == placement


class Runner(Protocol):
    """How a job of one kind follows a changed allocation while its replicas run.

    The controller owns the lifecycle and asks the job's runner to *apply* the new allocation to the
    running group. A runner for a job kind that resizes in place (a later issue) would tell its
    replicas the new placement and keep the group; :class:`RestartRunner` stops it to relaunch.
    """

    def apply(self, controller: Controller, group: Group, job: JobRecord, desired: dict[str, int],
              now: float) -> None:
        ...


class RestartRunner:
    """Resize by restart: SIGTERM every replica (the agent checkpoints and exits 143), state
    running → rescaling; once all have exited the controller relaunches on ``desired`` (or leaves the
    job pending when ``desired`` is empty)."""

    def apply(self, controller: Controller, group: Group, job: JobRecord, desired: dict[str, int],
              now: float) -> None:
        controller.request_stop(group, "re-allocated" if desired else "preempted")
        if job.state == JobState.RUNNING:
            controller.store.transition(job.id, JobState.RESCALING, reason="re-allocated", now=now)


class ElasticRunner:
    """Resize in place: the job's master reads its allocation from the service (``GET
    /v1/jobs/{id}/allocation``), moves its workers, and acknowledges the version (``PUT``). The store
    stays the one source of truth: the run's placement becomes the new allocation only when the
    acknowledged version is the current one. Not acknowledged within ``resize_timeout_s`` (the job
    ignores resizes, or is stuck), or preempted to no GPUs, the job is stopped and relaunched as a
    :class:`RestartRunner` would — the ordinary preemption path, which counts a restart."""

    def __init__(self, fallback: Runner | None = None) -> None:
        self.fallback = fallback or RestartRunner()

    def apply(self, controller: Controller, group: Group, job: JobRecord, desired: dict[str, int],
              now: float) -> None:
        if not desired:
            group.resize_target = None
            self.fallback.apply(controller, group, job, desired, now)
            return
        version, allocation, applied = controller.store.allocation_version(job.id)
        current = {n: int(g) for n, g in allocation.items() if int(g) > 0}
        if applied >= version and current == desired:
            controller.account(group, now)      # GPU time on the old placement up to now
            group.placement = dict(desired)
            group.usage = lch.usage_of(desired, [])
            group.resize_target = group.resize_deadline = None
            logger.info("job %s: resized in place to %s (allocation version %d)", job.id, desired, version)
            return
        mono = controller.monotonic()
        if group.resize_target != desired:
            group.resize_target = dict(desired)
            group.resize_deadline = mono + controller.config.resize_timeout_s
            logger.info("job %s: asked to resize in place to %s (allocation version %d)", job.id, desired,
                        version)
        elif group.resize_deadline is not None and mono >= group.resize_deadline:
            logger.warning("job %s: did not apply allocation version %d within %.0f s; stopping it to "
                           "relaunch", job.id, version, controller.config.resize_timeout_s)
            group.resize_target = group.resize_deadline = None
            self.fallback.apply(controller, group, job, desired, now)


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
    per = lch.gpus_per_replica(job.spec)
    if lch.rank_nodes(placement, per) != nodes:
        placement = {n: k * per for n, k in lch.replicas_of(nodes).items()}
    return placement
