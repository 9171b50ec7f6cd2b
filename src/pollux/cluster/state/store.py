"""The persistent job store of the live scheduler (SPEC §9): SQLite, one file.

Every operation commits before it returns, so a service restart loses nothing, and a second
:class:`JobStore` on the same file (another thread or process) sees every change. The database runs
in WAL mode with foreign keys on; one :class:`JobStore` holds one connection, guarded by a lock, so
it may be shared among threads.

The schema is versioned (:mod:`pollux.cluster.state.schema`): opening an older database migrates it, each
version's steps inside one transaction; opening one newer than this code knows raises
:class:`SchemaVersionError`. Job tokens are stored only as hashes (:func:`hash_token`): the plain
token exists on the record :meth:`JobStore.submit` returns and in :meth:`JobStore.issue_token`'s
answer, never in the file. A job spec is validated strictly when submitted and read back leniently
(:meth:`JobSpec.from_stored`), so that one bad row never breaks reading the others.

The job lifecycle (states, legal moves and what each does) is :mod:`pollux.cluster.state.lifecycle`;
:meth:`JobStore.transition` applies a move, with the failure or restart it counts, in one
transaction, and records it in the ``transitions`` table. The records live in
:mod:`pollux.cluster.state.records`.

The store is split by what it keeps, one class per table in a module named after it
(:mod:`.job_table`, :mod:`.token_table`, :mod:`.user_table`, :mod:`.allocation_table`, :mod:`.hints_table`,
:mod:`.policy_state_table`, :mod:`.replica_table`), over one connection (:mod:`.database`).
:class:`JobStore` joins them, and owns the one write that spans tables: a scheduling round's result
(:meth:`JobStore.apply_round`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pollux.cluster.state.allocation_table import AllocationTable, check_allocation
from pollux.cluster.state.database import timestamp
from pollux.cluster.state.hints_table import HintsTable
from pollux.cluster.state.job_table import JobTable
from pollux.cluster.state.lifecycle import (
    ACTIVE_STATES,
    JOB_STATES,
    SCHEDULED_STATES,
    TERMINAL_STATES,
    JobState,
)
from pollux.cluster.state.policy_state_table import PolicyStateTable, write_policy_state
from pollux.cluster.state.records import (
    AllocationRecord,
    JobOutlook,
    JobRecord,
    ReplicaRecord,
    ResizeRecord,
    TransitionRecord,
    UnknownJobError,
    UnknownUserError,
    UserRecord,
)
from pollux.cluster.state.replica_table import ReplicaTable
from pollux.cluster.state.round_table import RoundTable, write_outlooks, write_round
from pollux.cluster.state.schema import MIGRATIONS, SCHEMA_VERSION, SchemaVersionError, hash_token
from pollux.cluster.state.spec import JobSpec, SpecError
from pollux.cluster.state.token_table import TokenTable
from pollux.cluster.state.user_table import UserTable
from pollux.policy.base import PolicyState

__all__ = [
    "ACTIVE_STATES",
    "JOB_STATES",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "AllocationRecord",
    "JobRecord",
    "JobSpec",
    "JobStore",
    "ReplicaRecord",
    "ResizeRecord",
    "SchemaVersionError",
    "SpecError",
    "TransitionRecord",
    "UnknownJobError",
    "UnknownUserError",
    "UserRecord",
    "hash_token",
]


class JobStore(JobTable, TokenTable, UserTable, AllocationTable, HintsTable, PolicyStateTable, ReplicaTable,
               RoundTable):
    """The persistent job store; see the module docstring."""

    def apply_round(self, policy: str, policy_state: PolicyState | None,
                    changed: Mapping[str, Mapping[str, int]],
                    now: float | None = None, *, outlook: Iterable[JobOutlook] = (),
                    duration_s: float = 0.0, jobs: int = 0,
                    objective: float | None = None) -> dict[str, JobRecord]:
        """Write a scheduling round's result in one transaction: the policy's state, each changed
        job's new allocation (a pending job given GPUs starts: pending → starting), the round itself
        (``duration_s``: the policy's time; ``jobs`` it saw; the ``objective`` its policy reached) and
        each job's ``outlook``.

        A job no longer scheduled (cancelled, or finished, since the round read the store) is left
        alone. Every allocation is checked before anything is written, so a bad row writes nothing.
        Returns the jobs written, after the write.
        """
        rows = {job_id: check_allocation(row) for job_id, row in changed.items()}
        t = timestamp(now)
        written: dict[str, JobRecord] = {}
        with self._tx() as conn:
            write_policy_state(conn, policy, policy_state, t)
            write_round(conn, t, float(duration_s), policy, int(jobs), len(rows),
                        None if objective is None else float(objective))
            write_outlooks(conn, outlook)
            for job_id, row in rows.items():
                state = self._row(conn, job_id)["state"]
                if state not in SCHEDULED_STATES:
                    continue
                start = bool(row) and state == JobState.PENDING
                written[job_id] = self._transition(conn, job_id, JobState.STARTING if start else None,
                                                   "allocated", t, failure=False, restart=False, alloc=row,
                                                   expect=SCHEDULED_STATES)
        return written
