"""The on-disk running checkpoint of one job: partial saves, committed atomically, read by row group.

SCAR's running checkpoint (thesis §5.4.2) mixes rows saved at different times: it starts as the
initial parameters, and every partial checkpoint overwrites the rows it selected. On disk it is kept
like a small log-structured key-value store (the thesis's "shared persistent storage" may be a
database such as Cassandra, which behaves this way):

- ``delta-<seq>/`` — one save: for every (table, row group) that it touches, one file holding the
  saved rows' global ids (int64) followed by their values, and a ``manifest.json`` (tables, files,
  counts, CRC-32 of every file).
- ``base-<seq>/`` — a compaction: the whole running checkpoint as of save `seq` (every row, its
  newest value), in the same form. Compaction runs on the writer thread after every
  `compact_every` saves, so a recovery reads one base and few deltas. The trade-off: with 1 (the
  live controller's default) a recovery reads just the lost share, but the whole checkpoint is
  rewritten in the background after every save; a larger value writes less and makes a recovery
  also read the deltas since the last compaction.

Row groups are the PS shards of the job (`groups[table][row]`, the Litz row-to-shard assignment):
the rows one lost shard held sit in their own files, so partial recovery reads about 1/num_shards
of the bytes of a full checkpoint (`LoadResult.bytes_read` counts every data byte read; manifests,
a few hundred bytes, are counted apart in `meta_bytes_read`).

Atomicity: a save or a compaction is written into a hidden ``.tmp-…`` folder, every file and the
folder are fsynced, then the folder is renamed to its final name (one atomic ``rename``) and the
parent fsynced. A crash at any moment leaves either the complete folder or only a hidden temp
folder, which the next store on the directory removes. Old folders are removed only after a newer
base covering them is committed, and renamed to ``.trash-…`` before they are deleted, so a crash
during cleanup leaves nothing `load` could mistake for a save. `load` therefore always returns the
merge of a prefix of the committed saves — never a mix with an incomplete one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import uuid
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pollux.durable import fsync_dir, write_durable
from pollux.scar.api import ScarError

__all__ = ["LoadResult", "RunningStore", "TableInfo"]

FORMAT = "pollux-scar-running/1"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^(base|delta)-(\d{10})$")

Rows = dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (global row ids, values)


@dataclass(frozen=True)
class TableInfo:
    """Shape, dtype and row groups (owner shard per row) of one table of the running checkpoint."""

    shape: tuple[int, ...]
    dtype: str
    groups: np.ndarray

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class LoadResult:
    """What `RunningStore.load` read: per table the requested rows (sorted ids) and their values,
    the save sequence number the result reflects (-1: nothing committed), and the bytes read."""

    rows: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    seq: int = -1
    bytes_read: int = 0
    meta_bytes_read: int = 0
    files_read: int = 0


class RunningStore:
    """The running checkpoint of one job in `directory` (created if missing).

    `tables` gives every table's shape, dtype and row groups. `save` is synchronous; `save_async`
    queues a save on one background thread (saves commit in the order they were queued) and
    returns its future; `flush` waits for the queue. `load` may run while saves are queued: it sees
    the saves committed so far.
    """

    def __init__(
        self, directory: str | os.PathLike[str], tables: Mapping[str, TableInfo], compact_every: int = 1
    ) -> None:
        if compact_every < 1:
            raise ScarError(f"RunningStore.compact_every: must be >= 1, got {compact_every}")
        self.directory = Path(directory)
        self.tables = dict(tables)
        for name, info in self.tables.items():
            if info.groups.shape != (info.shape[0],):
                raise ScarError(f"RunningStore.tables[{name!r}].groups: one group per row expected")
        self.compact_every = compact_every
        self.directory.mkdir(parents=True, exist_ok=True)
        for p in self.directory.iterdir():  # leftovers of a crash: never committed, never read
            if p.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(p, ignore_errors=True)
        self._lock = threading.Lock()  # one writer at a time (the pool has one thread anyway)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scar-store")
        self._pending: list[Future[int]] = []
        self.next_seq = max((s for _, s in self._committed()), default=-1) + 1
        self.bytes_written = 0
        self.saves = 0

    # ------------------------------------------------------------------ listing
    def _committed(self) -> list[tuple[str, int]]:
        out = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m:
                out.append((m.group(1), int(m.group(2))))
        return sorted(out, key=lambda x: (x[1], x[0] == "delta"))

    def _plan(self) -> tuple[int | None, list[int]]:
        """(newest base seq, delta seqs after it) — what a load reads."""
        items = self._committed()
        bases = [s for k, s in items if k == "base"]
        base = max(bases) if bases else None
        deltas = [s for k, s in items if k == "delta" and (base is None or s > base)]
        return base, sorted(deltas)

    # ------------------------------------------------------------------ saving
    def save_async(self, rows: Rows) -> Future[int]:
        """Queue a save of `rows` ({table: (global row ids, values)}); the arrays are copied now,
        so the caller may go on changing its own. The future gives the save's sequence number."""
        snap = {
            t: (np.array(r, dtype=np.int64), np.array(v, dtype=self.tables[t].dtype))
            for t, (r, v) in self._check(rows).items()
        }
        seq = self.next_seq
        self.next_seq += 1
        fut = self._pool.submit(self._save, seq, snap)
        self._pending = [f for f in self._pending if not f.done()] + [fut]
        return fut

    def save(self, rows: Rows) -> int:
        return self.save_async(rows).result()

    def flush(self) -> None:
        """Wait until every queued save is committed (raise the first failure)."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)

    def _check(self, rows: Rows) -> Rows:
        for t, (r, v) in rows.items():
            if t not in self.tables:
                raise ScarError(f"RunningStore.save: no table {t!r}; tables: {sorted(self.tables)}")
            info = self.tables[t]
            r = np.asarray(r)
            if r.ndim != 1 or np.shape(v) != (r.size, *info.shape[1:]):
                raise ScarError(f"RunningStore.save: table {t!r}: values {np.shape(v)} for {r.size} rows")
            if r.size and (r.min() < 0 or r.max() >= info.shape[0]):
                raise ScarError(f"RunningStore.save: table {t!r}: row ids outside [0, {info.shape[0]})")
        return rows

    def _save(self, seq: int, rows: Rows) -> int:
        with self._lock:
            self._write_folder(f"delta-{seq:010d}", seq, rows)
            self.saves += 1
            if self.saves % self.compact_every == 0 or seq == 0:
                self._compact(seq)
        return seq

    def _write_folder(self, name: str, seq: int, rows: Rows) -> None:
        tmp = self.directory / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        files = []
        for ti, (t, (r, v)) in enumerate(sorted(rows.items())):
            order = np.argsort(r, kind="stable")
            r, v = r[order], v[order]
            groups = self.tables[t].groups[r]
            for g in np.unique(groups):
                sel = groups == g
                data = r[sel].tobytes() + np.ascontiguousarray(v[sel]).tobytes()
                fname = f"t{ti}-g{int(g)}.bin"
                write_durable(tmp / fname, data)
                self.bytes_written += len(data)
                files.append(
                    {
                        "table": t,
                        "group": int(g),
                        "file": fname,
                        "count": int(sel.sum()),
                        "crc32": zlib.crc32(data),
                    }
                )
        manifest = {"format": FORMAT, "seq": seq, "files": files}
        write_durable(tmp / MANIFEST, json.dumps(manifest).encode())
        fsync_dir(tmp)
        os.rename(tmp, self.directory / name)  # the commit
        fsync_dir(self.directory)

    def _compact(self, seq: int) -> None:
        """Fold the base and the deltas up to `seq` into a new base, then drop what it covers."""
        merged = self.load(upto=seq)
        rows = {t: (merged.rows[t], merged.values[t]) for t in merged.rows}
        self._write_folder(f"base-{seq:010d}", seq, rows)
        for kind, s in self._committed():
            if s < seq or (kind == "delta" and s == seq):
                src = self.directory / f"{kind}-{s:010d}"
                trash = self.directory / f".trash-{src.name}-{uuid.uuid4().hex[:8]}"
                os.rename(src, trash)
                shutil.rmtree(trash, ignore_errors=True)
        fsync_dir(self.directory)

    # ------------------------------------------------------------------ loading
    def load(self, rows: Mapping[str, np.ndarray] | None = None, upto: int | None = None) -> LoadResult:
        """The running checkpoint: the newest committed value of every row (or of `rows` per table;
        only the files of the row groups holding them are read). Rows never saved are absent from
        the result. `upto` ignores saves after that sequence number (compaction uses it). A load
        that races a compaction's cleanup (a folder vanished under it) starts again."""
        for attempt in range(5):
            try:
                return self._load(rows, upto)
            except FileNotFoundError:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _load(self, rows: Mapping[str, np.ndarray] | None, upto: int | None) -> LoadResult:
        base, deltas = self._plan()
        if upto is not None:
            deltas = [s for s in deltas if s <= upto]
        want = {
            t: None if rows is None or t not in rows else np.unique(np.asarray(rows[t], np.int64))
            for t in self.tables
            if rows is None or t in rows
        }
        out = LoadResult()
        have: dict[str, dict[str, np.ndarray]] = {}
        for t in want:
            info = self.tables[t]
            have[t] = {
                "mask": np.zeros(info.shape[0], dtype=bool),
                "values": np.zeros(info.shape, dtype=info.dtype),
            }
        folders = ([f"base-{base:010d}"] if base is not None else []) + [f"delta-{s:010d}" for s in deltas]
        for name in folders:
            folder = self.directory / name
            raw = (folder / MANIFEST).read_bytes()
            out.meta_bytes_read += len(raw)
            manifest = json.loads(raw)
            out.seq = int(manifest["seq"])
            for entry in manifest["files"]:
                t = entry["table"]
                if t not in want:
                    continue
                w = want[t]
                info = self.tables[t]
                if w is not None and not np.any(info.groups[w] == entry["group"]):
                    continue  # this group holds none of the wanted rows: not read
                data = (folder / entry["file"]).read_bytes()
                out.bytes_read += len(data)
                out.files_read += 1
                if zlib.crc32(data) != entry["crc32"]:
                    raise ScarError(f"running checkpoint {folder / entry['file']}: CRC mismatch")
                n = int(entry["count"])
                ids = np.frombuffer(data[: 8 * n], dtype=np.int64)
                vals = np.frombuffer(data[8 * n :], dtype=info.dtype).reshape(n, *info.shape[1:])
                have[t]["mask"][ids] = True
                have[t]["values"][ids] = vals
        for t, w in want.items():
            mask = have[t]["mask"]
            ids = np.flatnonzero(mask) if w is None else w[mask[w]]
            out.rows[t] = ids
            out.values[t] = have[t]["values"][ids]
        return out

    def full_bytes(self) -> int:
        """Data bytes of a full checkpoint of every table (what a full recovery reads)."""
        return sum(info.shape[0] * (8 + info.row_bytes) for info in self.tables.values())
