"""The policy state of the store: one opaque JSON value per policy name, saved with each round."""

from __future__ import annotations

import json
import sqlite3

from pollux.cluster.state.database import StoreConnection, timestamp
from pollux.policy.base import PolicyState

__all__ = ["PolicyStateTable", "write_policy_state"]


def write_policy_state(conn: sqlite3.Connection, name: str, state: PolicyState | None, t: float) -> None:
    """Save ``state`` under ``name`` inside the caller's transaction."""
    text = json.dumps(state, allow_nan=True)      # opaque and JSON-able (pollux.policy.base)
    conn.execute("INSERT INTO policy_state (name, time, state) VALUES (?, ?, ?) ON CONFLICT(name) "
                 "DO UPDATE SET time = excluded.time, state = excluded.state", (name, t, text))


class PolicyStateTable(StoreConnection):
    """Each policy's state between rounds."""

    def save_policy_state(self, name: str, state: PolicyState | None, now: float | None = None) -> None:
        """Save the policy's state under its name (a round saves it with its allocations instead:
        :meth:`pollux.cluster.state.store.JobStore.apply_round`)."""
        with self._tx() as conn:
            write_policy_state(conn, name, state, timestamp(now))

    def load_policy_state(self, name: str) -> PolicyState | None:
        """The saved state, or None if none was saved under ``name``."""
        with self._lock:
            row = self._conn.execute("SELECT state FROM policy_state WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            data = json.loads(row["state"])
            return data     # the policy decodes what it encoded (old tagged rows included)
