"""The master's dispatch queue: micro-tasks from the driver's dispatch to their completion.

The driver dispatches a micro-task (``DriverContext.dispatch``); it waits in ``pending``, tagged
with the master's *version* (the completions handled so far), until the next dispatch round groups
the queue into one batch per worker. Each executor's tasks are numbered (``next_seq``) so that a
worker runs them in dispatch order, even across an executor's move. A task sent is kept in
``tasks`` until its completion is handled; each batch is kept in ``inflight`` under its batch id
(direct channel) or its Ray call's reference. A recovery puts the tasks in flight back at the head
of the queue; a restored checkpoint puts back the queue it saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pollux.litz.records import PendingTask, TaskSpec

__all__ = ["DispatchQueue", "InFlight"]


@dataclass
class InFlight:
    """A batch sent and not yet handled: which worker runs it, its id, and its tasks."""

    worker_id: int
    batch_id: int
    task_ids: list[int]


class DispatchQueue:
    """The micro-tasks of one run, queued, sent and in flight; see the module docstring."""

    def __init__(self, num_executors: int) -> None:
        #: Completions handled so far; a task dispatched now is tagged with it.
        self.version = 0
        self.next_task_id = 0
        self.next_batch_id = 0
        self.pending: list[PendingTask] = []
        #: Tasks sent and not yet completed, by task id.
        self.tasks: dict[int, PendingTask] = {}
        #: Each executor's next sequence number: its tasks run in this order.
        self.next_seq: dict[int, int] = dict.fromkeys(range(num_executors), 0)
        #: The batches in flight, under their batch id (channel) or their Ray call's reference.
        self.inflight: dict[Any, InFlight] = {}

    def dispatch(self, executor_id: int, args: Any) -> None:
        """Queue a micro-task on `executor_id`, tagged with the current version."""
        self.pending.append(PendingTask(self.next_task_id, executor_id, args, self.version))
        self.next_task_id += 1

    def take_batches(self, exec_worker: Mapping[int, int]) -> dict[int, list[TaskSpec]]:
        """Every queued task, numbered per executor and grouped by the worker that hosts its
        executor (in queue order); they are then sent, and wait in ``tasks`` for completion."""
        batches: dict[int, list[TaskSpec]] = {}
        for task in self.pending:
            e = task.executor_id
            spec = (task.task_id, e, self.next_seq[e], task.args, task.version)
            self.next_seq[e] += 1
            self.tasks[task.task_id] = task
            batches.setdefault(exec_worker[e], []).append(spec)
        self.pending = []
        return batches

    def new_batch_id(self) -> int:
        """The id of the next batch sent."""
        bid = self.next_batch_id
        self.next_batch_id += 1
        return bid

    def requeue_inflight(self) -> int:
        """Queue every task sent and not completed again, ahead of the queue, in task order, and
        forget the batches in flight (results that come later are dropped). Returns how many."""
        again = [PendingTask(t.task_id, t.executor_id, t.args, t.version) for t in self.tasks.values()]
        again.sort(key=lambda t: t.task_id)
        self.pending = again + list(self.pending)
        self.tasks.clear()
        self.inflight.clear()
        return len(again)

    def restore(self, version: int, next_task_id: int, pending: list[PendingTask]) -> None:
        """The queue as a checkpoint saved it (on a fresh queue)."""
        self.version = version
        self.next_task_id = next_task_id
        self.pending = pending

    def oldest_inflight_batch(self) -> int:
        """The smallest batch id still in flight (the next batch's id when none is)."""
        return min((i.batch_id for i in self.inflight.values()), default=self.next_batch_id)
