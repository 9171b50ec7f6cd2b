"""The master's mirror of small PS tables, so that a dispatch can carry the parameters (pure numpy).

Why: a synchronous iteration otherwise makes every worker fetch the tables from the shards after
its batch arrives (the rows changed at the last commit, so its cache misses), a second sequential
round trip per iteration on top of the dispatch itself. The master already sees every small update
(they come back with their batch's results and ride inside its commits,
`RuntimeConfig.inline_update_bytes`), so for tables of at most `RuntimeConfig.push_table_bytes` it
keeps a copy exact at its latest commit and sends it with each batch; the worker fills its cache
with it, tagged with the master's version, and the tasks' reads hit.

Exactness: the copy starts from the values the shards start from, and each commit adds the same
deltas in the same key order as the shards do (so it equals them bit for bit). A table stops being
mirrored as soon as an update to it is staged at the shards without passing the master, and every
table when the layout changes under the master (a lost shard rebuilt by a fault-tolerance
controller); a full read of the table by the driver, at the latest commit, mirrors it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from pollux.litz.records import TableMeta

InlineLog = dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (rows, summed delta)


class TableMirror:
    """Copies of the tables no larger than `limit_bytes`, valid for one PS layout id."""

    def __init__(self, tables: Mapping[str, TableMeta], limit_bytes: int) -> None:
        self.eligible = {
            name
            for name, meta in tables.items()
            if limit_bytes > 0 and int(np.prod(meta.shape)) * np.dtype(meta.dtype).itemsize <= limit_bytes
        }
        self.values: dict[str, np.ndarray] = {}
        self.layout_id = -1

    def _check_layout(self, layout_id: int) -> None:
        if layout_id != self.layout_id:
            self.values = {}
            self.layout_id = layout_id

    def reset(self, layout_id: int, values: Mapping[str, np.ndarray]) -> None:
        """The shards of `layout_id` were just created holding `values` (every table)."""
        self.layout_id = layout_id
        self.values = {n: np.array(v, copy=True) for n, v in values.items() if n in self.eligible}

    def relabel(self, old_layout_id: int, new_layout_id: int) -> None:
        """Rows moved between shards (a migration): the values did not change."""
        if self.layout_id == old_layout_id:
            self.layout_id = new_layout_id

    def set(self, layout_id: int, name: str, values: np.ndarray) -> None:
        """A full read of `name` at the latest commit of layout `layout_id`."""
        self._check_layout(layout_id)
        if name in self.eligible:
            self.values[name] = np.array(values, copy=True)

    def drop(self, names: Iterable[str]) -> None:
        """Updates to `names` went to the shards without passing the master."""
        for name in names:
            self.values.pop(name, None)

    def apply(self, keys: list[tuple[int, int]], inline: Mapping[tuple[int, int], InlineLog]) -> None:
        """A commit of `keys` (in order); `inline` holds the logs of those that came back inline
        (the others' tables were dropped when their results were handled)."""
        for key in keys:
            for name, (rows, delta) in inline.get(key, {}).items():
                table = self.values.get(name)
                if table is not None:  # a new array: batches sent earlier may still hold the old one
                    table = table.copy()
                    table[rows] += delta
                    self.values[name] = table

    def current(self, layout_id: int, names: Iterable[str]) -> dict[str, np.ndarray]:
        """The mirrored tables among `names`, if the mirror belongs to layout `layout_id`."""
        self._check_layout(layout_id)
        return {n: self.values[n] for n in names if n in self.values}
