"""A trial's job has ended: what the study is told.

============  ==================================================================================
job state     the trial becomes
============  ==================================================================================
succeeded     COMPLETE with the value of its last ``pollux.hpo.report``; FAIL if it reported none
              (or a non-finite one), with that as the reason
failed        FAIL, with the job's failure reason (``replica 0 on node-1 exited with code 1``)
cancelled     FAIL: cancelled outside the study (the driver's own cancels are prunes or Ctrl-C,
              which it records itself)
(not found)   FAIL: the service no longer knows the job
============  ==================================================================================

The reason goes into the trial's user attribute ``pollux_failure``, where Optuna's tools show it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from pollux.hpo import attrs

__all__ = ["ACTIVE_JOB_STATES", "TERMINAL_JOB_STATES", "Outcome", "job_outcome", "missing_job"]

#: Job states after which nothing more happens to a job.
TERMINAL_JOB_STATES = frozenset({"succeeded", "failed", "cancelled"})
#: Job states of a job that still runs, or will.
ACTIVE_JOB_STATES = frozenset({"pending", "starting", "running", "rescaling"})


@dataclass(frozen=True)
class Outcome:
    """What to tell the study about a finished trial: COMPLETE with ``value``, or FAIL with ``failure``."""

    state: TrialState
    value: float | None = None
    failure: str | None = None


def _fail(reason: str) -> Outcome:
    return Outcome(TrialState.FAIL, None, reason)


def missing_job(job_id: str) -> Outcome:
    """The outcome of a trial whose job the service does not know (any more)."""
    return _fail(f"job {job_id} not found on the service")


def job_outcome(job: Mapping[str, Any], trial: FrozenTrial) -> Outcome | None:
    """The outcome of ``trial`` now that its ``job`` is as given; None while the job is not over."""
    state = job.get("state")
    job_id = job.get("id", "?")
    if state not in TERMINAL_JOB_STATES:
        return None
    if state == "failed":
        return _fail(str(job.get("failure_reason") or f"job {job_id} failed (the service gave no reason)"))
    if state == "cancelled":
        return _fail(f"job {job_id} was cancelled outside the study")
    value = trial.user_attrs.get(attrs.LAST_VALUE)
    if value is None:
        return _fail(f"job {job_id} succeeded but reported no value (call pollux.hpo.report on rank 0)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return _fail(f"job {job_id} succeeded but its last reported value is not a finite number: {value!r}")
    return Outcome(TrialState.COMPLETE, float(value))
