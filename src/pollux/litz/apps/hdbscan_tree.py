"""HDBSCAN from a k-nearest-neighbour graph: core distances, the minimum spanning tree of mutual
reachability on the graph's edges, the cluster hierarchy, excess-of-mass selection and labels.

Exact HDBSCAN (Campello, Moulavi & Sander 2013; scikit-learn's `HDBSCAN`) builds the minimum
spanning tree of the *complete* graph under the mutual-reachability distance
max(core(x), core(y), d(x, y)), where core(x) is the distance to x's `min_samples`-th nearest point
counting x itself. Thesis §4.7 keeps only the edges of the (approximate) kNN graph: the MST edges
that matter, those inside clusters, join near neighbours. What follows from the tree is exact:

1. `spanning_tree`: the MST of the kNN edges (scipy's `minimum_spanning_tree`, Kruskal-like, on one
   machine). A kNN graph may fall apart into components (well separated clusters, isolated noise);
   they are joined by the MST of the complete mutual-reachability graph of one representative per
   component (its point of smallest core distance), at most `MAX_JOIN_COMPONENTS` of them; beyond
   that, components are chained at a distance above every edge (they split at the root).
   The kNN graph lacks exact HDBSCAN's long edges between dense regions; by default
   (`link_hops`) each leaf cluster of a first hierarchy gets its lightest edge to the points the
   graph reaches around it (`hdbscan_links`), and the tree is built again with those links.
2. `single_linkage`: Kruskal's merges in order of weight (union-find): the dendrogram.
3. `condense`: top-down, with λ = 1 / distance. A split where both sides have at least
   `min_cluster_size` points starts two clusters; a side smaller than that leaves its cluster as
   points falling out at that λ.
4. `select_eom`: stability of a cluster = Σ over what leaves it (points, child clusters by size) of
   (λ_leave − λ_birth); bottom-up, a cluster is kept if its stability is at least its children's
   best total (excess of mass); the root is never a cluster (scikit-learn's default).
5. Labels: a point belongs to the selected cluster above the cluster it fell out of, else noise (-1).

The loops over the n − 1 merges are plain Python (about a microsecond each, well below the
NN-Descent before them); everything per point is numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

from pollux.litz.apps.hdbscan_links import BlockDistance, Links, cluster_links

#: Most graph components joined by exact mutual-reachability distances (their representatives'
#: complete graph has this many squared entries).
MAX_JOIN_COMPONENTS = 4096
#: Steps along the kNN graph that a leaf cluster's search for its link reaches (0: no links).
DEFAULT_LINK_HOPS = 2
#: Stands in for weight 0 in scipy's sparse graphs, where an explicit 0 would not be an edge.
_TINY = np.finfo(float).tiny


@dataclass(frozen=True)
class SpanningTree:
    """The n − 1 edges (u, v, weight) of the tree, and how many components the kNN graph had."""

    u: np.ndarray
    v: np.ndarray
    weight: np.ndarray
    components: int


@dataclass(frozen=True)
class Clustering:
    """Labels (-1 noise, clusters 0..K-1) and what they came from."""

    labels: np.ndarray
    num_clusters: int
    stability: np.ndarray  # of each selected cluster, in label order
    components: int
    links: int = 0  # edges added between clusters (hdbscan_links)

    @property
    def noise_fraction(self) -> float:
        return float(np.mean(self.labels < 0)) if self.labels.size else 0.0


def core_distances(dist: np.ndarray, min_samples: int) -> np.ndarray:
    """Distance to the `min_samples`-th nearest point counting the point itself (scikit-learn's
    definition): column `min_samples - 2` of the sorted neighbour distances (0 for min_samples 1)."""
    if min_samples <= 1:
        return np.zeros(dist.shape[0])
    return dist[:, min_samples - 2].copy()


def spanning_tree(idx: np.ndarray, dist: np.ndarray, core: np.ndarray, points: np.ndarray,
                  metric_distance: object, links: Links | None = None) -> SpanningTree:
    """MST of the mutual-reachability weights on the kNN edges and `links`, components joined
    (module doc).

    `metric_distance(a, b)` gives the distances between rows a[i] and b[i] of `points` (for the
    component representatives)."""
    n, k = idx.shape
    rows = np.repeat(np.arange(n), k)
    cols = idx.ravel()
    weight = np.maximum(dist.ravel(), np.maximum(core[rows], core[cols]))
    if links is not None and links.size:
        # A sparse matrix *adds* repeated entries: a link already in x's list (same weight) is left
        # out. Leaves are disjoint, so no two links share (x, y); (y, x) is another entry.
        new = ~(idx[links.u] == links.v[:, None]).any(axis=1)
        rows = np.r_[rows, links.u[new]]
        cols = np.r_[cols, links.v[new]]
        weight = np.r_[weight, links.weight[new]]
    graph = coo_matrix((np.where(weight > 0, weight, _TINY), (rows, cols)), shape=(n, n)).tocsr()
    forest = minimum_spanning_tree(graph).tocoo()
    u, v, w = forest.row.astype(np.int64), forest.col.astype(np.int64), forest.data
    count, comp = connected_components(graph, directed=False)
    if count > 1:
        ju, jv, jw = _join_components(comp, count, core, points, metric_distance, w)
        u, v, w = np.r_[u, ju], np.r_[v, jv], np.r_[w, jw]
    w = np.where(w <= _TINY, 0.0, w)
    return SpanningTree(u, v, w, int(count))


def _join_components(
    comp: np.ndarray, count: int, core: np.ndarray, points: np.ndarray, metric_distance: object,
    weights: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """count − 1 edges joining the components: the MST of their representatives' complete
    mutual-reachability graph, or (too many components) a chain above every other weight."""
    order = np.lexsort((np.arange(core.size), core, comp))
    first = np.r_[True, comp[order][1:] != comp[order][:-1]]
    reps = order[first]  # per component, its point of smallest core distance (then lowest id)
    if count > MAX_JOIN_COMPONENTS:
        top = 2.0 * max(float(weights.max(initial=0.0)), float(core.max(initial=0.0)), 1.0)
        return reps[:-1], reps[1:], np.full(count - 1, top)
    a, b = np.triu_indices(count, k=1)
    d = metric_distance(reps[a], reps[b])  # type: ignore[operator]
    mr = np.maximum(d, np.maximum(core[reps[a]], core[reps[b]]))
    dense = np.zeros((count, count))
    dense[a, b] = np.where(mr > 0, mr, _TINY)
    tree = minimum_spanning_tree(dense).tocoo()
    return reps[tree.row], reps[tree.col], tree.data


@dataclass(frozen=True)
class Dendrogram:
    """Merge i joins nodes left[i] and right[i] (points are 0..n-1, merge i is node n + i) at
    distance dist[i]; size[node] counts its points."""

    left: np.ndarray
    right: np.ndarray
    dist: np.ndarray
    size: np.ndarray


def single_linkage(tree: SpanningTree, n: int) -> Dendrogram:
    """Kruskal's merges of the tree's edges in order of weight (ties by edge order), by union-find."""
    order = np.argsort(tree.weight, kind="stable")
    parent = list(range(2 * n - 1))
    size = [1] * n + [0] * (n - 1)
    left = [0] * (n - 1)
    right = [0] * (n - 1)

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for i, (a, b) in enumerate(zip(tree.u[order].tolist(), tree.v[order].tolist(), strict=True)):
        ra, rb = find(a), find(b)
        node = n + i
        left[i], right[i] = ra, rb
        size[node] = size[ra] + size[rb]
        parent[ra] = parent[rb] = node
    return Dendrogram(np.array(left, dtype=np.int64), np.array(right, dtype=np.int64),
                      tree.weight[order], np.array(size, dtype=np.int64))


@dataclass(frozen=True)
class CondensedTree:
    """Clusters (0 = the root) with parent, birth λ and size; each point's cluster and λ of leaving."""

    parent: np.ndarray
    birth: np.ndarray
    size: np.ndarray
    point_cluster: np.ndarray
    point_lambda: np.ndarray


def condense(tree: Dendrogram, min_cluster_size: int) -> CondensedTree:
    """Walk the dendrogram from the root (see the module doc, step 3)."""
    n = tree.size.size // 2 + 1
    cluster = [-1] * (2 * n - 1)  # live cluster of a node; -1: its points have left (dead)
    left_at = [0.0] * (2 * n - 1)  # for a dead node: λ at which it left, and from which cluster
    left_from = [0] * (2 * n - 1)
    cluster[2 * n - 2] = 0
    parent, birth, csize = [-1], [0.0], [n]
    point_cluster = np.zeros(n, dtype=np.int64)
    point_lambda = np.zeros(n)
    sizes = tree.size.tolist()
    lefts, rights = tree.left.tolist(), tree.right.tolist()
    lambdas = [1.0 / d if d > 0 else np.inf for d in tree.dist.tolist()]
    for i in range(n - 2, -1, -1):
        node = n + i
        children = (lefts[i], rights[i])
        c = cluster[node]
        if c < 0:
            leave_at, leave_from = left_at[node], left_from[node]
        else:
            leave_at, leave_from = lambdas[i], c
            big = [sizes[ch] >= min_cluster_size for ch in children]
            if all(big):
                for ch in children:
                    cluster[ch] = len(parent)
                    parent.append(c)
                    birth.append(leave_at)
                    csize.append(sizes[ch])
                continue
        for ch in children:
            if c >= 0 and sizes[ch] >= min_cluster_size:
                cluster[ch] = c
            elif ch < n:
                point_cluster[ch] = leave_from
                point_lambda[ch] = leave_at
            else:
                left_at[ch], left_from[ch] = leave_at, leave_from
    return CondensedTree(np.array(parent, dtype=np.int64), np.array(birth), np.array(csize, dtype=np.int64),
                         point_cluster, point_lambda)


def stabilities(ct: CondensedTree) -> np.ndarray:
    """Σ (λ_leave − λ_birth) × size over what leaves each cluster (points and child clusters)."""
    count = ct.parent.size
    points = np.bincount(ct.point_cluster, weights=ct.point_lambda - ct.birth[ct.point_cluster],
                         minlength=count)
    kids = np.arange(1, count)
    grown = ct.size[kids] * (ct.birth[kids] - ct.birth[ct.parent[kids]])
    return points + np.bincount(ct.parent[kids], weights=grown, minlength=count)


def select_eom(ct: CondensedTree) -> tuple[np.ndarray, np.ndarray]:
    """Excess-of-mass selection: (selected mask over clusters, stabilities). Clusters are numbered
    parents before children, so one backward pass sums the children's best totals."""
    stab = stabilities(ct)
    count = stab.size
    selected = np.zeros(count, dtype=bool)
    best = stab.copy()
    kids_total = np.zeros(count)
    has_kids = np.zeros(count, dtype=bool)
    parents = ct.parent.tolist()
    for c in range(count - 1, 0, -1):
        if has_kids[c] and kids_total[c] > stab[c]:
            best[c] = kids_total[c]
        else:
            selected[c] = True
        kids_total[parents[c]] += best[c]
        has_kids[parents[c]] = True
    owner = np.full(count, -1, dtype=np.int64)  # the selected cluster at or above each cluster
    for c in range(1, count):
        above = owner[parents[c]]
        if above >= 0:
            selected[c] = False
            owner[c] = above
        elif selected[c]:
            owner[c] = c
    return selected, stab


def labels_from_tree(ct: CondensedTree) -> tuple[np.ndarray, np.ndarray]:
    """(labels, stability of each label's cluster)."""
    selected, stab = select_eom(ct)
    count = selected.size
    owner = np.full(count, -1, dtype=np.int64)
    parents = ct.parent.tolist()
    for c in range(1, count):
        owner[c] = c if selected[c] else owner[parents[c]]
    chosen = np.flatnonzero(selected)
    number = np.full(count, -1, dtype=np.int64)
    number[chosen] = np.arange(chosen.size)
    top = owner[ct.point_cluster]
    labels = np.where(top >= 0, number[np.maximum(top, 0)], -1)
    return labels, stab[chosen]


def cluster_knn_graph(idx: np.ndarray, dist: np.ndarray, points: np.ndarray, min_samples: int,
                      min_cluster_size: int, metric_distance: object,
                      link_hops: int = DEFAULT_LINK_HOPS, block_distance: BlockDistance | None = None,
                      ) -> Clustering:
    """HDBSCAN labels from a kNN graph (rows sorted by distance, distances in the metric).

    With `link_hops` > 0 the tree is built twice: the leaf clusters of the first hierarchy get their
    links (`hdbscan_links`; `block_distance`, a matrix of distances, only makes their search faster),
    and the labels come from the tree of the kNN edges and those links."""
    n = idx.shape[0]
    core = core_distances(dist, min_samples)
    tree = spanning_tree(idx, dist, core, points, metric_distance)
    condensed = condense(single_linkage(tree, n), min_cluster_size)
    links = None
    if link_hops > 0:
        links = cluster_links(condensed.point_cluster, condensed.parent, idx, core,
                              metric_distance, link_hops, block_distance)  # type: ignore[arg-type]
        if links.size:
            tree = spanning_tree(idx, dist, core, points, metric_distance, links)
            condensed = condense(single_linkage(tree, n), min_cluster_size)
    labels, stab = labels_from_tree(condensed)
    return Clustering(labels, int(stab.size), stab, tree.components, links.size if links is not None else 0)
