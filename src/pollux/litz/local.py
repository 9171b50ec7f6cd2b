"""The local Litz runtime: one process, one micro-task at a time, deterministic — the reference semantics.

`run_local(app, num_executors)` runs a Litz application without Ray. It exists for two reasons: fast
unit tests of applications, and a reference the distributed runtime (`pollux.litz.runtime`) is compared
with. Semantics, spelled out because the Ray runtime must give the same guarantees:

- The driver's `dispatch` appends the task to a queue, tagged with the master's *version* (the number
  of completions handled so far). Tasks run one at a time, in dispatch order (`order="fifo"`) or in a
  seeded random interleaving across executors that keeps each executor's own tasks in dispatch order
  (`order="random"`) — both are legal schedules of independent tasks.
- A task's `ps.update` calls are buffered (like a worker's update log) and applied, all at once, when
  the task completes; then the version is incremented and the driver's `handle_task_completion` sees
  the result (so tasks it dispatches carry the new version, never one shared with a task dispatched
  before this completion).
- Reads: with `reads="latest"` a task sees the PS as it is when it reads (every completed task's
  updates). With `reads="dispatch"` it sees the PS as it was when the task was dispatched — the
  stalest view §4.3 allows, and exactly what the Litz parameter cache serves: tasks dispatched at the
  same version share one snapshot. Either way a task dispatched after the driver saw A complete
  observes all of A's updates.
- Task arguments, results, executor state and driver state are passed through `pickle` (on by default),
  so an application that relies on sharing memory with the driver, or hands over something that cannot
  travel between Ray actors, fails here first.
- `migrate_every=k` moves one executor (round-robin) after every k completions: a fresh instance of the
  executor class gets the old one's pickled state and re-loads its input, as on a scale-in; the driver
  is rebuilt from its pickled `state_dict` at the same moment, as on a recovery. Results must not change.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pollux.litz.api import (
    Application,
    ApplicationError,
    Driver,
    Executor,
    LitzError,
    TableSpec,
    TaskResult,
)
from pollux.litz.records import RunSummary

Order = Literal["fifo", "random"]
Reads = Literal["latest", "dispatch"]


@dataclass
class LocalSummary(RunSummary):
    """What a local run returns: the Ray runtime's `RunSummary` (resizes, checkpoints and recoveries
    are always empty or zero here; one "worker", one "shard"), plus `migrations`."""

    num_workers: int = 1
    num_shards: int = 1
    migrations: int = 0


@dataclass
class _Task:
    """A dispatched micro-task: where it runs, its pickled arguments, the version it was tagged with."""

    seq: int
    executor_id: int
    args: Any  # pickled bytes when the run checks picklability, else the object itself
    version: int


class _Tables:
    """The parameter server's storage: named numpy tables, validated against their `TableSpec`s."""

    def __init__(self, specs: Sequence[TableSpec]) -> None:
        self.data: dict[str, np.ndarray] = {}
        for spec in specs:
            if spec.name in self.data:
                raise LitzError(f"Driver.tables(): table {spec.name!r} is declared twice")
            if spec.init is None:
                self.data[spec.name] = np.zeros(spec.shape, dtype=spec.dtype)
            else:
                self.data[spec.name] = np.array(spec.init, dtype=spec.dtype, copy=True)

    def table(self, name: str) -> np.ndarray:
        try:
            return self.data[name]
        except KeyError:
            raise LitzError(f"unknown PS table {name!r} (declared: {sorted(self.data)})") from None

    def read(self, name: str, rows: np.ndarray | None) -> np.ndarray:
        table = self.table(name)
        if rows is None:
            return table.copy()
        return table[_check_rows(name, table, rows)].copy()

    def apply(self, name: str, delta: np.ndarray, rows: np.ndarray | None) -> None:
        table = self.table(name)
        if rows is None:
            table += delta
        else:
            np.add.at(table, rows, delta)

    def snapshot(self) -> dict[str, np.ndarray]:
        return {name: t.copy() for name, t in self.data.items()}


def _check_rows(name: str, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    idx = np.asarray(rows)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise LitzError(f"PS table {name!r}: rows must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise LitzError(f"PS table {name!r}: rows out of range [0, {table.shape[0]})")
    return idx


class _TaskPS:
    """One task's view of the PS: reads from the live tables or a dispatch-time snapshot; buffered updates."""

    def __init__(self, tables: _Tables, snapshot: dict[str, np.ndarray] | None) -> None:
        self._tables = tables
        self._snapshot = snapshot
        self.log: list[tuple[str, np.ndarray, np.ndarray | None]] = []

    async def get(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        if self._snapshot is None:
            return self._tables.read(table, rows)
        self._tables.table(table)  # validates the name
        values = self._snapshot[table]
        return values.copy() if rows is None else values[_check_rows(table, values, rows)].copy()

    def update(self, table: str, delta: np.ndarray, rows: np.ndarray | None = None) -> None:
        target = self._tables.table(table)
        d = np.asarray(delta)
        if rows is None:
            expected: tuple[int, ...] = target.shape
            idx = None
        else:
            idx = _check_rows(table, target, rows).copy()
            expected = (idx.shape[0], *target.shape[1:])
        if d.shape != expected:
            raise LitzError(f"PS update of {table!r}: delta shape {d.shape}, expected {expected}")
        self.log.append((table, np.array(d, dtype=target.dtype, copy=True), idx))


@dataclass
class _TaskCtx:
    """`TaskContext` of one running task."""

    executor_id: int
    version: int
    ps: _TaskPS


class _DriverCtx:
    """`DriverContext` of the local master: queues dispatches, reads the live tables, collects reports."""

    def __init__(self, runtime: _LocalRuntime) -> None:
        self._rt = runtime

    @property
    def num_executors(self) -> int:
        return self._rt.num_executors

    @property
    def version(self) -> int:
        return self._rt.version

    def dispatch(self, executor_id: int, args: Any) -> None:
        self._rt.dispatch(executor_id, args)

    def ps_get(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        return self._rt.tables.read(table, rows)

    def report(self, **metrics: float) -> None:
        row: dict[str, Any] = {"t": time.perf_counter() - self._rt.t0, "version": self._rt.version}
        row.update(metrics)
        self._rt.metrics.append(row)
        if self._rt.on_progress is not None:
            self._rt.on_progress(row)

    def finish(self, result: Mapping[str, Any] | None = None) -> None:
        if self._rt.finished:
            return
        self._rt.finished = True
        self._rt.final = dict(result) if result is not None else {}


class _LocalRuntime:
    """The state of one local run (see the module docstring for the rules it implements)."""

    def __init__(
        self,
        app: Application,
        num_executors: int,
        seed: int,
        order: Order,
        reads: Reads,
        check_pickle: bool,
        migrate_every: int | None,
        on_progress: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        if num_executors < 1:
            raise LitzError(f"num_executors must be >= 1, got {num_executors}")
        if order not in ("fifo", "random"):
            raise LitzError(f"order must be 'fifo' or 'random', got {order!r}")
        if reads not in ("latest", "dispatch"):
            raise LitzError(f"reads must be 'latest' or 'dispatch', got {reads!r}")
        if migrate_every is not None and migrate_every < 1:
            raise LitzError(f"migrate_every must be >= 1 or None, got {migrate_every}")
        self.app = app
        self.num_executors = num_executors
        self.rng = np.random.default_rng(seed)
        self.order = order
        self.reads = reads
        self.check_pickle = check_pickle
        self.migrate_every = migrate_every
        self.on_progress = on_progress
        self.version = 0
        self.seq = 0
        self.queue: deque[_Task] = deque()
        self.snapshots: dict[int, tuple[dict[str, np.ndarray], int]] = {}  # version -> (tables, refs)
        self.metrics: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self.finished = False
        self.migrations = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.t0 = time.perf_counter()
        self.loop: asyncio.AbstractEventLoop
        self.driver: Driver = app.driver(num_executors, app.config)
        self.tables = _Tables(self.driver.tables())
        self.executors: list[Executor] = [self._new_executor(e, None) for e in range(num_executors)]
        self.ctx = _DriverCtx(self)

    # -- helpers -------------------------------------------------------------------------------
    def _blob(self, value: Any, what: str) -> bytes:
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # pickling errors come in many types
            raise LitzError(f"{self.app.name}: {what} is not picklable: {exc}") from exc

    def _roundtrip(self, value: Any, what: str) -> Any:
        return pickle.loads(self._blob(value, what)) if self.check_pickle else value

    def _new_executor(self, executor_id: int, state_blob: bytes | None) -> Executor:
        ex = self.app.executor(executor_id, self.num_executors, self.app.config)
        try:
            ex.set_input(ex.load_input())
            if state_blob is not None:
                ex.set_state(pickle.loads(state_blob))
        except Exception as exc:
            raise ApplicationError(
                f"{self.app.name}: executor {executor_id} failed to load its input or state: {exc!r}"
            ) from exc
        return ex

    # -- the master ----------------------------------------------------------------------------
    def dispatch(self, executor_id: int, args: Any) -> None:
        if not 0 <= int(executor_id) < self.num_executors:
            raise LitzError(f"dispatch: executor_id {executor_id} not in [0, {self.num_executors})")
        payload = self._blob(args, f"task args for executor {executor_id}") if self.check_pickle else args
        task = _Task(self.seq, int(executor_id), payload, self.version)
        self.seq += 1
        self.queue.append(task)
        if self.reads == "dispatch":
            snap = self.snapshots.get(self.version)
            if snap is None:
                self.snapshots[self.version] = (self.tables.snapshot(), 1)
                self.cache_misses += 1
            else:
                self.snapshots[self.version] = (snap[0], snap[1] + 1)
                self.cache_hits += 1

    def _args(self, task: _Task) -> Any:
        return pickle.loads(task.args) if self.check_pickle else task.args

    def _next_task(self) -> _Task:
        if self.order == "fifo" or len(self.queue) == 1:
            return self.queue.popleft()
        # Random interleaving across executors; each executor's own tasks stay in dispatch order.
        heads: dict[int, int] = {}
        for i, task in enumerate(self.queue):
            heads.setdefault(task.executor_id, i)
        choices = sorted(heads.values())
        pick = choices[int(self.rng.integers(len(choices)))]
        task = self.queue[pick]
        del self.queue[pick]
        return task

    def _take_snapshot(self, version: int) -> dict[str, np.ndarray] | None:
        if self.reads != "dispatch":
            return None
        tables, refs = self.snapshots[version]
        if refs <= 1:
            del self.snapshots[version]
        else:
            self.snapshots[version] = (tables, refs - 1)
        return tables

    def run_one(self, task: _Task) -> None:
        executor = self.executors[task.executor_id]
        args = self._args(task)
        ps = _TaskPS(self.tables, self._take_snapshot(task.version))
        ctx = _TaskCtx(task.executor_id, task.version, ps)
        try:
            value = self.loop.run_until_complete(executor.run_task(ctx, args))
        except LitzError:
            raise
        except Exception as exc:
            raise ApplicationError(
                f"{self.app.name}: executor {task.executor_id} raised in run_task"
                f"(args={args!r:.200}): {exc!r}"
            ) from exc
        value = self._roundtrip(value, f"result of executor {task.executor_id}")
        for name, delta, rows in ps.log:  # the task's update log, applied before the driver hears of it
            self.tables.apply(name, delta, rows)
        result = TaskResult(task.executor_id, self._args(task), value, task.version)
        # The version counts completions handled, *including* this one: a task the driver dispatches
        # now is tagged after A, so no value cached by a task dispatched before A's completion (tag
        # <= the old version) can serve it — that is what makes §4.3 hold with the cache.
        self.version += 1
        if not self.finished:  # after finish() the job only drains: updates land, the driver rests
            self.driver.handle_task_completion(self.ctx, result)
        if self.migrate_every is not None and self.version % self.migrate_every == 0:
            self._migrate()

    def _migrate(self) -> None:
        """Move one executor (round-robin) and rebuild the driver from its pickled state."""
        e = self.migrations % self.num_executors
        old = self.executors[e]
        state_blob = self._blob(old.get_state(), f"state of executor {e}")
        self.executors[e] = self._new_executor(e, state_blob)
        driver_blob = self._blob(self.driver.state_dict(), "driver state_dict()")
        driver = self.app.driver(self.num_executors, self.app.config)
        driver.load_state_dict(pickle.loads(driver_blob))
        self.driver = driver
        self.migrations += 1

    def run(self, max_tasks: int | None) -> LocalSummary:
        self.driver.dispatch_initial_tasks(self.ctx)
        done = 0
        self.loop = asyncio.new_event_loop()  # one loop for the run: a task is a coroutine, run to its end
        try:
            while self.queue:
                if max_tasks is not None and done >= max_tasks:
                    raise LitzError(f"{self.app.name}: more than max_tasks={max_tasks} tasks; stopping")
                self.run_one(self._next_task())
                done += 1
        finally:
            self.loop.close()
        if not self.finished:
            raise LitzError(
                f"{self.app.name}: no task is queued and the driver never called finish() "
                f"({done} tasks completed)"
            )
        return LocalSummary(
            wall_s=time.perf_counter() - self.t0,
            tasks_completed=done,
            metrics=self.metrics,
            final=self.final if self.final is not None else {},
            version=self.version,
            cache_hits=self.cache_hits,
            cache_misses=self.cache_misses,
            migrations=self.migrations,
        )


def run_local(
    app: Application,
    num_executors: int,
    seed: int = 0,
    staleness_order: Order = "fifo",
    *,
    reads: Reads = "latest",
    check_pickle: bool = True,
    migrate_every: int | None = None,
    max_tasks: int | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> LocalSummary:
    """Run `app` to completion in this process with `num_executors` executors; see the module docstring.

    `staleness_order` picks the order of queued independent tasks ("fifo" or a "random" interleaving
    seeded by `seed`); `reads` whether tasks read the live PS or their dispatch-time snapshot. After
    `finish()` the tasks still queued run and their updates are applied, but the driver hears of no
    more completions (the job drains, as on the Ray runtime); a run whose queue empties without
    `finish()` is an error, as is one longer than `max_tasks` tasks.
    """
    runtime = _LocalRuntime(
        app, num_executors, seed, staleness_order, reads, check_pickle, migrate_every, on_progress
    )
    return runtime.run(max_tasks)
