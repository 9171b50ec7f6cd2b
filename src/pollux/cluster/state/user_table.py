"""The users of the service: each a name and a token (kept only as its hash), created and revoked by
the admin. A user submits jobs of its own and sees only those (:mod:`pollux.cluster.api.access`)."""

from __future__ import annotations

import re
import secrets
import sqlite3
from typing import Any

from pollux.cluster.state.database import StoreConnection, timestamp
from pollux.cluster.state.records import UnknownUserError, UserRecord
from pollux.cluster.state.schema import hash_token
from pollux.cluster.state.spec import SpecError
from pollux.cluster.state.tokens import new_token

__all__ = ["USER_NAME_PATTERN", "UserTable", "validate_user_name"]

#: A user name: a lower-case letter, then up to 63 lower-case letters, digits, '.', '_' or '-'. It is
#: a Prometheus label value and part of URLs, so it stays plain; ``admin`` names the admin token.
USER_NAME_PATTERN = r"[a-z][a-z0-9._-]{0,63}"
_USER_NAME = re.compile(USER_NAME_PATTERN)
_RESERVED = frozenset({"admin"})


def validate_user_name(name: Any) -> str:
    """``name`` if it may name a user, else SpecError with field ``name`` saying what is allowed."""
    if not isinstance(name, str) or _USER_NAME.fullmatch(name) is None:
        raise SpecError("name", f"expected a user name ({USER_NAME_PATTERN}), got {name!r:.80}")
    if name in _RESERVED:
        raise SpecError("name", f"{name!r} is reserved")
    return name


class UserTable(StoreConnection):
    """Users and their tokens' hashes."""

    @staticmethod
    def _user(row: sqlite3.Row) -> UserRecord:
        return UserRecord(name=row["name"], created=row["created"], revoked=row["revoked"])

    def add_user(self, name: str, now: float | None = None) -> UserRecord:
        """Create user ``name`` with a new random token, returned plain on the record (only here).

        A revoked user may be added again (a new token; its jobs are still its own); an active one
        is a ValueError, as is a name :func:`validate_user_name` refuses (a SpecError).
        """
        name = validate_user_name(name)
        token = new_token()
        t = timestamp(now)
        with self._tx() as conn:
            row = conn.execute("SELECT revoked FROM users WHERE name = ?", (name,)).fetchone()
            if row is not None and row["revoked"] is None:
                raise ValueError(f"user {name!r} already exists")
            conn.execute("INSERT OR REPLACE INTO users (name, token_hash, created, revoked) "
                         "VALUES (?, ?, ?, NULL)", (name, hash_token(token), t))
            stored = conn.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
        return UserRecord(name=stored["name"], created=stored["created"], revoked=None, token=token)

    def users(self) -> list[UserRecord]:
        """Every user, revoked ones included, by name."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM users ORDER BY name").fetchall()
        return [self._user(r) for r in rows]

    def get_user(self, name: str) -> UserRecord:
        """The user; :class:`UnknownUserError` (a KeyError) if there is none of that name."""
        with self._lock:
            row = self._conn.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownUserError(name)
        return self._user(row)

    def revoke_user(self, name: str, now: float | None = None) -> UserRecord:
        """Revoke the user's token (its jobs stay, and keep running); ValueError if already revoked."""
        t = timestamp(now)
        with self._tx() as conn:
            row = conn.execute("SELECT revoked FROM users WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise UnknownUserError(name)
            if row["revoked"] is not None:
                raise ValueError(f"user {name!r} is already revoked")
            conn.execute("UPDATE users SET revoked = ? WHERE name = ?", (t, name))
        return self.get_user(name)

    def user_of_token(self, token: Any) -> str | None:
        """The active user whose token this is, or None. Found by the hash's index, then the
        hashes compared in constant time."""
        if not isinstance(token, str) or not token:
            return None
        digest = hash_token(token)
        with self._lock:
            row = self._conn.execute("SELECT name, token_hash FROM users "
                                     "WHERE token_hash = ? AND revoked IS NULL", (digest,)).fetchone()
        if row is None or not secrets.compare_digest(digest, str(row["token_hash"])):
            return None
        return str(row["name"])
