"""Shared pieces of the live SCAR tests: a controller that kills a PS shard at a chosen moment.

Imported by test modules that already skip without Ray (it imports Ray through SCAR's controller).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import litz_helpers as h
from pollux.litz.api import RunningJob
from pollux.scar.live.controller import ScarConfig, ScarController


class KillingController(ScarController):
    """SIGKILLs shard `victim` right after checkpoint number `kill_after` (0 = the initial save; a
    quiescent moment) or, with `kill_at_tasks`, once that many micro-tasks have completed. It
    remembers, at that moment, the tables, the running checkpoint on disk and the victim's rows."""

    def __init__(
        self,
        config: ScarConfig,
        kill_after: int | None = None,
        kill_at_tasks: int | None = None,
        victim: int = 1,
    ) -> None:
        super().__init__(config)
        self.kill_after, self.kill_at_tasks, self.victim = kill_after, kill_at_tasks, victim
        self.before: dict[str, Any] = {}

    def _kill(self, job: RunningJob) -> None:
        self._drain()  # every checkpoint so far on disk
        assert self.store is not None
        self.before = {
            "tables": job.ps_tables(),
            "running": dict(self.store.load().values),
            "lost": {t: np.flatnonzero(o == self.victim) for t, o in job.layout.owners.items()},
        }
        h.sigkill(job.shard_pids[self.victim])

    def checkpoint(self, job: RunningJob) -> None:
        super().checkpoint(job)
        if len(self.checkpoints) - 1 == self.kill_after and not self.before:
            self._kill(job)

    def due(self, job: RunningJob) -> bool:
        if (
            self.kill_at_tasks is not None
            and job.summary.tasks_completed >= self.kill_at_tasks
            and not self.before
        ):
            self._kill(job)
        return super().due(job)
