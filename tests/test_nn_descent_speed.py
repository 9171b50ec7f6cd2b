"""The faster NN-Descent join and merge (issue 39) give the graph the plain versions gave, bit for bit.

`nn_descent.local_join` computes a block's pair distances densely per neighbourhood (`_join_pairs`)
and `merge` finds the entries already in a list from one flagged sort; both replaced simpler code
that paired points one by one (`_pairs_within` / `_pairs_across` + `sq_distances`) and searched the
current lists (`np.searchsorted`). That simpler code is kept here, as the reference: on small seeded
data the proposals must be the same multiset (ids and distance bits), the pair counts the same, and
the lists after every merge identical (ids, distances, new flags), iteration after iteration.
"""

from __future__ import annotations

import numpy as np
import pytest

from pollux.litz.apps import nn_descent as nnd
from pollux.litz.apps.hdbscan_data import gaussian_clusters
from pollux.litz.apps.nn_descent_lists import rank_in_groups, sort_rows
from pollux.litz.apps.nn_descent_merge import Candidates


def reference_pairs_within(owner: np.ndarray, value: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (value[i], value[j]), i < j, of entries with the same owner (sorted by owner)."""
    counts = np.bincount(owner, minlength=m)
    rank = rank_in_groups(owner)
    reps = counts[owner] - rank - 1
    first = np.repeat(np.arange(owner.size), reps)
    offset = np.arange(first.size) - np.repeat(np.cumsum(reps) - reps, reps)
    return value[first], value[first + 1 + offset]


def reference_pairs_across(owner_a: np.ndarray, value_a: np.ndarray, owner_b: np.ndarray,
                           value_b: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of an entry of the first list and one of the second with the same owner."""
    counts_b = np.bincount(owner_b, minlength=m)
    starts_b = np.cumsum(counts_b) - counts_b
    reps = counts_b[owner_a]
    first = np.repeat(np.arange(owner_a.size), reps)
    offset = np.arange(first.size) - np.repeat(np.cumsum(reps) - reps, reps)
    return value_a[first], value_b[np.repeat(starts_b[owner_a], reps) + offset]


def reference_join(columns: np.ndarray, graph: np.ndarray, kinds: np.ndarray, lo: int, hi: int,
                   sample: int, seed: int, iteration: int,
                   dmax: np.ndarray | None) -> tuple[nnd.Proposals, int]:
    """The local join as it was: the same neighbourhoods, then every pair listed and measured."""
    n, k = graph.shape
    m = hi - lo
    fwd = kinds[lo:hi]
    nbr = graph[lo:hi]
    src, col = np.nonzero((graph >= lo) & (graph < hi) & (kinds != nnd.WAITING))
    target = graph[src, col] - lo
    rev_kind = kinds[src, col]
    rank_of, entry_of = nnd._ranks(n, k, seed, nnd._REVERSE, iteration)
    rev_rank = rank_of[src * k + col]
    members = {}
    for kind in (nnd.SAMPLED, nnd.OLD):
        r, c = np.nonzero(fwd == kind)
        pick = rev_kind == kind
        owner, rank = nnd._first_by_rank(target[pick], rev_rank[pick], n * k, sample)
        members[kind] = nnd._unique_pairs(np.concatenate([r, owner]),
                                          np.concatenate([nbr[r, c], entry_of[rank] // k]), n)
    new_o, new_v = members[nnd.SAMPLED]
    old_o, old_v = members[nnd.OLD]
    within_a, within_b = reference_pairs_within(new_o, new_v, m)
    across_a, across_b = reference_pairs_across(new_o, new_v, old_o, old_v, m)
    a = np.concatenate([within_a, across_a])
    b = np.concatenate([within_b, across_b])
    differ = a != b
    a, b = a[differ], b[differ]
    d = nnd.sq_distances(columns, a, b)
    reach = np.full(n, np.inf) if dmax is None else dmax
    to_a = d <= reach[a]
    to_b = d <= reach[b]
    proposals = nnd.Proposals(np.concatenate([a[to_a], b[to_b]]), np.concatenate([b[to_a], a[to_b]]),
                              np.concatenate([d[to_a], d[to_b]]))
    return proposals, int(a.size)


def reference_merge(lists: nnd.BlockLists, proposals: nnd.Proposals, columns: np.ndarray) -> int:
    """The merge as it was: repeats by a sort, the list entries found by `np.searchsorted`."""
    m, k = lists.idx.shape
    n = columns.shape[1]
    xl = proposals.x - lists.lo
    accept = proposals.d <= lists.sq[xl, -1]
    if not accept.any():
        return 0
    rows = np.repeat(np.arange(m, dtype=np.int64), k)
    current = rows * n + lists.idx.ravel()
    entries = nnd._sorted_unique(np.concatenate([current, xl[accept] * n + proposals.y[accept]]))
    owner, ident = entries // n, entries % n
    order = np.argsort(current)
    at = np.minimum(np.searchsorted(current[order], entries), current.size - 1)
    was_there = current[order][at] == entries
    was_new = lists.new.ravel()[order][at] & was_there
    dist = lists.sq.ravel()[order][at]
    came = np.flatnonzero(~was_there)
    dist[came] = nnd.sq_distances(columns, owner[came] + lists.lo, ident[came])
    dmax = lists.sq[:, -1]
    scale = np.where(dmax > 0, float(1 << 40) / (dmax * (1.0 + 1e-6) + 1e-300), 0.0)
    quant = np.minimum(dist * scale[owner], float((1 << 40) - 1)).astype(np.int64)
    ordered = np.sort(owner * (1 << 40) + quant)
    counts = np.bincount(owner, minlength=m)
    kth = ordered[np.cumsum(counts) - counts + k - 1] & ((1 << 40) - 1)
    below = quant < kth[owner]
    tied = np.flatnonzero(quant == kth[owner])
    room = k - np.bincount(owner[below], minlength=m)
    tie_order = tied[np.lexsort((ident[tied], dist[tied], owner[tied]))]
    chosen = below.copy()
    chosen[tie_order[rank_in_groups(owner[tie_order]) < room[owner[tie_order]]]] = True
    came_in = ~was_there[chosen].reshape(m, k)
    stayed_new = was_new[chosen].reshape(m, k)
    lists.idx, lists.sq, came_in, stayed_new = sort_rows(ident[chosen].reshape(m, k),
                                                              dist[chosen].reshape(m, k), came_in, stayed_new)
    lists.new = came_in | stayed_new
    return int(came_in.sum())


def as_multiset(proposals: nnd.Proposals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The proposals in one canonical order (by target, id, distance bits)."""
    order = np.lexsort((proposals.d, proposals.y, proposals.x))
    return proposals.x[order], proposals.y[order], proposals.d[order]


def assert_same_proposals(got: tuple[nnd.Proposals, int], want: tuple[nnd.Proposals, int]) -> None:
    assert got[1] == want[1]
    for a, b in zip(as_multiset(got[0]), as_multiset(want[0]), strict=True):
        np.testing.assert_array_equal(a, b)


def copy_lists(lists: nnd.BlockLists) -> nnd.BlockLists:
    return nnd.BlockLists(lists.lo, lists.idx.copy(), lists.sq.copy(), lists.new.copy())


def seeded_columns(n: int, dim: int, seed: int) -> np.ndarray:
    points = gaussian_clusters(n, dim, max(1, n // 100), 0.2, seed).points
    return np.ascontiguousarray(points.T, dtype=np.float64)


@pytest.mark.parametrize(("n", "dim", "k", "sample", "seed"), [(1500, 10, 10, 5, 0), (700, 3, 6, 6, 4),
                                                               (400, 2, 12, 2, 9)])
def test_join_and_merge_match_the_reference_every_iteration(n, dim, k, sample, seed):
    """Lists after every merge equal; every block's proposals, with and without d_max, equal."""
    columns = seeded_columns(n, dim, seed)
    lists = nnd.initial_lists(columns, 0, n, k, seed)
    reference = copy_lists(lists)
    blocks = [(0, n), (0, n // 3), (n // 3, n // 3 + 1), (n // 2, n)]
    for t in range(12):
        kinds = nnd.take_sample(lists, sample, seed, t, n)
        np.testing.assert_array_equal(kinds, nnd.take_sample(reference, sample, seed, t, n))
        dmax = lists.sq[:, -1]
        for lo, hi in blocks:
            for reach in (None, dmax):
                args = (columns, lists.idx, kinds, lo, hi, sample, seed, t, reach)
                assert_same_proposals(nnd.local_join(*args), reference_join(*args))
        proposals, _ = nnd.local_join(columns, lists.idx, kinds, 0, n, sample, seed, t, dmax)
        changed = nnd.merge(lists, proposals, columns)
        assert changed == reference_merge(reference, proposals, columns)
        np.testing.assert_array_equal(lists.idx, reference.idx)
        np.testing.assert_array_equal(lists.sq, reference.sq)
        np.testing.assert_array_equal(lists.new, reference.new)
        if changed == 0:
            break


def test_block_size_does_not_change_the_proposals(monkeypatch):
    """Tiny join blocks (many of them, each padded to its own widths) give the same proposals."""
    n, k, sample, seed = 900, 8, 4, 2
    columns = seeded_columns(n, 5, seed)
    lists = nnd.initial_lists(columns, 0, n, k, seed)
    for t in range(3):
        kinds = nnd.take_sample(lists, sample, seed, t, n)
        dmax = lists.sq[:, -1]
        want = nnd.local_join(columns, lists.idx, kinds, 0, n, sample, seed, t, dmax)
        monkeypatch.setattr(nnd, "_JOIN_BLOCK", 7)
        assert_same_proposals(nnd.local_join(columns, lists.idx, kinds, 0, n, sample, seed, t, dmax), want)
        monkeypatch.undo()
        nnd.merge(lists, want[0], columns)


def test_join_of_a_block_with_nothing_new_is_empty():
    """Every entry old: no pair has a new member, so nothing is tried or proposed."""
    n, k = 300, 5
    columns = seeded_columns(n, 4, 1)
    lists = nnd.initial_lists(columns, 0, n, k, 1)
    kinds = np.full(lists.idx.shape, nnd.OLD, dtype=np.int64)
    proposals, tried = nnd.local_join(columns, lists.idx, kinds, 0, n, 3, 1, 0, lists.sq[:, -1])
    assert tried == 0 and len(proposals) == 0


def test_merge_keeps_new_flags_of_entries_proposed_again():
    """A proposal of an entry already in the list is a repeat: the entry keeps its distance and its
    new flag (the flagged sort must pick the list's own copy, not the proposal)."""
    n, k = 200, 4
    columns = seeded_columns(n, 3, 5)
    lists = nnd.initial_lists(columns, 0, n, k, 5)
    lists.new[:] = False
    lists.new[::2, 0] = True
    reference = copy_lists(lists)
    x = np.repeat(np.arange(n), k)
    y = lists.idx.ravel()
    again = nnd.Proposals(x, y, lists.sq.ravel().copy())
    assert nnd.merge(lists, again, columns) == 0 == reference_merge(reference, again, columns)
    np.testing.assert_array_equal(lists.new, reference.new)
    np.testing.assert_array_equal(lists.idx, reference.idx)


def test_nn_descent_graph_matches_the_reference_loop():
    """The whole algorithm: same lists and change counts as the reference join and merge."""
    n, k, sample, seed = 1200, 10, 5, 7
    points = seeded_columns(n, 6, seed).T
    lists, changes = nnd.nn_descent(points, k, sample, seed, max_iterations=30, delta=0.001)
    columns = np.ascontiguousarray(points.T)
    reference = nnd.initial_lists(columns, 0, n, k, seed)
    reference_changes = []
    for t in range(30):
        kinds = nnd.take_sample(reference, sample, seed, t, n)
        dmax = reference.sq[:, -1]
        proposals, _ = reference_join(columns, reference.idx, kinds, 0, n, sample, seed, t, dmax)
        reference_changes.append(reference_merge(reference, proposals, columns))
        if reference_changes[-1] <= 0.001 * n * k:
            break
    assert changes == reference_changes
    np.testing.assert_array_equal(lists.idx, reference.idx)
    np.testing.assert_array_equal(lists.sq, reference.sq)


def run_both(columns: np.ndarray, k: int, sample: int, seed: int, iterations: int) -> None:
    """Join once, then merge the same proposals into the lists and into a reference copy, every
    iteration, checking the lists stay equal."""
    n = columns.shape[1]
    lists = nnd.initial_lists(columns, 0, n, k, seed)
    reference = copy_lists(lists)
    for t in range(iterations):
        kinds = nnd.take_sample(lists, sample, seed, t, n)
        nnd.take_sample(reference, sample, seed, t, n)
        proposals, _ = nnd.local_join(columns, lists.idx, kinds, 0, n, sample, seed, t, None)
        assert nnd.merge(lists, proposals, columns) == reference_merge(reference, proposals, columns)
        np.testing.assert_array_equal(lists.idx, reference.idx)
        np.testing.assert_array_equal(lists.sq, reference.sq)
        np.testing.assert_array_equal(lists.new, reference.new)


def test_merge_breaks_exact_distance_ties_by_id_like_the_reference():
    """Points of an integer grid, some repeated: many candidates at exactly the k-th distance (and
    rows whose d_max is 0), so the exact (distance, id) order of the tied ones decides."""
    side = np.arange(16, dtype=np.float64)
    grid = np.stack(np.meshgrid(side, side), axis=-1).reshape(-1, 2)
    points = np.concatenate([grid, grid[:40]])
    run_both(np.ascontiguousarray(points.T), k=6, sample=3, seed=1, iterations=6)


@pytest.mark.parametrize(("n", "fill"), [(600, False), (512, True)])
def test_merge_is_exact_at_any_quantisation(monkeypatch, n, fill):
    """Two-bit quantised distances: nearly every row's k-th level is crowded (often the top level),
    and its candidates are ordered exactly; the lists are still the reference's. With `fill`, the id
    field is widened so that the packed keys use all 63 bits (512 rows: the last row's keys reach
    just under 2^63)."""

    def layout(m: int, n: int) -> Candidates:
        rows = max(1, (m - 1).bit_length())
        return Candidates(62 - rows - 2 if fill else max(1, (n - 1).bit_length()), 2)

    monkeypatch.setattr(Candidates, "layout", staticmethod(layout))
    run_both(seeded_columns(n, 4, 3), k=8, sample=4, seed=3, iterations=5)
