"""Fast, in-process checks of the worker's per-task path and of the message format: no Ray cluster.

The over-partitioning figure (`benchmarks/litz.py --sections overpartition`) rests on these paths
being cheap; these tests pin down that being cheap did not cost correctness: tasks of one executor
still run in `seq` order (within a batch, and across batches that overlap), a pushed table serves
whole-table reads without a fetch, and `pack` still sends by value what only cloudpickle can send.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")

from pollux.litz.api import Application, Driver, Executor, TableSpec, TaskContext
from pollux.litz.cache import ParamCache
from pollux.litz.records import Layout, TableMeta, pack, unpack
from pollux.litz.worker import LitzWorkerActor


# ---------------------------------------------------------------------------------------- pack
def test_pack_uses_the_standard_pickler_for_plain_data() -> None:
    obj = (3, [(0, 1, 2, {"iteration": 4}, 5)], 0, {"W": np.arange(6.0).reshape(2, 3)}, 7)
    data = pack(obj)
    assert data == pickle.dumps(obj, protocol=5)
    back = unpack(data)
    np.testing.assert_array_equal(back[3]["W"], obj[3]["W"])
    assert back[3]["W"].flags.writeable


def test_pack_falls_back_to_cloudpickle_where_the_standard_pickler_cannot_send_it() -> None:
    from ray import cloudpickle

    offset = 5

    def local(x: int) -> int:  # a closure: the standard pickler refuses it
        return x + offset

    assert unpack(pack({"f": local}))["f"](1) == 6
    assert unpack(pack(lambda x: 2 * x))(4) == 8

    # a class of __main__ pickles "fine" by reference, but a worker's __main__ is not the driver's:
    # it must go by value, as cloudpickle sends it
    cls = type("MainThing", (), {"__module__": "__main__"})
    import __main__

    vars(__main__)["MainThing"] = cls
    try:
        obj = cls()
        assert pack(obj) == cloudpickle.dumps(obj, protocol=5)
    finally:
        del vars(__main__)["MainThing"]

    # a module registered by value (as `pollux litz run` does with a script): cloudpickle for all
    import litz_helpers

    registered = "litz_helpers" in cloudpickle.list_registry_pickle_by_value()  # local_ray does it
    if not registered:
        cloudpickle.register_pickle_by_value(litz_helpers)
    try:
        app = litz_helpers.lsq_app()
        assert pack(app) == cloudpickle.dumps(app, protocol=5) != pickle.dumps(app, protocol=5)
        plain = (1, [(0, 0, 0, {"iteration": 2}, 3)], 0, None, 3)  # ...but not for plain data
        assert pack(plain) == pickle.dumps(plain, protocol=5)
    finally:
        if not registered:
            cloudpickle.unregister_pickle_by_value(litz_helpers)


# ---------------------------------------------------------------------------------------- cache
def test_cache_floor_lets_whole_reads_of_a_pushed_table_hit() -> None:
    cache = ParamCache({"t": TableMeta("t", (3,), "float64")})
    assert cache.floor["t"] == -1
    cache.fill("t", np.array([0, 1, 2]), np.ones(3), version=4)  # a fetch: the floor stays put
    assert cache.floor["t"] == -1  # (a lower bound; stale_rows still says the truth)
    cache.fill_all("t", np.full(3, 2.0), version=6)
    assert cache.floor["t"] == 6
    cache.fill("t", np.array([1]), np.zeros(1), version=9)  # tags only grow: the floor still holds
    assert cache.floor["t"] == 6 and cache.stale_rows("t", None, 6).size == 0
    cache.fill_all("t", np.full(3, 5.0), version=8)  # row 1 is newer: kept, the others refreshed
    np.testing.assert_array_equal(cache.read("t", None), [5.0, 0.0, 5.0])
    assert cache.floor["t"] == 8 and cache.stale_rows("t", None, 8).size == 0


def test_summing_drained_logs_equals_adding_them() -> None:
    """The master sums the inline logs of a deferred commit (`UpdateLog.add_drained`): the same
    rows and, up to rounding, the same deltas as applying each log in turn."""
    from pollux.litz.cache import UpdateLog

    rng = np.random.default_rng(3)
    meta = {"t": TableMeta("t", (6, 2), "float64")}
    summed, reference = UpdateLog(meta), np.zeros((6, 2))
    for _ in range(20):
        log = UpdateLog(meta)
        if rng.random() < 0.5:
            log.add("t", rng.normal(size=(6, 2)), None)  # whole table
        else:
            rows = rng.choice(6, size=3, replace=True)  # repeated rows are summed by the log
            log.add("t", rng.normal(size=(3, 2)), rows)
        for table, (rows, delta) in log.drain().items():
            summed.add_drained(table, rows, delta)
            reference[rows] += delta
    rows, delta = summed.drain()["t"]
    assert rows.tolist() == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(delta, reference, rtol=1e-12, atol=1e-12)
    assert summed.drain() == {}


def test_update_log_mixes_whole_table_and_row_updates() -> None:
    """Whole-table updates take a fast path after the first (no checks, no touched rows): the
    drained rows and sums must still be those of adding every update in turn, and a bad update
    still gets its named error."""
    from pollux.litz.cache import UpdateLog

    rng = np.random.default_rng(5)
    meta = {"t": TableMeta("t", (5, 3), "float64"), "u": TableMeta("u", (4,), "float64")}
    log, reference = UpdateLog(meta), np.zeros((5, 3))
    for step in range(12):
        if step % 3 == 2:
            rows = rng.choice(5, size=2, replace=False)
            delta = rng.normal(size=(2, 3))
            log.add("t", delta, rows)
            reference[rows] += delta
        else:
            delta = rng.normal(size=(5, 3))
            log.add("t", delta, None)
            reference += delta
    log.add("u", np.ones(4, dtype=np.float32), None)  # whole table, another dtype
    log.add("u", np.zeros(4), None)  # the fast path
    with pytest.raises(ValueError, match="delta shape"):
        log.add("t", np.ones((4, 3)), None)
    with pytest.raises(KeyError, match="does not exist"):
        log.add("nope", np.ones(2), None)
    out = log.drain()
    assert out["t"][0].tolist() == [0, 1, 2, 3, 4] and out["u"][0].tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(out["t"][1], reference, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out["u"][1], np.ones(4))
    assert log.drain() == {}
    only_rows = UpdateLog(meta)  # rows only: nothing else is reported as touched
    only_rows.add("t", np.ones((1, 3)), np.array([2]))
    assert only_rows.drain()["t"][0].tolist() == [2]
    rows_then_whole = UpdateLog(meta)  # the fast path's whole-table update after a row update
    rows_then_whole.add("t", np.ones((1, 3)), np.array([2]))
    rows_then_whole.add("t", np.full((5, 3), 2.0), None)
    rows, delta = rows_then_whole.drain()["t"]
    assert rows.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(delta[:, 0], [2.0, 2.0, 3.0, 2.0, 2.0])


def test_cached_whole_table_read_is_read_only_and_follows_fills() -> None:
    cache = ParamCache({"t": TableMeta("t", (3,), "float64")})
    view = cache.read("t", None)
    with pytest.raises(ValueError):
        view[0] = 1.0
    cache.fill_all("t", np.array([1.0, 2.0, 3.0]), version=2)
    np.testing.assert_array_equal(view, [1.0, 2.0, 3.0])  # the same view sees the fill
    assert cache.read("t", None) is view


# ---------------------------------------------------------------------------------------- worker
class _LogExecutor(Executor):
    """Records the order its tasks ran in; reads the whole table "x" and adds its args to it."""

    def __init__(self, executor_id: int, num_executors: int, config: Any) -> None:
        super().__init__(executor_id, num_executors, config)
        self.ran: list[int] = []

    def load_input(self) -> Any:
        return None

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        x = await ctx.ps.get("x")
        if args.get("pause"):
            await asyncio.sleep(0.01)  # yields: a task of another batch may run meanwhile
        self.ran.append(int(args["n"]))
        ctx.ps.update("x", np.full(2, float(args["n"])))
        return float(x.sum())


class _NoDriver(Driver):
    def tables(self) -> list[TableSpec]:
        return [TableSpec("x", (2,))]

    def dispatch_initial_tasks(self, ctx: Any) -> None: ...

    def handle_task_completion(self, ctx: Any, result: Any) -> None: ...


def _worker(executors: int) -> tuple[LitzWorkerActor, asyncio.AbstractEventLoop]:
    app = Application("log", _NoDriver, _LogExecutor, {})
    tables = {"x": TableMeta("x", (2,), "float64")}
    layout = Layout(0, {"x": np.zeros(2, dtype=np.int64)}, [None])  # no shard: every read must hit
    worker = LitzWorkerActor(0, app, executors, tables, layout, 0.0, 1 << 20)
    loop = asyncio.new_event_loop()
    for e in range(executors):
        loop.run_until_complete(worker.add_executor(e, {}))
    return worker, loop


def test_batch_with_every_table_pushed_runs_in_order_and_sums_updates() -> None:
    worker, loop = _worker(2)
    push = {"x": np.array([1.0, 2.0])}
    # executor 0 twice (seq 0, 1) and executor 1 once, as the master batches them
    tasks = [(10, 0, 0, {"n": 1}, 3), (11, 1, 0, {"n": 2}, 3), (12, 0, 1, {"n": 3}, 3)]
    try:
        out = loop.run_until_complete(worker._run_batch(0, tasks, None, 0, push, 3))
    finally:
        loop.close()
    assert [r[0] for r in out["results"]] == [10, 11, 12]
    assert [r[1] for r in out["results"]] == [3.0, 3.0, 3.0]  # each read the pushed table
    assert worker.executors[0].ran == [1, 3] and worker.executors[1].ran == [2]
    assert worker.next_seq == {0: 2, 1: 1}
    rows, delta = out["inline"]["x"]
    assert rows.tolist() == [0, 1]
    np.testing.assert_array_equal(delta, [6.0, 6.0])
    assert out["stats"]["hits"] == 3 and out["stats"]["misses"] == 0
    assert out["full_reads"] == ["x"]


def test_overlapping_batches_keep_each_executors_order() -> None:
    """Batch B (executor 0's seq 1) starts before batch A (its seq 0) has run: B's task waits for its
    turn and is woken when A's task ends (the async-actor mode, where batches overlap)."""
    worker, loop = _worker(2)
    push = {"x": np.zeros(2)}
    batch_a = [(1, 1, 0, {"n": 1, "pause": True}, 0), (2, 0, 0, {"n": 2}, 0)]
    batch_b = [(3, 0, 1, {"n": 3}, 0)]

    async def both() -> list[Any]:
        b = asyncio.ensure_future(worker._run_batch(1, batch_b, None, 0, push, 0))
        await asyncio.sleep(0)  # B runs first and waits on executor 0's turn
        assert worker._waiters == 1
        a = await worker._run_batch(0, batch_a, None, 0, push, 0)
        return [a, await b]

    try:
        a, b = loop.run_until_complete(both())
    finally:
        loop.close()
    assert worker.executors[0].ran == [2, 3]
    assert worker._waiters == 0
    assert [r[0] for r in a["results"]] == [1, 2] and [r[0] for r in b["results"]] == [3]


def test_release_waits_for_the_executors_last_task() -> None:
    worker, loop = _worker(1)
    push = {"x": np.zeros(2)}

    async def go() -> dict[str, Any]:
        release = asyncio.ensure_future(worker.release_executor(0, 2, send_input=False))
        await asyncio.sleep(0)
        assert 0 in worker.executors  # seq 0 and 1 have not run yet
        await worker._run_batch(0, [(1, 0, 0, {"n": 1}, 0), (2, 0, 1, {"n": 2}, 0)], None, 0, push, 0)
        return await release

    try:
        package = loop.run_until_complete(go())
    finally:
        loop.close()
    assert package["next_seq"] == 2 and 0 not in worker.executors
