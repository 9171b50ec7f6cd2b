"""SCAR live on pollux.litz: prioritised checkpoints pick the top-r rows, partial recovery restores
exactly the lost shard's rows from the running checkpoint, the job goes on; full recovery rewinds.

One module-scoped local Ray (2 CPUs); a small MLR job with 4 PS shards, 4 executors, 10 iterations
(40 micro-tasks) per epoch, a checkpoint every epoch. A test subclass of the controller SIGKILLs a
shard right after a chosen checkpoint, remembering the tables and the running checkpoint then.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import litz_helpers as h  # noqa: E402
from pollux.litz.apps.mlr import mlr_app  # noqa: E402
from pollux.litz.runtime import LitzRuntime  # noqa: E402
from pollux.scar.live.controller import ScarConfig  # noqa: E402
from scar_helpers import KillingController  # noqa: E402

MLR = dict(
    dataset="gaussian",
    n=800,
    d=31,
    classes=4,
    batch_size=20,
    lr=0.5,
    staleness=0,
    double_buffer=False,
    epochs=8,
    report_every=10,
    seed=3,
)
TASKS_PER_EPOCH = 40


@pytest.fixture(scope="module")
def cluster():
    with h.local_ray():
        yield


def _run(
    tmp_path, kill_after: int | None = None, kill_at_tasks: int | None = None, **kw: Any
) -> tuple[Any, KillingController]:
    kw.setdefault("every_tasks", TASKS_PER_EPOCH)
    ctl = KillingController(
        ScarConfig(directory=str(tmp_path / "ckpt"), inspect=True, **kw),
        kill_after=kill_after,
        kill_at_tasks=kill_at_tasks,
    )
    cfg = h.config(num_executors=4, num_workers=2, num_shards=4, fault_tolerance=ctl)
    summary = LitzRuntime(mlr_app(**MLR), cfg).run()
    return summary, ctl


def test_running_copy_distances_and_update():
    from pollux.litz.ps import ShardState
    from pollux.scar.api import ScarError
    from pollux.scar.live.running import RunningCopy

    rows, vals = np.array([9, 2, 5]), np.array([[9.0, 0.0], [2.0, 0.0], [5.0, 0.0]])
    state = ShardState({"W": (rows, vals)})
    copy = RunningCopy(0, {"W": (rows, vals)})
    state.values["W"] += np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 1.0]])  # rows 2, 5, 9 (sorted)
    got_rows, dist = copy.distances(state)["W"]
    assert got_rows.tolist() == [2, 5, 9]
    np.testing.assert_allclose(dist, [5.0, 0.0, 1.0])
    saved = copy.update(state, {"W": np.array([2])})
    np.testing.assert_allclose(saved["W"][1], [[5.0, 4.0]])
    np.testing.assert_allclose(copy.distances(state)["W"][1], [0.0, 0.0, 1.0])
    with pytest.raises(ScarError, match="not on this shard"):
        copy.update(state, {"W": np.array([3])})


def test_priority_checkpoints_and_partial_recovery(cluster, tmp_path):
    summary, ctl = _run(tmp_path, kill_after=3, strategy="priority", fraction=1 / 8, recovery="partial")
    assert summary.final["iterations"] == 80, summary.final
    assert summary.recoveries == 1 and len(ctl.recoveries) == 1
    rec = ctl.recoveries[0]
    assert rec.kind == "partial" and rec.dead_shards == [1]
    assert rec.tasks_after == rec.tasks_before  # no global restart
    # 1. every checkpoint saved exactly the top ceil(rows / 8) rows by L2 distance from an
    #    independently replayed running checkpoint (ties by lower row id)
    (table,) = ctl.checkpoints[0].tables  # one table "W"
    running = ctl.checkpoints[0].tables[table].copy()  # the initial save: every row
    assert ctl.checkpoints[0].rows_saved == running.shape[0]
    k = int(np.ceil(running.shape[0] / 8))
    for c in ctl.checkpoints[1:]:
        cur = c.tables[table]
        d = np.sqrt(((cur - running) ** 2).sum(axis=1))
        np.testing.assert_allclose(c.distances[table], d, rtol=1e-9, atol=1e-12)
        top = sorted(range(d.size), key=lambda r: (-d[r], r))[:k]
        assert c.chosen[table].tolist() == sorted(top)
        running[c.chosen[table]] = cur[c.chosen[table]]
    # 2. partial recovery: the lost rows come from the running checkpoint, the others untouched
    before, after = ctl.before, rec.tables_after
    lost = before["lost"][table]
    others = np.setdiff1d(np.arange(running.shape[0]), lost)
    assert rec.rows_lost == lost.size and lost.size > 0
    np.testing.assert_array_equal(after[table][lost], before["running"][table][lost])
    np.testing.assert_array_equal(after[table][others], before["tables"][table][others])
    assert not np.array_equal(after[table][lost], before["tables"][table][lost])  # really lost
    # 3. it read about a quarter of a full checkpoint's bytes
    assert 0.1 < rec.bytes_read / rec.full_bytes < 0.45, (rec.bytes_read, rec.full_bytes)
    assert np.isfinite(summary.final["objective"])


def test_full_recovery_rewinds_to_the_last_full_checkpoint(cluster, tmp_path):
    summary, ctl = _run(
        tmp_path,
        strategy="full",
        fraction=1.0,
        recovery="full",
        every_tasks=4 * TASKS_PER_EPOCH,
        kill_at_tasks=6 * TASKS_PER_EPOCH,
    )
    (rec,) = ctl.recoveries
    assert rec.kind == "full" and rec.bytes_read == rec.full_bytes
    assert rec.tasks_after == 4 * TASKS_PER_EPOCH < rec.tasks_before  # back to the cut
    (table,) = rec.tables_after
    np.testing.assert_array_equal(rec.tables_after[table], ctl.before["running"][table])
    assert summary.final["iterations"] == 80


def test_partial_recovery_from_a_kill_mid_epoch(cluster, tmp_path):
    # killed between checkpoints, with tasks in flight: they are queued again, the job finishes
    summary, ctl = _run(tmp_path, kill_at_tasks=5 * TASKS_PER_EPOCH + 8, recovery="partial")
    (rec,) = ctl.recoveries
    assert rec.kind == "partial" and rec.dead_shards == [1]
    assert rec.tasks_after == rec.tasks_before
    # the batches that failed on the dead shard have answered: settling them must not wait out
    # detect_timeout_s (it did while an answer already read still counted as in flight)
    assert rec.duration_s < ctl.config.detect_timeout_s
    assert summary.final["iterations"] == 80 and summary.recoveries == 1
    assert np.isfinite(summary.final["objective"])
