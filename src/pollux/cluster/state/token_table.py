"""The job tokens of the store, kept only as hashes: a new one per launch, and the checks the API
makes with them."""

from __future__ import annotations

import secrets
from typing import Any

from pollux.cluster.state.database import StoreConnection
from pollux.cluster.state.schema import hash_token
from pollux.cluster.state.tokens import new_token

__all__ = ["TokenTable"]


class TokenTable(StoreConnection):
    """Each job's current token (its hash)."""

    def issue_token(self, job_id: str) -> str:
        """A new random token for the job, whose hash replaces the previous one; returns it plain.

        The controller calls this at every launch and hands the token to the replicas
        (``POLLUX_JOB_TOKEN``); a replica of an earlier launch can no longer act for the job.
        """
        token = new_token()
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
