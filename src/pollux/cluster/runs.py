"""Records of the control loop (:mod:`pollux.cluster.controller`): its settings, and the runs it tracks.

Kept apart from the loop itself so that the loop's module holds behaviour only; the controller
re-exports both records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pollux.cluster import launcher as lch
from pollux.cluster.backend_api import ReplicaHandle
from pollux.cluster.lifecycle import JobState
from pollux.cluster.store import JobRecord

if TYPE_CHECKING:
    from pollux.cluster.controller import Controller

__all__ = ["DEFAULT_KIND", "ControllerConfig", "Group", "RestartRunner", "Runner", "still_wanted"]

#: The kind of every job today: it follows a new allocation by checkpoint, stop and relaunch.
DEFAULT_KIND = "restart"


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
