"""Running a batch's micro-tasks out of dispatch order without changing what the PS sees.

Under a memory budget (`pollux.litz.executor_memory`) a worker runs the tasks of executors already
in memory before those it must load back from disk (`pollux.litz.out_of_core`'s `run_order`). The
updates must still reach the shards as an in-memory run sends them, or results would drift by
rounding: each task therefore logs into an update log of its own, and the logs are summed in
dispatch order once every task has run; the results are listed in dispatch order too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pollux.litz.cache import UpdateLog
from pollux.litz.records import TableMeta, TaskSpec

#: Runs one task with the update log it is given; returns the task's answer.
RunOne = Callable[[TaskSpec, UpdateLog], Awaitable[Any]]


async def run_reordered(
    tasks: list[TaskSpec], order: list[int], tables: dict[str, TableMeta], log: UpdateLog, run_one: RunOne
) -> list[Any]:
    """Run `tasks` in `order` (indices into `tasks`), each with its own log; sum the logs into `log`
    in dispatch order and return the answers in dispatch order (exactly an in-memory run's sums
    when each task updates each table once)."""
    logs = [UpdateLog(tables) for _ in tasks]
    results: list[Any] = [None] * len(tasks)
    for i in order:
        results[i] = await run_one(tasks[i], logs[i])
    for task_log in logs:
        for table, (rows, delta) in task_log.drain().items():
            log.add_drained(table, rows, delta)
    return results
