"""The persistent job store of the live scheduler (SPEC §9): SQLite, one file.

Every operation commits before it returns, so a service restart loses nothing, and a second
:class:`JobStore` on the same file (another thread or process) sees every change. The database runs
in WAL mode with foreign keys on; one :class:`JobStore` holds one connection, guarded by a lock, so
it may be shared among threads.

The schema is versioned: ``schema_version`` holds one row, and :data:`MIGRATIONS` lists the SQL steps
that take a database from version ``i`` to ``i + 1``, each applied inside one transaction. Opening an
older database migrates it; opening one newer than this code knows raises :class:`SchemaVersionError`.

Job lifecycle (every transition recorded in the ``transitions`` table)::

    pending → starting → running → (rescaling → running)* → succeeded | failed | cancelled
    pending | starting | running | rescaling → cancelled | failed
    starting → pending   (requeue after a failed launch)
    running | rescaling → pending    (preempted to zero GPUs, or the service stopped)

Entering ``pending`` or a terminal state clears the job's current allocation (an empty allocation is
appended to its history when it had GPUs).
"""

from __future__ import annotations

import json
import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pollux.hints import validate_hints
from pollux.policy.base import PolicyState, decode_state, encode_state

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
    "SchemaVersionError",
    "TransitionRecord",
    "UnknownJobError",
]

JOB_STATES = ("pending", "starting", "running", "rescaling", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE_STATES = frozenset({"starting", "running", "rescaling"})

#: Legal transitions: from state → the states it may move to.
_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"starting", "cancelled", "failed"}),
    "starting": frozenset({"running", "pending", "cancelled", "failed"}),
    "running": frozenset({"rescaling", "succeeded", "failed", "cancelled", "pending"}),
    "rescaling": frozenset({"running", "pending", "cancelled", "failed"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

#: Migration steps: ``MIGRATIONS[i]`` takes the schema from version ``i`` to ``i + 1``.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            token TEXT NOT NULL,
            submit_time REAL NOT NULL,
            start_time REAL,
            end_time REAL,
            restarts INTEGER NOT NULL DEFAULT 0,
            failure_reason TEXT,
            attained_service REAL NOT NULL DEFAULT 0.0,
            allocation TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX jobs_state ON jobs(state)",
        """CREATE TABLE transitions (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            from_state TEXT,
            to_state TEXT NOT NULL,
            time REAL NOT NULL,
            reason TEXT
        )""",
        "CREATE INDEX transitions_job ON transitions(job_id, seq)",
        """CREATE TABLE allocations (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            time REAL NOT NULL,
            allocation TEXT NOT NULL
        )""",
        "CREATE INDEX allocations_job ON allocations(job_id, seq)",
        """CREATE TABLE hints (
            job_id TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
            time REAL NOT NULL,
            hints TEXT NOT NULL
        )""",
        """CREATE TABLE policy_state (
            name TEXT PRIMARY KEY,
            time REAL NOT NULL,
            state TEXT NOT NULL
        )""",
        """CREATE TABLE replicas (
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            restart INTEGER NOT NULL,
            rank INTEGER NOT NULL,
            node TEXT NOT NULL,
            pid INTEGER,
            log_path TEXT,
            start_time REAL NOT NULL,
            exit_code INTEGER,
            end_time REAL,
            PRIMARY KEY (job_id, restart, rank)
        )""",
    ],
    [
        # Version 2: failed runs are counted apart from restarts (re-allocations also restart a job),
        # so that only failures use up the retry budget.
        "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
    ],
]
#: The schema version this code writes.
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaVersionError(RuntimeError):
    """The database was written by a newer Pollux with a schema this code does not know."""


class UnknownJobError(KeyError):
    """No job with this id in the store."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(job_id)

    def __str__(self) -> str:
        return f"unknown job {self.job_id!r}"


# ---------------------------------------------------------------------------------------------- records


def _int(data: Mapping[str, Any], name: str, *, minimum: int, default: Any = ...) -> Any:
    if name not in data or data[name] is None:
        if default is ...:
            raise ValueError(f"{name}: required field is missing")
        return default
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class JobSpec:
    """What a user submits: how to run the job and its batch and replica limits.

    ``entrypoint`` and ``init_batch_size`` are required. ``max_batch_size`` None means a fixed batch;
    ``local_bsz_bounds`` entries None mean unbounded; ``resources`` are per replica (default one GPU).
    """

    entrypoint: str
    init_batch_size: int
    args: tuple[str, ...] = ()
    working_dir: str | None = None
    max_batch_size: int | None = None
    local_bsz_bounds: tuple[int | None, int | None] | None = None
    min_replicas: int = 0
    max_replicas: int | None = None
    resources: dict[str, float] = field(default_factory=lambda: {"GPU": 1.0})
    preemptible: bool = True

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Validate a spec dict; raises ValueError whose message starts with the offending field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"spec: expected an object, got {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field")
        entry = data.get("entrypoint")
        if entry is None:
            raise ValueError("entrypoint: required field is missing")
        if not isinstance(entry, str) or not entry.strip():
            raise ValueError(f"entrypoint: expected a non-empty string, got {entry!r}")
        args = data.get("args") or ()
        if isinstance(args, str) or not isinstance(args, Sequence) or \
                not all(isinstance(a, str) for a in args):
            raise ValueError(f"args: expected a list of strings, got {args!r}")
        working_dir = data.get("working_dir")
        if working_dir is not None and not isinstance(working_dir, str):
            raise ValueError(f"working_dir: expected a string, got {working_dir!r}")
        init = _int(data, "init_batch_size", minimum=1)
        max_bsz = _int(data, "max_batch_size", minimum=1, default=None)
        if max_bsz is not None and max_bsz < init:
            raise ValueError(f"max_batch_size: {max_bsz} is below init_batch_size {init}")
        bounds = data.get("local_bsz_bounds")
        if bounds is not None:
            if isinstance(bounds, str) or not isinstance(bounds, Sequence) or len(bounds) != 2:
                raise ValueError(f"local_bsz_bounds: expected [lo, hi], got {bounds!r}")
            lo = _int({"local_bsz_bounds": bounds[0]}, "local_bsz_bounds", minimum=1, default=None)
            hi = _int({"local_bsz_bounds": bounds[1]}, "local_bsz_bounds", minimum=1, default=None)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"local_bsz_bounds: lower bound {lo} exceeds upper bound {hi}")
            bounds = (lo, hi)
        min_r = _int(data, "min_replicas", minimum=0, default=0)
        max_r = _int(data, "max_replicas", minimum=1, default=None)
        if max_r is not None and max_r < min_r:
            raise ValueError(f"max_replicas: {max_r} is below min_replicas {min_r}")
        resources = data.get("resources")
        if resources is None:
            resources = {"GPU": 1.0}
        if not isinstance(resources, Mapping):
            raise ValueError(f"resources: expected an object, got {resources!r}")
        res: dict[str, float] = {}
        for key, value in resources.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"resources.{key}: expected a finite non-negative number, got {value!r}")
            res[key] = float(value)
        preemptible = data.get("preemptible", True)
        if not isinstance(preemptible, bool):
            raise ValueError(f"preemptible: expected a boolean, got {preemptible!r}")
        return cls(entrypoint=entry, init_batch_size=init, args=tuple(args), working_dir=working_dir,
                   max_batch_size=max_bsz, local_bsz_bounds=bounds, min_replicas=min_r,
                   max_replicas=max_r, resources=res, preemptible=preemptible)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types; ``JobSpec.from_dict(spec.to_dict()) == spec``."""
        out = asdict(self)
        out["args"] = list(self.args)
        out["local_bsz_bounds"] = None if self.local_bsz_bounds is None else list(self.local_bsz_bounds)
        out["resources"] = dict(self.resources)
        return out


@dataclass(frozen=True)
class JobRecord:
    """One row of ``jobs``; ``allocation`` is the job's current ``{node: GPUs}``."""

    id: str
    name: str
    spec: JobSpec
    state: str
    token: str
    submit_time: float
    start_time: float | None
    end_time: float | None
    restarts: int
    failure_reason: str | None
    attained_service: float
    allocation: dict[str, int]
    failures: int = 0

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


# ----------------------------------------------------------------------------------------------- store


def _now(now: float | None) -> float:
    return time.time() if now is None else float(now)


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
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
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
        with self._lock:
            while True:
                with self._tx() as conn:
                    version = self._read_version()
                    if version > SCHEMA_VERSION:
                        raise SchemaVersionError(
                            f"job store {self.path} has schema version {version}, newer than the "
                            f"{SCHEMA_VERSION} this Pollux knows; upgrade Pollux to open it")
                    if version == SCHEMA_VERSION:
                        return
                    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                    conn.execute("DELETE FROM schema_version")
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version + 1,))

    def _row(self, conn: sqlite3.Connection, job_id: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJobError(job_id)
        return row

    @staticmethod
    def _job(row: sqlite3.Row) -> JobRecord:
        return JobRecord(
            id=row["id"], name=row["name"], spec=JobSpec.from_dict(json.loads(row["spec"])),
            state=row["state"], token=row["token"], submit_time=row["submit_time"],
            start_time=row["start_time"], end_time=row["end_time"], restarts=row["restarts"],
            failure_reason=row["failure_reason"], attained_service=row["attained_service"],
            allocation=json.loads(row["allocation"]), failures=row["failures"])

    # -- jobs

    def submit(self, spec: JobSpec | Mapping[str, Any], *, name: str | None = None,
               job_id: str | None = None, now: float | None = None) -> JobRecord:
        """Add a pending job; ``job_id`` defaults to ``job-<8 hex>``. Raises ValueError on a bad spec
        or an id already taken."""
        spec = spec if isinstance(spec, JobSpec) else JobSpec.from_dict(spec)
        t = _now(now)
        with self._tx() as conn:
            if job_id is None:
                while True:
                    job_id = f"job-{secrets.token_hex(4)}"
                    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
                        break
            elif not isinstance(job_id, str) or not job_id:
                raise ValueError(f"job_id: expected a non-empty string, got {job_id!r}")
            elif conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None:
                raise ValueError(f"job_id: {job_id!r} already exists")
            conn.execute(
                "INSERT INTO jobs (id, name, spec, state, token, submit_time) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, name if name is not None else job_id, json.dumps(spec.to_dict()), "pending",
                 secrets.token_urlsafe(32), t))
            conn.execute("INSERT INTO transitions (job_id, from_state, to_state, time, reason) "
                         "VALUES (?, NULL, 'pending', ?, 'submitted')", (job_id, t))
            return self._job(self._row(conn, job_id))

    def get_job(self, job_id: str) -> JobRecord:
        """The job; raises :class:`UnknownJobError` (a KeyError) for an unknown id."""
        with self._lock:
            return self._job(self._row(self._conn, job_id))

    def list_jobs(self, states: Iterable[str] | None = None) -> list[JobRecord]:
        """Jobs in submission order, optionally only those in ``states``."""
        with self._lock:
            if states is None:
                rows = self._conn.execute("SELECT * FROM jobs ORDER BY submit_time, rowid").fetchall()
            else:
                wanted = list(states)
                for s in wanted:
                    if s not in JOB_STATES:
                        raise ValueError(f"states: unknown job state {s!r}")
                marks = ",".join("?" * len(wanted))
                rows = self._conn.execute(
                    f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY submit_time, rowid",
                    wanted).fetchall()
            return [self._job(r) for r in rows]

    def transition(self, job_id: str, new_state: str, reason: str | None = None,
                   now: float | None = None) -> JobRecord:
        """Move a job to ``new_state``; raises ValueError naming from/to for an illegal move."""
        if new_state not in JOB_STATES:
            raise ValueError(f"unknown job state {new_state!r}")
        t = _now(now)
        with self._tx() as conn:
            row = self._row(conn, job_id)
            old = row["state"]
            if new_state not in _TRANSITIONS[old]:
                raise ValueError(f"illegal transition of job {job_id!r} from {old!r} to {new_state!r}")
            sets = ["state = ?"]
            params: list[Any] = [new_state]
            if new_state == "running" and row["start_time"] is None:
                sets.append("start_time = ?")
                params.append(t)
            if new_state in TERMINAL_STATES:
                sets.append("end_time = ?")
                params.append(t)
            if new_state == "failed":
                sets.append("failure_reason = ?")
                params.append(reason)
            if (new_state in TERMINAL_STATES or new_state == "pending") and json.loads(row["allocation"]):
                sets.append("allocation = '{}'")
                conn.execute("INSERT INTO allocations (job_id, time, allocation) VALUES (?, ?, '{}')",
                             (job_id, t))
            conn.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*params, job_id))
            conn.execute("INSERT INTO transitions (job_id, from_state, to_state, time, reason) "
                         "VALUES (?, ?, ?, ?, ?)", (job_id, old, new_state, t, reason))
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
        with self._tx() as conn:
            self._row(conn, job_id)
            conn.execute("UPDATE jobs SET restarts = restarts + 1 WHERE id = ?", (job_id,))
            return int(self._row(conn, job_id)["restarts"])

    def add_failure(self, job_id: str) -> int:
        """Count one more failed run of the job (a replica exited with an error); returns the count."""
        with self._tx() as conn:
            self._row(conn, job_id)
            conn.execute("UPDATE jobs SET failures = failures + 1 WHERE id = ?", (job_id,))
            return int(self._row(conn, job_id)["failures"])

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
            text = json.dumps(alloc)
            conn.execute("UPDATE jobs SET allocation = ? WHERE id = ?", (text, job_id))
            conn.execute("INSERT INTO allocations (job_id, time, allocation) VALUES (?, ?, ?)",
                         (job_id, t, text))

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
        """Validate (``HintsError``, a ValueError naming the field) and store the job's latest hints."""
        data = validate_hints(hints)
        t = _now(now)
        with self._tx() as conn:
            self._row(conn, job_id)
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

    # -- policy state

    def save_policy_state(self, name: str, state: PolicyState | None, now: float | None = None) -> None:
        text = json.dumps(encode_state(state) if state is not None else None, allow_nan=True)
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
            return None if data is None else decode_state(data)

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
