"""Mini-batch K-means on Litz (`pollux.litz.apps.kmeans`), in process and out of core on Ray.

The local runs check the application against a plain numpy loop of the same updates; the Ray runs
check the issue's acceptance: a run whose memory budget forces evictions gives the same centres as
an in-memory run of the same seed (bit for bit: one worker at staleness 0 sums the updates in one
order), under both policies, and the elastic mechanics (a checkpoint, a move, a budget changed
while running) still work with evicted executors.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from pollux.litz.apps.kmeans import holdout, kmeans_app, nearest_centre, partition
from pollux.litz.local import run_local
from pollux.litz.spill import measure

SMALL = {"k": 4, "dim": 8, "points_per_executor": 3000, "batch": 200, "iterations": 6, "seed": 3}


def _reference(config: dict[str, Any], num_executors: int) -> np.ndarray:
    """The same mini-batch K-means as a plain loop: per iteration every executor's batch is assigned
    to the centres of the iteration's start, then the sums and counts are added."""
    sums = holdout(config)[: config["k"]].astype(np.float64)
    weights = np.ones(config["k"])
    parts = [partition(config, e) for e in range(num_executors)]
    for it in range(config["iterations"]):
        centres = sums / weights[:, None]
        for e, points in enumerate(parts):
            rng = np.random.default_rng([config["seed"], 2, e, it])
            batch = points[rng.choice(len(points), size=config["batch"], replace=False)]
            idx, _ = nearest_centre(batch, centres)
            np.add.at(sums, idx, batch.astype(np.float64))
            weights += np.bincount(idx, minlength=config["k"])
    return sums / weights[:, None]


def test_local_kmeans_matches_the_numpy_loop_and_lowers_the_objective() -> None:
    app = kmeans_app(**SMALL)
    summary = run_local(app, num_executors=3, reads="dispatch")
    np.testing.assert_allclose(summary.final["centres"], _reference(dict(app.config), 3), rtol=1e-12)
    objectives = [m["objective"] for m in summary.metrics]
    assert objectives[-1] < objectives[0]
    # moves re-load the input and keep the state
    moved = run_local(app, num_executors=3, reads="dispatch", migrate_every=2)
    np.testing.assert_allclose(moved.final["centres"], summary.final["centres"], rtol=1e-12)


def test_kmeans_rejects_bad_config_naming_the_field() -> None:
    with pytest.raises(ValueError, match="points_per_executor"):
        kmeans_app(points_per_executor=0)
    with pytest.raises(ValueError, match="staleness"):
        kmeans_app(staleness=-1)


# ---------------------------------------------------------------------------------------- on Ray
ray = pytest.importorskip("ray")

import litz_helpers as h  # noqa: E402
from pollux.litz.records import RuntimeConfig  # noqa: E402
from pollux.litz.runtime import LitzRuntime  # noqa: E402

EXECUTORS = 8


@pytest.fixture(scope="module")
def cluster():
    with h.local_ray():
        yield


def _footprint(config: dict[str, Any]) -> int:
    assign = np.zeros(config["points_per_executor"], np.int32)
    return measure(partition(config, 0)) + measure({"assign": assign})


def _run(budget: int | None, policy: str = "litz", **extra: Any) -> Any:
    app = kmeans_app(**SMALL)
    cfg = RuntimeConfig(num_executors=EXECUTORS, num_workers=1, num_shards=1, memory_budget_bytes=budget,
                        out_of_core_policy=policy, **extra)
    return LitzRuntime(app, cfg).run()


def test_out_of_core_run_gives_the_centres_of_an_in_memory_run(cluster: None) -> None:
    budget = 3 * _footprint(dict(kmeans_app(**SMALL).config))   # 8 executors, room for 3
    plain = _run(None)
    assert plain.ooc_evictions == 0 and plain.ooc_reloads == 0
    for policy in ("litz", "lru"):
        ooc = _run(budget, policy)
        np.testing.assert_array_equal(np.asarray(ooc.final["centres"]), np.asarray(plain.final["centres"]))
        assert ooc.ooc_evictions > 0 and ooc.ooc_reloads > 0 and ooc.ooc_bytes_read > 0
        assert 0 < ooc.ooc_peak_bytes <= budget
        assert (ooc.ooc_prefetches > 0) == (policy == "litz")


def test_checkpoint_move_and_budget_change_work_with_evicted_executors(cluster: None, tmp_path: Any) -> None:
    config = dict(kmeans_app(**SMALL).config)
    budget = 2 * _footprint(config)
    app = kmeans_app(**{**SMALL, "iterations": 40})
    cfg = RuntimeConfig(num_executors=EXECUTORS, num_workers=2, num_shards=1, memory_budget_bytes=budget,
                        checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_s=0.5,
                        spill_dir=str(tmp_path))
    rt = LitzRuntime(app, cfg)
    done = threading.Event()

    def progress(rec: dict[str, Any]) -> None:
        if rec["iteration"] == 10 and not done.is_set():
            done.set()
            rt.resize(num_workers=1)               # moves executors, some of them on disk
            rt.set_memory_budget(budget // 2)      # and a lower budget while running
    summary = rt.run(on_progress=progress)
    expected = run_local(app, num_executors=EXECUTORS, reads="dispatch").final["centres"]
    # the start checkpoint read evicted executors' states from disk; two workers' updates reach
    # the PS in either order: equal up to rounding
    np.testing.assert_allclose(summary.final["centres"], expected, rtol=1e-9)
    assert summary.checkpoints_saved >= 1 and summary.resizes and summary.resizes[0]["moved"] > 0
    assert summary.ooc_evictions > 0 and summary.ooc_peak_bytes <= budget
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]   # the spill folder is gone
    with pytest.raises(ValueError, match="budget_bytes"):
        rt.set_memory_budget(-5)
