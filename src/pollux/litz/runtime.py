"""`LitzRuntime`: run a Litz application on Ray, resize it while it runs, recover it from failures.

    rt = LitzRuntime(app, RuntimeConfig(num_executors=16, num_workers=2, num_shards=2))
    rt.resize(num_workers=4)          # from any thread, also while run() runs
    rt.resize(node_ids=[a, b, c])     # one worker per listed Ray node (the live service's form)
    summary = rt.run()                # blocking; stops its actors before returning
    rt.status()                       # from any thread: workers, shards, version, resizing, ...

The caller owns Ray (``ray.init`` before, ``ray.shutdown`` after); the runtime creates and kills
only its own actors (workers: `pollux.litz.worker`; shards: `pollux.litz.ps`; the master loop:
`pollux.litz.master`; moves: `pollux.litz.elastic`). With a `checkpoint_dir` it takes a consistent
checkpoint at the start and every `checkpoint_every_s` (pause dispatch, let in-flight tasks drain,
commit their updates, collect executor states and tables; a background thread writes it while the
job goes on), and when a worker or shard actor dies it rebuilds every actor from the latest
checkpoint and goes on.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from pollux.litz.api import Application, LitzError
from pollux.litz.elastic import advance_resizes, resize_shards, resize_workers
from pollux.litz.master import Master
from pollux.litz.records import RunSummary, RuntimeConfig
from pollux.litz.running_job import consistent_cut, restore_cut
from pollux.litz.worker_links import ActorLost

__all__ = ["LitzRuntime", "RunSummary", "RuntimeConfig"]


class _CheckpointWriter:
    """Writes checkpoints on one background thread, so the job pauses only to take the cut."""

    def __init__(self, store: Any, master: Master) -> None:
        self.store = store
        self.master = master
        # After any step already in the folder (a resumed or re-run job): the newest is always ours.
        self.next_step = max(store.steps(), default=-1) + 1
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="litz-checkpoint")
        self._future: Future[Any] | None = None

    def busy(self) -> bool:
        return self._future is not None and not self._future.done()

    def submit(self, cp: Any) -> None:
        self.wait()
        self._future = self._pool.submit(self.store.save, cp.step, cp)
        self.next_step += 1

    def poll(self) -> None:
        """Count a finished save (and raise its error, naming the folder)."""
        if self._future is not None and self._future.done():
            future, self._future = self._future, None
            try:
                future.result()
            except Exception as err:
                raise LitzError(f"checkpoint to {self.store.directory} failed: {err}") from err
            self.master.summary.checkpoints_saved += 1

    def wait(self) -> None:
        if self._future is not None:
            wait_futures([self._future])
        self.poll()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


class LitzRuntime:
    """One Litz job on the Ray cluster the caller has initialised."""

    def __init__(self, app: Application, config: RuntimeConfig | None = None) -> None:
        self.app = app
        self.config = config or RuntimeConfig()
        self._requests: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._master: Master | None = None
        self._deferred: list[tuple[str, dict[str, Any]]] = []
        self._stop_checkpoint = False

    # ------------------------------------------------------------------ control (any thread)
    def resize(
        self,
        num_workers: int | None = None,
        num_shards: int | None = None,
        node_ids: list[str] | None = None,
    ) -> None:
        """Ask the running job (or the next `run`) to change its workers and/or PS shards.

        Returns at once; the master applies it between micro-task completions (one worker resize
        at a time, in order). `node_ids` (Ray node ids, repeats allowed) asks for exactly one worker
        per entry: workers on listed nodes stay, the others leave, missing ones are created there —
        how the live service moves a job onto the nodes of its new allocation.
        """
        if node_ids is not None:
            if not node_ids:
                raise ValueError("resize: node_ids must name at least one node")
            self._requests.put(("workers", {"num_workers": len(node_ids), "node_ids": list(node_ids)}))
        elif num_workers is not None:
            if int(num_workers) < 1:
                raise ValueError(f"resize: num_workers must be >= 1, got {num_workers}")
            self._requests.put(("workers", {"num_workers": int(num_workers), "node_ids": None}))
        if num_shards is not None:
            if int(num_shards) < 1:
                raise ValueError(f"resize: num_shards must be >= 1, got {num_shards}")
            self._requests.put(("shards", {"num_shards": int(num_shards)}))

    def set_memory_budget(self, budget_bytes: int | None) -> None:
        """Change the per-worker memory budget of the running job (or of the next `run`): a lower
        one evicts executors to disk at once, a higher one (or None: no limit) lets them come back
        as their tasks need them. How the live service would follow a node's memory being shared."""
        if budget_bytes is not None and int(budget_bytes) < 0:
            raise ValueError(f"set_memory_budget: budget_bytes must be >= 0 or None, got {budget_bytes}")
        self._requests.put(("memory", {"bytes": None if budget_bytes is None else int(budget_bytes)}))

    def stop(self, checkpoint: bool = False) -> None:
        """Ask a running job to stop after its in-flight tasks (as if the driver had finished); with
        ``checkpoint``, it first saves a checkpoint of that cut (its queued tasks included), from
        which a run with ``RuntimeConfig.resume`` goes on — how a preempted job leaves."""
        self._requests.put(("stop", {"checkpoint": bool(checkpoint)}))

    @property
    def num_workers(self) -> int:
        m = self._master
        return len(m.members.workers) if m is not None else self.config.num_workers

    def status(self) -> dict[str, Any]:
        """A snapshot for the live service and progress displays (safe from any thread)."""
        m = self._master
        if m is None:
            return {"running": False, "workers": self.config.num_workers, "shards": self.config.num_shards}
        return {
            "running": True,
            "workers": len(m.members.workers),
            "shards": len(m.layout.shards),
            "version": m.queue.version,
            "tasks_completed": m.summary.tasks_completed,
            "resizing": bool(
                m.resizes.any() or self._deferred or not self._requests.empty()
            ),
            "resizes": [dict(r) for r in list(m.summary.resizes)],
            "recoveries": m.summary.recoveries,
            "memory_budget_bytes": m.memory_budget,
        }

    def worker_pids(self) -> dict[int, int]:
        """{worker id: process id} of the live workers (tests kill one to check recovery)."""
        m = self._master
        return dict(m.members.pids) if m is not None else {}

    def shard_pids(self) -> list[int]:
        """Process ids of the PS shards of the current layout (tests kill one)."""
        m = self._master
        return list(m.shards.pids) if m is not None else []

    # ------------------------------------------------------------------ the run
    def run(self, on_progress: Callable[[dict[str, Any]], None] | None = None) -> RunSummary:
        from pollux.litz.checkpoint import CheckpointStore

        cfg = self.config
        m = Master(self.app, cfg)
        m.on_progress = on_progress
        self._master = m
        writer = _CheckpointWriter(CheckpointStore(cfg.checkpoint_dir), m) if cfg.checkpoint_dir else None
        ft = cfg.fault_tolerance
        try:
            m.make_shards(cfg.num_shards)
            for i in range(cfg.num_workers):
                m.make_worker(m.members.default_node(i))
            m.place_executors()
            if cfg.resume and writer is not None and writer.store.steps():
                self._recover(m, writer)             # a relaunched job: from its latest checkpoint
                m.summary.mark_resumed()
            else:
                m.driver.dispatch_initial_tasks(m.ctx)
                if writer is not None:
                    self._checkpoint(m, writer)
            if ft is not None:
                ft.start(m.view)
            while True:
                try:
                    self._loop(m, writer)
                    break
                except ActorLost as err:
                    if ft is not None and ft.recover(m.view, err):
                        continue  # repaired in place (e.g. SCAR partial recovery)
                    if writer is None:
                        raise LitzError(
                            f"{self.app.name}: an actor was lost and no checkpoint_dir is set: {err}"
                        ) from err
                    if m.summary.recoveries >= cfg.max_recoveries:
                        raise LitzError(
                            f"{self.app.name}: gave up after {m.summary.recoveries} recoveries: {err}"
                        ) from err
                    self._recover(m, writer)
            m.summary.num_workers = len(m.members.workers)
            m.summary.num_shards = len(m.layout.shards)
        finally:
            try:
                if writer is not None:
                    writer.close()
                if ft is not None:
                    ft.close(m.view)
            finally:
                m.stop_actors()
                m.remove_spill()
        m.summary.wall_s = time.monotonic() - m.t0
        m.summary.version = m.queue.version
        return m.summary

    def _handle_requests(self, m: Master) -> None:
        todo = self._deferred
        self._deferred = []
        while True:
            try:
                todo.append(self._requests.get_nowait())
            except queue.Empty:
                break
        for kind, kw in todo:
            if kind == "stop":
                m.finished = True
                m.summary.stopped = True
                self._stop_checkpoint = self._stop_checkpoint or bool(kw.get("checkpoint"))
            elif kind == "memory":
                m.set_memory_budget(kw["bytes"])
            elif kind == "shards":
                if m.resizes.shards:  # one shard resize at a time
                    self._deferred.append((kind, kw))
                else:
                    resize_shards(m, kw["num_shards"])
            elif m.resizes.workers:  # one worker resize at a time: later ones wait their turn
                self._deferred.append((kind, kw))
            else:
                resize_workers(m, kw["num_workers"], kw["node_ids"])
                if kw["node_ids"]:  # no shard stays on a node the job no longer has
                    resize_shards(m, len(m.layout.shards), kw["node_ids"])

    def _loop(self, m: Master, writer: _CheckpointWriter | None) -> None:
        cfg = self.config
        pausing = ft_pausing = False
        last_ckpt = last_progress = time.monotonic()
        while True:
            self._handle_requests(m)
            advance_resizes(m)
            if writer is not None:
                writer.poll()
            if (
                writer is not None
                and cfg.checkpoint_every_s is not None
                and not m.finished
                and not writer.busy()  # a slow disk makes the period longer, never a queue
                and time.monotonic() - last_ckpt >= cfg.checkpoint_every_s
            ):
                pausing = True
            ft = cfg.fault_tolerance
            if ft is not None and not m.finished and not pausing and ft.due(m.view):
                pausing = ft_pausing = True
            idle = not m.queue.inflight and not m.resizes.any()
            if ft is not None and pausing and ft_pausing and idle:
                ft.checkpoint(m.view)  # the controller's own cut (see RuntimeConfig)
                pausing = ft_pausing = False
            if (
                pausing
                and not ft_pausing
                and writer is not None
                and not m.queue.inflight
                and not m.resizes.any()
            ):
                self._checkpoint(m, writer)
                last_ckpt = time.monotonic()
                pausing = False
            if not pausing and not m.finished:
                m.send_pending()
            if m.finished and not m.queue.inflight:
                if m.driver_finished and m.summary.stopped:
                    # the driver finished on the completions of a stop's drain: the job is done,
                    # so no stop checkpoint (a resumed run would have nothing left to do)
                    m.summary.stopped = False
                    self._stop_checkpoint = False
                if not (self._stop_checkpoint and writer is not None):
                    return
                if not m.resizes.any():
                    self._checkpoint(m, writer)      # the cut a resumed run starts from
                    self._stop_checkpoint = False
                    return
                m.wait_completions(cfg.poll_s)
                continue
            if (
                not m.queue.inflight
                and not m.queue.pending
                and not m.resizes.any()
                and not pausing
            ):
                raise LitzError(
                    f"{self.app.name}: the driver has no task running or queued and did not finish()"
                )
            if m.wait_completions(cfg.poll_s) or not m.queue.inflight:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > cfg.stall_timeout_s:
                raise LitzError(
                    f"{self.app.name}: no micro-task completed for {cfg.stall_timeout_s:.0f} s "
                    f"({sum(len(i.task_ids) for i in m.queue.inflight.values())} in flight; "
                    "RuntimeConfig.stall_timeout_s)"
                )

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self, m: Master, writer: _CheckpointWriter) -> None:
        """A consistent cut, written to disk by the writer thread while the job goes on."""
        writer.submit(consistent_cut(m, writer.next_step))

    def _recover(self, m: Master, writer: _CheckpointWriter) -> None:
        """Rebuild every actor from the latest checkpoint and put the master back to that cut."""
        writer.wait()
        cp = writer.store.latest()
        if cp is None:
            raise LitzError(
                f"{self.app.name}: an actor was lost and {self.config.checkpoint_dir} holds no checkpoint"
            )
        restore_cut(m, cp)
