"""Records of the control loop (:mod:`pollux.cluster.controller`): its settings, and the runs it tracks.

Kept apart from the loop itself so that the loop's module holds behaviour only; the controller
re-exports both records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollux.cluster import launcher as lch
from pollux.cluster.backend import ReplicaHandle
from pollux.cluster.store import JobRecord

__all__ = ["ControllerConfig", "Group"]


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
