"""The commit a benchmark ran on, read from ``.git`` without running git.

A benchmark records its commit beside its figures. It reads the files rather than running ``git``:
it must not touch a tree that someone may be committing in, and a plain read cannot take git's
lock. Shared by the benchmark scripts beside it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_commit"]


def read_commit(root: Path) -> str | None:
    """The full hash checked out in the repository at ``root`` (a detached HEAD, the branch's loose
    ref or its line in ``packed-refs``), or None when it cannot be read."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[5:]
        loose = git / ref
        if loose.is_file():
            return loose.read_text().strip() or None
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None
