"""Links between clusters that a kNN graph lacks, found by walking the graph outward from each leaf
cluster: one Borůvka-like step on the hierarchy that the kNN graph's spanning tree gives.

Why: exact HDBSCAN's spanning tree holds *long* edges, of weight d(x, y) above both core distances,
that join two dense regions directly. A kNN graph has none of them (y is beyond x's k neighbours and
x beyond y's), so its tree joins the two regions later, through a chain of sparse (noise) points of
large core distance. The hierarchy then holds the regions apart for too long, and excess-of-mass
selection picks other clusters than exact HDBSCAN's (measured, 20,000 points in dimension 5: with
the *exact* 10-NN graph FM 0.88 against scikit-learn's labels; with every missing edge of the exact
tree added, 0.995).

What it does: for each leaf of the condensed tree (a cluster with no child clusters), the points
within `hops` steps of the cluster along the undirected kNN graph, outside it, are its candidates;
the lightest mutual-reachability edge max(d(x, y), core(x), core(y)) from a member x to a candidate y
is the leaf's link. A link is what Borůvka's algorithm would add for that component, restricted to
the neighbourhood the graph reaches: no index over the points (a k-d tree is slower than exact
HDBSCAN's own search from dimension ~10 on), only the graph and the metric, so it works for any
metric the kNN graph was built in. Measured on the same 20,000 points (the exact 10-NN graph, one
step, 2 hops): FM 0.88 → 0.93 in 0.2 s; dimension 10: 0.93 → 0.98.

Only a leaf's boundary (members with a neighbour outside) is paired with its candidates, in blocks
of at most `PAIR_BLOCK` pairs so that a large leaf cannot allocate without bound. Pairing every
member instead was measured too: FM 0.96 instead of 0.93 in dimension 5 above, the same cost with a
matrix-product `block_distance` (1.4 s at 2^17 points in ten large clusters) but 3-4x the cost with
the pair-by-pair default (2.6 s against 0.7-0.9 s at 2^15 points); over the ten dimensions of
`benchmarks/litz_hdbscan.py` both pass FM 0.90, and the boundary version had the cluster counts
within 2 % of exact in one dimension more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

#: Most (member, candidate) pairs whose distances are computed at once.
PAIR_BLOCK = 1 << 20

#: Distances between points a[i] and b[i] (pairs).
MetricDistance = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: The matrix of distances between points a[i] and b[j].
BlockDistance = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Links:
    """Edges (u, v, mutual-reachability weight) to add to the kNN graph, one per leaf cluster at most."""

    u: np.ndarray
    v: np.ndarray
    weight: np.ndarray

    @property
    def size(self) -> int:
        return int(self.u.size)


def undirected_graph(idx: np.ndarray) -> csr_matrix:
    """The kNN graph as a symmetric boolean adjacency matrix (x ~ y if either lists the other)."""
    n, k = idx.shape
    rows = np.repeat(np.arange(n), k)
    graph = csr_matrix((np.ones(rows.size, dtype=bool), (rows, idx.ravel())), shape=(n, n))
    return (graph + graph.T).tocsr()


def leaf_members(point_cluster: np.ndarray, parent: np.ndarray) -> list[np.ndarray]:
    """The points of each leaf cluster (no child clusters; never the root), in cluster order, each
    sorted by point index."""
    count = parent.size
    has_child = np.bincount(parent[1:], minlength=count) > 0
    order = np.argsort(point_cluster, kind="stable")
    bounds = np.searchsorted(point_cluster[order], np.arange(count + 1))
    return [order[bounds[c]:bounds[c + 1]] for c in range(1, count) if not has_child[c]]


def neighbourhood(graph: csr_matrix, member_rows: csr_matrix, inside: np.ndarray, hops: int) -> np.ndarray:
    """Points within `hops` steps of the members along `graph` that are not members (`member_rows`:
    the members' rows of `graph`; `inside` marks the members), sorted by index within each step,
    nearer steps first."""
    seen = inside.copy()
    found: list[np.ndarray] = []
    rows = member_rows
    for _ in range(hops):
        reached = np.unique(rows.indices)
        reached = reached[~seen[reached]]
        if reached.size == 0:
            break
        seen[reached] = True
        found.append(reached)
        rows = graph[reached]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def boundary(members: np.ndarray, member_rows: csr_matrix, inside: np.ndarray) -> np.ndarray:
    """The members with a neighbour outside (`member_rows`: their rows of the graph; `inside` marks
    the members), in member order: where the search for a cluster's lightest edge to its
    surroundings starts (module doc)."""
    rows = member_rows
    outside = np.zeros(rows.nnz + 1, dtype=np.int64)
    np.cumsum(~inside[rows.indices], out=outside[1:])
    return members[outside[rows.indptr[1:]] > outside[rows.indptr[:-1]]]


def pairwise_blocks(metric_distance: MetricDistance) -> BlockDistance:
    """A block distance from a pairwise one (each pair on its own: slower than a matrix product,
    exact in any metric)."""
    def block(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        pairs = metric_distance(np.repeat(a, b.size), np.tile(b, a.size))
        return np.asarray(pairs, dtype=np.float64).reshape(a.size, b.size)
    return block


def lightest_edge(members: np.ndarray, candidates: np.ndarray, core: np.ndarray,
                  block_distance: BlockDistance) -> tuple[int, int]:
    """(x, y) of the lightest mutual-reachability edge from a member to a candidate; ties go to the
    first pair in (member, candidate) order."""
    best = (-1, -1, np.inf)
    rows_per_block = max(PAIR_BLOCK // max(candidates.size, 1), 1)
    core_b = core[candidates][None, :]
    for start in range(0, members.size, rows_per_block):
        block = members[start:start + rows_per_block]
        weight = np.maximum(block_distance(block, candidates), np.maximum(core[block][:, None], core_b))
        i, j = np.unravel_index(int(np.argmin(weight)), weight.shape)
        if weight[i, j] < best[2]:
            best = (int(block[i]), int(candidates[j]), float(weight[i, j]))
    return best[0], best[1]


def cluster_links(point_cluster: np.ndarray, parent: np.ndarray, idx: np.ndarray, core: np.ndarray,
                  metric_distance: MetricDistance, hops: int,
                  block_distance: BlockDistance | None = None) -> Links:
    """Each leaf cluster's link (module doc); none where its neighbourhood is empty.

    `block_distance(a, b)` is the matrix of distances between points a[i] and b[j] (default: from
    `metric_distance`, pair by pair); it only chooses the links, whose weights come from
    `metric_distance`, so a faster matrix with other rounding changes no weight."""
    blocks = block_distance if block_distance is not None else pairwise_blocks(metric_distance)
    graph = undirected_graph(idx)
    inside = np.zeros(idx.shape[0], dtype=bool)
    u: list[int] = []
    v: list[int] = []
    for members in leaf_members(point_cluster, parent):
        inside[members] = True
        member_rows = graph[members]
        candidates = neighbourhood(graph, member_rows, inside, hops)
        edge = boundary(members, member_rows, inside)
        inside[members] = False
        if candidates.size == 0:
            continue
        x, y = lightest_edge(edge, candidates, core, blocks)
        u.append(x)
        v.append(y)
    ends_u = np.asarray(u, dtype=np.int64)
    ends_v = np.asarray(v, dtype=np.int64)
    weight = np.maximum(np.asarray(metric_distance(ends_u, ends_v), dtype=np.float64),
                        np.maximum(core[ends_u], core[ends_v]))
    return Links(ends_u, ends_v, weight)
