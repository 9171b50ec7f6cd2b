"""The tail of a job's log for its page: the last lines of each replica log file of its newest run,
read from the end of each file (a log may be large; only its last bytes are read), decoded leniently
(a job may write any bytes). Paths resolve as the API's logs route resolves them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pollux.cluster.state.records import ReplicaRecord

__all__ = ["LogTail", "log_tail"]

#: Bytes read from the end of each log file.
TAIL_BYTES = 64 * 1024
#: Replica files shown (ranks past this are left out; the API's logs route has them all).
MAX_FILES = 8


@dataclass(frozen=True)
class LogTail:
    """The last lines of one replica's log file, with what the file is."""

    restart: int
    rank: int
    node: str
    lines: list[str]
    missing: bool = False


def _last_lines(path: Path, lines: int) -> list[str] | None:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(size - TAIL_BYTES, 0))
            data = handle.read(TAIL_BYTES)
    except (OSError, ValueError):
        return None
    text = data.decode("utf-8", "replace").splitlines()
    if len(data) == TAIL_BYTES and text:   # the first line may be cut: drop it
        text = text[1:]
    return text[-lines:]


def log_tail(replicas: Sequence[ReplicaRecord], log_dir: Path | None, lines: int = 100) -> list[LogTail]:
    """The last ``lines`` lines of each replica log of the job's newest run (a file that cannot be
    read is listed as missing)."""
    if not replicas:
        return []
    newest = max(r.restart for r in replicas)
    out = []
    for rep in sorted((r for r in replicas if r.restart == newest), key=lambda r: r.rank)[:MAX_FILES]:
        if not rep.log_path:
            continue
        path = Path(rep.log_path)
        if not path.is_absolute() and log_dir is not None:
            path = Path(log_dir) / path
        found = _last_lines(path, lines)
        out.append(LogTail(rep.restart, rep.rank, rep.node, found or [], missing=found is None))
    return out
