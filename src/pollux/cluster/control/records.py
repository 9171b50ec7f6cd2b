"""Records of the control loop (:mod:`pollux.cluster.control.controller`): its settings, the runs
it tracks, and the job kinds it knows.

Kept apart from the loop so that the loop's modules hold behaviour, and so that the runners
(:mod:`pollux.cluster.control.runners`) can name a run without importing the loop.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollux.cluster.backends.api import ReplicaHandle
from pollux.cluster.backends.launcher import Usage
from pollux.cluster.state.store import JobRecord

__all__ = ["DEFAULT_KIND", "ELASTIC_KIND", "ControllerConfig", "Group", "still_wanted"]

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
    usage: Usage = field(default_factory=dict)
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
