"""The worker's version-tagged parameter cache and update log (thesis §4.4), pure numpy.

Cache rule: a row fetched by a task of version v is tagged v and serves any task of version <= v,
because such a task depends on a subset of the completions the fetching task depended on. SSP with
staleness s therefore gets its cache hits for free: all tasks of one iteration share a version.

Update log: the additive updates of the micro-tasks of one batch, summed per row, sent to the
shards as one staged flush before the batch's results go to the master.
"""

from __future__ import annotations

import numpy as np

from pollux.litz.records import TableMeta


class ParamCache:
    """Per-worker copy of PS rows with a version tag per row (-1: never fetched)."""

    def __init__(self, tables: dict[str, TableMeta]) -> None:
        self.meta = tables
        self.values = {n: np.zeros(m.shape, dtype=m.dtype) for n, m in tables.items()}
        self.tags = {n: np.full(m.shape[0], -1, dtype=np.int64) for n, m in tables.items()}
        # a lower bound of each table's tags (tags never decrease): a whole-table read at a version
        # <= it hits without looking at the tags
        self.floor = {n: -1 for n in tables}
        # one read-only view per table, made once: the values are only ever written in place
        self.views = {n: self._read_only(v) for n, v in self.values.items()}
        self.hits = 0
        self.misses = 0

    def table(self, name: str) -> TableMeta:
        if name not in self.meta:
            raise KeyError(f"PS table {name!r} does not exist; tables: {sorted(self.meta)}")
        return self.meta[name]

    def stale_rows(self, name: str, rows: np.ndarray | None, version: int) -> np.ndarray:
        """Rows (global ids) a task of `version` may not take from the cache."""
        tags = self.tags[name]
        if rows is None:
            return np.flatnonzero(tags < version)
        return np.unique(rows[tags[rows] < version])

    def fill(self, name: str, rows: np.ndarray, values: np.ndarray, version: int) -> None:
        """Store `values` of `rows` fetched for `version`, except where the cache already holds a
        row for a later version (a fetch that lost a race with a pushed table must not undo it)."""
        tags = self.tags[name]
        newer = tags[rows] <= version
        if not newer.all():
            rows, values = rows[newer], values[newer]
        self.values[name][rows] = values
        tags[rows] = version

    def fill_all(self, name: str, values: np.ndarray, version: int) -> None:
        """`fill` of every row (a pushed table), without the row index when no row is newer."""
        tags = self.tags[name]
        if int(tags.max()) > version:
            self.fill(name, np.arange(tags.size), values, version)
        else:
            self.values[name][...] = values
            tags[:] = version
        self.floor[name] = max(self.floor[name], version)

    def read(self, name: str, rows: np.ndarray | None) -> np.ndarray:
        """Cached values: a read-only view of the whole table, or a copy of `rows`."""
        if rows is None:
            return self.views[name]
        return self.values[name][rows]

    @staticmethod
    def _read_only(values: np.ndarray) -> np.ndarray:
        view = values.view()
        view.flags.writeable = False
        return view

    def count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1


class UpdateLog:
    """Additive updates summed per row, allocated per table on first use."""

    def __init__(self, tables: dict[str, TableMeta]) -> None:
        self.meta = tables
        self.delta: dict[str, np.ndarray] = {}
        self.touched: dict[str, np.ndarray] = {}
        self.whole: set[str] = set()  # tables some update covered entirely (all rows touched)
        self.updates = 0

    def add(self, name: str, delta: np.ndarray, rows: np.ndarray | None) -> None:
        summed = self.delta.get(name)
        if rows is None and summed is not None and type(delta) is np.ndarray and delta.shape == summed.shape:
            summed += delta  # the common case of a whole-table update, after the first: no checks
            self.whole.add(name)
            self.updates += 1
            return
        if name not in self.meta:
            raise KeyError(f"PS table {name!r} does not exist; tables: {sorted(self.meta)}")
        meta = self.meta[name]
        self._allocate(name)
        delta = np.asarray(delta)
        if rows is None:
            if delta.shape != meta.shape:
                raise ValueError(f"update {name!r}: delta shape {delta.shape}, table shape {meta.shape}")
            self.delta[name] += delta
            self.whole.add(name)
        else:
            rows = np.asarray(rows, dtype=np.int64)
            if delta.shape != (rows.size, *meta.shape[1:]):
                raise ValueError(
                    f"update {name!r}: delta shape {delta.shape} for {rows.size} rows of {meta.shape}"
                )
            np.add.at(self.delta[name], rows, delta)
            self.touched[name][rows] = True
        self.updates += 1

    def add_drained(self, name: str, rows: np.ndarray, delta: np.ndarray) -> None:
        """`add` of one table of another log's `drain` (rows unique and sorted), without `add`'s
        checks and without ``np.add.at``: the master sums the inline logs of many batches so that
        a commit carries one update per table, not one per batch."""
        self._allocate(name)
        if rows.size == self.meta[name].shape[0]:  # unique, sorted and all of them: every row, in order
            self.delta[name] += delta
            self.whole.add(name)
        else:
            self.delta[name][rows] += delta
            self.touched[name][rows] = True
        self.updates += 1

    def _allocate(self, name: str) -> None:
        """A table's summed deltas and touched rows, allocated on its first update."""
        if name not in self.delta:
            meta = self.meta[name]
            self.delta[name] = np.zeros(meta.shape, dtype=meta.dtype)
            self.touched[name] = np.zeros(meta.shape[0], dtype=bool)

    def drain(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{table: (touched rows, summed deltas)} and an empty log."""
        out = {}
        for name, delta in self.delta.items():
            if name in self.whole:
                out[name] = (np.arange(delta.shape[0]), delta)
                continue
            rows = np.flatnonzero(self.touched[name])
            if rows.size:
                out[name] = (rows, delta[rows] if rows.size < delta.shape[0] else delta)
        self.delta, self.touched, self.whole = {}, {}, set()
        return out
