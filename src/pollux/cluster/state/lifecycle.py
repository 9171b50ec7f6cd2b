"""The job lifecycle of the live service in one place: the states, the legal moves, what each does.

Both writers of a job's state go through here — the control loop (:mod:`pollux.cluster.control.controller`)
and the REST API's cancel — by way of :meth:`pollux.cluster.state.store.JobStore.transition`, which checks
the move with :func:`check_transition` and applies its :class:`Effects` in the same transaction as
any counter that goes with it (a failure, a restart), so a crash never leaves a failure counted
without its transition or the reverse.

::

    pending ─allocated─▶ starting ─replicas started─▶ running ─all exit 0─▶ succeeded
                         starting ─launch failed─▶ pending
    running ─re-allocated─▶ rescaling ─relaunched─▶ running
    starting | running | rescaling ─no GPUs left / service stopped / Ray lost─▶ pending
    any non-terminal ─▶ cancelled (user) | failed (retries exhausted, invalid spec)

The table :data:`TRANSITIONS` is the rule; ``docs/cluster.md`` lists each move with its cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ACTIVE_STATES", "JOB_STATES", "SCHEDULED_STATES", "TERMINAL_STATES", "TRANSITIONS", "Effects",
           "IllegalTransition", "JobState", "check_transition", "effects", "is_terminal"]


class JobState(StrEnum):
    """A job's lifecycle state; the value is what the store and the API hold (a plain string)."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    RESCALING = "rescaling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: Every state's name, in lifecycle order (the API's ``state`` filter takes these).
JOB_STATES: tuple[str, ...] = tuple(s.value for s in JobState)
#: States a job never leaves.
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: States in which a job may hold replicas (the controller looks at these every tick).
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.RESCALING})
#: States the scheduling round allocates for.
SCHEDULED_STATES: tuple[str, ...] = (JobState.PENDING, JobState.STARTING, JobState.RUNNING,
                                     JobState.RESCALING)

_S = JobState
#: Legal transitions: from a state to the states it may move to.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.PENDING: frozenset({_S.STARTING, _S.CANCELLED, _S.FAILED}),
    _S.STARTING: frozenset({_S.RUNNING, _S.PENDING, _S.CANCELLED, _S.FAILED}),
    _S.RUNNING: frozenset({_S.RESCALING, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.PENDING}),
    _S.RESCALING: frozenset({_S.RUNNING, _S.PENDING, _S.CANCELLED, _S.FAILED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    """A move the lifecycle does not allow (a ValueError, so callers that caught one still do)."""

    def __init__(self, job_id: str, old: str, new: str) -> None:
        self.job_id, self.old, self.new = job_id, old, new
        super().__init__(f"illegal transition of job {job_id!r} from {old!r} to {new!r}")


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def check_transition(job_id: str, old: str, new: str) -> JobState:
    """``new`` as a :class:`JobState` if ``old → new`` is legal; raises ValueError for an unknown
    state and :class:`IllegalTransition` for an illegal move."""
    try:
        target = JobState(new)
    except ValueError:
        raise ValueError(f"unknown job state {new!r}") from None
    try:
        source = JobState(old)
    except ValueError:
        raise IllegalTransition(job_id, old, new) from None
    if target not in TRANSITIONS[source]:
        raise IllegalTransition(job_id, old, new)
    return target


@dataclass(frozen=True)
class Effects:
    """What entering a state does to the job's row besides its state."""

    set_start_time: bool      # first time running
    set_end_time: bool        # terminal
    set_failure_reason: bool  # failed: the reason is kept
    clear_allocation: bool    # pending or terminal: the job holds no GPUs


def effects(new: JobState, *, started: bool) -> Effects:
    """The :class:`Effects` of entering ``new`` (``started``: the job has run before)."""
    return Effects(set_start_time=new is JobState.RUNNING and not started,
                   set_end_time=new in TERMINAL_STATES,
                   set_failure_reason=new is JobState.FAILED,
                   clear_allocation=new in TERMINAL_STATES or new is JobState.PENDING)
