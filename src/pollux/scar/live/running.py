"""The in-memory running checkpoint a PS shard keeps (thesis §5.4.3, "Actions During a Checkpoint").

Each Litz PS shard holds one `RunningCopy` as its extension object (`RuntimeConfig.fault_tolerance`
gives the shards this class as `shard_extension`): a copy of the shard's rows as they stand in the
running checkpoint, initialised to the rows the shard started with (the starting parameters, or —
for a replacement shard after a failure — the rows just reloaded from the running checkpoint on
disk). Keeping it beside the live rows is what makes a checkpoint cheap: the distances of step 1
are computed where the rows are, and step 4 copies only the selected rows, after which training
may go on while the controller persists them.

Blocks are PS rows. A block's distance (`row_distances`, chosen per table by the controller's
`ScarConfig.distances`) is either the L2 norm of (current row − saved row) — rows of MLR, MF and CNN
parameters — or `"tv"`: the total variation between the row's current and saved *distributions*
(each normalised by its sum) scaled by the row's length (its total count). The latter is the
thesis's measure for LDA's count rows: a document-topic row of length N_d whose distribution moved
by TV has had about N_d·TV of its tokens reassigned, which is what the sampler must redo if the row
is lost; the L2 norm would rank long documents and sharp distributions too high or too low.
The methods take the shard's `ShardState` first (`PSShardActor.extension_call` passes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pollux.scar.api import ScarError

RowsValues = dict[str, tuple[np.ndarray, np.ndarray]]

#: the row distances a table may use (`ScarConfig.distances`)
DISTANCES = ("l2", "tv")


def _as_rows(values: np.ndarray) -> np.ndarray:
    """(rows, width) float view of a table part (a 1-D table's rows are scalars; 0 rows is fine)."""
    a = np.asarray(values, dtype=float)
    return a.reshape(a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64)))


def tv_length_distance(current: np.ndarray, saved: np.ndarray) -> np.ndarray:
    """(rows,): N · TV(p, p') for count rows, p = row / row sum, N = max(current sum, saved sum).

    With equal sums (a document's length does not change while Gibbs reassigns its tokens) this
    is ½‖n − n'‖₁ — the experiments' `block_distance` for LDA — and computed so exactly (the
    scale factor is then 1.0). An empty row (sum 0) has no distribution: against a non-empty one
    its TV is 1 (every token of the other row is new or gone, e.g. the all-zero starting tables
    before LDA's init tasks), against an empty one 0. No NaN either way.
    """
    cur, old = _as_rows(current), _as_rows(saved)
    if cur.shape != old.shape:
        raise ScarError(f"tv distance: current rows {cur.shape} and saved rows {old.shape} differ")
    n_cur, n_old = cur.sum(axis=1), old.sum(axis=1)
    length = np.maximum(n_cur, n_old)
    full_cur, full_old = n_cur > 0, n_old > 0
    both = full_cur & full_old
    # rescale each row to the common length N: N · TV = ½ Σ |n·N/n_sum − n'·N/n'_sum|
    s_cur = np.divide(length, n_cur, out=np.zeros_like(length), where=both)
    s_old = np.divide(length, n_old, out=np.zeros_like(length), where=both)
    out = 0.5 * np.abs(cur * s_cur[:, None] - old * s_old[:, None]).sum(axis=1)
    return np.where(both, out, np.where(full_cur | full_old, length, 0.0))


def l2_distance(current: np.ndarray, saved: np.ndarray) -> np.ndarray:
    """(rows,): ‖current row − saved row‖₂."""
    diff = _as_rows(current) - _as_rows(saved)
    return np.sqrt(np.einsum("rk,rk->r", diff, diff))


def row_distances(current: np.ndarray, saved: np.ndarray, kind: str = "l2") -> np.ndarray:
    """(rows,): the distance `kind` ("l2" or "tv", see the module docstring) of each row."""
    if kind == "l2":
        return l2_distance(current, saved)
    if kind == "tv":
        return tv_length_distance(current, saved)
    raise ScarError(f"row distance: expected one of {', '.join(DISTANCES)}, got {kind!r}")


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

    def distances(
        self, state: Any, kinds: Mapping[str, str] | None = None
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{table: (global rows, distance of each row from its saved copy)}; `kinds` maps a table
        to "l2" (the default) or "tv" (`row_distances`)."""
        kinds = kinds or {}
        out = {}
        for table, rows in self.rows.items():
            cur = self._aligned(state, table)
            out[table] = (rows, row_distances(cur, self.saved[table], kinds.get(table, "l2")))
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
