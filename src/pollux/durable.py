"""Durable files: writing a file so that it survives a crash, and making a folder's entries durable.

Three parts keep checkpoints on disk with the same recipe — write every file and fsync it, fsync the
folder, rename the folder into place, fsync its parent — the agent (:mod:`pollux.torch.checkpoint`),
Litz (:mod:`pollux.litz.checkpoint`) and SCAR's running checkpoints (:mod:`pollux.scar.live.store`).
The two steps they share live here, below all three, so that none imports another for them.
Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["fsync_dir", "write_durable"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the folder `path`, so that the entries created or renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes | Callable[[BinaryIO], object]) -> None:
    """Write `path` and fsync it before returning: `data` is the bytes, or a function that writes
    to the open file (``torch.save`` streams there instead of building the bytes first)."""
    with open(path, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
