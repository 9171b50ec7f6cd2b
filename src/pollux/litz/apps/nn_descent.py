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
- `merge` (in `nn_descent_merge`): the owner's side, the new lists from the old ones and every
  proposal it received.

The records and the distance they all share are in `nn_descent_lists`.

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

import itertools

import numpy as np

from pollux.litz.apps.nn_descent_lists import BlockLists, Proposals, rank_in_groups, sort_rows, sq_distances
from pollux.litz.apps.nn_descent_merge import merge

__all__ = ["OLD", "SAMPLED", "WAITING", "BlockLists", "Proposals", "block_bounds", "initial_lists",
           "local_join", "merge", "nn_descent", "split_by_owner", "sq_distances", "take_sample"]

#: Published kind of a list entry: not used in the coming join (new, not sampled), new and sampled,
#: or old (already used once: it pairs only with new entries).
WAITING, SAMPLED, OLD = 0, 1, 2
#: Random-key purposes, so that one iteration's draws do not repeat another's.
_INIT, _FORWARD, _REVERSE = 0, 1, 2
#: Pairs (padding included) per block of neighbourhoods in the local join (`_join_pairs`).
_JOIN_BLOCK = 1 << 18
#: Padded over real distances a block of neighbourhoods of unlike sizes may compute (`_join_blocks`).
_JOIN_PADDING = 1.25


def block_bounds(n: int, blocks: int) -> np.ndarray:
    """Start of each of `blocks` contiguous, near-equal blocks of n points, then n."""
    return (np.arange(blocks + 1, dtype=np.int64) * n) // blocks


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
    idx, sq = sort_rows(idx, sq)
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
    keep = rank_in_groups(owner) < limit
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


def _slots(owner: np.ndarray, value: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries sorted by owner as a table: row u holds owner u's values, left-aligned (padded with 0),
    in their order; and the number of values of each row."""
    counts = np.bincount(owner, minlength=m)
    table = np.zeros((m, int(counts.max(initial=0))), np.int64)
    table[owner, rank_in_groups(owner)] = value
    return table, counts


def _cells(width_new: int, width_old: int) -> int:
    """Distances `_join_block` computes per neighbourhood for these widths (pairs and padding)."""
    return width_new * (width_new // 2 + width_old)


def _join_blocks(new_count: np.ndarray, old_count: np.ndarray) -> list[tuple[int, int]]:
    """Blocks (start, stop) of neighbourhoods sorted by (new, old) member counts. Runs of equal
    counts are merged while padding every neighbourhood to the run's widest costs at most
    `_JOIN_PADDING` times the real work (a Python loop over at most (2·sample + 1) × (k + sample + 1)
    runs: a block has a fixed cost of some 50 numpy calls, so tiny runs are better merged); then
    each merged run is cut into blocks of about `_JOIN_BLOCK` distances."""
    edges = np.flatnonzero((new_count[1:] != new_count[:-1]) | (old_count[1:] != old_count[:-1])) + 1
    edges = np.r_[0, edges, new_count.size].tolist()
    runs: list[tuple[int, int, int, int]] = []  # start, stop, widths
    real = 0
    for start, stop in itertools.pairwise(edges):
        news, olds = int(new_count[start]), int(old_count[start])
        work = _cells(news, olds) * (stop - start)
        if runs:
            first, _, width_new, width_old = runs[-1]
            wider = (max(width_new, news), max(width_old, olds))
            if _cells(*wider) * (stop - first) <= _JOIN_PADDING * (real + work):
                runs[-1] = (first, stop, *wider)
                real += work
                continue
        runs.append((start, stop, news, olds))
        real = work
    blocks: list[tuple[int, int]] = []
    for start, stop, width_new, width_old in runs:
        step = max(1, _JOIN_BLOCK // _cells(width_new, width_old))
        blocks.extend((lo, min(lo + step, stop)) for lo in range(start, stop, step))
    return blocks


def _join_pairs(columns: np.ndarray, new_o: np.ndarray, new_v: np.ndarray, old_o: np.ndarray,
                old_v: np.ndarray, m: int, dmax: np.ndarray | None) -> tuple[Proposals, int]:
    """The proposals of the pairs new × new (each once) and new × old of every neighbourhood, and
    how many pairs there were (pairs of a point with itself left out).

    Gathering both ends' coordinates for every pair is what costs (a random read per pair and
    dimension); here each neighbourhood's members are gathered once into a small dense table, and
    all its pairs' distances come from broadcasting a row of new members against the row of all
    members. Neighbourhoods of like sizes are taken together in blocks of about `_JOIN_BLOCK` pairs
    (sorted by size, so that padding a block to its widest neighbourhood costs little:
    `_join_blocks`). A distance is summed one dimension at a time, in order, as
    `sq_distances` sums it: the same bits. The proposals come out grouped by block, not in pair
    order; `merge` depends only on their set."""
    new_ids, new_count = _slots(new_o, new_v, m)
    old_ids, old_count = _slots(old_o, old_v, m)
    order = np.lexsort((old_count, new_count))
    order = order[new_count[order] > 0]
    if order.size == 0:
        return Proposals.empty(), 0
    parts: list[Proposals] = []
    tried = 0
    for start, stop in _join_blocks(new_count[order], old_count[order]):
        rows = order[start:stop]
        found, pairs = _join_block(columns, new_ids[rows], new_count[rows], old_ids[rows], old_count[rows],
                                   dmax)
        parts.extend(found)
        tried += pairs
    return Proposals.concat(parts), tried


def _partner_slots(width_new: int, width_old: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of a neighbourhood's slots as a table (partner set × new slot i): first the
    new × new pairs, i with new slot (i + h) mod width_new for the shifts h = 1 … width_new // 2
    (every unordered pair exactly once: for an even width the last shift meets each pair twice,
    so only its first half counts), then i with old slot j. Returns the partner slot of each cell
    and whether the cell is a pair of its own (not such a second meeting)."""
    half = width_new // 2
    slot = np.arange(width_new)
    shifted = (slot[None, :] + np.arange(1, half + 1)[:, None]) % width_new
    old = np.broadcast_to(width_new + np.arange(width_old)[:, None], (width_old, width_new))
    own = np.ones((half + width_old, width_new), dtype=bool)
    if width_new % 2 == 0 and half > 0:
        own[half - 1, half:] = False
    return np.concatenate([shifted, old]), own


def _join_block(columns: np.ndarray, new_ids: np.ndarray, new_count: np.ndarray, old_ids: np.ndarray,
                old_count: np.ndarray, dmax: np.ndarray | None) -> tuple[list[Proposals], int]:
    """One block of `_join_pairs`: neighbourhoods with their new and old members as slot tables
    (a row each). The pairs of a neighbourhood are those of `_partner_slots`; both directions are
    proposed where the distance is within the target's d_max. The tables are transposed (slot ×
    neighbourhood) so that numpy's inner loops run along the block's many neighbourhoods, not along a
    handful of slots; the new × new partners are a strided view of the new slots repeated twice, no
    copy."""
    width_new = int(new_count.max())
    width_old = int(old_count.max(initial=0))
    half = width_new // 2
    members = np.concatenate([new_ids[:, :width_new], old_ids[:, :width_old]], axis=1).T.copy()
    partner, own = _partner_slots(width_new, width_old)
    sq = np.zeros((half + width_old, width_new, members.shape[1]))
    diff = np.empty_like(sq)
    coords = np.empty(members.shape)
    twice = np.empty((2 * width_new, members.shape[1]))
    news = coords[:width_new]
    window = np.lib.stride_tricks.sliding_window_view(twice[1:], width_new, axis=0)[:half].transpose(0, 2, 1)
    for column in columns:
        np.take(column, members, out=coords)
        twice[:width_new] = news
        twice[width_new:] = news
        np.subtract(news[None], window, out=diff[:half])
        np.subtract(news[None], coords[width_new:, None, :], out=diff[half:])
        np.multiply(diff, diff, out=diff)
        np.add(sq, diff, out=sq)
    is_member = np.concatenate([np.arange(width_new)[:, None] < new_count[None, :],
                                np.arange(width_old)[:, None] < old_count[None, :]])
    first = np.broadcast_to(members[None, :width_new, :], sq.shape).ravel()  # a copy: contiguous
    second = members[partner]
    pair = (first.reshape(sq.shape) != second) & is_member[None, :width_new, :] & is_member[partner]
    pair &= own[:, :, None]
    if dmax is None:
        to_first = to_second = pair
    else:
        reach = dmax[members]
        to_first = pair & (sq <= reach[None, :width_new, :])
        to_second = pair & (sq <= reach[partner])
    # positions, then `take`: several times faster than indexing with a multi-dimensional mask
    at_first = np.flatnonzero(to_first)
    at_second = at_first if dmax is None else np.flatnonzero(to_second)
    second = second.ravel()
    dist = sq.ravel()
    proposals = [Proposals(first.take(at_first), second.take(at_first), dist.take(at_first)),
                 Proposals(second.take(at_second), first.take(at_second), dist.take(at_second))]
    return proposals, int(np.count_nonzero(pair))


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
    fwd = kinds[lo:hi].ravel()
    nbr = graph[lo:hi].ravel()
    into_block = np.flatnonzero((graph >= lo) & (graph < hi) & (kinds != WAITING))  # flat entry ids
    target = graph.ravel().take(into_block) - lo
    rev_kind = kinds.ravel().take(into_block)
    rank_of, entry_of = _ranks(n, k, seed, _REVERSE, iteration)
    rev_rank = rank_of.take(into_block)
    new_owner: list[np.ndarray] = []
    new_value: list[np.ndarray] = []
    old_owner: list[np.ndarray] = []
    old_value: list[np.ndarray] = []
    for kind, owners, values in ((SAMPLED, new_owner, new_value), (OLD, old_owner, old_value)):
        entries = np.flatnonzero(fwd == kind)
        owners.append(entries // k)
        values.append(nbr.take(entries))
        pick = rev_kind == kind
        o, rank = _first_by_rank(target.compress(pick), rev_rank.compress(pick), n * k, sample)
        owners.append(o)
        values.append(entry_of[rank] // k)  # the reverse neighbour: the entry's list owner
    new_o, new_v = _unique_pairs(np.concatenate(new_owner), np.concatenate(new_value), n)
    old_o, old_v = _unique_pairs(np.concatenate(old_owner), np.concatenate(old_value), n)
    return _join_pairs(columns, new_o, new_v, old_o, old_v, m, dmax)


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
