"""Atomic, consistent Litz checkpoints on local disk: one folder per step, visible only when complete.

A checkpoint holds what the master needs to resume a job exactly (thesis §4.4): the driver's state,
the micro-tasks buffered per executor, every executor's state, and the parameter-server tables. The
tables can be whole (the master gathered them) or row blocks with their *global* row indices (what a
PS shard owns under the seeded row permutation) — the form SCAR's partial checkpoints and partial
recovery need (issue 15): a reader can ask for some tables, or some rows of a table, and only the
blocks holding them are read from disk.

Layout of ``<directory>/step-<n>/`` (``n`` zero-padded so names sort by step; the names and the
folder moves are `checkpoint_folders`'):

- ``tensors/`` — the tables, written with ``torch.distributed.checkpoint`` (DCP) from this one
  process (``no_dist=True``): one key per row block of every table (``t<i>/b<j>``), plus the block's
  global row indices (``t<i>/b<j>/rows``) when they are not one contiguous range. DCP stores each key
  at its own offset, so loading a subset of keys reads only those bytes (`checkpoint_tables`).
- ``states.bin`` — the small application states, pickled one segment each (driver, and per executor
  its state and its buffered tasks) so one executor's state can be read without the others
  (`checkpoint_states`).
- ``manifest.json`` — the layout: tables (dtype, shape, blocks with global row ranges, CRC-32 of every
  block) and the pickle segments (offset, length, CRC-32).
- ``COMMITTED`` — written last, holding the manifest's CRC-32 (both by `checkpoint_manifest`).

Atomicity: everything is written into a hidden ``.tmp-…`` folder, every file and the folder are
fsynced, the commit marker is written and fsynced, and only then is the folder renamed to
``step-<n>`` (one atomic ``rename``) and the parent folder fsynced. A crash at any moment therefore
leaves either the new step complete or no trace of it besides a hidden temp folder, which a later save
removes; older steps are pruned (renamed away first, then deleted) only after the new one is committed.
Reading checks the marker, the manifest's CRC and each block's CRC, and raises `CheckpointError`
naming the file; `CheckpointStore.latest` then falls back to the previous complete step.

Why DCP for the arrays: it is PyTorch's maintained checkpoint format, works from one process without
a process group, writes with fsync, and loads any subset of keys reading only their byte ranges —
exactly the per-table, per-row-block access partial recovery needs. Arrays go in and out as zero-copy
``torch.from_numpy`` views (DCP fills preallocated arrays in place). Its cost is the import (about
1 s, paid on the first save or load that has tables; checkpoints without tables never import torch).
What is not an array (driver, executor and task states) is pickled by us, as Ray pickles it anyway.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pollux.litz.checkpoint_folders import MANIFEST, STATES, TENSORS, StepFolders
from pollux.litz.checkpoint_manifest import read_manifest, write_manifest
from pollux.litz.checkpoint_states import ApplicationStates, read_states, write_states
from pollux.litz.checkpoint_tables import CheckpointError, read_tables, write_tables

__all__ = ["CheckpointError", "CheckpointIO", "CheckpointStore", "LitzCheckpoint"]

DEFAULT_BLOCK_BYTES = 4 << 20


@dataclass
class LitzCheckpoint:
    """One consistent cut of a Litz job (the runtime takes it with no micro-task in flight).

    `tables[name]` holds table rows; `rows[name]` their global row indices (rows first). A table
    without a `rows` entry is whole: row ``k`` of the array is global row ``k``. A PS shard saves its
    part as ``tables[name] = values, rows[name] = global_rows``; the runtime saves all shards' rows of a
    table as one entry, shard after shard, with `block_starts` at the shard boundaries, so that the
    rows of one lost shard are read back as about 1/num_shards of the bytes. Rows keep their order
    through a save and a load. After `CheckpointStore.load`, `rows` holds an entry for every table
    that was saved partially or loaded with a row subset.
    """

    step: int
    driver_state: Any = None
    buffered_tasks: dict[int, list[Any]] = field(default_factory=dict)
    executor_states: dict[int, Any] = field(default_factory=dict)
    tables: dict[str, np.ndarray] = field(default_factory=dict)
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    #: Optional, per table: positions in `tables[name]` where a stored block must start (a sharded
    #: save puts them at shard boundaries; SCAR at its parameter blocks). Between two of them, and
    #: without any, blocks are cut every `block_rows` rows (default: about `block_bytes`).
    block_starts: dict[str, Sequence[int]] = field(default_factory=dict)

    def table_rows(self, name: str) -> np.ndarray:
        """Global row indices of `tables[name]` (0..n-1 for a whole table)."""
        if name in self.rows:
            return self.rows[name]
        return np.arange(self.tables[name].shape[0], dtype=np.int64)


@dataclass(frozen=True)
class CheckpointIO:
    """What one save or load cost: SCAR reports bytes read on recovery against a full checkpoint."""

    step: int
    path: str
    bytes: int
    seconds: float
    tensor_keys: int


class CheckpointStore:
    """Checkpoints of one job under `directory`: atomic saves, subset loads, the newest `keep` kept.

    `block_rows` fixes the rows per stored block (SCAR aligns it with its parameter blocks); by
    default a block is about `block_bytes`. `keep=None` keeps every step (a running checkpoint built
    of partial saves needs the older ones). Counters `bytes_written` / `bytes_read` add up all I/O;
    `last_save` / `last_load` describe the latest call.

    The store decides what goes into a step and when; the parts of the format live beside it: the
    step folders and their atomic moves in `StepFolders` (`checkpoint_folders`), the manifest and
    commit marker in `checkpoint_manifest`, the pickled states in `checkpoint_states` and the tables
    in `checkpoint_tables`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int | None = 2,
        *,
        block_rows: int | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"CheckpointStore.keep: {keep} must be >= 1 or None")
        if block_rows is not None and block_rows < 1:
            raise ValueError(f"CheckpointStore.block_rows: {block_rows} must be >= 1 or None")
        if block_bytes < 1:
            raise ValueError(f"CheckpointStore.block_bytes: {block_bytes} must be >= 1")
        self.folders = StepFolders(directory)
        self.directory = self.folders.directory
        self.keep = keep
        self.block_rows = block_rows
        self.block_bytes = block_bytes
        self.bytes_written = 0
        self.bytes_read = 0
        self.last_save: CheckpointIO | None = None
        self.last_load: CheckpointIO | None = None
        #: (step, reason) of committed steps `latest` skipped because they failed to load.
        self.skipped: list[tuple[int, str]] = []
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ listing
    def path(self, step: int) -> Path:
        """The folder of step `step` (``step-<n>``, zero-padded)."""
        return self.folders.path(step)

    def steps(self) -> list[int]:
        """Committed steps (folder renamed into place, marker present), oldest first."""
        return self.folders.steps()

    # ------------------------------------------------------------------ saving
    def save(
        self,
        ckpt: LitzCheckpoint | int,
        state: LitzCheckpoint | None = None,
        *,
        block_rows: int | None = None,
    ) -> CheckpointIO:
        """Write `ckpt` as ``step-<ckpt.step>``; it becomes visible only once complete.

        Also callable as ``save(step, state)`` (the step then overrides ``state.step``). Saving a step
        that exists replaces it (the old one is moved away first, so a crash leaves older steps).
        """
        if isinstance(ckpt, LitzCheckpoint):
            if state is not None:
                raise TypeError("CheckpointStore.save: pass either save(ckpt) or save(step, state)")
            cp = ckpt
        else:
            if state is None:
                raise TypeError("CheckpointStore.save(step, state): state is missing")
            cp = state
            if int(ckpt) != cp.step:
                cp = dataclasses.replace(cp, step=int(ckpt))
        if int(cp.step) < 0:
            raise CheckpointError(f"LitzCheckpoint.step: {cp.step} must be >= 0")
        t0 = time.perf_counter()
        self.folders.clean_stale()
        tmp = self.folders.new_temp()
        try:
            tables_md, tensor_bytes, nkeys = write_tables(
                tmp / TENSORS,
                cp.tables,
                cp.rows,
                cp.block_starts,
                block_rows or self.block_rows,
                self.block_bytes,
            )
            segments, states_bytes = write_states(
                tmp / STATES,
                ApplicationStates(
                    driver_state=cp.driver_state,
                    meta=cp.meta,
                    executor_states=cp.executor_states,
                    buffered_tasks=cp.buffered_tasks,
                ),
            )
            commit_bytes = write_manifest(tmp, cp.step, tables_md, segments)
            final = self.folders.commit(tmp, cp.step)
        except BaseException:
            self.folders.discard(tmp)
            raise
        total = tensor_bytes + states_bytes + commit_bytes
        self.bytes_written += total
        self.last_save = CheckpointIO(int(cp.step), str(final), total, time.perf_counter() - t0, nkeys)
        self._prune()
        return self.last_save

    def save_async(self, ckpt: LitzCheckpoint, *, block_rows: int | None = None) -> Future[CheckpointIO]:
        """`save` on one background thread, in submission order, so training goes on meanwhile
        (SCAR persists its selected blocks this way). The caller must not change the arrays of
        `ckpt` until the future is done (hand over copies). Commit and crash safety are `save`'s."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="litz-checkpoint")
        return self._pool.submit(self.save, ckpt, block_rows=block_rows)

    def close(self) -> None:
        """Wait for pending `save_async` calls and stop their thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def clear(self) -> None:
        """Remove every checkpoint (a new job reusing the folder must not resume an old one's)."""
        self.folders.clean_stale()
        self.folders.drop(self.steps())

    def _prune(self) -> None:
        """Drop all but the newest `keep` steps (only after a new one is committed)."""
        if self.keep is not None:
            self.folders.drop(self.steps()[: -self.keep])

    # ------------------------------------------------------------------ loading
    def manifest(self, step: int) -> dict[str, Any]:
        """The verified manifest of a committed step (layout, blocks, segments) without the data."""
        return read_manifest(self.path(step))[0]

    def latest(self, **load_kwargs: Any) -> LitzCheckpoint | None:
        """The newest committed step that loads; steps that fail are recorded in `skipped`."""
        for step in reversed(self.steps()):
            try:
                return self.load(step, **load_kwargs)
            except CheckpointError as exc:
                self.skipped.append((step, str(exc)))
                warnings.warn(f"checkpoint step {step} skipped: {exc}", RuntimeWarning, stacklevel=2)
        return None

    def load(
        self,
        step: int | None = None,
        *,
        tables: Iterable[str] | None = None,
        rows: Mapping[str, np.ndarray] | np.ndarray | Sequence[int] | None = None,
        executors: Iterable[int] | None = None,
        driver: bool = True,
        keys: Iterable[str] | None = None,
        strict: bool = True,
    ) -> LitzCheckpoint:
        """Read step `step` (newest committed when None), only the parts asked for.

        `tables` (alias `keys`): table names to read (None = all, empty = none). `rows`: per table,
        the global rows wanted (a mapping; a bare array means those rows of every table read); only
        blocks holding them are read and the result keeps their order (`strict`: a row the
        checkpoint lacks is an error, else it is left out). `executors`: ids
        whose state and buffered tasks to read (None = all). `driver`: read the driver state.
        """
        t0 = time.perf_counter()
        if step is None:
            committed = self.steps()
            if not committed:
                raise CheckpointError(f"{self.directory}: no committed checkpoint")
            step = committed[-1]
        folder = self.path(step)
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: no such checkpoint (committed: {self.steps()})")
        manifest, nread = read_manifest(folder)
        if tables is not None and keys is not None:
            raise TypeError("CheckpointStore.load: pass tables or keys, not both")
        names = list(manifest["tables"]) if tables is None and keys is None else list(tables or keys or [])
        if rows is None:
            rows = {}
        elif isinstance(rows, Mapping):
            rows = dict(rows)
        else:
            rows = {name: np.asarray(rows) for name in names}
        for name in [*names, *rows]:
            if name not in manifest["tables"]:
                raise CheckpointError(f"{folder / MANIFEST}: no table {name!r} in step {step}")
        for name in rows:
            if name not in names:
                names.append(name)
        states, sbytes = read_states(
            folder / STATES, manifest["segments"], driver=driver, executors=executors
        )
        nread += sbytes
        out = LitzCheckpoint(
            step=int(manifest["step"]),
            driver_state=states.driver_state,
            buffered_tasks=states.buffered_tasks,
            executor_states=states.executor_states,
            meta=states.meta,
        )
        tbytes, nkeys = read_tables(
            folder / TENSORS, manifest["tables"], names, rows, strict, out.tables, out.rows
        )
        nread += tbytes
        self.bytes_read += nread
        self.last_load = CheckpointIO(out.step, str(folder), nread, time.perf_counter() - t0, nkeys)
        return out
