"""Approximate HDBSCAN on Litz (`pollux.litz.apps.hdbscan`), on the local runtime: NN-Descent's recall,
agreement with scikit-learn's exact HDBSCAN, labels independent of executors, moves and the d_max
broadcast, the cluster extraction itself, bad input, and the command line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.cluster import HDBSCAN
from sklearn.metrics import adjusted_rand_score, fowlkes_mallows_score
from sklearn.neighbors import NearestNeighbors

from pollux.cli.entry import main
from pollux.litz.apps import make_app
from pollux.litz.apps.hdbscan import HDBSCANConfig, prepare
from pollux.litz.apps.hdbscan_data import gaussian_clusters, load_points
from pollux.litz.apps.hdbscan_tree import cluster_knn_graph
from pollux.litz.apps.nn_descent import nn_descent
from pollux.litz.local import run_local


def exact_labels(points: np.ndarray, min_cluster_size: int = 5, min_samples: int = 10) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # scikit-learn's note on its `copy` default
        return HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples).fit(points).labels_


def points_of(**config: object) -> np.ndarray:
    return prepare(HDBSCANConfig.from_mapping(config)).points


def euclidean(points: np.ndarray):
    return lambda a, b: np.sqrt(((points[a] - points[b]) ** 2).sum(axis=1))


def test_nn_descent_recall_of_the_true_knn():
    points = gaussian_clusters(3000, 6, 20, 0.2, seed=3).points
    lists, changes = nn_descent(points, k=10, sample=5, seed=3, max_iterations=30, delta=0.001)
    true = NearestNeighbors(n_neighbors=11).fit(points).kneighbors(points, return_distance=False)[:, 1:]
    hits = (lists.idx[:, :, None] == true[:, None, :]).any(axis=2).sum()
    assert hits / true.size >= 0.9
    assert changes[-1] <= 0.001 * 3000 * 10 < changes[0]  # it converged, from a random graph
    assert (np.diff(lists.sq, axis=1) >= 0).all() and (lists.idx != np.arange(3000)[:, None]).all()


def test_the_app_computes_the_reference_descent():
    config = {"n": 1500, "dim": 4, "clusters": 15, "seed": 5}
    summary = run_local(make_app("hdbscan", **config), num_executors=1)
    _, changes = nn_descent(points_of(**config), k=10, sample=5, seed=5, max_iterations=30, delta=0.001)
    assert summary.final["changes"] == changes


@pytest.mark.parametrize("dim", [2, 5, 10])
def test_agrees_with_exact_hdbscan(dim):
    """Table 4.2's kind of data (80 points per cluster, 20 % noise) with the default settings (k = 10,
    min_samples = k on both sides). Small sets vary: at 2000 points, dim 5, one seed gave FM 0.80
    (0.855 even with the exact 10-NN graph: the kNN graph's MST misses long edges of noise points)."""
    config = {"n": 4000, "dim": dim, "clusters": 40, "noise": 0.2, "seed": dim}
    final = run_local(make_app("hdbscan", **config), num_executors=2).final
    exact = exact_labels(points_of(**config))
    assert fowlkes_mallows_score(exact, final["labels"]) >= 0.9
    assert abs(final["clusters"] - (exact.max() + 1)) <= max(1, 0.05 * (exact.max() + 1))
    assert 0.1 < final["noise_fraction"] < 0.4


def test_labels_do_not_depend_on_executors_moves_order_or_broadcast():
    config = {"n": 1200, "dim": 3, "clusters": 10, "seed": 7}
    base = run_local(make_app("hdbscan", **config), num_executors=1).final
    runs = [
        run_local(make_app("hdbscan", **config), num_executors=3, migrate_every=2),
        run_local(make_app("hdbscan", **config), num_executors=4, seed=1, staleness_order="random",
                  reads="dispatch"),
        run_local(make_app("hdbscan", **config, broadcast=False), num_executors=3),
    ]
    for summary in runs:
        np.testing.assert_array_equal(summary.final["labels"], base["labels"])
        assert summary.final["changes"] == base["changes"]
    assert runs[0].migrations > 0
    with_broadcast, without = runs[0].final, runs[2].final
    assert 0 < with_broadcast["proposals_sent"] < without["proposals_sent"]


def test_extraction_on_the_complete_graph_is_exact_hdbscan():
    """With every other point as a neighbour the MST is exact HDBSCAN's; only ties may differ."""
    rng = np.random.default_rng(11)
    points = np.r_[rng.standard_normal((320, 2)) + rng.integers(0, 6, (320, 1)) * 4,
                   rng.uniform(-5, 25, (80, 2))]
    dist, idx = NearestNeighbors(n_neighbors=len(points)).fit(points).kneighbors(points)
    got = cluster_knn_graph(idx[:, 1:], dist[:, 1:], points, 10, 5, euclidean(points))
    exact = exact_labels(points)
    assert got.num_clusters == exact.max() + 1
    assert adjusted_rand_score(exact, got.labels) >= 0.97


def test_a_disconnected_graph_is_joined():
    rng = np.random.default_rng(2)
    points = np.r_[rng.standard_normal((150, 2)), rng.standard_normal((150, 2)) + 1000.0]
    dist, idx = NearestNeighbors(n_neighbors=4).fit(points).kneighbors(points)
    got = cluster_knn_graph(idx[:, 1:], dist[:, 1:], points, 3, 20, euclidean(points))
    assert got.components >= 2 and got.num_clusters == 2
    assert adjusted_rand_score(np.repeat([0, 1], 150), got.labels) == 1.0


def test_cosine_metric_agrees_with_exact():
    rng = np.random.default_rng(4)
    directions = rng.standard_normal((6, 8))
    points = np.repeat(directions, 100, axis=0) + 0.15 * rng.standard_normal((600, 8))
    points *= rng.uniform(0.5, 3.0, (600, 1))  # lengths do not matter to the cosine
    path = Path(__file__).parent / ".hdbscan_cosine.npy"
    try:
        np.save(path, points)
        final = run_local(make_app("hdbscan", data=str(path), metric="cosine"), num_executors=2).final
    finally:
        path.unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        exact = HDBSCAN(min_cluster_size=5, min_samples=10, metric="cosine").fit(points).labels_
    assert fowlkes_mallows_score(exact, final["labels"]) >= 0.9


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"k": 0}, "'k' must be >= 1"),
        ({"k": 5, "min_samples": 7}, "'min_samples' must be in [1, k + 1 = 6]"),
        ({"min_cluster_size": 1}, "'min_cluster_size' must be >= 2"),
        ({"sample_rate": 0}, "'sample_rate' must be in (0, 1]"),
        ({"metric": "manhattan"}, "'metric': unknown 'manhattan'"),
        ({"max_iterations": 0}, "'max_iterations' must be >= 1"),
        ({"link_hops": -1}, "'link_hops' must be >= 0"),
    ],
)
def test_bad_config_names_the_key(config, needle):
    with pytest.raises(ValueError, match="hdbscan config") as err:
        make_app("hdbscan", **config)
    assert needle in str(err.value)


def test_files_are_read_and_bad_ones_named(tmp_path):
    good = tmp_path / "points.csv"
    good.write_text("x,y\n1,2\n3,4\n5,6.5\n")
    np.testing.assert_array_equal(load_points(str(good)).points, [[1, 2], [3, 4], [5, 6.5]])
    cases = {
        "flat.npy": (lambda p: np.save(p, np.arange(5.0)), "expected a 2-D array"),
        "text.npy": (lambda p: np.save(p, np.array([["a"]])), "expected a numeric array"),
        "nan.csv": (lambda p: p.write_text("1,2\n3,nan\n"), "row 1 is not finite"),
        "words.csv": (lambda p: p.write_text("a,b\nc,d\n"), "not a CSV of numbers"),
        "points.txt": (lambda p: p.write_text("1,2\n"), "expected a .npy or .csv file"),
    }
    for name, (write, needle) in cases.items():
        path = tmp_path / name
        write(path)
        with pytest.raises(ValueError, match="data file") as err:
            load_points(str(path))
        assert needle in str(err.value) and name in str(err.value)
    with pytest.raises(ValueError, match="cannot be read"):
        load_points(str(tmp_path / "missing.npy"))


def test_cli_clusters_a_file_and_writes_labels(tmp_path, capsys):
    data = gaussian_clusters(600, 2, 6, 0.1, seed=1).points
    np.save(tmp_path / "pts.npy", data)
    out = tmp_path / "labels.npy"
    rc = main(["litz", "run", "hdbscan", "--local", "--data", str(tmp_path / "pts.npy"), "--executors", "2",
               "--out", str(out), "--json", "--quiet"])
    stdout, _ = capsys.readouterr()
    assert rc == 0
    summary = json.loads(stdout)
    labels = np.load(out)
    assert labels.shape == (600,) and "labels" not in summary["final"]
    assert summary["final"]["clusters"] == labels.max() + 1 >= 2
    assert summary["final"]["labels_file"] == str(out)
    rc = main(["litz", "run", "hdbscan", "--local", "--points", "50", "--set", "k=60"])
    _, err = capsys.readouterr()
    assert rc == 2 and "needs at least k + 2" in err


def test_cli_key_table_covers_every_key_the_app_reads():
    import re

    import pollux.litz.apps.hdbscan as app_module
    from pollux.cli.litz_apps import HDBSCAN_KEYS

    read = set(re.findall(r"config(?:\.get\(|\[)\"(\w+)\"", Path(app_module.__file__).read_text()))
    assert {"k", "min_samples", "broadcast", "data"} <= read <= set(HDBSCAN_KEYS)
