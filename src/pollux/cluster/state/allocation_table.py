"""The allocations of the store: each job's current ``{node: GPUs}``, its history (whose rows are the
allocation's versions), and the versions an elastic job acknowledged as applied in place."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from pollux.cluster.state.database import StoreConnection, timestamp
from pollux.cluster.state.records import AllocationRecord, ResizeRecord

__all__ = ["AllocationTable", "check_allocation", "write_allocation"]


def check_allocation(allocation: Mapping[str, int]) -> dict[str, int]:
    """``allocation`` without its zero entries, sorted; ValueError naming a bad entry."""
    if not isinstance(allocation, Mapping):
        raise ValueError(f"allocation: expected {{node: gpus}}, got {allocation!r}")
    out: dict[str, int] = {}
    for node, gpus in allocation.items():
        if not isinstance(node, str) or isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ValueError(f"allocation.{node}: expected a non-negative integer, got {gpus!r}")
        if gpus:
            out[node] = int(gpus)
    return dict(sorted(out.items()))


def write_allocation(conn: sqlite3.Connection, job_id: str, alloc: dict[str, int], t: float) -> None:
    """Make ``alloc`` the job's current allocation and append it to its history (a new version)."""
    text = json.dumps(alloc)
    conn.execute("UPDATE jobs SET allocation = ? WHERE id = ?", (text, job_id))
    conn.execute("INSERT INTO allocations (job_id, time, allocation) VALUES (?, ?, ?)", (job_id, t, text))


class AllocationTable(StoreConnection):
    """Allocations, their versions and their acknowledgements."""

    def set_allocation(self, job_id: str, allocation: Mapping[str, int], now: float | None = None) -> None:
        """Set the job's current ``{node: GPUs}`` (zero entries dropped) and append it to its history."""
        alloc = check_allocation(allocation)
        t = timestamp(now)
        with self._tx() as conn:
            self._row(conn, job_id)
            write_allocation(conn, job_id, alloc, t)

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
        t = timestamp(now)
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
