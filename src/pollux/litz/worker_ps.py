"""A worker's side of the parameter server: reads served from its version-tagged cache, and the
staging of a batch's summed updates at the shards that own their rows (thesis §4.4).

Kept apart from the worker actor (`pollux.litz.worker`), which hosts executors and runs their
micro-tasks: this is everything the worker does *towards the shards*, and the only part of it that
needs the current `Layout` (which shard owns which row).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from pollux.litz.cache import ParamCache
from pollux.litz.records import Layout, TableMeta


class WorkerPS:
    """Cached reads and update staging for one worker, on the newest layout it has seen."""

    def __init__(self, tables: dict[str, TableMeta], layout: Layout) -> None:
        self.layout = layout
        self.cache = ParamCache(tables)
        self.full_reads: set[str] = set()  # tables some task read whole: the master pushes them
        self._fetch_locks: dict[str, asyncio.Lock] = {}

    def set_layout(self, layout: Layout) -> None:
        """Adopt `layout` unless it is older than the one held (messages may cross)."""
        if layout.layout_id > self.layout.layout_id:
            self.layout = layout

    def take_push(self, push: dict[str, np.ndarray] | None, push_version: int) -> None:
        """Cache the whole tables the master pushed with a batch, as of `push_version`."""
        for table, values in (push or {}).items():
            self.cache.fill_all(table, values, push_version)

    async def read(
        self, table: str, rows: np.ndarray | None, version: int, stats: dict[str, float], min_commit: int = 0
    ) -> np.ndarray:
        """`table` (`rows`, or whole) as of `version` or later: from the cache where its rows are
        that new, otherwise fetched from the shards (the time spent counted in ps_wait_s)."""
        if rows is None and self.cache.floor.get(table, -1) >= version:  # the common hit, cheaply
            self.full_reads.add(table)
            stats["hits"] += 1
            return self.cache.read(table, None)
        meta = self.cache.table(table)
        idx = None if rows is None else np.asarray(rows, dtype=np.int64)
        if idx is None:
            self.full_reads.add(table)
        if idx is not None and idx.size and (idx.min() < 0 or idx.max() >= meta.shape[0]):
            raise IndexError(f"PS get {table!r}: rows outside [0, {meta.shape[0]})")
        if self.cache.stale_rows(table, idx, version).size == 0:
            stats["hits"] += 1
            return self.cache.read(table, idx)
        start = time.perf_counter()
        try:
            return await self._fetch(table, idx, version, stats, min_commit)
        finally:
            stats["ps_wait_s"] += time.perf_counter() - start

    async def _fetch(
        self, table: str, idx: np.ndarray | None, version: int, stats: dict[str, float], min_commit: int
    ) -> np.ndarray:
        lock = self._fetch_locks.setdefault(table, asyncio.Lock())
        async with lock:  # one fetch per table at a time: a second task then hits the cache
            stale = self.cache.stale_rows(table, idx, version)
            if stale.size == 0:
                stats["hits"] += 1
                return self.cache.read(table, idx)
            stats["misses"] += 1
            owner = self.layout.owners[table][stale]
            shards = np.unique(owner)
            parts = [stale[owner == s] for s in shards]
            got = await asyncio.gather(
                *[
                    self.layout.shards[int(s)].get.remote(table, part, min_commit)
                    for s, part in zip(shards, parts, strict=True)
                ]
            )
            for part, vals in zip(parts, got, strict=True):
                self.cache.fill(table, part, vals, version)
            return self.cache.read(table, idx)

    async def stage(self, key: tuple[int, int], drained: dict[str, tuple[np.ndarray, np.ndarray]]) -> bool:
        """Send each shard its rows of the batch's summed updates `drained`, staged under `key`
        for the master's commit; returns whether any shard got something."""
        by_shard: dict[int, list[tuple[str, np.ndarray, np.ndarray]]] = {}
        for table, (rows, delta) in drained.items():
            owner = self.layout.owners[table][rows]
            for s in np.unique(owner):
                sel = owner == s
                by_shard.setdefault(int(s), []).append((table, rows[sel], delta[sel]))
        if by_shard:
            await asyncio.gather(
                *[self.layout.shards[s].stage.remote(key, items) for s, items in by_shard.items()]
            )
        return bool(by_shard)
