"""The rounds of the store: one row per scheduling round, and each job's outlook from the latest
round that saw it (:class:`JobOutlook`), both written with the round's allocations in one
transaction (:meth:`JobStore.apply_round`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pollux.cluster.state.database import StoreConnection, stored_allocation
from pollux.cluster.state.records import JobOutlook, RoundRecord

__all__ = ["JobSeriesRow", "RoundTable", "write_outlooks", "write_round"]

_OUTLOOK_COLUMNS = ("job_id", "time", "gpus", "nodes", "batch_size", "local_bsz", "accum_steps", "efficiency",
                    "goodput", "speedup", "pgns")


@dataclass(frozen=True)
class JobSeriesRow:
    """What a job's metric series show: who and what it is, its counts, and its latest outlook."""

    job_id: str
    owner: str | None
    kind: str
    allocation: dict[str, int]
    restarts: int
    failures: int
    outlook: JobOutlook | None


def write_round(conn: sqlite3.Connection, time: float, duration_s: float, policy: str, jobs: int,
                changed: int, objective: float | None = None) -> None:
    conn.execute("INSERT INTO rounds (time, duration_s, policy, jobs, changed, objective) "
                 "VALUES (?, ?, ?, ?, ?, ?)", (time, duration_s, policy, jobs, changed, objective))


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
        return [RoundRecord(r["number"], r["time"], r["duration_s"], r["policy"], r["jobs"], r["changed"],
                            r["objective"]) for r in reversed(rows)]

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

    def round_durations(self, buckets: Iterable[float]) -> tuple[list[int], int, float]:
        """For a histogram of the policy's time per round over every round kept: the number of rounds
        at most each bucket's bound, the count and the sum — in one query."""
        bounds = [float(b) for b in buckets]
        sums = ", ".join("COALESCE(SUM(duration_s <= ?), 0)" for _ in bounds)
        with self._lock:
            columns = [sums] if bounds else []
            columns += ["COUNT(*)", "COALESCE(SUM(duration_s), 0)"]
            row = self._conn.execute(f"SELECT {', '.join(columns)} FROM rounds", bounds).fetchone()
        values = list(row)
        return [int(v) for v in values[:-2]], int(values[-2]), float(values[-1])

    def job_series(self, since: float, owner: str | None = None) -> list[JobSeriesRow]:
        """The jobs whose metric series are shown: every job not ended, and those ended at ``since``
        or later, with their latest outlook (only ``owner``'s, if given). The spec is not parsed:
        its ``kind`` is read by SQLite, so that a huge spec costs no Python time."""
        query = ("SELECT j.id AS id, j.owner AS owner, "
                 "COALESCE(CASE WHEN json_valid(j.spec) THEN json_extract(j.spec, '$.kind') END, 'restart') "
                 "AS kind, "
                 "j.allocation AS allocation, "
                 "j.restarts AS restarts, j.failures AS failures, o.* "
                 "FROM jobs j LEFT JOIN job_outlook o ON o.job_id = j.id "
                 "WHERE (j.end_time IS NULL OR j.end_time >= ?)")
        params: list[object] = [float(since)]
        if owner is not None:
            query += " AND j.owner = ?"
            params.append(owner)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY j.submit_time, j.rowid", params).fetchall()
        return [JobSeriesRow(r["id"], r["owner"], str(r["kind"]), stored_allocation(r["allocation"]),
                             int(r["restarts"]), int(r["failures"]),
                             None if r["job_id"] is None else _outlook(r)) for r in rows]


def _outlook(row: Mapping[str, object]) -> JobOutlook:
    """A stored outlook; the job's own columns of a joined row are ignored."""
    return JobOutlook(**{c: row[c] for c in _OUTLOOK_COLUMNS})  # type: ignore[arg-type]
