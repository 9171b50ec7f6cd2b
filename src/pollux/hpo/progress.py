"""What the driver tells whoever watches it: events as they happen and a snapshot once a tick.

The driver (:mod:`pollux.hpo.runner`) knows nothing of terminals; it calls an :class:`Observer`. The
command line's is :class:`pollux.hpo.display.StudyDisplay` (a live table on a terminal, plain lines
elsewhere); a test or a notebook may pass its own, or :class:`QuietObserver`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pollux.hpo.summary import StateCounts

__all__ = ["Observer", "QuietObserver", "RunningView", "StudySnapshot"]


@dataclass(frozen=True)
class RunningView:
    """A running trial: its job's state and GPUs, what it reported last, for how long it has run."""

    number: int
    job_id: str
    job_state: str
    gpus: int
    restarts: int
    params: dict[str, Any]
    last_step: int | None
    last_value: float | None
    seconds: float


@dataclass(frozen=True)
class StudySnapshot:
    """The study at one tick of the driver."""

    study: str
    target: int
    counts: StateCounts
    running: tuple[RunningView, ...]
    best_number: int | None
    best_value: float | None
    maximize: bool


class Observer(Protocol):
    """Receives the driver's news."""

    def event(self, message: str) -> None:
        """Something happened: a trial started, was adopted, finished, was pruned or failed."""

    def update(self, snapshot: StudySnapshot) -> None:
        """The study now (about once a second)."""


class QuietObserver:
    """An observer that ignores everything."""

    def event(self, message: str) -> None:
        pass

    def update(self, snapshot: StudySnapshot) -> None:
        pass
