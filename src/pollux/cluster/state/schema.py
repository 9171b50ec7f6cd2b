"""The schema of the job store (:mod:`pollux.cluster.state.store`) and its migrations.

``schema_version`` holds one row, and :data:`MIGRATIONS` lists the steps that take a database from
version ``i`` to ``i + 1``; the store applies each version's steps inside one transaction. A step is
an SQL statement, or a function called with the connection (for changes SQL alone cannot make, such
as hashing the stored tokens). Opening a database newer than :data:`SCHEMA_VERSION` raises
:class:`SchemaVersionError`.

Version 1 is the first schema; version 2 counts failed runs apart from restarts; version 3 keeps job
tokens only as hashes (:func:`hash_token`), in the column ``token_hash``, with an index for finding
the job of a token; version 4 records the allocations an elastic job has applied in place; version 5
adds users (each with a hashed token) and the owner of each job (NULL: the admin's, as every job
submitted before users existed); version 6 keeps the rounds and each job's latest outlook; version 7
keeps every accepted hints body (``hints_history``, append-only), for the web view's charts over time;
version 8 keeps the objective each round's policy reached (:func:`pollux.policy.base.state_objective`).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "MigrationStep", "SchemaVersionError", "hash_token"]


def hash_token(token: str) -> str:
    """The form in which a job token is stored: the SHA-256 hex digest of its UTF-8 bytes.

    A plain, unsalted hash is enough: tokens are 256 random bits, so there is nothing to guess.
    """
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _hash_stored_tokens(conn: sqlite3.Connection) -> None:
    """Migration step to version 3: replace every job's plain token by its hash."""
    rows = conn.execute("SELECT id, token_hash FROM jobs").fetchall()
    for job_id, token in rows:
        conn.execute("UPDATE jobs SET token_hash = ? WHERE id = ?", (hash_token(str(token)), job_id))


#: One step of a migration: an SQL statement, or a function run with the connection (same transaction).
MigrationStep = str | Callable[[sqlite3.Connection], None]

#: Migration steps: ``MIGRATIONS[i]`` takes the schema from version ``i`` to ``i + 1``.
MIGRATIONS: list[list[MigrationStep]] = [
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
    [
        # Version 3: job tokens are kept only as hashes (a reader of the file cannot act as a job).
        "ALTER TABLE jobs RENAME COLUMN token TO token_hash",
        _hash_stored_tokens,
        "CREATE INDEX jobs_token_hash ON jobs(token_hash)",
    ],
    [
        # Version 4: an elastic job acknowledges each allocation it has applied in place (issue 14);
        # ``version`` is the allocation's row in ``allocations``.
        """CREATE TABLE applied (
            version INTEGER PRIMARY KEY,
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            time REAL NOT NULL
        )""",
        "CREATE INDEX applied_job ON applied(job_id, version)",
    ],
    [
        # Version 5: users of their own (issue 35). A user's token is kept only as its hash; a
        # revoked user keeps its row (its jobs still name it) with ``revoked`` set.
        """CREATE TABLE users (
            name TEXT PRIMARY KEY,
            token_hash TEXT NOT NULL UNIQUE,
            created REAL NOT NULL,
            revoked REAL
        )""",
        "ALTER TABLE jobs ADD COLUMN owner TEXT",
        "CREATE INDEX jobs_owner ON jobs(owner, submit_time)",
    ],
    [
        # Version 6: the rounds, and what the latest round expects of each job (issue 35: /metrics
        # and the web view), written with the round's allocations.
        """CREATE TABLE rounds (
            number INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            duration_s REAL NOT NULL,
            policy TEXT NOT NULL,
            jobs INTEGER NOT NULL,
            changed INTEGER NOT NULL
        )""",
        """CREATE TABLE job_outlook (
            job_id TEXT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
            time REAL NOT NULL,
            gpus INTEGER NOT NULL,
            nodes INTEGER NOT NULL,
            batch_size REAL,
            local_bsz REAL,
            accum_steps INTEGER,
            efficiency REAL,
            goodput REAL,
            speedup REAL,
            pgns REAL
        )""",
    ],
    [
        # Version 7: every accepted hints body, append-only (issue 35: the web view's charts over
        # time), written in the same transaction as the latest hints. A job's latest hints from before
        # the upgrade open its history.
        """CREATE TABLE hints_history (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            time REAL NOT NULL,
            hints TEXT NOT NULL
        )""",
        "CREATE INDEX hints_history_job ON hints_history(job_id, seq)",
        "INSERT INTO hints_history (job_id, time, hints) SELECT job_id, time, hints FROM hints ORDER BY time",
    ],
    [
        # Version 8: the objective the policy reached in each round (NULL for a policy that keeps
        # none, and for the rounds before the upgrade).
        "ALTER TABLE rounds ADD COLUMN objective REAL",
    ],
]
#: The schema version this code writes.
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaVersionError(RuntimeError):
    """The database was written by a newer Pollux with a schema this code does not know."""
