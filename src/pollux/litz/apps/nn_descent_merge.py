"""NN-Descent's merge: the owner's side of an iteration, each list's k best of its entries and the
proposals it received (`merge`), by one sort of packed integers (`Candidates`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pollux.litz.apps.nn_descent_lists import BlockLists, Proposals, rank_in_groups, sort_rows, sq_distances


@dataclass(frozen=True)
class Candidates:
    """How `merge` packs a candidate entry (a list entry or an accepted proposal) into one int64:
    (row, quantised distance, id, proposed) from the high bits down, so that one plain sort orders
    the candidates by row, then by distance at the quantisation's resolution, then by id, and puts
    the repeats of an entry next to each other, the list's own copy (proposed = 0) first."""

    id_bits: int
    quant_bits: int

    @staticmethod
    def layout(m: int, n: int) -> Candidates:
        id_bits = max(1, (n - 1).bit_length())
        quant_bits = 62 - id_bits - max(1, (m - 1).bit_length())
        if quant_bits < 1:
            raise ValueError(f"nn_descent: {n} points are too many to merge (packed keys need n < 2^30)")
        return Candidates(id_bits, quant_bits)

    @property
    def quant_shift(self) -> int:
        return 1 + self.id_bits

    @property
    def row_shift(self) -> int:
        return 1 + self.id_bits + self.quant_bits

    def pack_into(self, out: np.ndarray, row: np.ndarray, scaled: np.ndarray, ident: np.ndarray,
                  proposed: int) -> None:
        """Write the packed candidates to `out`; `scaled` (distance × the row's scale, consumed) is
        quantised here. In place where it can be: these arrays hold tens of millions of entries."""
        np.minimum(scaled, float((1 << self.quant_bits) - 1), out=scaled)
        part = scaled.astype(np.int64)
        np.left_shift(row, self.row_shift, out=out)
        part <<= self.quant_shift
        out |= part
        np.left_shift(ident, 1, out=part)
        out |= part
        out |= proposed

    def quant(self, packed: np.ndarray) -> np.ndarray:
        return (packed >> self.quant_shift) & ((1 << self.quant_bits) - 1)

    def ident(self, packed: np.ndarray) -> np.ndarray:
        return (packed >> 1) & ((1 << self.id_bits) - 1)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions start … start + count − 1 of every range, and the range each comes from."""
    which = np.repeat(np.arange(starts.size), counts)
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(which.size), which


def merge(lists: BlockLists, proposals: Proposals, columns: np.ndarray) -> int:
    """Apply every proposal for the block: each list becomes the k best of its entries and the
    proposals it got, by (distance, id), without repeats; entries that come in are new. A proposal is
    accepted only if it is not farther than d_max(x) (the owner's rule). Returns the number of
    entries that changed. The result depends only on the *set* of proposals, not on their order.

    Sorting tens of millions of proposals by (target, distance, id) with a lexsort (or an argsort, to
    carry the distances along) costs seconds, so the selection uses one sort of packed integers
    (`Candidates`): distances quantised relative to the row's d_max, so that every candidate below
    the k-th one's level is in and every one above it is out, and repeats fall next to each other.
    A row whose k-th level holds more candidates than it has room for orders just those exactly, by
    (distance, id), their distances recomputed (the same bits as the proposer's: `sq_distances`).
    Of the chosen entries, those that came in get their distance recomputed, and those already there
    are looked up in their row (with their new flags). Only the sort and a few passes touch every
    candidate; the rest works on the k chosen per row.
    """
    m, k = lists.idx.shape
    n = columns.shape[1]
    dmax = lists.sq[:, -1].copy()
    target, offered, dist = proposals.x - lists.lo, proposals.y, proposals.d
    accept = dist <= dmax[target]
    if not accept.any():
        return 0
    if not accept.all():
        target, offered, dist = target[accept], offered[accept], dist[accept]
    layout = Candidates.layout(m, n)
    scale = np.where(dmax > 0, float(1 << layout.quant_bits) / (dmax * (1.0 + 1e-6) + 1e-300), 0.0)
    rows = np.repeat(np.arange(m, dtype=np.int64), k)
    packed = np.empty(m * k + target.size, dtype=np.int64)
    layout.pack_into(packed[: m * k], rows, scale[rows] * lists.sq.ravel(), lists.idx.ravel(), 0)
    scaled = scale[target]
    scaled *= dist
    layout.pack_into(packed[m * k :], target, scaled, offered, 1)
    packed.sort()
    first = np.empty(packed.size, dtype=bool)
    first[0] = True
    np.greater(packed[1:] ^ packed[:-1], 1, out=first[1:])  # differ in more than the proposed bit
    packed = packed.compress(first)
    row_key = np.arange(m, dtype=np.int64) << layout.row_shift
    starts = np.searchsorted(packed, row_key)
    level = row_key | (layout.quant(packed[starts + k - 1]) << layout.quant_shift)  # the k-th's level
    below = np.searchsorted(packed, level) - starts
    tied = np.searchsorted(packed, level | ((1 << layout.quant_shift) - 1), side="right") - starts - below
    picked = starts[:, None] + np.arange(k)  # right for every row with room for all its tied ones
    unsure = np.flatnonzero(tied > k - below)
    if unsure.size:
        position, which = _ranges(starts[unsure] + below[unsure], tied[unsure])
        row = unsure[which]
        ident = layout.ident(packed[position])
        order = np.lexsort((ident, sq_distances(columns, row + lists.lo, ident), row))
        rank = rank_in_groups(row[order])
        keep = order[rank < k - below[row[order]]]
        picked[row[keep], below[row[keep]] + rank[rank < k - below[row[order]]]] = position[keep]
    chosen = packed[picked]
    new_idx = layout.ident(chosen)
    came_in = (chosen & 1).astype(bool)
    new_sq = np.empty((m, k))
    new_flag = came_in.copy()
    stayed_r, stayed_c = np.nonzero(~came_in)
    column_of = np.argmax(lists.idx[stayed_r] == new_idx[stayed_r, stayed_c][:, None], axis=1)
    new_sq[stayed_r, stayed_c] = lists.sq[stayed_r, column_of]
    new_flag[stayed_r, stayed_c] = lists.new[stayed_r, column_of]
    came_r, came_c = np.nonzero(came_in)
    new_sq[came_r, came_c] = sq_distances(columns, came_r + lists.lo, new_idx[came_r, came_c])
    lists.idx, lists.sq, lists.new = sort_rows(new_idx, new_sq, new_flag)
    return int(came_r.size)
