"""The hints of the store: each job's latest hints body, validated, with the per-GPU-type profiles
of earlier bodies kept (:func:`pollux.hints.merge_type_profiles`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pollux.cluster.state.database import StoreConnection, timestamp
from pollux.hints import merge_type_profiles, validate_hints

__all__ = ["HintsTable"]


class HintsTable(StoreConnection):
    """Each job's latest hints."""

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
