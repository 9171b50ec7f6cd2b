"""A job's log files as one stream (``GET /v1/jobs/{id}/logs``): each after a header line, read in
chunks and decoded leniently."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path

__all__ = ["log_stream"]

#: Bytes read from a log file at a time.
LOG_CHUNK = 1 << 16


def log_stream(files: list[tuple[str, Path]]) -> Iterator[bytes]:
    """The log files that can be opened, one after another, each after its header line; read in
    chunks (a log may be large: it is never held whole in memory) and decoded leniently (a job may
    write any bytes)."""
    for header, path in files:
        try:
            handle = path.open("rb")
        except (OSError, ValueError):
            continue
        with handle:
            yield header.encode("utf-8")
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            last = ""
            while chunk := handle.read(LOG_CHUNK):
                text = decoder.decode(chunk)
                if text:
                    last = text
                    yield text.encode("utf-8")
            tail = decoder.decode(b"", final=True)
            if tail:
                last = tail
                yield tail.encode("utf-8")
            if last and not last.endswith("\n"):
                yield b"\n"
