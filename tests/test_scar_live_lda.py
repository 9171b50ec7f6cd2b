"""SCAR live on pollux.litz with LDA's count rows: the "tv" row distance (total variation of the row
distributions × row length), prioritised checkpoints by it, partial recovery of a killed shard.

The unit tests check the distance on hand-made rows. The live test runs the Litz LDA application
(3 executors, 4 PS shards, a checkpoint every epoch of 9 micro-tasks, the top 1/8 rows) with "tv" on
its word-topic counts — a word's row keeps its total (its occurrences) while Gibbs moves its tokens
between topics, so N · TV is exactly ½‖n − n'‖₁, the tokens moved — and "l2" on the topic totals.
The tables start empty (the init tasks add the random assignments), so the first periodic
checkpoint saves every row (`full_first=1`). A controller subclass SIGKILLs a shard right after a
checkpoint.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pollux.scar.api import ScarError
from pollux.scar.live.running import RunningCopy, row_distances, tv_length_distance

ray = pytest.importorskip("ray")

import litz_helpers as h  # noqa: E402
from pollux.litz.apps.lda import lda_app  # noqa: E402
from pollux.litz.runtime import LitzRuntime  # noqa: E402
from pollux.scar.live.controller import ScarConfig, ScarController  # noqa: E402
from scar_helpers import KillingController  # noqa: E402

LDA = dict(num_topics=5, true_topics=5, num_docs=120, vocab_size=60, doc_length=40, epochs=6, seed=1)
EXECUTORS = 3
TASKS_PER_EPOCH = EXECUTORS * EXECUTORS  # num_blocks defaults to the executors: B rounds of E tasks
KINDS = {"word_topic": "tv"}  # topic_totals: l2 (the default)


# ---------------------------------------------------------------------------------- unit tests
def test_tv_length_distance_on_hand_made_rows():
    cur = np.array(
        [
            [3.0, 1.0, 0.0, 0.0],  # same length 4, p = (.75, .25) vs (.25, .75): TV .5 -> 2
            [2.0, 4.0, 0.0, 0.0],  # same distribution as (1, 2): scale-free, 0 (L2 would be > 0)
            [0.0, 0.0, 0.0, 0.0],  # emptied: TV 1 × the saved length 5
            [0.0, 3.0, 0.0, 0.0],  # filled from empty (the starting tables): 3
            [0.0, 0.0, 0.0, 0.0],  # both empty: 0, not NaN
            [2.0, 2.0, 0.0, 0.0],  # lengths 4 vs 1: p (.5, .5) vs (1, 0), TV .5 × max length 4 -> 2
            [0.0, 0.0, 6.0, 4.0],  # disjoint supports: TV 1 × 10
        ]
    )
    saved = np.array(
        [
            [1.0, 3.0, 0.0, 0.0],
            [1.0, 2.0, 0.0, 0.0],
            [0.0, 5.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0],
            [7.0, 3.0, 0.0, 0.0],
        ]
    )
    expected = [2.0, 0.0, 5.0, 3.0, 0.0, 2.0, 10.0]
    got = tv_length_distance(cur, saved)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    # equal lengths: exactly half the L1 distance of the counts (the experiments' LDA block_distance)
    rng = np.random.default_rng(0)
    a = rng.multinomial(50, np.full(6, 1 / 6), size=40).astype(float)
    b = rng.multinomial(50, np.full(6, 1 / 6), size=40).astype(float)
    np.testing.assert_array_equal(tv_length_distance(a, b), 0.5 * np.abs(a - b).sum(axis=1))
    # 1-D tables (rows are scalars) and empty shard parts
    np.testing.assert_array_equal(tv_length_distance(np.array([4.0, 0.0]), np.array([2.0, 0.0])), [0.0, 0.0])
    assert tv_length_distance(np.zeros((0, 3)), np.zeros((0, 3))).shape == (0,)
    np.testing.assert_allclose(row_distances(cur[:2], saved[:2], "l2"), [np.sqrt(8.0), np.sqrt(5.0)])
    with pytest.raises(ScarError, match="row distance"):
        row_distances(cur, saved, "kl")


def test_running_copy_uses_the_table_kinds():
    from pollux.litz.ps import ShardState

    rows = np.array([4, 1])
    start = {"nwk": (rows, np.array([[0.0, 0.0], [2.0, 2.0]])), "nk": (np.array([0]), np.array([3.0]))}
    state = ShardState({t: (r, v.copy()) for t, (r, v) in start.items()})
    copy = RunningCopy(0, start)
    state.values["nwk"][:] = [[4.0, 0.0], [0.0, 6.0]]  # rows 1, 4 (sorted): 2 moved; filled with 6
    state.values["nk"][:] = [7.0]
    got = copy.distances(state, {"nwk": "tv"})
    assert got["nwk"][0].tolist() == [1, 4]
    np.testing.assert_array_equal(got["nwk"][1], [2.0, 6.0])
    np.testing.assert_array_equal(got["nk"][1], [4.0])  # l2 by default
    np.testing.assert_allclose(copy.distances(state)["nwk"][1], [np.sqrt(8.0), 6.0])  # all l2


def test_config_names_bad_distances(tmp_path):
    with pytest.raises(ScarError, match=r"ScarConfig.distances\['word_topic'\]"):
        ScarConfig(directory=str(tmp_path), distances={"word_topic": "kl"})
    ctl = ScarController(ScarConfig(directory=str(tmp_path / "c"), distances={"doc_topic": "tv"}))
    with pytest.raises(ScarError, match="no table 'doc_topic'"):
        ctl.start(SimpleNamespace(tables={"word_topic": None, "topic_totals": None}))
    ctl.close(None)


# ---------------------------------------------------------------------------------- live
@pytest.fixture(scope="module")
def cluster():
    with h.local_ray():
        yield


def _expected_distance(table: str, cur: np.ndarray, saved: np.ndarray) -> np.ndarray:
    """The test's own reckoning: word rows keep their totals once non-empty, so N·TV = ½‖n − n'‖₁
    (or the whole row when the saved row is still the empty start); topic totals by |Δ|."""
    if table == "topic_totals":
        return np.abs(cur - saved)
    n_cur, n_saved = cur.sum(axis=1), saved.sum(axis=1)
    assert np.all((n_saved == 0) | (n_saved == n_cur)), "a word row's total changed"
    return np.where(n_saved == 0, n_cur, 0.5 * np.abs(cur - saved).sum(axis=1))


def test_tv_priority_checkpoints_and_partial_recovery_on_lda(cluster, tmp_path):
    ctl = KillingController(
        ScarConfig(
            directory=str(tmp_path / "ckpt"),
            strategy="priority",
            fraction=1 / 8,
            every_tasks=TASKS_PER_EPOCH,
            recovery="partial",
            distances=KINDS,
            inspect=True,
            full_first=1,
        ),
        kill_after=3,
        victim=2,
    )
    cfg = h.config(num_executors=EXECUTORS, num_workers=2, num_shards=4, fault_tolerance=ctl)
    summary = LitzRuntime(lda_app(**LDA), cfg).run()
    assert summary.final["iterations"] == LDA["epochs"], summary.final
    assert np.isfinite(summary.final["objective"])
    assert summary.recoveries == 1
    (rec,) = ctl.recoveries
    assert rec.kind == "partial" and rec.dead_shards == [ctl.victim]
    assert rec.tasks_after == rec.tasks_before  # no global restart
    order = sorted(ctl.checkpoints[0].tables)  # select_blocks sees the tables in name order
    assert order == ["topic_totals", "word_topic"]
    # 1. every checkpoint saved exactly the top ceil(rows / 8) rows by the test's own distances,
    #    replaying the running checkpoint from the initial save (the all-zero starting tables)
    running = {t: ctl.checkpoints[0].tables[t].astype(float) for t in order}
    assert not any(v.any() for v in running.values())
    total = sum(running[t].shape[0] for t in order)
    k = int(np.ceil(total / 8))
    assert len(ctl.checkpoints) >= LDA["epochs"]
    first = ctl.checkpoints[1]  # full_first: every row, the counts after the init tasks
    assert first.rows_saved == total and all(first.chosen[t].size == running[t].shape[0] for t in order)
    running = {t: first.tables[t].astype(float) for t in order}
    for c in ctl.checkpoints[2:]:
        d = {t: _expected_distance(t, c.tables[t].astype(float), running[t]) for t in order}
        for t in order:
            np.testing.assert_array_equal(c.distances[t], d[t])
        flat = np.concatenate([d[t] for t in order])
        top = np.array(sorted(range(total), key=lambda i: (-flat[i], i))[:k])
        n0 = running[order[0]].shape[0]
        assert c.chosen["topic_totals"].tolist() == sorted(top[top < n0].tolist())
        assert c.chosen["word_topic"].tolist() == sorted((top[top >= n0] - n0).tolist())
        assert c.rows_saved == k
        for t in order:
            running[t][c.chosen[t]] = c.tables[t][c.chosen[t]]
    # 2. partial recovery: exactly the lost rows from the running checkpoint, the others untouched
    before, after = ctl.before, rec.tables_after
    assert rec.rows_lost == sum(before["lost"][t].size for t in order) > 0
    moved = False
    for t in order:
        lost = before["lost"][t]
        others = np.setdiff1d(np.arange(after[t].shape[0]), lost)
        np.testing.assert_array_equal(after[t][lost], before["running"][t][lost])
        np.testing.assert_array_equal(after[t][others], before["tables"][t][others])
        moved |= not np.array_equal(before["running"][t][lost], before["tables"][t][lost])
    assert moved  # the running checkpoint really was behind on some lost row
    lost = before["lost"]["word_topic"]  # a word's row keeps its total: no lost row comes back empty
    totals = before["tables"]["word_topic"][lost].sum(axis=1)
    np.testing.assert_array_equal(after["word_topic"][lost].sum(axis=1), totals)
    assert 0.05 < rec.bytes_read / rec.full_bytes < 0.6, (rec.bytes_read, rec.full_bytes)
