"""The links between clusters that a kNN graph lacks (`pollux.litz.apps.hdbscan_links`): what a link
is, that each is the lightest edge its search can see, that repeated edges are not summed, and that
the links bring the labels of the exact kNN graph closer to exact HDBSCAN."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.cluster import HDBSCAN
from sklearn.metrics import fowlkes_mallows_score
from sklearn.neighbors import NearestNeighbors

from pollux.litz.apps import hdbscan_links
from pollux.litz.apps.hdbscan_data import gaussian_clusters
from pollux.litz.apps.hdbscan_links import (
    Links,
    cluster_links,
    leaf_members,
    lightest_edge,
    pairwise_blocks,
)
from pollux.litz.apps.hdbscan_tree import (
    cluster_knn_graph,
    condense,
    core_distances,
    single_linkage,
    spanning_tree,
)


def euclidean(points: np.ndarray):
    return lambda a, b: np.sqrt(((points[a] - points[b]) ** 2).sum(axis=1))


def knn(points: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    dist, idx = NearestNeighbors(n_neighbors=k + 1).fit(points).kneighbors(points)
    return idx[:, 1:], dist[:, 1:]


def first_hierarchy(points: np.ndarray, k: int = 10):
    idx, dist = knn(points, k)
    core = core_distances(dist, k)
    tree = spanning_tree(idx, dist, core, points, euclidean(points))
    return idx, dist, core, condense(single_linkage(tree, len(points)), 5)


def reached(idx: np.ndarray, members: set[int], hops: int) -> set[int]:
    """Breadth-first search of the undirected graph, written out plainly (the reference)."""
    adjacent = adjacent_sets(idx)
    seen, frontier = set(members), set(members)
    for _ in range(hops):
        frontier = {y for x in frontier for y in adjacent[x]} - seen
        seen |= frontier
    return seen - members


def adjacent_sets(idx: np.ndarray) -> dict[int, set[int]]:
    adjacent: dict[int, set[int]] = {i: set() for i in range(idx.shape[0])}
    for x, row in enumerate(idx.tolist()):
        for y in row:
            adjacent[x].add(y)
            adjacent[y].add(x)
    return adjacent


def test_each_link_is_the_lightest_edge_from_its_leafs_boundary_to_what_the_graph_reaches():
    points = gaussian_clusters(1500, 3, 15, 0.2, seed=1).points
    idx, _, core, condensed = first_hierarchy(points)
    links = cluster_links(condensed.point_cluster, condensed.parent, idx, core, euclidean(points), hops=2)
    leaves = leaf_members(condensed.point_cluster, condensed.parent)
    adjacent = adjacent_sets(idx)
    assert links.size == len(leaves) >= 10
    for members, x, y, weight in zip(leaves, links.u, links.v, links.weight, strict=True):
        inside = set(members.tolist())
        outside = reached(idx, inside, 2)
        edge = [a for a in sorted(inside) if adjacent[a] - inside]
        assert x in edge and y in outside
        best = min(max(np.linalg.norm(points[a] - points[b]), core[a], core[b])
                   for a in edge for b in outside)
        assert weight == pytest.approx(best, rel=1e-12)
        assert weight == max(euclidean(points)(np.array([x]), np.array([y]))[0], core[x], core[y])


def test_leaves_are_the_clusters_without_children_and_hold_their_points():
    points = gaussian_clusters(1200, 2, 12, 0.2, seed=2).points
    _, _, _, condensed = first_hierarchy(points)
    leaves = leaf_members(condensed.point_cluster, condensed.parent)
    parents = set(condensed.parent[1:].tolist())
    expected = [c for c in range(1, condensed.parent.size) if c not in parents]
    assert len(leaves) == len(expected)
    for members, c in zip(leaves, expected, strict=True):
        assert members.tolist() == np.flatnonzero(condensed.point_cluster == c).tolist()


def test_blocks_of_pairs_give_the_same_edge(monkeypatch):
    rng = np.random.default_rng(3)
    points = rng.standard_normal((300, 4))
    core = rng.uniform(0.1, 0.5, 300)
    members, candidates = np.arange(0, 120), np.arange(120, 300)
    blocks = pairwise_blocks(euclidean(points))
    whole = lightest_edge(members, candidates, core, blocks)
    monkeypatch.setattr(hdbscan_links, "PAIR_BLOCK", 500)
    assert lightest_edge(members, candidates, core, blocks) == whole
    weights = [max(np.linalg.norm(points[a] - points[b]), core[a], core[b])
               for a in members for b in candidates]
    first = int(np.argmin(weights))
    assert whole == (int(members[first // candidates.size]), int(candidates[first % candidates.size]))


def test_a_link_repeating_a_graph_edge_is_not_counted_twice():
    """A sparse matrix adds repeated entries: a link equal to a kNN entry must leave the tree as it
    was. Points 0, 1, 3 on a line, one neighbour each: 2 lists 1, which lists 0, so the edge (2, 1)
    is listed once and the tree needs it."""
    points = np.array([[0.0], [1.0], [3.0]])
    idx = np.array([[1], [0], [1]])
    dist = np.array([[1.0], [1.0], [2.0]])
    core = core_distances(dist, 1)
    plain = spanning_tree(idx, dist, core, points, euclidean(points))
    again = spanning_tree(idx, dist, core, points, euclidean(points),
                          Links(np.array([2]), np.array([1]), np.array([2.0])))
    assert sorted(plain.weight.tolist()) == sorted(again.weight.tolist()) == [1.0, 2.0]


def test_links_bring_the_exact_knn_graph_closer_to_exact_hdbscan():
    """Measured at 20,000 points, dimension 5: FM 0.88 without links, 0.96 with (module doc); this
    smaller seeded set shows the same direction and stays on the exact side."""
    points = gaussian_clusters(5000, 5, 50, 0.2, seed=0).points
    idx, dist = knn(points, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        exact = HDBSCAN(min_cluster_size=5, min_samples=10).fit(points).labels_
    plain = cluster_knn_graph(idx, dist, points, 10, 5, euclidean(points), link_hops=0)
    linked = cluster_knn_graph(idx, dist, points, 10, 5, euclidean(points))
    assert plain.links == 0 and linked.links > 0
    fm_plain = fowlkes_mallows_score(exact, plain.labels)
    fm_linked = fowlkes_mallows_score(exact, linked.labels)
    assert fm_linked >= 0.95 and fm_linked > fm_plain
