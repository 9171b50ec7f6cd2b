"""The Litz master: holds the driver, sends micro-tasks to workers, handles their completions.

Runs in the calling process (`LitzRuntime.run()`); one thread owns every piece of state here (other
threads talk to `LitzRuntime`, which queues their requests for this thread). Per dispatch round the
master commits the flush keys of every completion handled so far — without waiting: the batches it
sends carry the commit number, and shards hold reads until that commit is applied — so the tasks it
sends next see those updates (§4.3); it sends one batch per worker. Small update logs came back
with their results and ride inside the commit (`RuntimeConfig.inline_update_bytes`). Because
updates become visible only at a commit, and commits happen only when the driver sends new work or
reads the PS, a driver at staleness 0 computes the same thing whatever the number of workers and
the timing. Batches go to the workers and come back over each worker's direct channel
(`pollux.litz.channel`, `RuntimeConfig.direct_channel`), in flight under their batch id; a batch
that carries a new PS layout, and every batch without the channel, is a Ray call instead, in
flight under its ObjectRef.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError, RayTaskError

from pollux.litz.actors import wait_dead
from pollux.litz.api import Application, ApplicationError, LitzError, TaskResult
from pollux.litz.channel import ChannelClosed
from pollux.litz.commit_log import CommitLog
from pollux.litz.dispatch_queue import DispatchQueue, InFlight
from pollux.litz.membership import Membership
from pollux.litz.mirror import TableMirror
from pollux.litz.records import (
    Layout,
    RunSummary,
    RuntimeConfig,
    TableMeta,
    pack,
    unpack,
)
from pollux.litz.resizes import ResizesUnderWay
from pollux.litz.running_job import MasterView
from pollux.litz.shard_layout import ShardLayout
from pollux.litz.worker_links import ActorLost, WorkerLinks, raise_batch_error

#: Inline updates held back from the shards while every table travels with the batches: a commit is
#: sent once the logs handled since the last one reach this many bytes (one message per shard for
#: many iterations' keys, their updates summed per table; 1 MiB against 64 KiB: 2.12–2.22 against
#: 2.25–2.35 ms per synchronous MLR iteration, the shard's CPU a third). It bounds how far the
#: shards lag behind the mirror, not the message, which the sum keeps at one table's size.
DEFERRED_COMMIT_BYTES = 1 << 20


class _Context:
    """The `DriverContext` the driver's callbacks get."""

    def __init__(self, master: Master) -> None:
        self._m = master

    @property
    def num_executors(self) -> int:
        return self._m.cfg.num_executors

    @property
    def version(self) -> int:
        return self._m.queue.version

    def dispatch(self, executor_id: int, args: Any) -> None:
        if not 0 <= int(executor_id) < self._m.cfg.num_executors:
            raise LitzError(f"dispatch: executor_id {executor_id} outside [0, {self._m.cfg.num_executors})")
        self._m.queue.dispatch(int(executor_id), args)

    def ps_get(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        return self._m.ps_read(table, rows)

    def report(self, **metrics: float) -> None:
        m = self._m
        rec = {"t": time.monotonic() - m.t0, "version": m.queue.version, **metrics}
        m.summary.metrics.append(rec)
        if m.on_progress is not None:
            m.on_progress(dict(rec, workers=len(m.members.workers), shards=len(m.layout.shards)))

    def finish(self, result: Mapping[str, Any] | None = None) -> None:
        self._m.finished = True
        self._m.driver_finished = True
        self._m.summary.final = dict(result or {})


class Master:
    """State and loop of one run. `LitzRuntime` builds it, runs it and stops its actors."""

    def __init__(self, app: Application, cfg: RuntimeConfig) -> None:
        self.app, self.cfg = app, cfg
        self.driver = app.driver(cfg.num_executors, app.config)
        specs = list(self.driver.tables())
        if len({s.name for s in specs}) != len(specs):
            raise LitzError(f"{app.name}: table names repeat: {[s.name for s in specs]}")
        self.specs = {s.name: s for s in specs}
        self.tables = {s.name: TableMeta(s.name, tuple(int(d) for d in s.shape), s.dtype) for s in specs}
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        self.summary = RunSummary()
        self.ctx = _Context(self)
        self.t0 = time.monotonic()
        self.links = WorkerLinks(self)
        self.view = MasterView(self)  # what a fault-tolerance controller sees
        self.reset_run_state()
        self.members = Membership(app, cfg, self.tables, self.links, self.get)
        self.shards = ShardLayout(cfg, self.tables, self.get)
        self.resizes = ResizesUnderWay()  # worker and shard resizes begun, not yet done
        # no push under a fault-tolerance controller: the tasks' reads are then also what notices
        # a lost shard before another commit lands on the others (SCAR's partial recovery keeps
        # the surviving rows exactly as they were when the shard was lost)
        push_bytes = cfg.push_table_bytes if cfg.fault_tolerance is None else 0
        self.mirror = TableMirror(self.tables, push_bytes)
        self.push_tables: set[str] = set()  # tables tasks read whole (pushed with every batch)
        self.memory_budget = cfg.memory_budget_bytes  # per worker; None: no limit
        self.spill_root: str | None = None  # this run's spill folder, made when a budget is first set
        self.budget_calls: dict[int, Any] = {}  # worker -> its budget call, awaited before placing

    def reset_run_state(self) -> None:
        """Queues, commits and counters back to a run's start (a cut is then restored over them)."""
        self.queue = DispatchQueue(self.cfg.num_executors)  # micro-tasks from dispatch to completion
        self.commits = CommitLog(self, self.tables)  # flush keys on their way to the shards
        self.links.arrived.clear()  # channel results read, not yet handled
        self.finished = False  # no more dispatch: the driver finished, or the run is stopping
        self.driver_finished = False  # the driver called finish(): completions no longer go to it

    # ------------------------------------------------------------------ actors
    @property
    def layout(self) -> Layout:
        """The current PS layout (`ShardLayout`)."""
        return self.shards.layout

    def make_shards(self, num_shards: int, values: Mapping[str, np.ndarray] | None = None) -> None:
        """Create `num_shards` shards holding `values` (default: the tables' initial values)."""
        start: dict[str, np.ndarray] = {}
        for name, meta in self.tables.items():
            full = values[name] if values is not None else self.specs[name].init
            start[name] = (
                np.zeros(meta.shape, dtype=meta.dtype) if full is None else np.asarray(full, dtype=meta.dtype)
            )
        self.shards.create(num_shards, start, self.members.default_node, self.commits.commit_id)
        self.mirror.reset(self.layout.layout_id, start)

    def make_worker(self, node: str | None = None) -> int:
        """Create a worker (on Ray node `node` when given) that knows the current layout."""
        wid = self.members.make(node, self.layout)
        if self.memory_budget is not None:
            self._send_budget(wid)
        return wid

    # ------------------------------------------------------------------ out-of-core
    def _send_budget(self, wid: int) -> None:
        """Tell worker `wid` its memory budget (Ray orders it before the master's later calls)."""
        if self.spill_root is None:
            self.spill_root = tempfile.mkdtemp(prefix="litz-spill-", dir=self.cfg.spill_dir)
        folder = os.path.join(self.spill_root, f"worker-{wid}")
        worker = self.members.workers[wid]
        call = worker.set_memory_budget.remote(self.memory_budget, self.cfg.out_of_core_policy, folder)
        self.budget_calls[wid] = call

    def set_memory_budget(self, budget: int | None) -> None:
        """A new per-worker memory budget (None: no limit) for every worker, now and later."""
        self.memory_budget = budget
        for wid in sorted(self.members.workers):
            self._send_budget(wid)
        self.budget_calls.clear()  # not waited for: a running job's workers follow when they can

    def remove_spill(self) -> None:
        """Remove this run's spill folder (after its workers are gone)."""
        if self.spill_root is not None:
            shutil.rmtree(self.spill_root, ignore_errors=True)
            self.spill_root = None

    def place_executors(self, states: Mapping[int, tuple[Any, int]] | None = None) -> None:
        """Spread all executors over the workers, loading inputs (`Membership.place_executors`)."""
        # an async actor may start calls out of order: the budget must be in place before the
        # executors arrive, or they would all be in memory at once before it evicts them
        calls, self.budget_calls = self.budget_calls, {}
        self.get([ref for wid, ref in calls.items() if wid in self.members.workers])
        self.members.place_executors(self.queue.next_seq, states)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """`ray.get` with actor deaths turned into `ActorLost` and application errors named."""
        try:
            return ray.get(refs, timeout=timeout)
        except RayTaskError as err:
            cause: Any = err
            while isinstance(cause, RayTaskError) and cause.cause is not None and cause.cause is not cause:
                cause = cause.cause
            if isinstance(cause, RayActorError):
                raise ActorLost(str(cause)) from err
            if isinstance(cause, LitzError):
                raise cause from err
            raise LitzError(f"{self.app.name}: a Litz actor failed: {err}") from err
        except RayActorError as err:
            raise ActorLost(str(err)) from err

    def stop_actors(self) -> None:
        """Kill every worker and shard and wait until Ray reports each one gone."""
        handles = self.members.forget_all() + self.shards.take_all()
        handles += self.resizes.take_new_shards()
        for h in handles:
            ray.kill(h, no_restart=True)
        wait_dead(handles)

    # ------------------------------------------------------------------ PS
    def commit(self) -> None:
        """Send the handled flush keys to every shard as the next commit, without waiting
        (`CommitLog.commit`)."""
        self.commits.commit()

    def sync_commits(self) -> None:
        """Wait until every commit sent is applied (before a PS migration)."""
        self.commits.sync()

    def ps_read(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        try:
            return self._ps_read(table, rows)
        except ActorLost as err:
            # a shard died under a driver callback: a fault-tolerance controller that can repair the
            # job in place lets the callback go on (its read retried on the repaired layout)
            ft = self.cfg.fault_tolerance
            if ft is None or not ft.recover_in_place(self.view, err):
                raise
            return self._ps_read(table, rows)

    def _ps_read(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        if table not in self.tables:
            raise LitzError(f"ps_get: no table {table!r}; tables: {sorted(self.tables)}")
        self.commit()
        meta = self.tables[table]
        idx = np.arange(meta.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
        owner = self.layout.owners[table][idx]
        out = np.empty((idx.size, *meta.shape[1:]), dtype=meta.dtype)
        shards = np.unique(owner)
        commit_id = self.commits.commit_id
        got = self.get(
            [self.layout.shards[int(s)].get.remote(table, idx[owner == s], commit_id) for s in shards]
        )
        for s, vals in zip(shards, got, strict=True):
            out[owner == s] = vals
        if rows is None:
            self.mirror.set(self.layout.layout_id, table, out)  # exact at the latest commit
        return out

    def ps_tables(self) -> dict[str, np.ndarray]:
        return {name: self.ps_read(name) for name in self.tables}

    # ------------------------------------------------------------------ dispatch and completion
    def send_pending(self) -> None:
        queue = self.queue
        if not queue.pending:
            return
        self.commits.advance_mirror()
        push = self.mirror.current(self.layout.layout_id, self.push_tables) if self.push_tables else {}
        # Every table comes with the batch (exact at the latest handled key): no task reads a shard,
        # so the commit can wait and carry several keys in one message. Anything that reads the
        # shards (the driver's `ps_read`, checkpoints, migrations, a table not pushed) commits first.
        if len(push) < len(self.tables) or self.commits.unsent_bytes >= DEFERRED_COMMIT_BYTES:
            self.commit()
        batches = queue.take_batches(self.members.exec_worker)
        for wid, specs in batches.items():
            known = self.members.layouts
            layout = self.layout if known[wid] < self.layout.layout_id else None
            known[wid] = self.layout.layout_id
            bid = queue.new_batch_id()
            payload = pack((bid, specs, self.commits.commit_id, push or None, queue.version))
            self.summary.batches += 1
            info = InFlight(wid, bid, [s[0] for s in specs])
            ch = self.links.channel(wid) if self.cfg.direct_channel and layout is None else None
            if ch is not None:
                # in flight under its batch id (an int; a Ray call's is its ObjectRef)
                queue.inflight[bid] = info
                try:
                    ch.send(payload)
                except ChannelClosed as err:
                    raise ActorLost(f"worker {wid}: {err}") from err
            else:  # a new layout (holding actor handles) goes as a Ray call, as without the channel
                run = self.members.workers[wid].run_batch
                ref = run.remote(payload) if layout is None else run.remote(payload, layout)
                queue.inflight[ref] = info

    def wait_completions(self, timeout: float) -> int:
        """Handle every batch that is back within `timeout`; returns the tasks completed."""
        self.commits.check()
        queue = self.queue
        if not queue.inflight:
            time.sleep(min(timeout, 0.01))
            return 0
        ready = self.links.ready_results(timeout)
        ready.sort(key=lambda r: r[0])
        done = 0
        for _, key in ready:
            if key not in queue.inflight:
                self.links.arrived.pop(key, None)
                continue  # a recovery took it back (its tasks are queued again)
            info = queue.inflight.pop(key)
            out = self.links.arrived.pop(key) if isinstance(key, int) else unpack(self.get(key))
            if "error" in out:
                raise_batch_error(self.app.name, out, info.worker_id)
            if out["key"] is not None:
                self.commits.handled(out["key"], out.get("inline"))
                if out.get("inline") is None:  # staged at the shards: the mirror cannot follow these tables
                    self.mirror.drop(out.get("staged_tables", self.tables))
                self.summary.flushes += 1
            self.push_tables.update(out.get("full_reads", ()))
            self.summary.cache_hits += int(out["stats"]["hits"])
            self.summary.cache_misses += int(out["stats"]["misses"])
            self.summary.worker_busy_s += out["stats"]["run_s"] + out["stats"]["flush_s"]
            if out.get("ooc") is not None:
                self.summary.add_out_of_core(out["ooc"])
            # taken out of `tasks` first: a recovery run from a driver callback below re-queues
            # what is still in `tasks`, and these tasks have completed
            batch = [(queue.tasks.pop(task_id), value, error) for task_id, value, error in out["results"]]
            for task, value, error in batch:
                if error is not None:
                    raise ApplicationError(f"{self.app.name}: {error}")
                queue.version += 1
                self.summary.tasks_completed += 1
                done += 1
                # after `LitzRuntime.stop()` the driver still sees the tasks that were in flight
                # (what it dispatches then stays queued, and the stop's checkpoint keeps it)
                if not self.driver_finished:
                    result = TaskResult(task.executor_id, task.args, value, task.version)
                    self.driver.handle_task_completion(self.ctx, result)
        return done

    def await_inflight(self, timeout: float) -> None:
        """Wait at most `timeout` until every in-flight batch is back or failed, handling none of
        them (see `WorkerLinks.await_inflight`)."""
        self.links.await_inflight(timeout)
