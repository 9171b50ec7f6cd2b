"""The records the job store reads and writes (:mod:`pollux.cluster.state.store`), apart from the store.

Plain frozen dataclasses, so that the controller, the API and the tests can hold them without the
store's SQLite plumbing; :mod:`pollux.cluster.state.store` re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass

from pollux.cluster.state.lifecycle import TERMINAL_STATES
from pollux.cluster.state.spec import JobSpec

__all__ = [
    "AllocationRecord",
    "JobOutlook",
    "JobRecord",
    "ReplicaRecord",
    "ResizeRecord",
    "RoundRecord",
    "TransitionRecord",
    "UnknownJobError",
    "UnknownUserError",
    "UserRecord",
]


class UnknownJobError(KeyError):
    """No job with this id in the store."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(job_id)

    def __str__(self) -> str:
        return f"unknown job {self.job_id!r}"


class UnknownUserError(KeyError):
    """No user of this name in the store."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown user {self.name!r}"


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class UserRecord:
    """One user of the service: its name, when it was created, and when it was revoked (None while
    its token works). ``token`` is the plain token on the record :meth:`JobStore.add_user` returns,
    None on every record read back (the store keeps only its hash)."""

    name: str
    created: float
    revoked: float | None = None
    token: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None


@dataclass(frozen=True)
class JobRecord:
    """One row of ``jobs``; ``allocation`` is the job's current ``{node: GPUs}``.

    ``token`` is the job's plain token on the record :meth:`JobStore.submit` returns, and None on
    every record read back (only its hash is stored). ``spec_error`` is None, or — for a row whose
    stored spec no longer validates — the first problem, ``spec`` then being a best-effort reading
    (:meth:`JobSpec.from_stored`). ``owner`` is the user who submitted the job, None for the
    admin's jobs.
    """

    id: str
    name: str
    spec: JobSpec
    state: str
    token: str | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    restarts: int
    failure_reason: str | None
    attained_service: float
    allocation: dict[str, int]
    failures: int = 0
    spec_error: str | None = None
    owner: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class TransitionRecord:
    job_id: str
    from_state: str | None
    to_state: str
    time: float
    reason: str | None


@dataclass(frozen=True)
class AllocationRecord:
    job_id: str
    time: float
    allocation: dict[str, int]


@dataclass(frozen=True)
class ResizeRecord:
    """An allocation of an elastic job: its version, when the round made it, and when the job's master
    said it had applied it in place (None: not acknowledged)."""

    version: int
    time: float
    allocation: dict[str, int]
    applied: float | None


@dataclass(frozen=True)
class ReplicaRecord:
    job_id: str
    restart: int
    rank: int
    node: str
    pid: int | None
    log_path: str | None
    start_time: float
    exit_code: int | None
    end_time: float | None


@dataclass(frozen=True)
class JobOutlook:
    """What a round expects of a job on the allocation it gave (:mod:`pollux.cluster.control.outlook`):
    its GPUs and nodes, and — once the job has reported hints — the batch size, local batch and
    accumulation steps its goodput model chooses there, the statistical efficiency, goodput (examples
    per second, weighted by efficiency), speedup over one GPU, and the gradient noise scale. ``time``
    is the round's."""

    job_id: str
    time: float
    gpus: int
    nodes: int
    batch_size: float | None = None
    local_bsz: float | None = None
    accum_steps: int | None = None
    efficiency: float | None = None
    goodput: float | None = None
    speedup: float | None = None
    pgns: float | None = None


@dataclass(frozen=True)
class RoundRecord:
    """One scheduling round: when, how long the policy took, which policy, how many jobs it saw, how
    many allocations it changed, and the objective the policy reached (None: it keeps none)."""

    number: int
    time: float
    duration_s: float
    policy: str
    jobs: int
    changed: int
    objective: float | None = None
