"""Parameter-server shards: Ray async actors holding some rows of every table (thesis §4.4).

Updates arrive in two steps so that the §4.3 guarantee holds and a run at staleness 0 does not
depend on timing: a worker *stages* its aggregated update log under a flush key (before its
results go to the master), and the master *commits* the keys of the completions it has handled
before it sends any task that must see them. Reads see committed updates only. A small update log
skips the staging call: it travels with the batch's results to the master, and the commit message
carries it here (staged and applied in one step, in the same key order).

Shard migration (`migrate`) moves rows, with their staged deltas, to their new owners; afterwards
a shard forwards every request for a row it gave away to the shard it gave it to, and a request for
a row that is on its way here waits for it (`absorb`), so no micro-task ever blocks on a resize.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np

from pollux.litz.records import unpack

FlushKey = tuple[int, int]
StagedItem = tuple[str, np.ndarray, np.ndarray]  # table, global rows (unique), delta
Parcel = tuple[str, np.ndarray, np.ndarray, dict[FlushKey, list[StagedItem]]]  # rows moving


class ShardState:
    """The data of one shard (pure numpy, testable without Ray): per table its sorted global rows
    and their values, staged deltas by flush key, and where rows it gave away went."""

    def __init__(self, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.rows: dict[str, np.ndarray] = {}
        self.values: dict[str, np.ndarray] = {}
        for name, (rows, values) in tables.items():
            order = np.argsort(rows, kind="stable")
            self.rows[name] = np.asarray(rows, dtype=np.int64)[order]
            self.values[name] = np.array(values[order], copy=True)
        self.staged: dict[FlushKey, list[StagedItem]] = {}
        self.moved_to: dict[str, np.ndarray] = {}  # table -> new owner per global row (-1: never)

    def locate(self, table: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(local index, present mask) of global `rows`."""
        have = self.rows[table]
        if have.size == 0:
            return np.zeros(rows.size, dtype=np.int64), np.zeros(rows.size, dtype=bool)
        loc = np.minimum(np.searchsorted(have, rows), have.size - 1)
        return loc, have[loc] == rows

    def add_rows(self, table: str, rows: np.ndarray, values: np.ndarray) -> None:
        allrows = np.concatenate([self.rows[table], rows])
        allvals = np.concatenate([self.values[table], values])
        order = np.argsort(allrows, kind="stable")
        self.rows[table], self.values[table] = allrows[order], allvals[order]

    def take_rows(self, table: str, rows: np.ndarray) -> np.ndarray:
        loc, ok = self.locate(table, rows)
        if not ok.all():
            raise KeyError(f"shard table {table!r}: rows {rows[~ok][:5]} are not here")
        out = self.values[table][loc]
        keep = np.ones(self.rows[table].size, dtype=bool)
        keep[loc] = False
        self.rows[table], self.values[table] = self.rows[table][keep], self.values[table][keep]
        return out

    def commit(self, keys: list[FlushKey]) -> int:
        applied = 0
        for key in keys:
            for table, rows, delta in self.staged.pop(key, []):
                loc, ok = self.locate(table, rows)
                if not ok.all():
                    raise KeyError(f"commit {key}: table {table!r} rows {rows[~ok][:5]} not here")
                self.values[table][loc] += delta
                applied += 1
        return applied


class PSShardActor:
    """One PS shard; wrapped with ``ray.remote`` by the master (async actor)."""

    def __init__(
        self,
        index: int,
        tables: dict[str, tuple[np.ndarray, np.ndarray]],
        commit_id: int = 0,
        extension: Any = None,
    ) -> None:
        self.index = index
        # a side object of a fault-tolerance controller (RuntimeConfig.fault_tolerance), built from
        # the shard's starting rows: SCAR keeps its in-memory running checkpoint there
        self.extension = extension(index, tables) if extension is not None else None
        self.commit_id = commit_id
        self._committed = asyncio.Condition()
        self.state = ShardState(tables)
        self.peers: list[Any] = []
        self._arrived = asyncio.Event()
        self.forwarded = 0

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> int:
        return self.index

    async def _split(self, table: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(local index, here mask, new owner of the rest); waits for rows that are on their way."""
        while True:
            loc, ok = self.state.locate(table, rows)
            if ok.all():
                return loc, ok, np.empty(0, dtype=np.int64)
            moved = self.state.moved_to.get(table)
            dest = moved[rows[~ok]] if moved is not None else np.full(int((~ok).sum()), -1)
            if (dest >= 0).all():
                return loc, ok, dest
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=60.0)
            except TimeoutError as err:
                raise KeyError(f"shard {self.index}: table {table!r} rows never arrived") from err

    async def _await_commit(self, commit_id: int) -> None:
        if self.commit_id < commit_id:
            async with self._committed:
                await self._committed.wait_for(lambda: self.commit_id >= commit_id)

    async def get(self, table: str, rows: np.ndarray, min_commit: int = 0) -> np.ndarray:
        """Values of `rows` once commit `min_commit` is applied here (the master does not wait for
        its commits: the reads that need them do)."""
        await self._await_commit(min_commit)
        rows = np.asarray(rows, dtype=np.int64)
        loc, ok, dest = await self._split(table, rows)
        if dest.size == 0:
            return self.state.values[table][loc]
        values = self.state.values[table]
        out = np.empty((rows.size, *values.shape[1:]), dtype=values.dtype)
        out[ok] = values[loc[ok]]
        away = np.flatnonzero(~ok)
        self.forwarded += 1
        parts = {int(d): away[dest == d] for d in np.unique(dest)}
        got = await asyncio.gather(
            *[self.peers[d].get.remote(table, rows[idx], min_commit) for d, idx in parts.items()]
        )
        for idx, vals in zip(parts.values(), got, strict=True):
            out[idx] = vals
        return out

    async def stage(self, key: FlushKey, items: list[StagedItem]) -> int:
        mine: list[StagedItem] = []
        remote: dict[int, list[StagedItem]] = {}
        for table, rows, delta in items:
            rows = np.asarray(rows, dtype=np.int64)
            _, ok, dest = await self._split(table, rows)
            if dest.size == 0:
                mine.append((table, rows, delta))
                continue
            if ok.any():
                mine.append((table, rows[ok], delta[ok]))
            away_rows, away_delta = rows[~ok], delta[~ok]
            for d in np.unique(dest):
                sel = dest == d
                remote.setdefault(int(d), []).append((table, away_rows[sel], away_delta[sel]))
        if mine:
            self.state.staged.setdefault(key, []).extend(mine)
        if remote:
            self.forwarded += 1
            await asyncio.gather(*[self.peers[d].stage.remote(key, its) for d, its in remote.items()])
        return len(mine)

    async def commit(
        self,
        keys: list[FlushKey],
        commit_id: int,
        inline: bytes | None = None,
    ) -> int:
        """Apply the staged updates of `keys`, as commit number `commit_id` (in order). `inline`:
        updates of some of those keys that came back to the master with their batch's results
        (`RuntimeConfig.inline_update_bytes`), this shard's rows of them as a `pack`-ed
        ``{key: [StagedItem, ...]}``; staged here first."""
        await self._await_commit(commit_id - 1)
        staged: dict[FlushKey, list[StagedItem]] = unpack(inline) if inline is not None else {}
        for key, items in staged.items():
            self.state.staged.setdefault(key, []).extend(items)
        applied = self.state.commit(keys)
        async with self._committed:
            self.commit_id = max(self.commit_id, commit_id)
            self._committed.notify_all()
        return applied

    async def migrate(
        self, owners: dict[str, np.ndarray], peers: list[Any], commit_id: int, new_index: int
    ) -> int:
        """Become shard `new_index` of the layout `owners`/`peers` (-1: retired, keep nothing); give
        every row now owned by another shard (with its staged deltas) to it, and forward requests
        for those rows there from now on. Returns the number of rows given away. `commit_id` is the
        master's last commit (applied on the old shards by then)."""
        async with self._committed:  # old shards are there already; new ones join at this commit
            self.commit_id = max(self.commit_id, commit_id)
            self._committed.notify_all()
        self.index = new_index
        self.peers = list(peers)
        outgoing: dict[int, list[Parcel]] = {}
        moved = 0
        for table, owner in owners.items():
            have = self.state.rows[table]
            leave = have[owner[have] != self.index]
            if leave.size == 0:
                self.state.moved_to[table] = np.where(owner != self.index, owner, -1)
                continue
            staged_out: dict[FlushKey, list[StagedItem]] = {}
            for key, items in self.state.staged.items():
                kept = []
                for t, rows, delta in items:
                    if t != table:
                        kept.append((t, rows, delta))
                        continue
                    go = owner[rows] != self.index
                    if go.any():
                        staged_out.setdefault(key, []).append((t, rows[go], delta[go]))
                    if (~go).any():
                        kept.append((t, rows[~go], delta[~go]))
                self.state.staged[key] = kept
            values = self.state.take_rows(table, leave)
            self.state.moved_to[table] = np.where(owner != self.index, owner, -1)
            dest = owner[leave]
            for d in np.unique(dest):
                sel = dest == d
                its_staged: dict[FlushKey, list[StagedItem]] = {}
                for key, items in staged_out.items():
                    sub = [(t, r[owner[r] == d], x[owner[r] == d]) for t, r, x in items]
                    sub = [item for item in sub if item[1].size]
                    if sub:
                        its_staged[key] = sub
                outgoing.setdefault(int(d), []).append((table, leave[sel], values[sel], its_staged))
            moved += int(leave.size)
        await asyncio.gather(*[self.peers[d].absorb.remote(parcels) for d, parcels in outgoing.items()])
        return moved

    def absorb(self, parcels: list[Parcel]) -> int:
        for table, rows, values, staged in parcels:
            self.state.add_rows(table, rows, values)
            moved = self.state.moved_to.get(table)
            if moved is not None:
                moved[rows] = -1
            for key, items in staged.items():
                self.state.staged.setdefault(key, []).extend(i for i in items if i[1].size)
        self._arrived.set()
        return len(parcels)

    def snapshot(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Committed rows and values of every table (for checkpoints); staged deltas excluded."""
        return {t: (self.state.rows[t].copy(), self.state.values[t].copy()) for t in self.state.rows}

    async def extension_call(self, method: str, args: tuple[Any, ...] = (), min_commit: int = 0) -> Any:
        """``extension.<method>(shard state, *args)`` once commit `min_commit` is applied here."""
        if self.extension is None:
            raise RuntimeError(f"shard {self.index}: no extension (RuntimeConfig.fault_tolerance)")
        await self._await_commit(min_commit)
        return getattr(self.extension, method)(self.state, *args)

    def stats(self) -> dict[str, int]:
        return {"forwarded": self.forwarded, "staged_keys": len(self.state.staged)}
