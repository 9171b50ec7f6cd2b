"""The rounds of the store: one row per scheduling round, and each job's outlook from the latest
round that saw it (:class:`JobOutlook`), both written with the round's allocations in one
transaction (:meth:`JobStore.apply_round`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

from pollux.cluster.state.database import StoreConnection
from pollux.cluster.state.records import JobOutlook, RoundRecord

__all__ = ["RoundTable", "write_outlooks", "write_round"]

_OUTLOOK_COLUMNS = ("job_id", "time", "gpus", "nodes", "batch_size", "local_bsz", "accum_steps", "efficiency",
                    "goodput", "speedup", "pgns")


def write_round(conn: sqlite3.Connection, time: float, duration_s: float, policy: str, jobs: int,
                changed: int) -> None:
    conn.execute("INSERT INTO rounds (time, duration_s, policy, jobs, changed) VALUES (?, ?, ?, ?, ?)",
                 (time, duration_s, policy, jobs, changed))


def write_outlooks(conn: sqlite3.Connection, outlooks: Iterable[JobOutlook]) -> None:
    """Replace each job's outlook by the round's (jobs that no longer exist are skipped)."""
    rows = [tuple(getattr(o, c) for c in _OUTLOOK_COLUMNS) for o in outlooks]
    marks = ", ".join("?" * len(_OUTLOOK_COLUMNS))
    conn.executemany(f"INSERT OR REPLACE INTO job_outlook ({', '.join(_OUTLOOK_COLUMNS)}) "
                     f"SELECT {marks} WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?)",
                     [(*r, r[0]) for r in rows])


class RoundTable(StoreConnection):
    """Rounds and the jobs' outlooks."""

    def rounds(self, limit: int = 100) -> list[RoundRecord]:
        """The newest ``limit`` rounds, oldest first."""
        with self._lock:
            query = "SELECT * FROM rounds ORDER BY number DESC LIMIT ?"
            rows = self._conn.execute(query, (int(limit),)).fetchall()
        return [RoundRecord(r["number"], r["time"], r["duration_s"], r["policy"], r["jobs"], r["changed"])
                for r in reversed(rows)]

    def outlooks(self, job_ids: Iterable[str] | None = None) -> dict[str, JobOutlook]:
        """The latest outlook of each job (of ``job_ids``, or of every job that has one)."""
        with self._lock:
            if job_ids is None:
                rows = self._conn.execute("SELECT * FROM job_outlook").fetchall()
            else:
                ids = list(job_ids)
                rows = []
                for start in range(0, len(ids), 500):   # SQLite's bound on host parameters
                    chunk = ids[start:start + 500]
                    rows += self._conn.execute(
                        f"SELECT * FROM job_outlook WHERE job_id IN ({','.join('?' * len(chunk))})",
                        chunk).fetchall()
        return {r["job_id"]: _outlook(r) for r in rows}


def _outlook(row: Mapping[str, object]) -> JobOutlook:
    return JobOutlook(**{c: row[c] for c in _OUTLOOK_COLUMNS})  # type: ignore[arg-type]
