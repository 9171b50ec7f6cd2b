"""The hints of the store: each job's latest hints body, validated, with the per-GPU-type profiles
of earlier bodies kept (:func:`pollux.hints.merge_type_profiles`); and every body accepted, in order
(``hints_history``), read back down-sampled so that a chart of a long history stays cheap."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pollux.cluster.state.database import StoreConnection, timestamp
from pollux.hints import merge_type_profiles, validate_hints

__all__ = ["MAX_HISTORY_POINTS", "HintsEntry", "HintsTable"]

#: The most entries one read of a job's hints history returns (a chart has no use for more).
MAX_HISTORY_POINTS = 1000


@dataclass(frozen=True)
class HintsEntry:
    """One accepted hints body of a job, as stored (earlier per-type profiles merged in), and when;
    ``seq`` numbers the bodies of every job in the order they arrived (never reused)."""

    seq: int
    time: float
    hints: dict[str, Any]


class HintsTable(StoreConnection):
    """Each job's latest hints, and every body accepted."""

    def put_hints(self, job_id: str, hints: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
        """Validate (``HintsError``, a ValueError naming the field) and store the job's latest hints.

        Per-GPU-type profiles of earlier hints that these do not name are kept
        (:func:`pollux.hints.merge_type_profiles`)."""
        data = validate_hints(hints)
        t = timestamp(now)
        with self._tx() as conn:
            self._row(conn, job_id)
            row = conn.execute("SELECT hints FROM hints WHERE job_id = ?", (job_id,)).fetchone()
            data = merge_type_profiles(None if row is None else json.loads(row["hints"]), data)
            text = json.dumps(data, allow_nan=False)
            conn.execute("INSERT INTO hints (job_id, time, hints) VALUES (?, ?, ?) ON CONFLICT(job_id) "
                         "DO UPDATE SET time = excluded.time, hints = excluded.hints",
                         (job_id, t, text))
            conn.execute("INSERT INTO hints_history (job_id, time, hints) VALUES (?, ?, ?)",
                         (job_id, t, text))
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

    def hints_history(self, job_id: str, points: int = 200) -> list[HintsEntry]:
        """The job's accepted hints bodies, oldest first, down-sampled to at most ``points`` entries
        (2 … :data:`MAX_HISTORY_POINTS`): every k-th body and the newest, chosen by SQLite from the
        ``(job_id, seq)`` index, so that only the bodies returned are read and parsed.

        Raises :class:`UnknownJobError` for an unknown job, ValueError for ``points`` out of range."""
        if isinstance(points, bool) or not isinstance(points, int) or not 2 <= points <= MAX_HISTORY_POINTS:
            raise ValueError(f"points: expected an integer from 2 to {MAX_HISTORY_POINTS}, got {points!r}")
        with self._lock:
            self._row(self._conn, job_id)
            total = int(self._conn.execute("SELECT COUNT(*) FROM hints_history WHERE job_id = ?",
                                           (job_id,)).fetchone()[0])
            # With k = ceil(n / (points - 1)), the multiples of k below n are at most points - 1;
            # the newest entry makes at most ``points``.
            stride = 1 if total <= points else math.ceil(total / (points - 1))
            rows = self._conn.execute(
                "WITH numbered AS (SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) - 1 AS i "
                "FROM hints_history WHERE job_id = ?) "
                "SELECT h.seq, h.time, h.hints FROM numbered n JOIN hints_history h ON h.seq = n.seq "
                "WHERE n.i % ? = 0 OR n.i = ? ORDER BY h.seq",
                (job_id, stride, total - 1)).fetchall()
        return [HintsEntry(int(r["seq"]), float(r["time"]), json.loads(r["hints"])) for r in rows]
