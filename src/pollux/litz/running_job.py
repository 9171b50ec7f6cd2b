"""The master as a fault-tolerance controller sees it: a `RunningJob` and its operations.

A controller plugged in through ``RuntimeConfig.fault_tolerance`` (SCAR's) gets a
:class:`MasterView` in every hook (:class:`pollux.litz.api.FaultTolerance`). It reads the job and
asks for what a recovery needs — queue the work in flight again, replace shards, take and restore a
consistent cut — and each operation is carried out here, on the master's parts, so that no
controller rewrites the master's queues or layout. Litz's own checkpoints use the same two cut
functions (:func:`consistent_cut`, :func:`restore_cut`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from pollux.litz.api import ShardRows
from pollux.litz.records import Layout, PendingTask, RunSummary, TableMeta

if TYPE_CHECKING:
    from pollux.litz.checkpoint import LitzCheckpoint
    from pollux.litz.master import Master

__all__ = ["MasterView", "consistent_cut", "restore_cut"]


class MasterView:
    """One run's master seen as a :class:`pollux.litz.api.RunningJob`."""

    def __init__(self, master: Master) -> None:
        self._master = master

    @property
    def tables(self) -> Mapping[str, TableMeta]:
        return self._master.tables

    @property
    def layout(self) -> Layout:
        return self._master.layout

    @property
    def commit_id(self) -> int:
        return self._master.commits.commit_id

    @property
    def shard_pids(self) -> list[int]:
        return list(self._master.shards.pids)

    @property
    def summary(self) -> RunSummary:
        return self._master.summary

    def elapsed_s(self) -> float:
        return time.monotonic() - self._master.t0

    def commit(self) -> None:
        self._master.commit()

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        return self._master.get(refs, timeout)

    def ps_tables(self) -> dict[str, np.ndarray]:
        return self._master.ps_tables()

    def requeue_inflight(self, timeout_s: float) -> int:
        """Wait for the batches in flight (they may have failed), queue their tasks again ahead of
        the queue in task order, and drop commits that cannot complete."""
        m = self._master
        m.await_inflight(timeout_s)
        requeued = m.queue.requeue_inflight()
        m.commits.abandon(timeout_s)
        return requeued

    def replace_shards(self, rows: Mapping[int, ShardRows]) -> None:
        """A new actor for each shard index in ``rows`` (on the node a shard of that index goes
        to), the old one killed; the owners of the rows stay as they were."""
        m = self._master
        m.shards.replace(rows, m.members.default_node, m.commits.commit_id)

    def consistent_cut(self, step: int) -> LitzCheckpoint:
        return consistent_cut(self._master, step)

    def restore_cut(self, cut: LitzCheckpoint) -> None:
        restore_cut(self._master, cut)


def consistent_cut(m: Master, step: int) -> LitzCheckpoint:
    """A `LitzCheckpoint` of the job as it stands (call with no task in flight): updates committed,
    executor states and tables collected."""
    from pollux.litz.checkpoint import LitzCheckpoint  # torch's checkpoint library: only when asked

    m.commit()
    states: dict[int, Any] = {}
    for part in m.get([w.collect_states.remote() for w in m.members.workers.values()]):
        states.update(part)
    buffered: dict[int, list[Any]] = {}
    for t in m.queue.pending:
        buffered.setdefault(t.executor_id, []).append((t.task_id, t.args, t.version))
    return LitzCheckpoint(
        step=step,
        driver_state=copy.deepcopy(m.driver.state_dict()),  # the driver goes on mutating it
        buffered_tasks=copy.deepcopy(buffered),
        executor_states={e: st for e, (st, _) in states.items()},
        tables=m.ps_tables(),
        meta={
            "version": m.queue.version,
            "next_task_id": m.queue.next_task_id,
            "tasks_completed": m.summary.tasks_completed,
            "metrics": len(m.summary.metrics),
            "seqs": {e: q for e, (_, q) in states.items()},
            "pending_order": [t.task_id for t in m.queue.pending],
        },
    )


def restore_cut(m: Master, cp: LitzCheckpoint) -> None:
    """Rebuild every actor from the cut `cp` and put the master back to it (a global restart)."""
    leaving = m.resizes.leaving_workers()
    shards = len(m.layout.shards)
    members = m.members
    nodes = [members.nodes.get(w) for w in sorted(members.workers) if w not in leaving]
    m.stop_actors()
    m.resizes.forget_workers()
    m.reset_run_state()
    m.driver.load_state_dict(cp.driver_state)
    m.summary.rewind(cp.meta["tasks_completed"], cp.meta["metrics"])
    tasks = {
        tid: PendingTask(tid, e, args, v)
        for e, items in cp.buffered_tasks.items()
        for tid, args, v in items
    }
    pending = [tasks[tid] for tid in cp.meta["pending_order"]]
    m.queue.restore(int(cp.meta["version"]), int(cp.meta["next_task_id"]), pending)
    m.make_shards(max(1, shards), values=cp.tables)
    for node in nodes or [members.default_node(0)]:
        m.make_worker(node)
    seqs = cp.meta["seqs"]
    m.place_executors(
        {e: (cp.executor_states.get(e), int(seqs.get(e, 0))) for e in range(m.cfg.num_executors)}
    )
    m.summary.count_restored_cut()
