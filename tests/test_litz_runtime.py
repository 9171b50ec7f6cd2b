"""The Litz runtime on a real local Ray cluster: exactness, §4.3 dependencies, cache, layout.

One module-scoped ``ray.init(num_cpus=2)``; the last check is that no Ray process is left behind.
"""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import litz_helpers as h  # noqa: E402
from pollux.litz.api import ApplicationError, LitzError  # noqa: E402
from pollux.litz.records import shard_assignment  # noqa: E402
from pollux.litz.runtime import LitzRuntime  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    # a custom resource per worker, as the live service may use
    with h.local_ray(resources={"litz_slot": 2}):
        yield


def test_shard_assignment_is_a_seeded_permutation_split():
    owner = shard_assignment(10, 3, seed=4)
    perm = np.random.default_rng(4).permutation(10)
    for k, part in enumerate(np.array_split(perm, 3)):
        assert (owner[part] == k).all()


def test_cache_serves_tasks_of_lower_or_equal_version_only():
    from pollux.litz.cache import ParamCache
    from pollux.litz.records import TableMeta

    cache = ParamCache({"t": TableMeta("t", (4, 2), "float64")})
    assert cache.stale_rows("t", None, 0).tolist() == [0, 1, 2, 3]
    cache.fill("t", np.array([1, 2]), np.ones((2, 2)), version=5)
    assert cache.stale_rows("t", np.array([1, 2]), 5).size == 0  # same version: hit
    assert cache.stale_rows("t", np.array([1, 2]), 3).size == 0  # older task: hit
    assert cache.stale_rows("t", np.array([1, 2, 3]), 6).tolist() == [1, 2, 3]  # newer task: fetch
    view = cache.read("t", None)
    with pytest.raises(ValueError):
        view[0, 0] = 1.0  # tasks get read-only views of the cache


def test_update_log_sums_repeated_rows_and_drains():
    from pollux.litz.cache import UpdateLog
    from pollux.litz.records import TableMeta

    log = UpdateLog({"t": TableMeta("t", (5,), "float64")})
    log.add("t", np.array([1.0, 2.0, 3.0]), np.array([0, 3, 0]))
    log.add("t", np.full(5, 0.5), None)
    rows, delta = log.drain()["t"]
    assert rows.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(delta, [4.5, 0.5, 0.5, 2.5, 0.5])
    assert log.drain() == {}
    with pytest.raises(ValueError, match="delta shape"):
        log.add("t", np.ones(3), None)
    with pytest.raises(KeyError, match="does not exist"):
        log.add("nope", np.ones(5), None)


def test_shard_state_commits_only_staged_keys_in_order():
    from pollux.litz.ps import ShardState

    st = ShardState({"t": (np.array([7, 2, 5]), np.array([70.0, 20.0, 50.0]))})
    assert st.rows["t"].tolist() == [2, 5, 7]
    st.staged[(0, 1)] = [("t", np.array([5]), np.array([1.0]))]
    st.staged[(1, 1)] = [("t", np.array([2, 7]), np.array([2.0, 3.0]))]
    assert st.commit([(1, 1), (9, 9)]) == 1  # unknown keys: nothing staged here
    np.testing.assert_allclose(st.values["t"], [22.0, 50.0, 73.0])
    assert (0, 1) in st.staged
    np.testing.assert_allclose(st.take_rows("t", np.array([5])), [50.0])
    assert st.rows["t"].tolist() == [2, 7]


def test_mirror_follows_the_shards_bit_for_bit_until_it_cannot():
    from pollux.litz.mirror import TableMirror
    from pollux.litz.ps import ShardState
    from pollux.litz.records import TableMeta

    rng = np.random.default_rng(0)
    meta = {"t": TableMeta("t", (6, 3), "float64"), "big": TableMeta("big", (1000, 100), "float64")}
    start = {"t": rng.normal(size=(6, 3)), "big": np.zeros((1000, 100))}
    mirror = TableMirror(meta, limit_bytes=1024)
    assert mirror.eligible == {"t"}  # 6 x 3 x 8 bytes; big is 800 kB
    mirror.reset(1, start)
    shard = ShardState({"t": (np.arange(6), start["t"])})
    for c in range(5):
        keys = [(0, c), (1, c)]
        inline = {}
        for k in keys:
            rows = np.sort(rng.choice(6, size=3, replace=False))
            inline[k] = {"t": (rows, rng.normal(size=(3, 3)) * 1e-3)}
            shard.staged[k] = [("t", *inline[k]["t"])]
        held = mirror.current(1, ["t"])["t"]
        mirror.apply(keys, inline)
        shard.commit(keys)
        assert np.array_equal(mirror.current(1, ["t", "big"])["t"], shard.values["t"])
    assert not np.array_equal(held, mirror.values["t"])  # a batch sent earlier keeps its copy
    mirror.relabel(1, 2)  # a migration moves rows, not values
    assert "t" in mirror.current(2, ["t"])
    assert mirror.current(3, ["t"]) == {}  # another layout (a rebuilt shard): nothing is pushed
    mirror.set(3, "t", shard.values["t"])  # the driver's full read mirrors it again
    mirror.drop(["t"])  # an update staged at the shards
    assert mirror.current(3, ["t"]) == {}


def test_cache_keeps_rows_of_a_later_version():
    from pollux.litz.cache import ParamCache
    from pollux.litz.records import TableMeta

    cache = ParamCache({"t": TableMeta("t", (3,), "float64")})
    cache.fill("t", np.arange(3), np.full(3, 9.0), version=9)  # a pushed table
    cache.fill("t", np.array([0, 2]), np.zeros(2), version=4)  # a slower, older fetch lands later
    np.testing.assert_array_equal(cache.read("t", None), [9.0, 9.0, 9.0])
    assert cache.stale_rows("t", None, 9).size == 0


def test_one_executor_equals_numpy(cluster):
    app = h.lsq_app(iterations=8)
    cfg = h.config(num_executors=1, num_workers=1, num_shards=2, worker_resources={"litz_slot": 1})
    summary = LitzRuntime(app, cfg).run()
    ref = h.lsq_reference(1, dict(app.config))
    got = [m["objective"] for m in summary.metrics]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=0)
    assert summary.tasks_completed == 8
    assert summary.final["iterations"] == 8


def test_many_executors_equal_numpy_and_cache_hits(cluster):
    app = h.lsq_app(iterations=6)
    summary = LitzRuntime(app, h.config(num_executors=8, num_workers=2, num_shards=3)).run()
    ref = h.lsq_reference(8, dict(app.config))
    np.testing.assert_allclose([m["objective"] for m in summary.metrics], ref, rtol=1e-6, atol=0)
    # 4 executors per worker share one fetch per iteration (one version per iteration at s = 0)
    assert summary.cache_hits >= 6 * 2 * 3
    assert summary.flushes <= summary.batches


def test_staleness_gets_cache_hits_and_converges(cluster):
    app = h.lsq_app(iterations=12, staleness=2)
    summary = LitzRuntime(app, h.config(num_executors=4, num_workers=2, num_shards=2)).run()
    assert summary.cache_hits > 0
    ref = h.lsq_reference(4, dict(app.config))
    assert summary.final["objective"] < 2 * ref[-1] + 1e-3


@pytest.mark.parametrize(
    "hops",
    [
        {},
        {"push_table_bytes": 0},
        {"inline_update_bytes": 0},
        {"sequential_workers": False},
        {"direct_channel": False},
        {"direct_channel": False, "sequential_workers": False},
    ],
    ids=["inline+push", "inline", "staged", "overlapping-batches", "ray-calls", "ray-calls-async"],
)
def test_dependency_guarantee(cluster, hops):
    # each task is dispatched after the previous one's completion, alternating workers: it must
    # read every earlier update although its worker may hold an older cached value — whether the
    # update came back inline or was staged, and whether the table came with the batch or not
    node = ray.get_runtime_context().get_node_id()  # placement by node affinity, as the service does
    cfg = h.config(num_executors=4, num_workers=2, num_shards=2, node_ids=[node], **hops)
    summary = LitzRuntime(h.chain_app(12), cfg).run()
    assert summary.final["seen"] == [float(i) for i in range(12)]


def test_application_error_is_named(cluster):
    app = h.lsq_app(iterations=3, dim=-1 + 7)
    bad = h.Application("bad", app.driver, h.LsqExecutor, {**app.config, "lr": "x"})
    with pytest.raises((ApplicationError, LitzError), match="executor"):
        LitzRuntime(bad, h.config(num_executors=2, num_workers=1, num_shards=1)).run()


def test_a_worker_without_a_channel_gets_its_batches_as_ray_calls(cluster, monkeypatch):
    # the network refuses the master's connection (as a firewall between nodes would): the run
    # warns, sends that worker's batches as Ray calls, and computes the same thing
    import pollux.litz.worker_links as links_mod

    def refuse(address, token, timeout_s=10.0):
        raise ConnectionRefusedError(f"refused: {address}")

    monkeypatch.setattr(links_mod, "ChannelClient", refuse)
    app = h.lsq_app(iterations=6)
    with pytest.warns(RuntimeWarning, match="no direct channel"):
        summary = LitzRuntime(app, h.config(num_executors=4, num_workers=2, num_shards=2)).run()
    assert summary.channel_fallbacks == 2
    ref = h.lsq_reference(4, dict(app.config))
    np.testing.assert_allclose([m["objective"] for m in summary.metrics], ref, rtol=1e-6, atol=0)
