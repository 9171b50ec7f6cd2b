"""The job store's connection to its SQLite file: opening it (WAL, foreign keys, secure delete),
migrating its schema, one transaction at a time, and reading a job's row into a record.

Every table of the store (:mod:`.job_table`, :mod:`.token_table`, :mod:`.allocation_table`,
:mod:`.hints_table`, :mod:`.policy_state_table`, :mod:`.replica_table`) builds on
:class:`StoreConnection`; :class:`pollux.cluster.state.store.JobStore` joins them.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Self

from pollux.cluster.state.records import JobRecord, UnknownJobError
from pollux.cluster.state.schema import MIGRATIONS, SCHEMA_VERSION, SchemaVersionError
from pollux.cluster.state.spec import JobSpec

__all__ = ["StoreConnection", "Transaction", "stored_allocation", "stored_spec", "timestamp"]

#: Parsed specs remembered by their stored text (a few KB each at most).
SPEC_MEMO_SIZE = 8192


def timestamp(now: float | None) -> float:
    """``now``, or the wall clock when the caller gives none (the service passes its own clock)."""
    return time.time() if now is None else float(now)


def stored_allocation(text: str) -> dict[str, int]:
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


class StoreConnection:
    """One connection to the store's file, guarded by a lock so that threads may share it."""

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> Transaction:
        return Transaction(self)

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
        spec, spec_error = stored_spec(row["spec"])
        return JobRecord(
            id=row["id"], name=row["name"], spec=spec, state=row["state"], token=None,
            submit_time=row["submit_time"], start_time=row["start_time"], end_time=row["end_time"],
            restarts=row["restarts"], failure_reason=row["failure_reason"],
            attained_service=row["attained_service"], allocation=stored_allocation(row["allocation"]),
            failures=row["failures"], spec_error=spec_error, owner=row["owner"])


@functools.lru_cache(maxsize=SPEC_MEMO_SIZE)
def stored_spec(text: str) -> tuple[JobSpec, str | None]:
    """:meth:`JobSpec.from_stored`, remembered by the stored text: a job's spec never changes once
    stored, and listing 5,000 jobs parsed and validated every one of them again (a third of the
    list's time). Specs are frozen and shared read-only."""
    return JobSpec.from_stored(text)


class Transaction:
    """``with store._tx() as conn``: take the lock, BEGIN IMMEDIATE, COMMIT or ROLLBACK."""

    def __init__(self, store: StoreConnection) -> None:
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
