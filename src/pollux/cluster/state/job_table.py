"""The jobs of the store: submitting, reading and listing them, and moving them through their
lifecycle (:mod:`pollux.cluster.state.lifecycle`) with what each move counts, in one transaction."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import secrets
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollux.cluster.state.allocation_table import check_allocation, write_allocation
from pollux.cluster.state.database import StoreConnection, stored_spec, timestamp
from pollux.cluster.state.lifecycle import JOB_STATES, TERMINAL_STATES, check_transition, effects
from pollux.cluster.state.records import JobRecord, TransitionRecord, UnknownJobError
from pollux.cluster.state.schema import hash_token
from pollux.cluster.state.spec import JobSpec, is_job_id, validate_name
from pollux.cluster.state.tokens import new_token

__all__ = ["LISTING_COLUMNS", "MAX_PAGE_SIZE", "JobPage", "JobTable"]

_log = logging.getLogger(__name__)

#: The most jobs one page of a listing holds.
MAX_PAGE_SIZE = 500

#: The columns of :meth:`JobTable.listing_rows`'s rows, in this order: every column a job's record is
#: read from (not its token's hash).
LISTING_COLUMNS: tuple[str, ...] = (
    "id", "name", "spec", "state", "submit_time", "start_time", "end_time", "restarts", "failure_reason",
    "attained_service", "allocation", "failures", "owner",
)
_ID = LISTING_COLUMNS.index("id")
_SPEC = LISTING_COLUMNS.index("spec")
_STATE = LISTING_COLUMNS.index("state")


@dataclass(frozen=True)
class JobPage:
    """One page of a job listing: its jobs (submission order) and how many jobs the filter matches."""

    jobs: list[JobRecord]
    total: int


def _job_filter(states: Iterable[str] | None, *, owner: str | None = None,
                admins_only: bool = False) -> tuple[list[str] | None, str, list[Any]]:
    """The states asked for (checked; ValueError naming an unknown one), and the ``WHERE`` clause
    and parameters that keep only jobs in them, only ``owner``'s or — ``admins_only`` — the admin's."""
    wanted = None if states is None else list(states)
    for state in wanted or ():
        if state not in JOB_STATES:
            raise ValueError(f"states: unknown job state {state!r}")
    where: list[str] = []
    params: list[Any] = []
    if wanted is not None:
        where.append(f"state IN ({','.join('?' * len(wanted))})")
        params += wanted
    if admins_only:
        where.append("owner IS NULL")
    elif owner is not None:
        where.append("owner = ?")
        params.append(owner)
    clause = f"WHERE {' AND '.join(where)} " if where else ""
    return wanted, clause, params


class JobTable(StoreConnection):
    """Jobs and their transitions."""

    def submit(self, spec: JobSpec | Mapping[str, Any], *, name: str | None = None,
               job_id: str | None = None, now: float | None = None, owner: str | None = None) -> JobRecord:
        """Add a pending job; ``job_id`` defaults to ``job-<8 hex>``, ``name`` to the id; ``owner`` is
        the user submitting it (None: the admin).

        Raises :class:`SpecError` (a ValueError naming the field) for a bad spec or name, ValueError
        for a bad id or one already taken. The returned record is the only one that carries the
        job's plain token; the store keeps its hash.
        """
        spec = JobSpec.from_dict(spec.to_dict() if isinstance(spec, JobSpec) else spec)
        if name is not None:
            name = validate_name(name)
        if job_id is not None and (not isinstance(job_id, str) or not is_job_id(job_id)):
            raise ValueError(f"job_id: expected 1-128 letters, digits, '.', '_' or '-', got {job_id!r:.80}")
        token = new_token()
        t = timestamp(now)
        with self._tx() as conn:
            if job_id is None:
                while True:
                    job_id = f"job-{secrets.token_hex(4)}"
                    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                        break
            elif conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None:
                raise ValueError(f"job_id: {job_id!r} already exists")
            conn.execute(
                "INSERT INTO jobs (id, name, spec, state, token_hash, submit_time, owner) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, name if name is not None else job_id, json.dumps(spec.to_dict()), "pending",
                 hash_token(token), t, owner))
            conn.execute("INSERT INTO transitions (job_id, from_state, to_state, time, reason) "
                         "VALUES (?, NULL, 'pending', ?, 'submitted')", (job_id, t))
            return dataclasses.replace(self._job(self._row(conn, job_id)), token=token)

    def get_job(self, job_id: str) -> JobRecord:
        """The job; raises :class:`UnknownJobError` (a KeyError) for an unknown id."""
        with self._lock:
            return self._job(self._row(self._conn, job_id))

    def list_jobs(self, states: Iterable[str] | None = None, *, owner: str | None = None) -> list[JobRecord]:
        """Jobs in submission order, optionally only those in ``states`` and only ``owner``'s.

        Never fails because of one bad row: a job whose stored spec no longer validates is listed
        with ``spec_error`` set, and if it is not terminal yet it is failed first (reason
        ``invalid spec: ...``), so that no scheduling round ever sees it.
        """
        wanted, clause, params = _job_filter(states, owner=owner)
        with self._lock:
            query = f"SELECT * FROM jobs {clause}ORDER BY submit_time, rowid"
            rows = self._conn.execute(query, params).fetchall()
            jobs = [self._job(r) for r in rows]
            if any(j.spec_error is not None and not j.terminal for j in jobs):
                jobs = [self._fail_invalid(j) for j in jobs]
                if wanted is not None:
                    jobs = [j for j in jobs if j.state in wanted]
            return jobs

    def listing_rows(self, states: Iterable[str] | None = None, *,
                     owner: str | None = None) -> list[tuple[Any, ...]]:
        """The jobs :meth:`list_jobs` lists, as their rows: :data:`LISTING_COLUMNS` as stored (plain
        tuples), in the same order, after failing the same jobs (a non-terminal job whose stored spec
        no longer validates; the rows are then read again).

        For an answer made from the rows themselves: the API's listing remembers each job's JSON by
        the row it was made from (:mod:`pollux.cluster.api.listing`); reading 5,000 rows costs a
        fraction of reading them into records.
        """
        _, clause, params = _job_filter(states, owner=owner)
        query = f"SELECT {', '.join(LISTING_COLUMNS)} FROM jobs {clause}ORDER BY submit_time, rowid"
        with self._lock:
            rows = self._plain_rows(query, params)
            invalid = [row[_ID] for row in rows
                       if row[_STATE] not in TERMINAL_STATES and stored_spec(row[_SPEC])[1] is not None]
            if not invalid:
                return rows
            for job_id in invalid:
                self._fail_invalid(self._job(self._row(self._conn, job_id)))
            return self._plain_rows(query, params)

    def _plain_rows(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows of ``query`` as plain tuples (not :class:`sqlite3.Row`, which costs more), their
        text decoded by :mod:`sqlite3` itself: the store's lenient text factory, a Python call per
        value, was a third of the time of reading 5,000 rows. A text that is not UTF-8 (a file edited
        by hand) fails the strict decoding; the rows are then read again the lenient way, so they
        hold the same values either way. The caller holds the lock (the factory is the connection's)."""
        cursor = self._conn.cursor()
        cursor.row_factory = None
        lenient = self._conn.text_factory
        self._conn.text_factory = str
        try:
            return cursor.execute(query, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):
                raise
        finally:
            self._conn.text_factory = lenient
        return cursor.execute(query, params).fetchall()

    def jobs_page(self, states: Iterable[str] | None = None, *, owner: str | None = None,
                  admins_only: bool = False, offset: int = 0, limit: int = 50,
                  newest_first: bool = False) -> JobPage:
        """One page of the jobs in submission order, or the newest first (SQL ``LIMIT``/``OFFSET``: a
        page costs the same with 50 jobs or 100,000), optionally only those in ``states``, only
        ``owner``'s, or — with ``admins_only`` — only the admin's (owner NULL); with the number of
        jobs the filter matches.

        A read, and only a read: a job whose stored spec no longer validates is shown with
        ``spec_error`` set (:meth:`list_jobs` fails such jobs; a page of the web view does not write).
        ValueError for an unknown state, a negative offset or a limit outside 1 … :data:`MAX_PAGE_SIZE`.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset: expected a non-negative integer, got {offset!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
            raise ValueError(f"limit: expected an integer from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
        _, clause, params = _job_filter(states, owner=owner, admins_only=admins_only)
        with self._lock:
            total = int(self._conn.execute(f"SELECT COUNT(*) FROM jobs {clause}", params).fetchone()[0])
            order = "submit_time DESC, rowid DESC" if newest_first else "submit_time, rowid"
            rows = self._conn.execute(f"SELECT * FROM jobs {clause}ORDER BY {order} LIMIT ? OFFSET ?",
                                      [*params, limit, offset]).fetchall()
            return JobPage([self._job(r) for r in rows], total)

    def _fail_invalid(self, job: JobRecord) -> JobRecord:
        if job.spec_error is None or job.terminal:
            return job
        _log.error("job %s: stored spec is invalid (%s); failing it", job.id, job.spec_error)
        try:
            return self.transition(job.id, "failed", reason=f"invalid spec: {job.spec_error}")
        except (sqlite3.Error, ValueError) as exc:  # a read-only file, or it moved on meanwhile
            _log.error("job %s: could not fail it: %s", job.id, exc)
            return job

    def count_by_state(self) -> dict[str, int]:
        """``{state: number of jobs}`` for every state of :data:`JOB_STATES` (zeros included),
        counted by SQL without loading a single job."""
        counts = dict.fromkeys(JOB_STATES, 0)
        with self._lock:
            for state, n in self._conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"):
                counts[state] = int(n)
        return counts

    def transition(self, job_id: str, new_state: str | None, reason: str | None = None,
                   now: float | None = None, *, failure: bool = False, restart: bool = False,
                   allocation: Mapping[str, int] | None = None,
                   expect: Iterable[str] | None = None) -> JobRecord:
        """Move a job to ``new_state`` (None: stay), counting a ``failure`` and/or a ``restart`` of
        it in the same transaction; returns the job after.

        The move is checked by :func:`pollux.cluster.state.lifecycle.check_transition` (ValueError naming
        from/to for an illegal one) and its effects applied: start time on first running, end time
        and (for failed) the reason on a terminal state, the allocation cleared on pending or a
        terminal state. ``allocation`` (after the move) replaces the job's allocation and is appended
        to its history. With ``expect``, a job found in another state is left alone (nothing is
        written) and returned as it is: the caller acted on a state that changed meanwhile.
        """
        alloc = None if allocation is None else check_allocation(allocation)
        with self._tx() as conn:
            return self._transition(conn, job_id, new_state, reason, timestamp(now), failure=failure,
                                    restart=restart, alloc=alloc, expect=expect)

    def _transition(self, conn: sqlite3.Connection, job_id: str, new_state: str | None, reason: str | None,
                    t: float, *, failure: bool, restart: bool, alloc: dict[str, int] | None,
                    expect: Iterable[str] | None) -> JobRecord:
        """:meth:`transition` inside the caller's transaction."""
        row = self._row(conn, job_id)
        old = row["state"]
        if expect is not None and old not in set(expect):
            return self._job(row)
        sets: list[str] = []
        params: list[Any] = []
        if failure:
            sets.append("failures = failures + 1")
        if restart:
            sets.append("restarts = restarts + 1")
        if new_state is not None:
            target = check_transition(job_id, old, new_state)
            fx = effects(target, started=row["start_time"] is not None)
            sets.append("state = ?")
            params.append(target.value)
            if fx.set_start_time:
                sets.append("start_time = ?")
                params.append(t)
            if fx.set_end_time:
                sets.append("end_time = ?")
                params.append(t)
            if fx.set_failure_reason:
                sets.append("failure_reason = ?")
                params.append(reason)
            if fx.clear_allocation and json.loads(row["allocation"]):
                sets.append("allocation = '{}'")
                conn.execute("INSERT INTO allocations (job_id, time, allocation) VALUES (?, ?, '{}')",
                             (job_id, t))
            conn.execute("INSERT INTO transitions (job_id, from_state, to_state, time, reason) "
                         "VALUES (?, ?, ?, ?, ?)", (job_id, old, target.value, t, reason))
        if sets:
            conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*params, job_id))
        if alloc is not None:
            write_allocation(conn, job_id, alloc, t)
        return self._job(self._row(conn, job_id))

    def transitions(self, job_id: str) -> list[TransitionRecord]:
        """The job's state history, oldest first (the first entry is the submission, from None)."""
        with self._lock:
            self._row(self._conn, job_id)
            rows = self._conn.execute(
                "SELECT * FROM transitions WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
            return [TransitionRecord(r["job_id"], r["from_state"], r["to_state"], r["time"], r["reason"])
                    for r in rows]

    def add_restart(self, job_id: str) -> int:
        """Count one more restart of the job; returns the new count."""
        return self.transition(job_id, None, restart=True).restarts

    def add_failure(self, job_id: str) -> int:
        """Count one more failed run of the job (a replica exited with an error); returns the count."""
        return self.transition(job_id, None, failure=True).failures

    def add_service(self, job_id: str, gpu_seconds: float) -> float:
        """Add attained service (GPU-seconds) to the job; returns the new total."""
        if not math.isfinite(gpu_seconds) or gpu_seconds < 0:
            raise ValueError(f"gpu_seconds: expected a finite non-negative number, got {gpu_seconds!r}")
        with self._tx() as conn:
            self._row(conn, job_id)
            conn.execute("UPDATE jobs SET attained_service = attained_service + ? WHERE id = ?",
                         (float(gpu_seconds), job_id))
            return float(self._row(conn, job_id)["attained_service"])

    def add_services(self, gpu_seconds: Mapping[str, float]) -> None:
        """Add attained service to many jobs in one transaction: all of it, or (an unknown job, a
        bad amount) none of it.

        Why: the control loop accounts every running job before each round. One transaction per
        job — a thousand a round at size — held the store's lock a thousand times in a row, and every
        API call that needed the store queued behind the run of them (``benchmarks/service_scale.py``).
        """
        for job_id, amount in gpu_seconds.items():
            if not math.isfinite(amount) or amount < 0:
                raise ValueError(f"gpu_seconds[{job_id!r}]: expected a finite non-negative number, "
                                 f"got {amount!r}")
        if not gpu_seconds:
            return
        with self._tx() as conn:
            for job_id, amount in gpu_seconds.items():
                cursor = conn.execute("UPDATE jobs SET attained_service = attained_service + ? WHERE id = ?",
                                      (float(amount), job_id))
                if cursor.rowcount != 1:
                    raise UnknownJobError(job_id)
