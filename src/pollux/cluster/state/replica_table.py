"""The replicas of the store: each started replica process of each run (restart) of a job, where it
ran, its PID and log, and how it exited — what a restarted service adopts or stops."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pollux.cluster.state.database import StoreConnection, timestamp
from pollux.cluster.state.records import ReplicaRecord

__all__ = ["ReplicaTable"]


class ReplicaTable(StoreConnection):
    """Replica processes by (job, restart, rank)."""

    def record_replica(self, job_id: str, restart: int, rank: int, node: str, pid: int | None,
                       log_path: str | Path | None, now: float | None = None) -> ReplicaRecord:
        """Record a started replica process (by PID); replaces a record with the same key."""
        t = timestamp(now)
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
                (int(exit_code), timestamp(now), job_id, int(restart), int(rank)))
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
