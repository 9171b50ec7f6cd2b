"""NN-Descent (Dong, Moses & Li 2011) cut into the pieces an owner of a block of points runs.

NN-Descent builds an approximate k-nearest-neighbour graph on the idea that a neighbour of a
neighbour is likely a neighbour. Every point keeps a list of k candidates, sorted by distance; in
an iteration every point v looks at pairs of points in its *neighbourhood* (its list and the points
whose list holds v, "reverse neighbours") and proposes each to the other. A proposal (x, y, d) is
accepted when it beats the last entry of x's list, d_max(x). Only pairs with at least one *new*
member (one that entered its list since the last time it was used) are tried, and per point at most
`sample` new forward and `sample` new reverse neighbours take part (the sample rate ρ·k).

The functions here work on one *block* of points [lo, hi), the unit a Litz executor owns:

- `initial_lists`: random distinct neighbours for the block, sorted;
- `take_sample`: which entries of the block's lists take part in the next join (new and sampled,
  old, or waiting), which the owner publishes for everyone;
- `local_join`: from the published graph, the proposals the block's neighbourhoods produce, with
  the owner of each proposal's target (and optionally the d_max broadcast to drop hopeless ones);
- `merge`: the owner's side, the new lists from the old ones and every proposal it received.

**Determinism.** Every random choice comes from keys drawn for *all* points from a generator seeded
by (seed, purpose, iteration), so a block's choices do not depend on how the points are cut into
blocks; `merge` is a function of the *set* of proposals (ties are broken by neighbour index).
Together with synchronous iterations (every join reads the graph every merge of the previous
iteration published) the graph after t iterations is a function of the data, the seed and t only:
not of the number of executors, nor of where they ran. `nn_descent` runs the same steps on one block
holding every point, the plain single-process reference.

Distances are squared Euclidean (`sq_distances`, summed one dimension at a time in a fixed order,
so that a distance is bit-for-bit the same whoever computes it); cosine distance is half the squared
Euclidean distance of unit vectors, so the caller normalises the points for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Published kind of a list entry: not used in the coming join (new, not sampled), new and sampled,
#: or old (already used once: it pairs only with new entries).
WAITING, SAMPLED, OLD = 0, 1, 2
#: Random-key purposes, so that one iteration's draws do not repeat another's.
_INIT, _FORWARD, _REVERSE = 0, 1, 2
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
        return Proposals(
            np.concatenate([p.x for p in parts]),
            np.concatenate([p.y for p in parts]),
            np.concatenate([p.d for p in parts]),
        )

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes + self.d.nbytes)


def block_bounds(n: int, blocks: int) -> np.ndarray:
    """Start of each of `blocks` contiguous, near-equal blocks of n points, then n."""
    return (np.arange(blocks + 1, dtype=np.int64) * n) // blocks


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


def _sort_rows(idx: np.ndarray, sq: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rows sorted by (distance, id); `more` arrays follow the same permutation."""
    order = np.lexsort((idx, sq), axis=-1)
    return tuple(np.take_along_axis(arr, order, axis=1) for arr in (idx, sq, *more))


def initial_lists(columns: np.ndarray, lo: int, hi: int, k: int, seed: int) -> BlockLists:
    """k distinct random neighbours (never the point itself) of each point of [lo, hi), sorted."""
    n = columns.shape[1]
    draws = np.random.default_rng([seed, _INIT]).integers(0, n - 1, size=(n, 2 * k))[lo:hi]
    own = np.arange(lo, hi)[:, None]
    draws += draws >= own  # skip the point itself: ids 0..n-2 map to every id but `own`
    order = np.argsort(draws, axis=1, kind="stable")
    by_id = np.take_along_axis(draws, order, axis=1)
    repeat = np.zeros_like(draws, dtype=bool)
    repeat_sorted = np.zeros_like(repeat)
    repeat_sorted[:, 1:] = by_id[:, 1:] == by_id[:, :-1]  # a later draw of the same id
    np.put_along_axis(repeat, order, repeat_sorted, axis=1)
    rank = np.argsort(repeat, axis=1, kind="stable")[:, :k]  # first k distinct ids, in draw order
    idx = np.take_along_axis(draws, rank, axis=1)
    short = np.flatnonzero(np.take_along_axis(repeat, rank, axis=1).any(axis=1))
    for row in short:  # fewer than k distinct draws (rare, small n): a seeded permutation instead
        point = lo + int(row)
        others = np.random.default_rng([seed, _INIT, point]).permutation(n - 1)[:k]
        idx[row] = others + (others >= point)
    rows = np.repeat(np.arange(lo, hi), k)
    sq = sq_distances(columns, rows, idx.ravel()).reshape(idx.shape)
    idx, sq = _sort_rows(idx, sq)
    return BlockLists(lo, idx, sq, np.ones(idx.shape, dtype=bool))


def _keys(n: int, k: int, seed: int, purpose: int, iteration: int) -> np.ndarray:
    """Random keys of all n × k list entries for one purpose and iteration (same in every block)."""
    return np.random.default_rng([seed, purpose, iteration]).random((n, k))


def _ranks(n: int, k: int, seed: int, purpose: int, iteration: int) -> tuple[np.ndarray, np.ndarray]:
    """A random order of all n × k list entries (entry u·k + j has rank order[u·k + j]) and its
    inverse (the entry of each rank); the same in every block."""
    order = np.random.default_rng([seed, purpose, iteration]).permutation(n * k)
    entry = np.empty_like(order)
    entry[order] = np.arange(n * k)
    return order, entry


def take_sample(lists: BlockLists, sample: int, seed: int, iteration: int, n: int) -> np.ndarray:
    """The published kinds of the block's entries for `iteration`'s join: up to `sample` new entries
    per point (those with the smallest random keys) are SAMPLED and stop being new; the other new
    ones wait; the rest are OLD. Mutates `lists.new`."""
    m, k = lists.idx.shape
    keys = _keys(n, k, seed, _FORWARD, iteration)[lists.lo : lists.lo + m]
    keyed = np.where(lists.new, keys, np.inf)
    if sample < k:
        threshold = np.partition(keyed, sample - 1, axis=1)[:, sample - 1 : sample]
        sampled = lists.new & (keyed <= threshold)
    else:
        sampled = lists.new.copy()
    kinds = np.where(sampled, SAMPLED, np.where(lists.new, WAITING, OLD)).astype(np.int64)
    lists.new &= ~sampled
    return kinds


def _first_by_rank(owner: np.ndarray, rank: np.ndarray, ranks: int, limit: int) -> tuple[
        np.ndarray, np.ndarray]:
    """(owner, rank) of the `limit` entries of smallest rank per owner. Ranks are distinct (a random
    permutation of `ranks` numbers), so one plain sort of packed (owner, rank) integers orders them,
    with no tie whose order could depend on the block."""
    packed = np.sort(owner.astype(np.int64) * ranks + rank)
    owner = packed // ranks
    keep = _rank_in_groups(owner) < limit
    return owner[keep], packed[keep] % ranks


def _unique_pairs(owner: np.ndarray, value: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (owner, value) pairs (value < n), sorted: one sort of packed integers."""
    packed = _sorted_unique(owner.astype(np.int64) * n + value)
    return packed // n, packed % n


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted (a sort and a mask: numpy's hash-based `unique` is slower here)."""
    ordered = np.sort(values)
    if ordered.size == 0:
        return ordered
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]]


def _rank_in_groups(sorted_groups: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal values (input sorted)."""
    if sorted_groups.size == 0:
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    lengths = np.diff(np.r_[starts, sorted_groups.size])
    return np.arange(sorted_groups.size) - np.repeat(starts, lengths)


def _pairs_within(owner: np.ndarray, value: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (value[i], value[j]), i < j, of entries with the same owner (input sorted by owner)."""
    counts = np.bincount(owner, minlength=m)
    rank = _rank_in_groups(owner)
    reps = counts[owner] - rank - 1  # partners after entry i in its group
    first = np.repeat(np.arange(owner.size), reps)
    offset = np.arange(first.size) - np.repeat(np.cumsum(reps) - reps, reps)
    return value[first], value[first + 1 + offset]


def _pairs_across(owner_a: np.ndarray, value_a: np.ndarray, owner_b: np.ndarray, value_b: np.ndarray,
                  m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair (a, b) of an entry of the first list and one of the second with the same owner
    (both sorted by owner)."""
    counts_b = np.bincount(owner_b, minlength=m)
    starts_b = np.cumsum(counts_b) - counts_b
    reps = counts_b[owner_a]
    first = np.repeat(np.arange(owner_a.size), reps)
    offset = np.arange(first.size) - np.repeat(np.cumsum(reps) - reps, reps)
    return value_a[first], value_b[np.repeat(starts_b[owner_a], reps) + offset]


def local_join(
    columns: np.ndarray,
    graph: np.ndarray,
    kinds: np.ndarray,
    lo: int,
    hi: int,
    sample: int,
    seed: int,
    iteration: int,
    dmax: np.ndarray | None = None,
) -> tuple[Proposals, int]:
    """The proposals of the neighbourhoods of the points [lo, hi) in `iteration`, and how many pairs
    were tried (distances computed).

    `graph` and `kinds` are the published (n, k) lists and kinds of *all* points. A point's
    neighbourhood is its SAMPLED and OLD forward entries plus up to `sample` points u whose SAMPLED
    (OLD) entry is v, chosen by random key. Pairs: new × new (each once) and new × old. With
    `dmax` (the d_max broadcast: the squared distance of every point's last neighbour, as its owner
    has it) a proposal (x, y, d) with d above d_max(x) is dropped here instead of at x's owner, by
    the owner's own rule, so the lists that result are the same with and without it.
    """
    n, k = graph.shape
    m = hi - lo
    fwd = kinds[lo:hi]
    nbr = graph[lo:hi]
    into_block = (graph >= lo) & (graph < hi) & (kinds != WAITING)
    src, col = np.nonzero(into_block)
    target = graph[src, col] - lo
    rev_kind = kinds[src, col]
    rank_of, entry_of = _ranks(n, k, seed, _REVERSE, iteration)
    rev_rank = rank_of[src * k + col]
    new_owner: list[np.ndarray] = []
    new_value: list[np.ndarray] = []
    old_owner: list[np.ndarray] = []
    old_value: list[np.ndarray] = []
    for kind, owners, values in ((SAMPLED, new_owner, new_value), (OLD, old_owner, old_value)):
        r, c = np.nonzero(fwd == kind)
        owners.append(r)
        values.append(nbr[r, c])
        pick = rev_kind == kind
        o, rank = _first_by_rank(target[pick], rev_rank[pick], n * k, sample)
        owners.append(o)
        values.append(entry_of[rank] // k)  # the reverse neighbour: the entry's list owner
    new_o, new_v = _unique_pairs(np.concatenate(new_owner), np.concatenate(new_value), n)
    old_o, old_v = _unique_pairs(np.concatenate(old_owner), np.concatenate(old_value), n)
    within_a, within_b = _pairs_within(new_o, new_v, m)
    across_a, across_b = _pairs_across(new_o, new_v, old_o, old_v, m)
    a = np.concatenate([within_a, across_a])
    b = np.concatenate([within_b, across_b])
    differ = a != b  # a point both new and old in a neighbourhood (forward one way, reverse the other)
    a, b = a[differ], b[differ]
    d = sq_distances(columns, a, b)
    if dmax is None:
        return Proposals(np.concatenate([a, b]), np.concatenate([b, a]), np.concatenate([d, d])), int(a.size)
    to_a = d <= dmax[a]
    to_b = d <= dmax[b]
    proposals = Proposals(np.concatenate([a[to_a], b[to_b]]), np.concatenate([b[to_a], a[to_b]]),
                          np.concatenate([d[to_a], d[to_b]]))
    return proposals, int(a.size)


def split_by_owner(proposals: Proposals, bounds: np.ndarray) -> dict[int, Proposals]:
    """The proposals for each block (its owner), by target id; blocks with none are left out."""
    if bounds.size == 2:  # one block owns every point
        return {0: proposals} if len(proposals) else {}
    owner = np.searchsorted(bounds, proposals.x, side="right") - 1
    if bounds.size <= 1 << 15:
        owner = owner.astype(np.int16)  # numpy sorts 16-bit integers stably by radix sort: O(size)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=bounds.size - 1)
    ends = np.cumsum(counts)
    out: dict[int, Proposals] = {}
    for block in np.flatnonzero(counts):
        sel = order[ends[block] - counts[block] : ends[block]]
        out[int(block)] = Proposals(proposals.x[sel], proposals.y[sel], proposals.d[sel])
    return out


def merge(lists: BlockLists, proposals: Proposals, columns: np.ndarray) -> int:
    """Apply every proposal for the block: each list becomes the k best of its entries and the
    proposals it got, by distance, without repeats; entries that come in are new. A proposal is
    accepted only if it is not farther than d_max(x) (the owner's rule). Returns the number of
    entries that changed. The result depends only on the *set* of proposals, not on their order.

    Sorting tens of millions of proposals by (target, distance, id) with a lexsort costs seconds, so
    the selection uses only sorts of packed integers: repeats go by one sort of (target, id)
    (distances are recomputed for the proposals left: the same bits as the proposer's), then the k-th
    smallest distance of each list is found on distances quantised relative to its d_max (2^-40),
    and only the entries tied with it at that resolution are ordered exactly, by (distance, id).
    """
    m, k = lists.idx.shape
    n = columns.shape[1]
    xl = proposals.x - lists.lo
    accept = proposals.d <= lists.sq[xl, -1]
    if not accept.any():
        return 0
    rows = np.repeat(np.arange(m, dtype=np.int64), k)
    current = rows * n + lists.idx.ravel()
    entries = _sorted_unique(np.concatenate([current, xl[accept] * n + proposals.y[accept]]))
    owner, ident = entries // n, entries % n
    order = np.argsort(current)
    at = np.minimum(np.searchsorted(current[order], entries), current.size - 1)
    was_there = current[order][at] == entries
    was_new = lists.new.ravel()[order][at] & was_there
    dist = lists.sq.ravel()[order][at]
    came = np.flatnonzero(~was_there)
    dist[came] = sq_distances(columns, owner[came] + lists.lo, ident[came])
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
    chosen[tie_order[_rank_in_groups(owner[tie_order]) < room[owner[tie_order]]]] = True
    new_idx = ident[chosen].reshape(m, k)  # `entries` is sorted by owner: k chosen per row, in order
    new_sq = dist[chosen].reshape(m, k)
    came_in = ~was_there[chosen].reshape(m, k)
    stayed_new = was_new[chosen].reshape(m, k)
    lists.idx, lists.sq, came_in, stayed_new = _sort_rows(new_idx, new_sq, came_in, stayed_new)
    lists.new = came_in | stayed_new
    return int(came_in.sum())


def nn_descent(points: np.ndarray, k: int, sample: int, seed: int, max_iterations: int,
               delta: float) -> tuple[BlockLists, list[int]]:
    """The whole algorithm in one process (one block of every point, n × dim): the lists, and the
    number of entries that changed in each iteration. Stops after an iteration changing at most
    δ·n·k entries."""
    n = points.shape[0]
    columns = np.ascontiguousarray(points.T, dtype=np.float64)
    lists = initial_lists(columns, 0, n, k, seed)
    changes: list[int] = []
    for t in range(max_iterations):
        kinds = take_sample(lists, sample, seed, t, n)
        proposals, _ = local_join(columns, lists.idx, kinds, 0, n, sample, seed, t, lists.sq[:, -1])
        changes.append(merge(lists, proposals, columns))
        if changes[-1] <= delta * n * k:
            break
    return lists, changes
