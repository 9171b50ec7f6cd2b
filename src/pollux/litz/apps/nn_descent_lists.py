"""The records and primitives NN-Descent's pieces share (`nn_descent`, `nn_descent_merge`): a block's
kNN lists, proposals, and the squared distances every piece must compute bit for bit alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Pairs per chunk of a distance computation (keeps its temporaries in cache; not its result).
_DISTANCE_CHUNK = 1 << 16


@dataclass
class BlockLists:
    """The kNN lists of the points [lo, hi): neighbour ids, squared distances (rows sorted by
    (distance, id)) and whether each entry is new (not yet used in a join)."""

    lo: int
    idx: np.ndarray  # (m, k) int64
    sq: np.ndarray  # (m, k) float64
    new: np.ndarray  # (m, k) bool


@dataclass
class Proposals:
    """Proposals (x, y, d): y for x's list at squared distance d."""

    x: np.ndarray  # int64, global ids of the targets
    y: np.ndarray  # int64
    d: np.ndarray  # float64

    @staticmethod
    def empty() -> Proposals:
        return Proposals(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))

    @staticmethod
    def concat(parts: list[Proposals]) -> Proposals:
        if not parts:
            return Proposals.empty()
        if len(parts) == 1:  # no copy (proposals are never changed in place)
            return parts[0]
        return Proposals(
            np.concatenate([p.x for p in parts]),
            np.concatenate([p.y for p in parts]),
            np.concatenate([p.d for p in parts]),
        )

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes + self.d.nbytes)


def sq_distances(columns: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between points a[i] and b[i]; `columns` is the point matrix
    transposed (dim × n, one contiguous row per dimension: gathering one coordinate of many points is
    numpy's fastest gather, 2-3× faster per pair than gathering whole rows). Summed one dimension at
    a time, in order, so that a pair gives the same bits in any call and in either order."""
    out = np.zeros(a.shape[0])
    for start in range(0, a.shape[0], _DISTANCE_CHUNK):
        stop = start + _DISTANCE_CHUNK
        part = out[start:stop]
        left, right = a[start:stop], b[start:stop]
        for column in columns:
            diff = column[left] - column[right]
            diff *= diff
            part += diff
    return out


def sort_rows(idx: np.ndarray, sq: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows sorted by (distance, id); `more` arrays follow the same permutation."""
    order = np.lexsort((idx, sq), axis=-1)
    return tuple(np.take_along_axis(arr, order, axis=1) for arr in (idx, sq, *more))


def rank_in_groups(sorted_groups: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal values (input sorted)."""
    if sorted_groups.size == 0:
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    lengths = np.diff(np.r_[starts, sorted_groups.size])
    return np.arange(sorted_groups.size) - np.repeat(starts, lengths)
