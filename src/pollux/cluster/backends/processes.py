"""Processes on this machine, read from /proc: whether one lives, stopping one (SIGTERM, then
SIGKILL), every descendant of a process, and a kill of a whole tree that reaps what it can.

A replica's actor is a child subreaper (:mod:`pollux.cluster.backends.ray_backend`): whatever the
replica leaves behind re-parents to the actor, which kills and reaps it all before it reports the
exit. The server and the tests use the same walk to find what a process started.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

__all__ = ["descendants", "kill_tree", "pid_alive", "reap", "session_of", "signal_all", "stop_pid"]


def _parent_pids() -> dict[int, int]:
    """``{pid: parent pid}`` of every process visible in /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                out[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(root: int) -> list[int]:
    """PIDs of every process below ``root`` (children first), from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def signal_all(pgid: int | None, pids: Iterable[int], signum: int) -> None:
    """Send ``signum`` to the process group ``pgid`` (if any) and to each of ``pids``; a process
    already gone is skipped (it may exit between the walk and the signal)."""
    if pgid is not None:
        try:
            os.killpg(pgid, signum)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def kill_tree(pgid: int | None, root: int | None = None, timeout_s: float = 5.0) -> int:
    """SIGKILL the process group ``pgid`` and every descendant of ``root`` (default: this process),
    reaping those that are this process's children; returns how many descendants were found.

    Meant for a subreaper whose only children are one replica's processes: orphans re-parent to it,
    so they are reaped here rather than left as zombies.
    """
    root = os.getpid() if root is None else root
    found: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        left = descendants(root)
        found.update(left)
        signal_all(pgid, left, signal.SIGKILL)
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:   # not our child (yet): its parent dies and it re-parents to us
                pass
            except OSError:
                pass
        if not left or time.monotonic() > deadline:
            return len(found)
        time.sleep(0.02)


def pid_alive(pid: int | None) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def stop_pid(pid: int | None, timeout_s: float, *, group: bool = False) -> bool:
    """SIGTERM ``pid`` (its process group if ``group``), wait up to ``timeout_s``, then SIGKILL.

    Returns True if it had to be killed.
    """
    if not pid_alive(pid):
        return False
    assert pid is not None

    def send(sig: int) -> None:
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap(pid)
        if not pid_alive(pid):
            return False
        time.sleep(0.1)
    send(signal.SIGKILL)
    for _ in range(50):
        reap(pid)
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    return True


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is this process's child (so it leaves no zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def session_of(pid: int) -> int | None:
    """The session id of ``pid`` (from /proc), or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None
