"""A study as records: one row per trial, best first; the counts by state; the best trial.

Read from Optuna's ``FrozenTrial`` only (its state, value, parameters, times and the user attributes
of :mod:`pollux.hpo.attrs`), so ``pollux hpo show`` reads any study the driver left, running or not,
and what it prints is what Optuna's own tools see.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from pollux.hpo import attrs

__all__ = ["StateCounts", "TrialRow", "best_trial", "counted", "format_params", "state_counts",
           "trial_rows"]

#: The order of states in a table after the value: finished with a value, still running, the rest.
STATE_ORDER = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1, TrialState.RUNNING: 2, TrialState.FAIL: 3,
               TrialState.WAITING: 4}


@dataclass(frozen=True)
class TrialRow:
    """One trial as the final table and ``pollux hpo show`` print it (``--json``: these fields)."""

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    job: str | None
    duration_s: float | None
    failure: str | None = None
    requeued: bool = False
    last_step: int | None = None
    intermediate: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StateCounts:
    """How many trials are in each state; ``requeued`` are FAIL trials given up by the driver itself,
    counted apart (they do not count towards ``--trials``)."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    waiting: int = 0
    requeued: int = 0

    @property
    def counted(self) -> int:
        """The trials that count towards ``--trials``: every one asked, but the requeued."""
        return self.complete + self.pruned + self.failed + self.running


def is_requeued(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.FAIL and bool(trial.user_attrs.get(attrs.REQUEUED))


def state_counts(trials: Iterable[FrozenTrial]) -> StateCounts:
    n = {"complete": 0, "pruned": 0, "failed": 0, "running": 0, "waiting": 0, "requeued": 0}
    for t in trials:
        if is_requeued(t):
            n["requeued"] += 1
        elif t.state == TrialState.COMPLETE:
            n["complete"] += 1
        elif t.state == TrialState.PRUNED:
            n["pruned"] += 1
        elif t.state == TrialState.FAIL:
            n["failed"] += 1
        elif t.state == TrialState.RUNNING:
            n["running"] += 1
        elif t.state == TrialState.WAITING:
            n["waiting"] += 1
    return StateCounts(**n)


def counted(trials: Iterable[FrozenTrial]) -> int:
    """The trials of a study that count towards ``--trials`` (:attr:`StateCounts.counted`)."""
    return state_counts(trials).counted


def best_trial(trials: Iterable[FrozenTrial], maximize: bool) -> FrozenTrial | None:
    """The COMPLETE trial with the best value (the lowest number among equals); None before one."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if not done:
        return None
    sign = -1.0 if maximize else 1.0
    return min(done, key=lambda t: (sign * float(t.value or 0.0), t.number))


def _duration(trial: FrozenTrial) -> float | None:
    if trial.datetime_start is None:
        return None
    if trial.datetime_complete is None:
        return None
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def row_of(trial: FrozenTrial) -> TrialRow:
    value = trial.value if trial.state in (TrialState.COMPLETE, TrialState.PRUNED) else None
    job = trial.user_attrs.get(attrs.JOB)
    failure = trial.user_attrs.get(attrs.FAILURE) if trial.state == TrialState.FAIL else None
    return TrialRow(number=trial.number, state=trial.state.name, value=value, params=dict(trial.params),
                    job=str(job) if job is not None else None, duration_s=_duration(trial),
                    failure=str(failure) if failure is not None else None, requeued=is_requeued(trial),
                    last_step=trial.last_step, intermediate=dict(trial.intermediate_values))


def trial_rows(trials: Sequence[FrozenTrial], maximize: bool) -> list[TrialRow]:
    """Every trial, best first: COMPLETE by value, then PRUNED by their last value, then RUNNING, then
    FAIL; within a state without values, by number."""
    sign = -1.0 if maximize else 1.0

    def key(t: FrozenTrial) -> tuple[int, float, int]:
        order = STATE_ORDER.get(t.state, 5)
        value = t.value if t.state in (TrialState.COMPLETE, TrialState.PRUNED) else None
        if value is None or not math.isfinite(value):
            return order, math.inf, t.number
        return order, sign * value, t.number

    return [row_of(t) for t in sorted(trials, key=key)]


def format_params(params: dict[str, Any]) -> str:
    """Parameters on one line, floats to 4 significant digits: ``lr=0.0123 width=2``."""
    parts = []
    for name, value in params.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{name}={text}")
    return " ".join(parts)
