"""The in-memory running checkpoint a PS shard keeps (thesis §5.4.3, "Actions During a Checkpoint").

Each Litz PS shard holds one `RunningCopy` as its extension object (`RuntimeConfig.fault_tolerance`
gives the shards this class as `shard_extension`): a copy of the shard's rows as they stand in the
running checkpoint, initialised to the rows the shard started with (the starting parameters, or —
for a replacement shard after a failure — the rows just reloaded from the running checkpoint on
disk). Keeping it beside the live rows is what makes a checkpoint cheap: the distances of step 1
are computed where the rows are, and step 4 copies only the selected rows, after which training
may go on while the controller persists them.

Blocks are PS rows: a block's distance is the L2 norm of (current row − saved row).
The methods take the shard's `ShardState` first (`PSShardActor.extension_call` passes it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pollux.scar.api import ScarError

RowsValues = dict[str, tuple[np.ndarray, np.ndarray]]


class RunningCopy:
    """Saved values of this shard's rows, per table, aligned with the shard's sorted global rows."""

    def __init__(self, index: int, tables: RowsValues) -> None:
        self.index = index
        self.rows: dict[str, np.ndarray] = {}
        self.saved: dict[str, np.ndarray] = {}
        for name, (rows, values) in tables.items():
            order = np.argsort(np.asarray(rows, dtype=np.int64), kind="stable")
            self.rows[name] = np.asarray(rows, dtype=np.int64)[order]
            self.saved[name] = np.array(np.asarray(values)[order], dtype=float, copy=True)

    def _aligned(self, state: Any, table: str) -> np.ndarray:
        have = state.rows[table]
        if have.shape != self.rows[table].shape or not np.array_equal(have, self.rows[table]):
            raise ScarError(
                f"shard {self.index}: table {table!r} rows changed since the running copy was made "
                "(SCAR does not follow PS shard migrations)"
            )
        return np.asarray(state.values[table])

    def distances(self, state: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{table: (global rows, L2 distance of each row from its saved copy)}."""
        out = {}
        for table, rows in self.rows.items():
            cur = self._aligned(state, table)
            diff = (cur - self.saved[table]).reshape(rows.size, -1)
            out[table] = (rows, np.sqrt(np.einsum("rk,rk->r", diff, diff)))
        return out

    def update(self, state: Any, chosen: dict[str, np.ndarray]) -> RowsValues:
        """Copy the current values of the `chosen` global rows into the running copy; return them
        ({table: (rows, values)}) for the controller to persist."""
        out: RowsValues = {}
        for table, want in chosen.items():
            cur = self._aligned(state, table)
            want = np.asarray(want, dtype=np.int64)
            loc = np.searchsorted(self.rows[table], want)
            have = self.rows[table]
            if want.size and (loc.max() >= have.size or not np.array_equal(have[loc], want)):
                raise ScarError(f"shard {self.index}: table {table!r}: chosen rows are not on this shard")
            self.saved[table][loc] = cur[loc]
            out[table] = (want, np.array(cur[loc], copy=True))
        return out

    def snapshot(self, state: Any) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """{table: (rows, current values, saved values)} — for tests and diagnostics."""
        return {
            t: (r.copy(), np.array(self._aligned(state, t), copy=True), self.saved[t].copy())
            for t, r in self.rows.items()
        }
