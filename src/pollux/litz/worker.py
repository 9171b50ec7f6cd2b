"""Worker actors: many executors per worker, micro-tasks run as coroutines (thesis §4.4).

A worker receives *batches* of micro-tasks from the master (one message per worker per dispatch
round, not one per task: by default over the master's direct channel, `open_channel` and
`pollux.litz.channel`, otherwise as a `run_batch` Ray call). Each task runs as a coroutine on the
worker's event loop, so a task that waits on a PS read yields to the others (a batch whose tables
all came with it, so that no read waits, runs its tasks one after another). By default a worker
runs one batch at a time (without the channel as a threaded actor, `SequentialWorkerActor`);
otherwise batches overlap too. Over the channel, the Ray calls that add and release executors
run on the same event loop as the batches. Tasks of one executor run one at
a time in dispatch order (`seq`), which is also what makes moving an executor safe:
`release_executor` waits until the executor's last task sent here has run, then hands its state
(and, on scale-out, its input) on.

Under a memory budget (`set_memory_budget`, `RuntimeConfig.memory_budget_bytes`) the worker keeps
only some executors in memory and the rest on local disk (`pollux.litz.executor_memory`, thesis
§4.8): each task's executor is loaded before it runs, and the executors of the tasks sent here but
not started (`_queued`) tell the policy which to evict and which to load ahead. A batch's tasks then
run one at a time, those of resident executors first where the policy says so
(`pollux.litz.reordered_batch`).

All updates of a batch are summed in one update log and staged at the shards before the batch's
results go back to the master (`pollux.litz.worker_ps`, which also serves reads from the cache); the
master commits them (see `pollux.litz.ps`). A small log
(`RuntimeConfig.inline_update_bytes`) instead goes back with the results and reaches the shards
inside the master's next commit, which saves a round trip per batch.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from collections.abc import Awaitable
from typing import Any

import numpy as np
from ray.exceptions import RayError

from pollux.litz import channel
from pollux.litz.api import Application, Executor, LitzError
from pollux.litz.cache import UpdateLog
from pollux.litz.executor_memory import ExecutorMemory
from pollux.litz.records import Layout, TableMeta, TaskSpec, pack, unpack
from pollux.litz.reordered_batch import run_reordered
from pollux.litz.worker_ps import WorkerPS


class _TaskPS:
    """The PS as one micro-task sees it: cached reads at the task's version, logged updates."""

    def __init__(
        self,
        ps: WorkerPS,
        version: int,
        log: UpdateLog,
        stats: dict[str, float],
        min_commit: int,
    ) -> None:
        self._ps, self._version, self._log, self._stats = ps, version, log, stats
        self._min_commit = min_commit

    async def get(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        return await self._ps.read(table, rows, self._version, self._stats, self._min_commit)

    def update(self, table: str, delta: np.ndarray, rows: np.ndarray | None = None) -> None:
        self._log.add(table, delta, None if rows is None else np.asarray(rows, dtype=np.int64))


class _TaskContext:
    def __init__(self, executor_id: int, version: int, ps: _TaskPS) -> None:
        self._executor_id, self._version, self._ps = executor_id, version, ps

    @property
    def executor_id(self) -> int:
        return self._executor_id

    @property
    def version(self) -> int:
        return self._version

    @property
    def ps(self) -> _TaskPS:
        return self._ps


class LitzWorkerActor:
    """One worker; wrapped with ``ray.remote`` by the master: as an async actor (max_concurrency > 1)
    when `RuntimeConfig.sequential_workers` is off, otherwise inside `SequentialWorkerActor`."""

    def __init__(
        self,
        worker_id: int,
        app: Application,
        num_executors: int,
        tables: dict[str, TableMeta],
        layout: Layout,
        task_floor_s: float,
        inline_update_bytes: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.inline_update_bytes = inline_update_bytes
        self.app = app
        self.num_executors = num_executors
        self.tables = tables
        self.ps = WorkerPS(tables, layout)  # reads through the cache, staging at the shards
        self.task_floor_s = task_floor_s
        self.executors: dict[int, Executor] = {}
        self.next_seq: dict[int, int] = {}
        self._turns = asyncio.Condition()
        self._waiters = 0  # coroutines waiting on `_turns`
        self._node_clock = 0.0
        self._channel_server: asyncio.AbstractServer | None = None
        self.memory: ExecutorMemory | None = None  # out-of-core: only under a memory budget
        self._queued: dict[int, int] = {}  # task id -> executor of the tasks here not started

    # ------------------------------------------------------------------ plumbing
    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> int:
        return self.worker_id

    def set_layout(self, layout: Layout) -> None:
        self.ps.set_layout(layout)

    # ------------------------------------------------------------------ the master's channel
    async def open_channel(self, token: bytes, overlap: bool) -> tuple[str, int]:
        """Listen for the master's direct connection (`pollux.litz.channel`) on this node's IP;
        returns (host, port). Batches that come that way run like `run_batch` calls, one at a
        time in arrival order (with `overlap`, concurrently, as an async actor's calls would)."""
        import ray

        host = ray.util.get_node_ip_address()
        server = await asyncio.start_server(
            lambda r, w: channel.serve(r, w, token, self._channel_batch, overlap), host, 0
        )
        self._channel_server = server  # kept: the server lives as long as the actor
        addr = server.sockets[0].getsockname()
        return str(addr[0]), int(addr[1])

    async def watch(self) -> None:
        """Returns only when the actor dies (with an error): the master's way to notice a worker
        lost without its socket closing (a lost node)."""
        await asyncio.Event().wait()

    async def _channel_batch(self, message: bytes) -> bytes:
        """One batch from the channel: `run_batch`'s result with its batch id, or the error that
        stopped it (a lost shard: "lost"; the runtime's own: "litz"; anything else: "other")."""
        batch_id = -1
        try:
            batch_id, tasks, min_commit, push, push_version = unpack(message)
            out = await self._run_batch(batch_id, tasks, None, min_commit, push, push_version)
        except RayError as err:
            return pack({"batch_id": batch_id, "error": "lost", "message": str(err)})
        except Exception as err:
            kind = "litz" if isinstance(err, LitzError) else "other"
            return pack({"batch_id": batch_id, "error": kind, "message": f"{type(err).__name__}: {err}"})
        out["batch_id"] = batch_id
        return pack(out)

    # ------------------------------------------------------------------ memory budget
    async def set_memory_budget(self, budget: int | None, policy: str, spill_dir: str) -> None:
        """Keep the executors' accounted bytes within `budget` (None: no limit), evicting to
        `spill_dir` with `policy` ("litz" or "lru"); the first call adopts every executor hosted."""
        if self.memory is None:
            memory = ExecutorMemory(self.executors, self._shell, spill_dir, policy, None)
            memory.queue = lambda: list(self._queued.values())
            for e, ex in self.executors.items():  # no await in between: nothing arrives meanwhile
                memory.adopt(e, ex)
            self.memory = memory
        await self.memory.set_budget(budget)

    def _shell(self, executor_id: int) -> Executor:
        """A fresh instance of an executor, without input or state (what an evicted one leaves)."""
        return self.app.executor(executor_id, self.num_executors, self.app.config)

    def close_memory(self) -> None:
        """Remove this worker's spill files (the run ends)."""
        if self.memory is not None:
            self.memory.close()

    # ------------------------------------------------------------------ executors
    async def add_executor(self, executor_id: int, package: dict[str, Any]) -> int:
        """Host `executor_id`: its input from `package` (scale-out) or from storage, its state and
        the sequence number of the next task it will run. Returns bytes of state received."""
        if self.memory is None:
            ex = self._arrive(executor_id, package)
        else:
            # one arrival at a time, room made before it loads: Ray starts an async actor's calls
            # together, and every executor would otherwise load its input before any was evicted
            async with self.memory.arrivals:
                await self.memory.make_room_for_arrival()
                ex = self._arrive(executor_id, package)
                await self.memory.admit(executor_id, ex)
        async with self._turns:
            self.executors[executor_id] = ex
            self.next_seq[executor_id] = int(package.get("next_seq", 0))
            self._turns.notify_all()
        return int(package.get("state_bytes", 0))

    def _arrive(self, executor_id: int, package: dict[str, Any]) -> Executor:
        """A new instance of the executor with its input (from the package or storage) and state."""
        ex = self.app.executor(executor_id, self.num_executors, self.app.config)
        ex.set_input(package["input"] if package.get("has_input") else ex.load_input())
        if package.get("state") is not None:
            ex.set_state(package["state"])
        return ex

    async def release_executor(self, executor_id: int, expected_seq: int, send_input: bool) -> dict[str, Any]:
        """Wait for the executor's tasks sent here (seq < expected_seq) to run, then give it up."""
        # next_seq is set last when an executor arrives (after an out-of-core admit, which may wait)
        await self._wait_turn(lambda: self.next_seq.get(executor_id, -1) >= expected_seq)
        if self.memory is not None:  # read back from disk if it was evicted
            state, data = await self.memory.take(executor_id)
        ex = self.executors.pop(executor_id)
        seq = self.next_seq.pop(executor_id)
        if self.memory is None:
            state, data = ex.get_state(), ex.input
        return {
            "state": state,
            "state_bytes": len(pickle.dumps(state, protocol=5)) if state is not None else 0,
            "has_input": send_input,
            "input": data if send_input else None,
            "next_seq": seq,
        }

    async def collect_states(self) -> dict[int, tuple[Any, int]]:
        """{executor: (state, next seq)} of every hosted executor (for a consistent checkpoint);
        an evicted executor's state is read from disk."""
        if self.memory is None:
            return {e: (ex.get_state(), self.next_seq[e]) for e, ex in self.executors.items()}
        return {e: (await self.memory.state_of(e), self.next_seq[e]) for e in list(self.executors)}

    # ------------------------------------------------------------------ micro-tasks
    async def run_batch(self, payload: bytes, layout: Layout | None = None) -> bytes:
        """`_run_batch` on the master's `pack`-ed (batch_id, tasks, min_commit, push, push_version);
        returns its result `pack`-ed (see `pollux.litz.records.pack`)."""
        batch_id, tasks, min_commit, push, push_version = unpack(payload)
        return pack(await self._run_batch(batch_id, tasks, layout, min_commit, push, push_version))

    async def _run_batch(
        self,
        batch_id: int,
        tasks: list[TaskSpec],
        layout: Layout | None = None,
        min_commit: int = 0,
        push: dict[str, np.ndarray] | None = None,
        push_version: int = 0,
    ) -> dict[str, Any]:
        """Run `tasks` (cooperatively), stage their summed updates, return their results. Reads
        wait for the master's commit `min_commit` at the shards (the §4.3 guarantee). `push`:
        whole tables as of that commit (the master's mirror, `pollux.litz.mirror`), cached for
        `push_version` (the master's version, >= every task's here), so those reads hit."""
        if layout is not None:
            self.set_layout(layout)
        self.ps.take_push(push, push_version)
        log = UpdateLog(self.tables)
        stats = {"hits": 0.0, "misses": 0.0, "ps_wait_s": 0.0}
        start = time.perf_counter()
        if self.memory is not None:
            try:
                results = await self._run_tasks(tasks, log, stats, min_commit, push)
            finally:
                for t in tasks:
                    self._queued.pop(t[0], None)
        else:
            results = await self._run_tasks(tasks, log, stats, min_commit, push)
        stats["run_s"] = time.perf_counter() - start
        out = await self._finish_batch(batch_id, log, stats, start, results)
        if self.memory is not None:
            out["ooc"] = self.memory.drain_stats()
        return out

    async def _run_tasks(
        self,
        tasks: list[TaskSpec],
        log: UpdateLog,
        stats: dict[str, float],
        min_commit: int,
        push: dict[str, np.ndarray] | None,
    ) -> list[Any]:
        """Run a batch's tasks, in order or cooperatively (see `_run_batch`)."""
        if self.memory is not None:
            # Under a budget, one task at a time: tasks overlapping their PS reads would each pin
            # their executor in memory at once, however many there are.
            order = self.memory.policy.run_order([t[1] for t in tasks], self.memory.resident)
            self._queued.update((tasks[i][0], tasks[i][1]) for i in order)
            self.memory.kick()  # load ahead what the batch needs first
            if order != sorted(order):

                def run_one(task: TaskSpec, task_log: UpdateLog) -> Awaitable[Any]:
                    return self._run_one(task, task_log, stats, min_commit)

                return await run_reordered(tasks, order, self.tables, log, run_one)
            return [await self._run_one(t, log, stats, min_commit) for t in tasks]
        if len(tasks) == 1 or self._reads_all_local(push):
            # In order, without an event-loop task each: nothing to overlap when every read hits
            # the pushed tables (with the lock-free turn in `_run_one`, ~11 of the ~29 µs a task
            # used to cost in the over-partitioning benchmark's batches).
            return [await self._run_one(t, log, stats, min_commit) for t in tasks]
        # cooperatively: a task waiting on a shard read yields to the others
        return list(await asyncio.gather(*[self._run_one(t, log, stats, min_commit) for t in tasks]))

    async def _finish_batch(
        self, batch_id: int, log: UpdateLog, stats: dict[str, float], start: float, results: list[Any]
    ) -> dict[str, Any]:
        """Stage the batch's summed updates (or keep them inline) and build its answer."""
        drained = log.drain()
        key = (self.worker_id, batch_id)
        answer = {"results": results, "stats": stats, "worker": self.worker_id,
                  "full_reads": sorted(self.ps.full_reads)}
        nbytes = sum(rows.nbytes + delta.nbytes for rows, delta in drained.values())
        if drained and nbytes <= self.inline_update_bytes:
            # small: back with the results; the master's next commit carries it to the shards
            answer.update(key=key, inline=drained)
        else:
            staged = await self.ps.stage(key, drained)
            answer.update(key=key if staged else None, inline=None, staged_tables=sorted(drained))
        stats["flush_s"] = time.perf_counter() - start - stats["run_s"]
        return answer

    def _reads_all_local(self, push: dict[str, np.ndarray] | None) -> bool:
        """Every table came with the batch (so every read hits) and no node floor paces tasks."""
        return push is not None and self.task_floor_s <= 0 and len(push) == len(self.tables)

    async def _wait_turn(self, predicate: Any) -> None:
        """Wait on `_turns` until `predicate()`, counted in `_waiters` so that a task that ends
        with nobody waiting need not take the lock to notify."""
        async with self._turns:
            self._waiters += 1
            try:
                await self._turns.wait_for(predicate)
            finally:
                self._waiters -= 1

    async def _run_one(
        self, task: TaskSpec, log: UpdateLog, stats: dict[str, float], min_commit: int
    ) -> tuple[int, Any, str | None]:
        task_id, eid, seq, args, version = task
        if self.next_seq.get(eid, -1) != seq:  # not this task's turn yet
            await self._wait_turn(lambda: self.next_seq.get(eid, -1) == seq)
        if self.memory is not None:
            self._queued.pop(task_id, None)
            await self.memory.ensure(eid)  # loaded back if it was evicted; pinned while it runs
        ex = self.executors[eid]
        task_stats = {"hits": 0.0, "misses": 0.0, "ps_wait_s": 0.0}
        ctx = _TaskContext(eid, version, _TaskPS(self.ps, version, log, task_stats, min_commit))
        start = time.perf_counter()
        value: Any = None
        error: str | None = None
        try:
            value = await ex.run_task(ctx, args)
        except RayError:  # a lost shard, not the application's fault: the master recovers
            raise
        except Exception as exc:  # the application's own error: reported to the master, named
            error = f"executor {eid}, task {task_id} (args {args!r}): {type(exc).__name__}: {exc}"
        finally:
            if self.memory is not None:
                await self.memory.done(eid)
            if self.task_floor_s > 0:
                # the emulated node runs one task per floor period: reserve the next slot on its
                # clock and sleep until the slot ends (deadlines, so sleep overshoots do not add up)
                now = time.perf_counter()
                compute = now - start - task_stats["ps_wait_s"]
                self._node_clock = max(self._node_clock, start) + max(self.task_floor_s, compute)
                await asyncio.sleep(max(0.0, self._node_clock - now))
            for k, v in task_stats.items():
                stats[k] += v
            self.next_seq[eid] = seq + 1  # one event loop: no lock needed to set it
            if self._waiters:
                async with self._turns:
                    self._turns.notify_all()
        return task_id, value, error


class SequentialWorkerActor:
    """A worker as a threaded Ray actor that runs one call at a time (`RuntimeConfig.
    sequential_workers`): each call runs the `LitzWorkerActor` coroutine to completion on the
    worker's own event loop, so a batch's micro-tasks still overlap the PS reads they wait on, but a
    batch starts only when the previous call has returned.

    Why: Ray's async-actor path (a call handed to the actor's event-loop thread and its result
    handed back) costs more CPU per call than a threaded actor's: on the 2-core VM two round trips
    took 1.6 ms against 1.34 ms, and a synchronous MLR iteration 2.6 against 2.33 ms. Calls from the
    master run in the order it sent them, which is all the executor order needs: a batch's tasks
    follow every earlier batch's, `add_executor` precedes the batches that use the executor, and
    `release_executor` follows those that did.
    """

    def __init__(self, *args: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._worker = LitzWorkerActor(*args)

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> int:
        return self._worker.worker_id

    def set_layout(self, layout: Layout) -> None:
        self._worker.set_layout(layout)

    def add_executor(self, executor_id: int, package: dict[str, Any]) -> int:
        return self._loop.run_until_complete(self._worker.add_executor(executor_id, package))

    def release_executor(self, executor_id: int, expected_seq: int, send_input: bool) -> dict[str, Any]:
        return self._loop.run_until_complete(
            self._worker.release_executor(executor_id, expected_seq, send_input)
        )

    def collect_states(self) -> dict[int, tuple[Any, int]]:
        return self._loop.run_until_complete(self._worker.collect_states())

    def set_memory_budget(self, budget: int | None, policy: str, spill_dir: str) -> None:
        self._loop.run_until_complete(self._worker.set_memory_budget(budget, policy, spill_dir))

    def close_memory(self) -> None:
        self._worker.close_memory()

    def run_batch(self, payload: bytes, layout: Layout | None = None) -> bytes:
        return self._loop.run_until_complete(self._worker.run_batch(payload, layout))
