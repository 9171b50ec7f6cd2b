"""Out-of-core execution (thesis §4.8) without Ray: the policies, the spill files, a worker's memory.

The policies are pure (`pollux.litz.out_of_core`): checked on hand-made views and on a replay of an
iterative schedule. The spill store and `ExecutorMemory` run on a temporary folder; the worker's
out-of-core path runs in process, as `test_litz_worker_unit` runs the worker.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest

from pollux.litz.api import Application, Driver, Executor, TableSpec, TaskContext
from pollux.litz.executor_memory import ExecutorMemory
from pollux.litz.out_of_core import LitzPolicy, LruPolicy, MemoryView, make_policy
from pollux.litz.records import Layout, RunSummary, RuntimeConfig, TableMeta
from pollux.litz.spill import SpillStore, measure
from pollux.litz.worker import LitzWorkerActor


def _view(resident: list[int], queue: list[int], budget: float = 30, pinned: set[int] | None = None,
          sizes: dict[int, int] | None = None) -> MemoryView:
    footprint = sizes or dict.fromkeys(range(10), 10)
    used = sum(footprint[e] for e in resident)
    return MemoryView(budget, used, footprint, resident, queue, frozenset(pinned or ()))


# ---------------------------------------------------------------------------------------- policies
def test_lru_evicts_the_least_recently_used_unpinned_executor() -> None:
    view = _view([3, 1, 2], queue=[3], pinned={3})
    assert LruPolicy().victims(view, 10) == [1]
    assert LruPolicy().victims(view, 20) == [1, 2]
    assert LruPolicy().prefetch(view) is None


def test_litz_evicts_idle_executors_first_most_recent_first_then_the_furthest_queued() -> None:
    # resident, least recent first: 0, 1, 2, 3; queue: 3 next, then 0; 1 and 2 have no queued task
    view = _view([0, 1, 2, 3], queue=[3, 0], budget=40)
    assert LitzPolicy().victims(view, 10) == [2]            # idle, and used more recently than 1
    assert LitzPolicy().victims(view, 30) == [2, 1, 0]      # then the furthest queued: 0 (after 3)
    assert LitzPolicy().victims(view, 50) == [2, 1, 0, 3]   # not enough even then: every candidate
    pinned = _view([0, 1, 2, 3], queue=[3, 0], budget=40, pinned={2})
    assert LitzPolicy().victims(pinned, 10) == [1]


def test_litz_prefetches_the_next_missing_executor_evicting_only_what_is_needed_later() -> None:
    policy = LitzPolicy()
    # 4 is next after 0; room for it by evicting 2 (no queued task)
    assert policy.prefetch(_view([0, 2, 3], queue=[0, 4, 3])) == (4, [2])
    # room left in the budget: nothing to evict
    assert policy.prefetch(_view([0, 3], queue=[0, 4, 3])) == (4, [])
    # every resident executor is needed before 4: loading it early would cost a reload sooner
    assert policy.prefetch(_view([0, 1, 3], queue=[0, 1, 3, 4])) is None
    # everything queued is resident: nothing to do
    assert policy.prefetch(_view([0, 1], queue=[1, 0])) is None


def test_make_policy_names_the_field_for_an_unknown_policy() -> None:
    assert make_policy("lru").name == "lru"
    with pytest.raises(ValueError, match="out_of_core_policy"):
        make_policy("fifo")
    with pytest.raises(ValueError, match="out_of_core_policy"):
        RuntimeConfig(out_of_core_policy="fifo")
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        RuntimeConfig(memory_budget_bytes=-1)


def _replay(policy: Any, executors: int, fits: int, iterations: int) -> tuple[int, int]:
    """(loads, largest number resident) of a worker running one task per executor per iteration,
    each iteration one batch in the policy's run order; loads ahead happen between tasks, as a
    worker's do."""
    resident: OrderedDict[int, None] = OrderedDict()
    sizes = dict.fromkeys(range(executors), 1)
    loads = peak = 0

    def view(queue: list[int], pinned: set[int]) -> MemoryView:
        return MemoryView(fits, len(resident), sizes, list(resident), queue, frozenset(pinned))

    for _ in range(iterations):
        dispatched = list(range(executors))
        batch = [dispatched[i] for i in policy.run_order(dispatched, resident)]
        for pos, e in enumerate(batch):
            queue = batch[pos + 1:]
            if e not in resident:
                for v in policy.victims(view(queue, {e}), 1):
                    del resident[v]
                resident[e] = None
                loads += 1
            resident.move_to_end(e)
            plan = policy.prefetch(view(queue, {e}))
            if plan is not None:
                for v in plan[1]:
                    del resident[v]
                resident[plan[0]] = None
                loads += 1
            peak = max(peak, len(resident))
    return loads, peak


def test_on_an_iterative_schedule_litz_loads_e_minus_b_per_iteration_and_lru_every_task() -> None:
    lru, lru_peak = _replay(LruPolicy(), executors=8, fits=4, iterations=10)
    litz, litz_peak = _replay(LitzPolicy(), executors=8, fits=4, iterations=10)
    assert lru == 80                      # LRU on a loop larger than memory: every task misses
    assert litz == 8 + 9 * (8 - 4)        # the first fill, then only the E - B that cannot fit
    assert lru_peak <= 4 and litz_peak <= 4


def test_litz_runs_resident_executors_first_keeping_each_executors_order() -> None:
    executors = [0, 1, 2, 0, 3, 1]
    order = LitzPolicy().run_order(executors, resident={1, 3})
    assert [executors[i] for i in order] == [1, 3, 1, 0, 2, 0]
    assert order == [1, 4, 5, 0, 2, 3]    # executor 1's tasks (1, 5) and 0's (0, 3) in their order
    assert LruPolicy().run_order(executors, resident={1, 3}) == list(range(6))


# ---------------------------------------------------------------------------------------- spill files
def test_spill_round_trip_keeps_arrays_and_objects_and_counts_bytes(tmp_path: Any) -> None:
    store = SpillStore(tmp_path / "w0")
    state = {"a": np.arange(1000, dtype=np.float32).reshape(10, 100), "n": 3, "words": ["x", "y"]}
    written = store.write(5, "state", state)
    assert written == measure(state) and written >= 4000
    back, read = store.read(5, "state")
    assert read == written and back["n"] == 3 and back["words"] == ["x", "y"]
    np.testing.assert_array_equal(back["a"], state["a"])
    back["a"][0, 0] = -1.0  # a fresh, writable array
    assert store.has(5, "state") and not store.has(5, "input")
    with pytest.raises(FileNotFoundError, match="executor 6"):
        store.read(6, "state")
    store.drop(5)
    assert not store.has(5, "state")
    store.close()
    assert not (tmp_path / "w0").exists()


# ---------------------------------------------------------------------------------------- memory
class _Block(Executor):
    """Input: 1000 float64 (8 KB); state: a counter array changed by every task."""

    def load_input(self) -> Any:
        return np.full(1000, float(self.executor_id))

    def get_state(self) -> Any:
        return {"count": getattr(self, "count", np.zeros(1))}

    def set_state(self, state: Any) -> None:
        self.count = state["count"]

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        self.count = self.get_state()["count"] + 1
        x = await ctx.ps.get("x")
        ctx.ps.update("x", np.full(2, float(self.input[0])))
        return float(self.count[0]) + 0.0 * float(x.sum())


def _memory(tmp_path: Any, budget: float, policy: str = "litz") -> tuple[ExecutorMemory, dict[int, Executor]]:
    executors: dict[int, Executor] = {}
    memory = ExecutorMemory(executors, lambda e: _Block(e, 4, {}), str(tmp_path / "spill"), policy, budget)
    return memory, executors


def test_memory_keeps_the_budget_and_reloads_evicted_state_intact(tmp_path: Any) -> None:
    one = measure(np.zeros(1000)) + measure({"count": np.zeros(1)})
    memory, executors = _memory(tmp_path, budget=2 * one)

    async def go() -> None:
        for e in range(4):
            ex = _Block(e, 4, {})
            ex.set_input(ex.load_input())
            ex.set_state({"count": np.full(1, 10.0 * e)})
            await memory.admit(e, ex)
            executors[e] = ex
            assert memory.used <= memory.budget
        assert len(memory.resident) == 2 and memory.counters["evictions"] == 2
        for e in (0, 1, 2, 3, 0):
            await memory.ensure(e)
            ex = executors[e]
            assert ex.input[0] == float(e)           # its own input back from disk
            ex.set_state({"count": ex.get_state()["count"] + 1})
            await memory.done(e)
            assert memory.used <= memory.budget
        await memory._settle()                        # a load ahead may still be in flight
        assert float((await memory.state_of(1))["count"][0]) == 11.0
        assert float((await memory.state_of(0))["count"][0]) == 2.0
        state, data = await memory.take(3)
        assert float(state["count"][0]) == 31.0 and data[0] == 3.0
        await memory.set_budget(one)                  # a lower budget evicts at once
        assert memory.used <= one and len(memory.resident) <= 1
        await memory.set_budget(None)
        assert math.isinf(memory.budget)

    asyncio.run(go())
    stats = memory.drain_stats()
    assert stats["reloads"] >= 3 and stats["bytes_read"] > 0 and stats["bytes_written"] > 0
    assert stats["peak_bytes"] <= 2 * one
    assert memory.drain_stats()["reloads"] == 0       # drained
    memory.close()
    assert not (tmp_path / "spill").exists()


def test_a_clean_executor_is_evicted_without_writing_its_state_again(tmp_path: Any) -> None:
    one = measure(np.zeros(1000)) + measure({"count": np.zeros(1)})
    memory, executors = _memory(tmp_path, budget=one, policy="lru")

    async def go() -> None:
        for e in range(2):
            ex = _Block(e, 4, {})
            ex.set_input(ex.load_input())
            await memory.admit(e, ex)
            executors[e] = ex
        written = memory.counters["bytes_written"]   # executor 0's input and state
        await memory.ensure(0)                        # loads 0, evicts 1 (input + state written)
        await memory.done(0)                          # 0 ran: dirty again
        after_one = memory.counters["bytes_written"]
        await memory.ensure(1)                        # evicts 0: its state only (input on disk)
        await memory.done(1)
        state_bytes = measure({"count": np.zeros(1)})
        assert memory.counters["bytes_written"] - after_one == state_bytes
        assert written > 0

    asyncio.run(go())
    memory.close()


# ---------------------------------------------------------------------------------------- worker
class _NoDriver(Driver):
    def tables(self) -> list[TableSpec]:
        return [TableSpec("x", (2,))]

    def dispatch_initial_tasks(self, ctx: Any) -> None: ...

    def handle_task_completion(self, ctx: Any, result: Any) -> None: ...


def _worker(executors: int) -> LitzWorkerActor:
    app = Application("block", _NoDriver, _Block, {})
    tables = {"x": TableMeta("x", (2,), "float64")}
    layout = Layout(0, {"x": np.zeros(2, dtype=np.int64)}, [None])  # no shard: every read must hit
    return LitzWorkerActor(0, app, executors, tables, layout, 0.0, 1 << 20)


@pytest.mark.parametrize("policy", ["litz", "lru"])
def test_worker_under_a_budget_gives_the_results_of_one_without(tmp_path: Any, policy: str) -> None:
    one = measure(np.zeros(1000)) + measure({"count": np.zeros(1)})
    push = {"x": np.zeros(2)}
    tasks = [(4 * i + e, e, i, {}, 0) for i in range(3) for e in range(4)]  # 3 iterations of 4

    async def run(budget: float | None) -> tuple[dict[str, Any], LitzWorkerActor]:
        worker = _worker(4)
        if budget is not None:
            await worker.set_memory_budget(int(budget), policy, str(tmp_path / policy))
        for e in range(4):
            await worker.add_executor(e, {})
        out = await worker._run_batch(0, tasks, None, 0, push, 0)
        states = await worker.collect_states()
        out["counts"] = {e: float(s["count"][0]) for e, (s, _) in states.items()}
        out["package"] = await worker.release_executor(1, 3, send_input=True)
        return out, worker

    plain, _ = asyncio.run(run(None))
    ooc, worker = asyncio.run(run(2 * one))
    assert [r[1] for r in ooc["results"]] == [r[1] for r in plain["results"]]
    np.testing.assert_array_equal(ooc["inline"]["x"][1], plain["inline"]["x"][1])
    assert ooc["counts"] == plain["counts"] == {0: 3.0, 1: 3.0, 2: 3.0, 3: 3.0}
    assert float(ooc["package"]["state"]["count"][0]) == 3.0 and ooc["package"]["input"][0] == 1.0
    stats = ooc["ooc"]
    assert stats["evictions"] > 0 and stats["reloads"] > 0 and stats["peak_bytes"] <= 2 * one
    if policy == "lru":
        assert stats["prefetches"] == 0 and stats["reloads"] == 12   # every task a miss
    else:
        assert stats["reloads"] < 12
    summary = RunSummary()
    summary.add_out_of_core(stats)
    assert summary.ooc_reloads == stats["reloads"] and summary.ooc_peak_bytes == stats["peak_bytes"]
    worker.close_memory()
    assert not (tmp_path / policy).exists()


def test_a_budget_set_while_running_adopts_the_executors_and_evicts_down_to_it(tmp_path: Any) -> None:
    one = measure(np.zeros(1000)) + measure({"count": np.zeros(1)})
    push = {"x": np.zeros(2)}

    async def go() -> tuple[LitzWorkerActor, dict[str, Any]]:
        worker = _worker(4)
        for e in range(4):
            await worker.add_executor(e, {})
        await worker._run_batch(0, [(e, e, 0, {}, 0) for e in range(4)], None, 0, push, 0)
        await worker.set_memory_budget(2 * one, "litz", str(tmp_path / "late"))
        assert worker.memory is not None and worker.memory.used <= 2 * one
        out = await worker._run_batch(1, [(4 + e, e, 1, {}, 0) for e in range(4)], None, 0, push, 0)
        return worker, out

    worker, out = asyncio.run(go())
    assert [r[1] for r in out["results"]] == [2.0, 2.0, 2.0, 2.0]   # each executor's second task
    assert out["ooc"]["evictions"] >= 2 and out["ooc"]["peak_bytes"] <= 4 * one
    worker.close_memory()
