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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pollux.cluster.state.lifecycle import (
    ACTIVE_STATES,
    JOB_STATES,
    TERMINAL_STATES,
    check_transition,
    effects,
)
from pollux.cluster.state.records import (
    AllocationRecord,
    JobRecord,
    ReplicaRecord,
    ResizeRecord,
    TransitionRecord,
    UnknownJobError,
)
from pollux.cluster.state.schema import MIGRATIONS, SCHEMA_VERSION, SchemaVersionError, hash_token
from pollux.cluster.state.spec import JobSpec, SpecError, is_job_id, validate_name
from pollux.hints import merge_type_profiles, validate_hints
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
    "hash_token",
]

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- store


def _now(now: float | None) -> float:
    return time.time() if now is None else float(now)


#: What an explicit ``job_id`` may be (it appears in URLs, file names and Ray actor names).


def _stored_allocation(text: str) -> dict[str, int]:
    """A stored ``{node: GPUs}``; an unreadable one reads as no allocation rather than raising."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): int(v) for k, v in data.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 0}


def _decode_text(raw: bytes) -> str:
    """SQLite TEXT to str; bytes that are not UTF-8 (a file edited by hand) do not fail the read."""
    return raw.decode("utf-8", "replace")


def _check_allocation(allocation: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(allocation, Mapping):
        raise ValueError(f"allocation: expected {{node: gpus}}, got {allocation!r}")
    out: dict[str, int] = {}
    for node, gpus in allocation.items():
        if not isinstance(node, str) or isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ValueError(f"allocation.{node}: expected a non-negative integer, got {gpus!r}")
        if gpus:
            out[node] = int(gpus)
    return dict(sorted(out.items()))


class JobStore:
    """The persistent job store; see the module docstring."""

    def __init__(self, path: Path | str, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None,
                                     check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.text_factory = _decode_text
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            # Deleted or replaced content (a plain token before migration 3) is zeroed, not left behind.
            self._conn.execute("PRAGMA secure_delete=ON")
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    # -- plumbing

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self)

    @property
    def schema_version(self) -> int:
        with self._lock:
            return self._read_version()

    def _read_version(self) -> int:
        row = self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone()
        if row is None:
            return 0
        row = self._conn.execute("SELECT version FROM schema_version").fetchone()
        return 0 if row is None else int(row[0])

    def _migrate(self) -> None:
        migrated = False
        with self._lock:
            while True:
                with self._tx() as conn:
                    version = self._read_version()
                    if version > SCHEMA_VERSION:
                        raise SchemaVersionError(
                            f"job store {self.path} has schema version {version}, newer than the "
                            f"{SCHEMA_VERSION} this Pollux knows; upgrade Pollux to open it")
                    if version == SCHEMA_VERSION:
                        break
                    migrated = True
                    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                    for step in MIGRATIONS[version]:
                        if callable(step):
                            step(conn)
                        else:
                            conn.execute(step)
                    conn.execute("DELETE FROM schema_version")
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version + 1,))
            if migrated:  # write the migrated pages into the file now, overwriting the old ones
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _row(self, conn: sqlite3.Connection, job_id: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJobError(job_id)
        return row

    @staticmethod
    def _job(row: sqlite3.Row) -> JobRecord:
        """A record from a row; never raises for a row whose content no longer validates."""
        spec, spec_error = JobSpec.from_stored(row["spec"])
        return JobRecord(
            id=row["id"], name=row["name"], spec=spec, state=row["state"], token=None,
            submit_time=row["submit_time"], start_time=row["start_time"], end_time=row["end_time"],
            restarts=row["restarts"], failure_reason=row["failure_reason"],
            attained_service=row["attained_service"], allocation=_stored_allocation(row["allocation"]),
            failures=row["failures"], spec_error=spec_error)

    # -- jobs

    def submit(self, spec: JobSpec | Mapping[str, Any], *, name: str | None = None,
               job_id: str | None = None, now: float | None = None) -> JobRecord:
        """Add a pending job; ``job_id`` defaults to ``job-<8 hex>``, ``name`` to the id.

        Raises :class:`SpecError` (a ValueError naming the field) for a bad spec or name, ValueError
        for a bad id or one already taken. The returned record is the only one that carries the
        job's plain token; the store keeps its hash.
        """
        spec = JobSpec.from_dict(spec.to_dict() if isinstance(spec, JobSpec) else spec)
        if name is not None:
            name = validate_name(name)
        if job_id is not None and (not isinstance(job_id, str) or not is_job_id(job_id)):
            raise ValueError(f"job_id: expected 1-128 letters, digits, '.', '_' or '-', got {job_id!r:.80}")
        token = secrets.token_urlsafe(32)
        t = _now(now)
        with self._tx() as conn:
            if job_id is None:
                while True:
                    job_id = f"job-{secrets.token_hex(4)}"
                    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                        break
            elif conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None:
                raise ValueError(f"job_id: {job_id!r} already exists")
            conn.execute(
                "INSERT INTO jobs (id, name, spec, state, token_hash, submit_time) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, name if name is not None else job_id, json.dumps(spec.to_dict()), "pending",
                 hash_token(token), t))
            conn.execute("INSERT INTO transitions (job_id, from_state, to_state, time, reason) "
                         "VALUES (?, NULL, 'pending', ?, 'submitted')", (job_id, t))
            return dataclasses.replace(self._job(self._row(conn, job_id)), token=token)

    def get_job(self, job_id: str) -> JobRecord:
        """The job; raises :class:`UnknownJobError` (a KeyError) for an unknown id."""
        with self._lock:
            return self._job(self._row(self._conn, job_id))

    def list_jobs(self, states: Iterable[str] | None = None) -> list[JobRecord]:
        """Jobs in submission order, optionally only those in ``states``.

        Never fails because of one bad row: a job whose stored spec no longer validates is listed
        with ``spec_error`` set, and if it is not terminal yet it is failed first (reason
        ``invalid spec: ...``), so that no scheduling round ever sees it.
        """
        wanted = None if states is None else list(states)
        for s in wanted or ():
            if s not in JOB_STATES:
                raise ValueError(f"states: unknown job state {s!r}")
        with self._lock:
            if wanted is None:
                rows = self._conn.execute("SELECT * FROM jobs ORDER BY submit_time, rowid").fetchall()
            else:
                marks = ",".join("?" * len(wanted))
                rows = self._conn.execute(
                    f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY submit_time, rowid",
                    wanted).fetchall()
            jobs = [self._job(r) for r in rows]
            if any(j.spec_error is not None and not j.terminal for j in jobs):
                jobs = [self._fail_invalid(j) for j in jobs]
                if wanted is not None:
                    jobs = [j for j in jobs if j.state in wanted]
            return jobs

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

    # -- tokens

    def issue_token(self, job_id: str) -> str:
        """A new random token for the job, whose hash replaces the previous one; returns it plain.

        The controller calls this at every launch and hands the token to the replicas
        (``POLLUX_JOB_TOKEN``); a replica of an earlier launch can no longer act for the job.
        """
        token = secrets.token_urlsafe(32)
        with self._tx() as conn:
            self._row(conn, job_id)
            conn.execute("UPDATE jobs SET token_hash = ? WHERE id = ?", (hash_token(token), job_id))
        return token

    def token_matches(self, job_id: str, token: Any) -> bool:
        """Whether ``token`` is the job's current token (a constant-time comparison of hashes);
        False for an unknown job or a token that is not a non-empty string."""
        if not isinstance(token, str) or not token:
            return False
        with self._lock:
            row = self._conn.execute("SELECT token_hash FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row is not None and secrets.compare_digest(hash_token(token), str(row[0]))

    def job_of_token(self, token: Any) -> str | None:
        """The id of the job whose current token this is, or None (so the API can answer 403 to a
        valid token of another job and 401 to a token of none). Looked up by hash, by index."""
        if not isinstance(token, str) or not token:
            return None
        with self._lock:
            row = self._conn.execute("SELECT id FROM jobs WHERE token_hash = ?",
                                     (hash_token(token),)).fetchone()
        return None if row is None else str(row[0])

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
        alloc = None if allocation is None else _check_allocation(allocation)
        t = _now(now)
        with self._tx() as conn:
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
                self._write_allocation(conn, job_id, alloc, t)
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

    # -- allocations

    def set_allocation(self, job_id: str, allocation: Mapping[str, int], now: float | None = None) -> None:
        """Set the job's current ``{node: GPUs}`` (zero entries dropped) and append it to its history."""
        alloc = _check_allocation(allocation)
        t = _now(now)
        with self._tx() as conn:
            self._row(conn, job_id)
            self._write_allocation(conn, job_id, alloc, t)

    @staticmethod
    def _write_allocation(conn: sqlite3.Connection, job_id: str, alloc: dict[str, int], t: float) -> None:
        text = json.dumps(alloc)
        conn.execute("UPDATE jobs SET allocation = ? WHERE id = ?", (text, job_id))
        conn.execute("INSERT INTO allocations (job_id, time, allocation) VALUES (?, ?, ?)", (job_id, t, text))

    def allocation_version(self, job_id: str) -> tuple[int, dict[str, int], int]:
        """``(version, allocation, applied)``: the job's current allocation, its version (the row of
        the allocation history, growing with every change; 0 before the first) and the newest version
        its master acknowledged (0: none) — what an elastic job reads to follow its allocation."""
        with self._lock:
            self._row(self._conn, job_id)
            row = self._conn.execute("SELECT seq, allocation FROM allocations WHERE job_id = ? "
                                     "ORDER BY seq DESC LIMIT 1", (job_id,)).fetchone()
            ack = self._conn.execute("SELECT MAX(version) FROM applied WHERE job_id = ?",
                                     (job_id,)).fetchone()
        if row is None:
            return 0, {}, int(ack[0] or 0)
        return int(row["seq"]), json.loads(row["allocation"]), int(ack[0] or 0)

    def ack_allocation(self, job_id: str, version: int, now: float | None = None) -> bool:
        """Record that the job applied allocation ``version`` in place; False (nothing written) if that
        is not the job's current version (a newer round overtook it). ``ValueError`` for a version
        that was never the job's."""
        t = _now(now)
        with self._tx() as conn:
            self._row(conn, job_id)
            seqs = [int(r[0]) for r in conn.execute(
                "SELECT seq FROM allocations WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()]
            if int(version) not in seqs:
                raise ValueError(f"version: {version} is not an allocation of job {job_id}")
            if int(version) != seqs[-1]:
                return False
            conn.execute("INSERT OR IGNORE INTO applied (version, job_id, time) VALUES (?, ?, ?)",
                         (int(version), job_id, t))
        return True

    def resizes(self, job_id: str) -> list[ResizeRecord]:
        """Every allocation of the job with its version and, if acknowledged, when it was applied."""
        with self._lock:
            self._row(self._conn, job_id)
            rows = self._conn.execute(
                "SELECT a.seq, a.time, a.allocation, p.time AS applied FROM allocations a "
                "LEFT JOIN applied p ON p.version = a.seq WHERE a.job_id = ? ORDER BY a.seq",
                (job_id,)).fetchall()
        return [ResizeRecord(int(r["seq"]), float(r["time"]), json.loads(r["allocation"]),
                             None if r["applied"] is None else float(r["applied"])) for r in rows]

    def allocation_history(self, job_id: str) -> list[AllocationRecord]:
        with self._lock:
            self._row(self._conn, job_id)
            rows = self._conn.execute(
                "SELECT * FROM allocations WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
            return [AllocationRecord(r["job_id"], r["time"], json.loads(r["allocation"])) for r in rows]

    def current_allocations(self) -> dict[str, dict[str, int]]:
        """``{job id: {node: GPUs}}`` of every job holding GPUs now (a policy ``Allocation``)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, allocation FROM jobs WHERE allocation != '{}' ORDER BY submit_time, rowid"
            ).fetchall()
            return {r["id"]: json.loads(r["allocation"]) for r in rows}

    # -- hints

    def put_hints(self, job_id: str, hints: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
        """Validate (``HintsError``, a ValueError naming the field) and store the job's latest hints.

        Per-GPU-type profiles of earlier hints that these do not name are kept
        (:func:`pollux.hints.merge_type_profiles`)."""
        data = validate_hints(hints)
        t = _now(now)
        with self._tx() as conn:
            self._row(conn, job_id)
            row = conn.execute("SELECT hints FROM hints WHERE job_id = ?", (job_id,)).fetchone()
            data = merge_type_profiles(None if row is None else json.loads(row["hints"]), data)
            conn.execute("INSERT INTO hints (job_id, time, hints) VALUES (?, ?, ?) ON CONFLICT(job_id) "
                         "DO UPDATE SET time = excluded.time, hints = excluded.hints",
                         (job_id, t, json.dumps(data, allow_nan=False)))
        return data

    def get_hints(self, job_id: str) -> dict[str, Any] | None:
        """The job's latest hints, or None if it has sent none."""
        with self._lock:
            self._row(self._conn, job_id)
            row = self._conn.execute("SELECT hints FROM hints WHERE job_id = ?", (job_id,)).fetchone()
            return None if row is None else json.loads(row["hints"])

    def hints_of(self, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """``{job: latest hints}`` of those of ``job_ids`` that sent some, in one query (a round)."""
        ids = sorted(set(job_ids))
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for k in range(0, len(ids), 500):   # SQLite's bound on parameters is far above 500
                chunk = ids[k:k + 500]
                rows = self._conn.execute(f"SELECT job_id, hints FROM hints WHERE job_id IN "
                                          f"({','.join('?' * len(chunk))})", chunk).fetchall()
                out.update((r["job_id"], json.loads(r["hints"])) for r in rows)
        return out

    # -- policy state

    def save_policy_state(self, name: str, state: PolicyState | None, now: float | None = None) -> None:
        text = json.dumps(state, allow_nan=True)      # opaque and JSON-able (pollux.policy.base)
        with self._tx() as conn:
            conn.execute("INSERT INTO policy_state (name, time, state) VALUES (?, ?, ?) ON CONFLICT(name) "
                         "DO UPDATE SET time = excluded.time, state = excluded.state",
                         (name, _now(now), text))

    def load_policy_state(self, name: str) -> PolicyState | None:
        """The saved state, or None if none was saved under ``name``."""
        with self._lock:
            row = self._conn.execute("SELECT state FROM policy_state WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            data = json.loads(row["state"])
            return data     # the policy decodes what it encoded (old tagged rows included)

    # -- replicas

    def record_replica(self, job_id: str, restart: int, rank: int, node: str, pid: int | None,
                       log_path: str | Path | None, now: float | None = None) -> ReplicaRecord:
        """Record a started replica process (by PID); replaces a record with the same key."""
        t = _now(now)
        with self._tx() as conn:
            self._row(conn, job_id)
            conn.execute(
                "INSERT OR REPLACE INTO replicas (job_id, restart, rank, node, pid, log_path, start_time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, int(restart), int(rank), node, pid, None if log_path is None else str(log_path), t))
            return self._replica(conn.execute(
                "SELECT * FROM replicas WHERE job_id = ? AND restart = ? AND rank = ?",
                (job_id, int(restart), int(rank))).fetchone())

    def set_replica_exit(self, job_id: str, restart: int, rank: int, exit_code: int,
                         now: float | None = None) -> None:
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE replicas SET exit_code = ?, end_time = ? "
                "WHERE job_id = ? AND restart = ? AND rank = ?",
                (int(exit_code), _now(now), job_id, int(restart), int(rank)))
            if cur.rowcount == 0:
                self._row(conn, job_id)
                raise KeyError(f"no replica (restart {restart}, rank {rank}) of job {job_id!r}")

    def replicas(self, job_id: str, restart: int | None = None) -> list[ReplicaRecord]:
        """The job's replica processes by (restart, rank), optionally of one restart only."""
        with self._lock:
            self._row(self._conn, job_id)
            if restart is None:
                rows = self._conn.execute(
                    "SELECT * FROM replicas WHERE job_id = ? ORDER BY restart, rank", (job_id,)).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT * FROM replicas WHERE job_id = ? AND restart = ? ORDER BY rank",
                    (job_id, int(restart))).fetchall()
            return [self._replica(r) for r in rows]

    @staticmethod
    def _replica(r: sqlite3.Row) -> ReplicaRecord:
        return ReplicaRecord(r["job_id"], r["restart"], r["rank"], r["node"], r["pid"], r["log_path"],
                             r["start_time"], r["exit_code"], r["end_time"])


class _Transaction:
    """``with store._tx() as conn``: take the lock, BEGIN IMMEDIATE, COMMIT or ROLLBACK."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            self.store._conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store._lock.release()
            raise
        return self.store._conn

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.store._conn.execute("COMMIT")
            else:
                self.store._conn.execute("ROLLBACK")
        finally:
            self.store._lock.release()
