"""The state folder of a Pollux server: its locks, the check of its job store, file modes, Ray's token.

One state folder runs at most one service. Two OS-level locks (``flock``, released by the kernel when
their holder dies, however it dies) make that so, rather than a look at PIDs followed by a start:

* ``DIR/start.lock`` is held by ``pollux server start`` (and ``stop``) for the whole operation, so
  two starts on one folder never both spawn a Ray host and a service: the second fails at once;
* ``DIR/service.lock`` is held by the service process for its whole life, taken before it touches
  Ray or the store, so a service started by hand on a folder whose service lives refuses to run.
  Each lock file holds its holder's PID, for messages and for ``pollux server status``.

The job store (``DIR/jobs.db``) is checked before anything starts: a store that is missing, empty,
not an SQLite database or corrupt is refused, naming the file and what to do, unless the folder is
new. A folder *has had a store* once ``DIR/state.json`` exists: the service writes it when it has
opened the store (a folder of an older version gets it at its first start with a readable store).
SQLite would otherwise happily turn a truncated file into an empty store.

With ``--run-as USER`` the folder is 0711 (another user may reach a path inside it, not list it) and
everything in it is private to the service's user (0600 files, 0700 folders) except ``checkpoints/``
(0711; each job's checkpoint folder is given to the job's user). Without it the folder is 0700.

The embedded Ray cluster runs with Ray's token authentication (``RAY_AUTH_MODE=token``), its token in
``DIR/ray-token`` (0600): a process without the token (a job running as another user) cannot connect
to the cluster, which runs as the service's user.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

__all__ = ["FolderLock", "LockedError", "StoreError", "check_run_as", "check_store", "lock_holder",
           "mark_store", "private_file", "ray_auth_env", "secure_state_dir"]

START_LOCK = "start.lock"
SERVICE_LOCK = "service.lock"
STORE = "jobs.db"
MARKER = "state.json"
RAY_TOKEN = "ray-token"
#: Files of the folder that only the service's user may read (0600), whatever the umask was.
PRIVATE_FILES = ("admin-token", STORE, f"{STORE}-wal", f"{STORE}-shm", MARKER, "server.json",
                 "service.json", "ray.json", RAY_TOKEN, "service.log", "rayhost.log", START_LOCK,
                 SERVICE_LOCK)
#: The first 16 bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"


class LockedError(RuntimeError):
    """The lock is held by another process (``pid``, if it wrote one)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        super().__init__(f"{path} is locked" + (f" by PID {pid}" if pid else ""))


class StoreError(RuntimeError):
    """The folder's job store cannot be used; the message names the file and what to do."""


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class FolderLock:
    """An exclusive ``flock`` on ``path``, held from :meth:`acquire` until :meth:`release` or exit.

    The lock belongs to the open file, which child processes do not inherit (Python opens files
    non-inheritable), so it is released exactly when this process releases it or dies.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, timeout_s: float = 0.0) -> None:
        """Take the lock, waiting up to ``timeout_s``; raises :class:`LockedError` if still held."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                    os.close(fd)
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise LockedError(self.path, _read_pid(self.path)) from None
                    raise
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            finally:
                os.close(self._fd)     # closing the file releases the lock
                self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(path: Path) -> int | None:
    """The PID holding ``path``'s lock (0 if it wrote none), or None if nobody holds it.

    Probes with a shared lock that is dropped at once; a holder taking the lock at that instant
    retries for a moment (:meth:`FolderLock.acquire` with a timeout), so the probe cannot make it fail.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return _read_pid(Path(path)) or 0
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------- the store


def had_store(state: Path) -> Path | None:
    """The marker file that shows this folder has had a job store, if it exists."""
    marker = Path(state) / MARKER
    return marker if marker.exists() else None


def check_store(state: Path) -> None:
    """Raise :class:`StoreError` if ``state/jobs.db`` is missing, empty or unreadable in a folder
    that has had a store, or is not an intact SQLite database at all; a new folder passes."""
    state = Path(state)
    db = state / STORE
    evidence = had_store(state)
    fresh = f"remove {evidence} to start with an empty store" if evidence else ""
    if not db.exists():
        if evidence is None:
            return
        raise StoreError(f"{db}: the job store is missing, but this folder has had one ({evidence} "
                         f"exists); restore {db} from a backup, or {fresh}")
    try:
        size = db.stat().st_size
        with open(db, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"{db}: cannot read the job store ({exc.strerror or exc})") from None
    if size == 0:
        if evidence is None:
            return        # e.g. `touch jobs.db` in a new folder: SQLite makes it an empty store
        raise StoreError(f"{db}: the job store is empty (0 bytes), but this folder has had one "
                         f"({evidence} exists); restore {db} from a backup, or move it away and {fresh}")
    if header != SQLITE_HEADER:
        raise StoreError(f"{db}: not an SQLite database (the job store is damaged); restore it from a "
                         f"backup, or move it away" + (f" and {fresh}" if fresh else " to start with an "
                                                       "empty store"))
    problem = _sqlite_problem(db)
    if problem:
        raise StoreError(f"{db}: the job store is damaged ({problem}); restore it from a backup, or move "
                         f"it away" + (f" and {fresh}" if fresh else " to start with an empty store"))


def _sqlite_problem(db: Path) -> str | None:
    """What ``PRAGMA quick_check`` and a look at the jobs table find wrong, or None."""
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
        if [tuple(r) for r in rows] != [("ok",)]:
            return "; ".join(str(r[0]) for r in rows[:3])
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "jobs" not in tables:
            return "it holds no jobs table: not a Pollux job store"
        if "jobs" in tables:
            conn.execute("SELECT count(*) FROM jobs").fetchone()
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        conn.close()
    return None


def mark_store(state: Path) -> None:
    """Record that this folder has a job store (``state.json``), once."""
    path = Path(state) / MARKER
    if path.exists():
        return
    private_file(path, json.dumps({"store": STORE, "created": time.time(),
                                   "note": "this folder has a Pollux job store; a missing or empty "
                                           "jobs.db is refused while this file exists"}) + "\n")


def private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ users and modes


def check_run_as(user: str | None) -> pwd.struct_passwd | None:
    """The password entry of ``--run-as USER``; raises ValueError naming what is wrong."""
    if user is None:
        return None
    if os.geteuid() != 0:
        raise ValueError(f"--run-as {user}: only a service running as root can run replicas as another "
                         f"user (this one runs as uid {os.geteuid()})")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"--run-as {user}: no such user") from None
    if entry.pw_uid == 0:
        raise ValueError(f"--run-as {user}: that is root (uid 0); name an unprivileged user")
    return entry


def secure_state_dir(state: Path, run_as: str | None) -> None:
    """Set the modes of the folder and what is in it (see the module docstring)."""
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o711 if run_as else 0o700)
    for name in PRIVATE_FILES:
        try:
            os.chmod(state / name, 0o600)
        except FileNotFoundError:
            pass
    for name, mode in (("logs", 0o700), ("checkpoints", 0o711 if run_as else 0o700)):
        (state / name).mkdir(exist_ok=True)
        os.chmod(state / name, mode)


def ray_auth_env(state: Path) -> dict[str, str]:
    """Environment that enables Ray's token authentication with the folder's token (made if needed)."""
    path = Path(state) / RAY_TOKEN
    if not path.exists() or not path.read_text().strip():
        private_file(path, secrets.token_hex(32) + "\n")
    os.chmod(path, 0o600)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
