"""Executors on local disk: the files an out-of-core worker evicts executors to (thesis §4.8).

One folder per worker; per executor a `.state` file (what `Executor.get_state` returned) and an
`.input` file (its loaded input, written once: input never changes, so a later eviction of the same
executor writes its state only). Both are pickled with protocol 5 and out-of-band buffers: numpy
arrays go to and from the file as raw bytes (`write` of the array's memory, `readinto` a fresh
memory map that the unpickled array then wraps) without an extra copy, and those system
calls release the GIL, so a load ahead on the worker's I/O thread overlaps the task computing on
the event loop.

File layout: 8-byte length of the pickle, the pickle, 8-byte count of buffers, 8 bytes per buffer
length, the buffers. `measure` gives the same byte count without writing: an executor's footprint.
"""

from __future__ import annotations

import mmap
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

__all__ = ["SpillStore", "measure"]

_WORD = 8


def _dump(obj: Any) -> tuple[bytes, list[memoryview]]:
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return meta, [b.raw() for b in buffers]


def measure(obj: Any) -> int:
    """Bytes `obj` takes serialised (the pickle and its out-of-band buffers)."""
    meta, views = _dump(obj)
    return len(meta) + sum(v.nbytes for v in views)


def _fresh_map(size: int) -> mmap.mmap | bytearray:
    """A buffer of `size` bytes in a memory map of its own (a bytearray when empty).

    Why: the unpickled arrays wrap it, and when the executor is evicted and they are freed, the map
    goes back to the system. A buffer from malloc would not: once glibc has freed one large block it
    serves blocks of that size from its heap and keeps them there when freed, and on the 2-core VM a
    K-means worker under a budget of half its executors' bytes grew back to the resident memory of
    an in-memory run within ten iterations. (Setting glibc's threshold for maps instead would also
    map every large temporary of the application's tasks, a page fault per page each time.)"""
    if size == 0:
        return bytearray()
    return mmap.mmap(-1, size)


def _read_into(f: Any, view: memoryview, path: Path) -> None:
    """Fill `view` from `f` (a raw read may return less than asked)."""
    done = 0
    while done < view.nbytes:
        got = f.readinto(view[done:])
        if not got:
            raise OSError(f"spill file {path} is truncated")
        done += got


class SpillStore:
    """The spill files of one worker, under `folder` (created; `close` removes it)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, executor_id: int, part: str) -> Path:
        return self.folder / f"executor-{executor_id}.{part}"

    def has(self, executor_id: int, part: str) -> bool:
        return self._path(executor_id, part).exists()

    def write(self, executor_id: int, part: str, obj: Any) -> int:
        """Write `obj` as the executor's `part` ("state" or "input"); returns bytes written."""
        meta, views = _dump(obj)
        path = self._path(executor_id, part)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as f:
            f.write(len(meta).to_bytes(_WORD, "little"))
            f.write(meta)
            f.write(len(views).to_bytes(_WORD, "little"))
            for v in views:
                f.write(v.nbytes.to_bytes(_WORD, "little"))
            for v in views:
                f.write(v)
        os.replace(tmp, path)  # a reader never sees half a file
        return len(meta) + sum(v.nbytes for v in views)

    def read(self, executor_id: int, part: str) -> tuple[Any, int]:
        """The executor's `part` as written, and the bytes read."""
        path = self._path(executor_id, part)
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise FileNotFoundError(f"spill file {path} is missing (executor {executor_id})") from None
        with f:
            meta = f.read(int.from_bytes(f.read(_WORD), "little"))
            count = int.from_bytes(f.read(_WORD), "little")
            sizes = [int.from_bytes(f.read(_WORD), "little") for _ in range(count)]
            buffers = []
            for size in sizes:
                buf = _fresh_map(size)
                _read_into(f, memoryview(buf), path)
                buffers.append(buf)
        return pickle.loads(meta, buffers=buffers), len(meta) + sum(sizes)

    def drop(self, executor_id: int) -> None:
        """Forget an executor's files (it left this worker)."""
        for part in ("state", "input"):
            self._path(executor_id, part).unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
