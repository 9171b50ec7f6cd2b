"""The Litz application API (thesis Table 4.1) — the only thing an application imports.

An application is a *driver* (runs in the master; decides which micro-task runs next) and an
*executor* class (many instances, each owning one partition of the input and, optionally, its own
state). Micro-tasks are short; after each one control returns to the runtime, which is what lets the
runtime move executors and parameter-server shards between machines while the job runs.

Consistency (§4.3): a micro-task B dispatched *after* the driver saw micro-task A complete observes
every update A made; one dispatched *before* may see some, all or none of them. The runtime tags each
dispatched task with the master's *version* (the number of completions handled so far); a cached
parameter fetched by a task of version v serves any later task of version <= v. Bounded staleness
(SSP) therefore needs nothing from the runtime: a driver with staleness s dispatches iteration i's
tasks when iteration i - s - 1 has completed, and tasks of one iteration share cached values.

Parameters are named dense tables (rows first); updates are additive (`update` adds `delta`).
Everything an application hands the runtime (task arguments, results, executor and driver state)
must be picklable: it travels between Ray actors and into checkpoints.

A fault-tolerance strategy (SCAR's) is not an application: it implements :class:`FaultTolerance`
and sees the job through :class:`RunningJob`, at the end of this module.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from pollux.litz.checkpoint import LitzCheckpoint
    from pollux.litz.records import Layout, RunSummary, TableMeta


class LitzError(RuntimeError):
    """A Litz job cannot go on (bad application, lost actor without a checkpoint, …)."""


class ApplicationError(LitzError):
    """The application's own code raised; the message names the executor and task."""


@dataclass(frozen=True)
class TableSpec:
    """A parameter table: `shape[0]` rows, spread over the PS shards by a seeded permutation.

    `init` is the table's starting value (None = zeros). Rows are the unit of sharding, caching,
    update aggregation and (for SCAR) of partial checkpoints and recovery.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float64"
    init: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("TableSpec.name: must not be empty")
        if len(self.shape) < 1 or any(int(d) <= 0 for d in self.shape):
            raise ValueError(f"TableSpec {self.name!r}: shape {self.shape} must be positive, rows first")
        if self.init is not None and tuple(self.init.shape) != tuple(self.shape):
            raise ValueError(
                f"TableSpec {self.name!r}: init has shape {tuple(self.init.shape)}, expected {self.shape}"
            )


class ParameterServer(Protocol):
    """What a micro-task (and the driver) sees of the parameter server."""

    async def get(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Values of `rows` (all rows when None), at least as fresh as the task's version requires."""
        ...

    def update(self, table: str, delta: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Add `delta` to `rows` (all rows when None). Buffered in the worker's update log; applied
        before the task's completion reaches the driver."""
        ...


class TaskContext(Protocol):
    """Handed to `Executor.run_task`: who runs, and the parameter server."""

    @property
    def executor_id(self) -> int: ...

    @property
    def version(self) -> int: ...

    @property
    def ps(self) -> ParameterServer: ...


class DriverContext(Protocol):
    """Handed to the driver's callbacks: dispatch, read the PS, report progress, finish."""

    @property
    def num_executors(self) -> int: ...

    @property
    def version(self) -> int: ...

    def dispatch(self, executor_id: int, args: Any) -> None:
        """Queue a micro-task `run_task(args)` on executor `executor_id` (thesis `DispatchTask`)."""
        ...

    def ps_get(self, table: str, rows: np.ndarray | None = None) -> np.ndarray:
        """Current PS values, with every completed task's updates applied (for objectives, logs)."""
        ...

    def report(self, **metrics: float) -> None:
        """Progress for logs and the runner's summary (iteration, objective, …)."""
        ...

    def finish(self, result: Mapping[str, Any] | None = None) -> None:
        """The job is done once in-flight tasks drain; `result` goes into the run summary."""
        ...


@dataclass(frozen=True)
class TaskResult:
    """A finished micro-task as the driver sees it."""

    executor_id: int
    args: Any
    value: Any
    version: int


class Executor(abc.ABC):
    """One logical partition of the work. Many per worker; movable between workers at any boundary.

    Input data (`load_input`) is kept apart from state (`get_state`) because the runtime treats them
    differently: on scale-out the input travels from memory, on scale-in it is re-loaded from storage,
    and it is never checkpointed. State is whatever the algorithm keeps between tasks (LDA's topic
    assignments); it is moved and checkpointed.
    """

    def __init__(self, executor_id: int, num_executors: int, config: Mapping[str, Any]) -> None:
        self.executor_id = executor_id
        self.num_executors = num_executors
        self.config = config

    def load_input(self) -> Any:
        """Read this executor's partition from storage (or generate it, seeded). Returns it."""
        return None

    @property
    def input(self) -> Any:
        return getattr(self, "_input", None)

    def set_input(self, data: Any) -> None:
        self._input = data

    def get_state(self) -> Any:
        """Picklable executor state (default: none)."""
        return None

    def set_state(self, state: Any) -> None:
        """Restore what `get_state` returned (default: nothing to restore)."""
        return None

    @abc.abstractmethod
    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        """One micro-task (thesis `RunTask`): read the PS, compute, update the PS, return a result."""


class Driver(abc.ABC):
    """The application's control loop, in the master (`DispatchInitialTasks`, `HandleTaskCompletion`)."""

    def __init__(self, num_executors: int, config: Mapping[str, Any]) -> None:
        self.num_executors = num_executors
        self.config = config

    @abc.abstractmethod
    def tables(self) -> Sequence[TableSpec]:
        """The parameter tables, with their initial values."""

    @abc.abstractmethod
    def dispatch_initial_tasks(self, ctx: DriverContext) -> None: ...

    @abc.abstractmethod
    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None: ...

    def state_dict(self) -> Any:
        """Picklable driver state for checkpoints (default: the instance's __dict__ minus config)."""
        return {k: v for k, v in vars(self).items() if k != "config"}

    def load_state_dict(self, state: Any) -> None:
        vars(self).update(state)


@dataclass(frozen=True)
class Application:
    """What the runtime needs to start a job: the two classes and their shared config."""

    name: str
    driver: type[Driver]
    executor: type[Executor]
    config: Mapping[str, Any] = field(default_factory=dict)


#: Rows and their values of each table that one PS shard holds: ``{table: (global rows, values)}``.
ShardRows = Mapping[str, tuple[np.ndarray, np.ndarray]]


class RunningJob(Protocol):
    """What a fault-tolerance controller sees of a running Litz job, and what it may ask of it.

    The runtime hands one to every :class:`FaultTolerance` hook. It reads the job (tables, PS
    layout, commit number, summary) and offers the few operations a recovery needs, so that a
    controller never rewrites the master's queues or layout itself.
    """

    @property
    def tables(self) -> Mapping[str, TableMeta]:
        """Shape and dtype of every PS table."""
        ...

    @property
    def layout(self) -> Layout:
        """The current PS layout: the shard actors, and which shard owns each row."""
        ...

    @property
    def commit_id(self) -> int:
        """The number of the last commit sent; a shard call carrying it sees every update handled."""
        ...

    @property
    def shard_pids(self) -> list[int]:
        """The process id of each current shard, in layout order (monitoring, fault injection)."""
        ...

    @property
    def summary(self) -> RunSummary:
        """The run's summary; a controller counts its recoveries and loaded checkpoints there."""
        ...

    def elapsed_s(self) -> float:
        """Seconds since the run started (the time base of the summary's records)."""
        ...

    def commit(self) -> None:
        """Send every handled update to the shards as the next commit, without waiting."""
        ...

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """``ray.get`` with a lost actor raised as a Litz error."""
        ...

    def ps_tables(self) -> dict[str, np.ndarray]:
        """Every table's values at the latest commit."""
        ...

    def requeue_inflight(self, timeout_s: float) -> int:
        """Wait at most ``timeout_s`` for the batches in flight, then queue their tasks again, in
        their order, ahead of the queue; their updates are never committed, and commits that cannot
        complete are dropped. Returns the number of tasks queued again."""
        ...

    def replace_shards(self, rows: Mapping[int, ShardRows]) -> None:
        """Start a new actor for each shard index in ``rows``, holding those rows, in place of the
        old one (killed), under a new layout with the same row owners."""
        ...

    def consistent_cut(self, step: int) -> LitzCheckpoint:
        """A checkpoint of the whole job as it stands (call with no task in flight)."""
        ...

    def restore_cut(self, cut: LitzCheckpoint) -> None:
        """Rebuild every actor from ``cut`` and put the job back to it (a global restart)."""
        ...


class FaultTolerance(Protocol):
    """A fault-tolerance controller, plugged in through ``RuntimeConfig.fault_tolerance``.

    Litz calls its hooks and does not know what it is (SCAR's is
    :class:`pollux.scar.live.controller.ScarController`). A new strategy implements these hooks over
    the :class:`RunningJob` it is handed; see ``docs/architecture.md``.
    """

    @property
    def shard_extension(self) -> Callable[[int, ShardRows], Any] | None:
        """A picklable factory giving every PS shard a side object (``PSShardActor.extension_call``
        invokes it with the shard's data), or None."""
        ...

    def start(self, job: RunningJob) -> None:
        """The run started (after the initial dispatch)."""
        ...

    def due(self, job: RunningJob) -> bool:
        """Asked in the master loop: True pauses dispatch until no task is in flight, then
        :meth:`checkpoint` runs."""
        ...

    def checkpoint(self, job: RunningJob) -> None:
        """Take the controller's own checkpoint (no task in flight)."""
        ...

    def before_commit(self, job: RunningJob) -> None:
        """Called before every commit is sent, i.e. before any table value changes."""
        ...

    def recover(self, job: RunningJob, error: BaseException) -> bool:
        """An actor was lost. True: the job is repaired and goes on; False: Litz's own checkpoint
        recovery applies."""
        ...

    def recover_in_place(self, job: RunningJob, error: BaseException) -> bool:
        """The same, asked when a driver callback's PS read failed: only a repair that leaves the
        master's state as it is may say True (the read is then retried)."""
        ...

    def close(self, job: RunningJob) -> None:
        """The run ended."""
        ...
