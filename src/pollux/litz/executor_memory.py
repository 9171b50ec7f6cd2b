"""A worker's executors under a memory budget: evict to local disk, reload before the next task.

Thesis §4.8: when the executors of a worker would take more memory than its budget, whole
executors are serialised with the application's own function (`Executor.get_state`, plus the input
they loaded) and written to local disk, and an executor is loaded back before its next task. Python
cannot trap allocations as the thesis's C++ runtime does, so the budget is kept by *accounting*: an
executor's footprint is the size of its serialised state and input (`pollux.litz.spill.measure`),
measured when it arrives and again after each of its tasks (state may grow or shrink), and the
worker keeps the sum of the resident executors' footprints within the budget.

Which executor goes, and which is loaded ahead of its task, is the policy's choice
(`pollux.litz.out_of_core`); this module does the I/O and the accounting:

* one I/O job at a time, on one background thread (one disk): evict the victims (write what is not
  already on disk: an executor's input once, its state when a task ran since it was last written),
  drop them, then read the executor to load. The victims' bytes leave the account when the job is
  planned and the loaded executor's enter it, so the account never exceeds the budget: the job
  frees the victims before it reads;
* a task's executor is made resident before it runs (`ensure`: waits for a load ahead in flight or
  loads it now), and pinned while it runs (`done` unpins it);
* loads ahead (`kick`) are driven from the event loop at every task boundary, without waiting: the
  thread reads the next executor while the current task computes.

Executors arriving (placed at the start, moved in) come one at a time, room made for each before
it loads its input (`make_room_for_arrival`): Ray starts an async actor's calls together, and
every executor would otherwise load before any was evicted. Loads read into memory maps of their
own (`pollux.litz.spill`), given back to the system when the executor is evicted.

An evicted executor stays in the worker's table as a *shell* (a fresh instance without input or
state), so that the worker's bookkeeping (sequence numbers, moves) is unchanged; its real state is
read back from disk for a move (`take`) or a checkpoint (`state_of`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pollux.litz.api import Executor
from pollux.litz.out_of_core import EvictionPolicy, MemoryView, make_policy
from pollux.litz.spill import SpillStore, measure

__all__ = ["ExecutorMemory"]

#: Stands for "already on disk, nothing to write" in an eviction.
_SKIP = object()

#: One eviction: (executor, state or _SKIP, input or _SKIP).
_Eviction = tuple[int, Any, Any]


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
        return trim
    except (OSError, AttributeError):
        return None


#: Gives the free pages of the C heap back to the system (glibc walks every arena). Why: an
#: executor that loaded its input itself (`load_input`, at placement) holds arrays from malloc, and
#: glibc keeps freed large blocks in its heap once it has freed one; without this, a K-means worker
#: under a budget of half its executors' bytes kept ~40 MB more resident than the budget allowed.
_TRIM = _malloc_trim()


def _io_job(store: SpillStore, evictions: list[_Eviction], load: int | None) -> tuple[int, Any]:
    """On the I/O thread: write and drop the victims, then read `load` (state, input, bytes)."""
    written = 0
    while evictions:
        executor_id, state, data = evictions.pop()  # popped: the victim's memory goes with it
        if state is not _SKIP:
            written += store.write(executor_id, "state", state)
        if data is not _SKIP:
            written += store.write(executor_id, "input", data)
        del state, data
        if _TRIM is not None:
            _TRIM(0)
    if load is None:
        return written, None
    state, read_state = store.read(load, "state")
    data, read_input = store.read(load, "input")
    return written, (state, data, read_state + read_input)


class ExecutorMemory:
    """The out-of-core side of one worker; see the module docstring."""

    def __init__(
        self,
        executors: dict[int, Executor],
        make_shell: Callable[[int], Executor],
        folder: str,
        policy: str = "litz",
        budget: float | None = None,
    ) -> None:
        self.executors = executors  # the worker's own table: evicted executors become shells here
        self.make_shell = make_shell
        self.store = SpillStore(folder)
        self.policy: EvictionPolicy = make_policy(policy)
        self.budget = math.inf if budget is None else float(budget)
        self.footprint: dict[int, int] = {}
        self.input_bytes: dict[int, int] = {}
        self.resident: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.dirty: set[int] = set()  # state changed since last written (or never written)
        self.input_on_disk: set[int] = set()
        self.busy: set[int] = set()  # running a task: never evicted
        self.queue: Callable[[], list[int]] = list  # the worker's unstarted tasks' executors
        self.used = 0
        self.lock = asyncio.Lock()
        self.arrivals = asyncio.Lock()  # executors arriving (placed, moved in) come one at a time
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="litz-spill")
        self._job: Future[tuple[int, Any]] | None = None
        self._job_load: int | None = None
        self._job_prefetch = False
        self.counters = {
            "evictions": 0,
            "reloads": 0,
            "prefetches": 0,
            "bytes_written": 0,
            "bytes_read": 0,
            "wait_s": 0.0,
        }
        self.peak = 0

    # ------------------------------------------------------------------ accounting
    def view(self, pinned: set[int] | None = None) -> MemoryView:
        pins = set(self.busy) | (pinned or set())
        if self._job_load is not None:
            pins.add(self._job_load)
        return MemoryView(
            budget=self.budget,
            used=self.used,
            footprint=self.footprint,
            resident=list(self.resident),
            # tasks of an executor still on its way here (a move) wait for it, not for a load
            queue=[e for e in self.queue() if e in self.footprint],
            pinned=frozenset(pins),
        )

    def _account(self, delta: int) -> None:
        self.used += delta
        self.peak = max(self.peak, self.used)

    def _measure(self, executor_id: int, ex: Executor) -> int:
        """Footprint of a resident executor now (its input measured once: it never changes)."""
        if executor_id not in self.input_bytes:
            self.input_bytes[executor_id] = measure(ex.input)
        return self.input_bytes[executor_id] + measure(ex.get_state())

    def drain_stats(self) -> dict[str, float]:
        """The counters since the last call, and the peak of accounted bytes so far."""
        out: dict[str, float] = dict(self.counters)
        for k in self.counters:
            self.counters[k] = 0
        out["peak_bytes"] = self.peak
        return out

    # ------------------------------------------------------------------ I/O jobs
    def _submit(self, victims: list[int], load: int | None, prefetch: bool) -> None:
        """Start one I/O job: evict `victims`, then load `load` (no job may be in flight)."""
        evictions: list[_Eviction] = []
        for v in victims:
            ex = self.executors[v]
            on_disk = v not in self.dirty and self.store.has(v, "state")
            state = _SKIP if on_disk else ex.get_state()
            data = _SKIP if v in self.input_on_disk else ex.input
            evictions.append((v, state, data))
            self.input_on_disk.add(v)
            self.dirty.discard(v)
            self.executors[v] = self.make_shell(v)  # the job holds the only reference now
            del self.resident[v]
            self._account(-self.footprint[v])
            self.counters["evictions"] += 1
            del ex, state, data
        if load is not None:
            self._account(self.footprint[load])
        self._job = self._pool.submit(_io_job, self.store, evictions, load)
        self._job_load = load
        self._job_prefetch = prefetch

    def _install(self) -> None:
        """Take the finished job's result (raising its I/O error) and host what it loaded."""
        job, load, prefetch = self._job, self._job_load, self._job_prefetch
        assert job is not None
        self._job, self._job_load, self._job_prefetch = None, None, False
        written, loaded = job.result()
        self.counters["bytes_written"] += written
        if load is None or loaded is None:
            return
        state, data, nbytes = loaded
        ex = self.make_shell(load)
        ex.set_input(data)
        ex.set_state(state)
        self.executors[load] = ex
        self.resident[load] = None
        self.counters["reloads"] += 1
        self.counters["bytes_read"] += nbytes
        if prefetch:
            self.counters["prefetches"] += 1

    async def _settle(self) -> None:
        """Wait for the job in flight (a load ahead) and install it."""
        if self._job is not None:
            await asyncio.wrap_future(self._job)
            self._install()

    async def _run(self, victims: list[int], load: int | None) -> None:
        """Run one job to its end (the lock held, nothing in flight)."""
        if not victims and load is None:
            return
        self._submit(victims, load, prefetch=False)
        await self._settle()

    def kick(self) -> None:
        """Install a finished load ahead and start the next one the policy asks for (never waits)."""
        if self.lock.locked():
            return
        if self._job is not None:
            if not self._job.done():
                return
            self._install()
        plan = self.policy.prefetch(self.view())
        if plan is not None:
            load, victims = plan
            self._submit(victims, load, prefetch=True)

    # ------------------------------------------------------------------ the worker's calls
    def adopt(self, executor_id: int, ex: Executor) -> None:
        """Account an executor already in memory (a budget set while running), without making
        room: the caller then keeps the budget (`set_budget`)."""
        if executor_id in self.footprint:
            return
        self.footprint[executor_id] = self._measure(executor_id, ex)
        self.resident[executor_id] = None
        self.dirty.add(executor_id)
        self._account(self.footprint[executor_id])

    async def make_room_for_arrival(self) -> None:
        """Before an executor arrives (its size not yet known): make room for one as large as the
        largest hosted, so that loading it does not take the worker over its budget."""
        expected = max(self.footprint.values(), default=0)
        if self.used + expected <= self.budget:
            return
        async with self.lock:
            await self._settle()
            await self._run(self.policy.victims(self.view(), expected), None)

    async def admit(self, executor_id: int, ex: Executor) -> None:
        """Host an executor that arrived in memory (placed, moved in, restored): make room."""
        size = self._measure(executor_id, ex)
        async with self.lock:
            await self._settle()
            self.footprint[executor_id] = size
            self.input_on_disk.discard(executor_id)
            self.store.drop(executor_id)  # anything left from an earlier stay here is stale
            victims = self.policy.victims(self.view({executor_id}), size)
            await self._run(victims, None)
            self.executors[executor_id] = ex
            self.resident[executor_id] = None
            self.dirty.add(executor_id)
            self._account(size)

    async def ensure(self, executor_id: int) -> None:
        """Make the executor resident for its next task (loading it if it is not) and pin it."""
        if executor_id not in self.footprint:  # arrived while the budget was being set
            self.adopt(executor_id, self.executors[executor_id])
        if executor_id not in self.resident:
            start = time.perf_counter()
            async with self.lock:
                await self._settle()
                if executor_id not in self.resident:
                    need = self.footprint[executor_id]
                    victims = self.policy.victims(self.view({executor_id}), need)
                    await self._run(victims, executor_id)
            self.counters["wait_s"] += time.perf_counter() - start
        self.resident.move_to_end(executor_id)
        self.busy.add(executor_id)
        self.kick()

    async def done(self, executor_id: int) -> None:
        """The executor's task ended: unpin it, re-measure it, keep the budget, load ahead."""
        self.busy.discard(executor_id)
        ex = self.executors[executor_id]
        self.adopt(executor_id, ex)  # a no-op unless it arrived while the budget was being set
        self.dirty.add(executor_id)
        size = self._measure(executor_id, ex)
        self._account(size - self.footprint[executor_id])
        self.footprint[executor_id] = size
        if self.used > self.budget:
            await self._shrink()
        self.kick()

    async def _shrink(self) -> None:
        async with self.lock:
            await self._settle()
            if self.used > self.budget:
                await self._run(self.policy.victims(self.view(), 0), None)

    async def set_budget(self, budget: float | None) -> None:
        """A new budget (None: no limit); evicts at once down to a lower one."""
        self.budget = math.inf if budget is None else float(budget)
        await self._shrink()

    async def take(self, executor_id: int) -> tuple[Any, Any]:
        """(state, input) of an executor leaving this worker, read back from disk if evicted."""
        async with self.lock:
            await self._settle()
            if executor_id in self.resident:
                ex = self.executors[executor_id]
                state, data = ex.get_state(), ex.input
                del self.resident[executor_id]
                self._account(-self.footprint[executor_id])
            else:
                state, data = await self._read(executor_id)
            self.store.drop(executor_id)
            for table in (self.footprint, self.input_bytes):
                table.pop(executor_id, None)
            self.dirty.discard(executor_id)
            self.input_on_disk.discard(executor_id)
            return state, data

    async def state_of(self, executor_id: int) -> Any:
        """The executor's state (for a checkpoint), read from disk if evicted."""
        async with self.lock:
            await self._settle()
            if executor_id in self.resident:
                return self.executors[executor_id].get_state()
            loop = asyncio.get_running_loop()
            state, nbytes = await loop.run_in_executor(self._pool, self.store.read, executor_id, "state")
            self.counters["bytes_read"] += nbytes
            return state

    async def _read(self, executor_id: int) -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        state, n_state = await loop.run_in_executor(self._pool, self.store.read, executor_id, "state")
        data, n_input = await loop.run_in_executor(self._pool, self.store.read, executor_id, "input")
        self.counters["bytes_read"] += n_state + n_input
        return state, data

    def close(self) -> None:
        """Stop the I/O thread and remove the spill files."""
        self._pool.shutdown(wait=True)
        self.store.close()
