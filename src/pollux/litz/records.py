"""Records of the Litz runtime: its configuration, its run summary, and the row-to-shard layout.

Kept apart from the actors so that the master, the workers, the shards, the live service and the
benchmarks share one spelling of each record, and so that the layout rule (a seeded permutation of
rows split into `num_shards` parts) is written once: the SCAR issue recovers shards by that rule.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pollux.litz.api import FaultTolerance


@dataclass
class RuntimeConfig:
    """How `LitzRuntime` runs a job.

        `task_floor_s` pads every micro-task so that a worker finishes at most one task per
        `task_floor_s` seconds: an emulated node speed, so that two real cores can show what eight nodes
        would do (real compute must stay well below the floor for the emulation to hold).
        `worker_resources` (a Ray custom resource per worker, e.g. ``{"node:litz-3": 0.01}``) and
        `node_ids` (Ray node ids; worker i goes to ``node_ids[i % len(node_ids)]`` by node affinity) let
        the live service put workers on the nodes it allocated; both default to "anywhere". A worker
        resize whose new workers are not running after `worker_start_timeout_s` is cancelled (its
        record gets an "error"); `max_recoveries` bounds restores from checkpoints per run; a run in
    which no micro-task completes for `stall_timeout_s` fails (a hang becomes an error). `resume`
    starts from the latest checkpoint in `checkpoint_dir` when there is one (a relaunched job).

    `fault_tolerance` plugs in a fault-tolerance controller (SCAR's, issue 15) without Litz knowing
    it: an object with the hooks of `pollux.litz.api.FaultTolerance` (start, due, checkpoint,
    before_commit, recover, recover_in_place, close), each handed the job as a
    `pollux.litz.api.RunningJob` (what it may read, and the operations a recovery needs). Its
    ``shard_extension``, a picklable factory ``(shard index, {table: (rows, values)}) -> object`` or
    None, gives every PS shard a side object that `PSShardActor.extension_call` invokes with the
    shard's data (e.g. SCAR's in-memory running checkpoint).

    `inline_update_bytes`: a batch whose summed updates take at most this many bytes sends them
    back with its results, and the master hands them to the shards inside its next commit (one
    message instead of a staging round trip to every shard before the results can go back: the
    sequential hops of a synchronous iteration drop from three to two). Larger updates are staged
    at the shards as before, so they never pass through the master. 0 stages every update.
    `push_table_bytes`: tables of at most this many bytes that tasks read whole are mirrored by the
    master (exact, from those inline updates; `pollux.litz.mirror`) and sent with every batch, so
    the tasks' reads hit the worker's cache instead of waiting for a fetch — one round trip per
    synchronous iteration instead of two. 0 turns it off; so does a `fault_tolerance` controller
    (a task's read of a lost shard is then what stops the job before more commits land elsewhere).

    `direct_channel` (default): batches and their results travel over a TCP connection from the
    master to each worker (`pollux.litz.channel`; a Ray actor call costs about 15 times a loopback
    socket's round trip), the rest over Ray; workers are then async actors. False: batches are Ray
    calls too.
    `sequential_workers` (default): a worker runs one batch at a time, in the order sent, a
    batch's micro-tasks overlapping their shard reads on its event loop (without the channel, as a
    threaded Ray actor running one call at a time, `pollux.litz.worker.SequentialWorkerActor`:
    less Ray overhead per batch than an async actor's). False: up to `max_concurrency` batches at
    once, so a batch can also start while an earlier one still waits on PS reads. Shards are async
    actors with `max_concurrency` either way.

    `memory_budget_bytes` (per worker; None: no limit) turns on out-of-core execution (thesis §4.8,
    `pollux.litz.executor_memory`): a worker keeps its executors' accounted bytes (serialised state
    and input) within the budget by evicting whole executors to local disk, under `spill_dir` (a
    fresh folder per run inside it, removed at the end; default: the system's temporary folder),
    and loads each back before its next task. `out_of_core_policy`: "litz" (the thesis's victim
    choice along the worker's queue, with loads ahead) or "lru" (least recently used, on demand: the
    baseline). `LitzRuntime.set_memory_budget` changes the budget while the job runs.
    """

    num_executors: int = 4
    num_workers: int = 2
    num_shards: int = 2
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every_s: float | None = None
    task_floor_s: float = 0.0
    worker_resources: Mapping[str, float] | None = None
    node_ids: list[str] | None = None
    worker_num_cpus: float = 0.0
    max_concurrency: int = 1000
    sequential_workers: bool = True
    direct_channel: bool = True
    max_recoveries: int = 3
    worker_start_timeout_s: float = 120.0
    stall_timeout_s: float = 600.0
    resume: bool = False
    poll_s: float = 0.05
    fault_tolerance: FaultTolerance | None = None
    inline_update_bytes: int = 1 << 20
    push_table_bytes: int = 1 << 20
    memory_budget_bytes: int | None = None
    out_of_core_policy: str = "litz"
    spill_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_executors", "num_workers", "num_shards"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RuntimeConfig.{name}: must be >= 1, got {getattr(self, name)}")
        if self.task_floor_s < 0:
            raise ValueError(f"RuntimeConfig.task_floor_s: must be >= 0, got {self.task_floor_s}")
        if self.checkpoint_every_s is not None and self.checkpoint_every_s <= 0:
            raise ValueError("RuntimeConfig.checkpoint_every_s: must be > 0 or None")
        if self.inline_update_bytes < 0:
            raise ValueError(
                f"RuntimeConfig.inline_update_bytes: must be >= 0, got {self.inline_update_bytes}"
            )
        if self.push_table_bytes < 0:
            raise ValueError(f"RuntimeConfig.push_table_bytes: must be >= 0, got {self.push_table_bytes}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 0:
            raise ValueError(
                f"RuntimeConfig.memory_budget_bytes: must be >= 0 or None, got {self.memory_budget_bytes}"
            )
        if self.out_of_core_policy not in ("litz", "lru"):
            raise ValueError(
                f"RuntimeConfig.out_of_core_policy: must be 'litz' or 'lru', got {self.out_of_core_policy!r}"
            )
        if self.max_concurrency < 2:
            raise ValueError("RuntimeConfig.max_concurrency: workers need > 1 to overlap micro-tasks")


@dataclass
class RunSummary:
    """What one `LitzRuntime.run()` did.

    `resizes` entries: kind ("workers" / "shards"), from, to, and seconds since the run started:
    t_trigger (asked), t_ready (new actors running), t_done (executors arrived; for a scale-in the
    last leaving actor gone — the release time; None if the run ended first); moved (executors or
    rows), state_bytes (pickled executor state moved), replaced (shards moved off unlisted nodes),
    error (only when the resize was cancelled: its new actors did not start).

    `ooc_*`: out-of-core execution under `RuntimeConfig.memory_budget_bytes`, summed over workers
    (as reported with their batches): executors evicted to disk, loaded back (on demand or ahead),
    of those loaded ahead of their task (`ooc_prefetches`), bytes written and read, seconds tasks
    waited for a load (`ooc_wait_s`), and the largest accounted bytes of one worker's executors
    (`ooc_peak_bytes`).
    """

    wall_s: float = 0.0
    tasks_completed: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    checkpoints_saved: int = 0
    checkpoints_loaded: int = 0
    recoveries: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    version: int = 0
    num_workers: int = 0
    num_shards: int = 0
    flushes: int = 0
    batches: int = 0
    stopped: bool = False  # ended by LitzRuntime.stop(), not by the driver's finish()
    resumed: bool = False  # started from a checkpoint (RuntimeConfig.resume)
    worker_busy_s: float = 0.0  # summed over batches: running tasks plus staging their updates
    channel_fallbacks: int = 0  # workers whose direct channel could not connect (Ray calls instead)
    ooc_evictions: int = 0
    ooc_reloads: int = 0
    ooc_prefetches: int = 0
    ooc_bytes_written: int = 0
    ooc_bytes_read: int = 0
    ooc_wait_s: float = 0.0
    ooc_peak_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}

    def add_out_of_core(self, counters: Mapping[str, float]) -> None:
        """Add one batch's out-of-core counters (`ExecutorMemory.drain_stats`)."""
        self.ooc_evictions += int(counters["evictions"])
        self.ooc_reloads += int(counters["reloads"])
        self.ooc_prefetches += int(counters["prefetches"])
        self.ooc_bytes_written += int(counters["bytes_written"])
        self.ooc_bytes_read += int(counters["bytes_read"])
        self.ooc_wait_s += float(counters["wait_s"])
        self.ooc_peak_bytes = max(self.ooc_peak_bytes, int(counters["peak_bytes"]))

    def rewind(self, tasks_completed: int, metrics: int) -> None:
        """Back to a consistent cut: the tasks completed then, and the first `metrics` reports."""
        self.tasks_completed = int(tasks_completed)
        del self.metrics[int(metrics) :]

    def count_restored_cut(self) -> None:
        """A cut was loaded to recover the run (every actor rebuilt from it)."""
        self.checkpoints_loaded += 1
        self.recoveries += 1

    def mark_resumed(self) -> None:
        """The cut just loaded was the run's start (a relaunched job), not a recovery from a loss."""
        self.recoveries -= 1
        self.resumed = True


@dataclass
class PendingTask:
    """A micro-task the driver dispatched, as the master queues it: tagged with the master's
    version at dispatch (the completions handled by then), which its cached reads may not be older
    than."""

    task_id: int
    executor_id: int
    args: Any
    version: int


TaskSpec = tuple[int, int, int, Any, int]
"""A dispatched micro-task as it travels to a worker: (task_id, executor_id, seq, args, version);
`seq` orders the tasks of one executor. A plain tuple, not a dataclass: a batch of 16 pickles and
unpickles in 10 µs against 25 µs, on the master's and the workers' per-iteration path."""


@dataclass(frozen=True)
class TableMeta:
    """Shape and dtype of a table, without its initial value (what workers and shards need)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def shard_assignment(num_rows: int, num_shards: int, seed: int) -> np.ndarray:
    """Owner shard of every row: ``np.random.default_rng(seed).permutation(num_rows)`` split into
    `num_shards` consecutive parts (``np.array_split``); part k belongs to shard k.

    The same rule for every table and every layout, so a shard's rows can be recomputed from
    (rows, shards, seed) alone — the SCAR issue relies on this.
    """
    if num_rows < 1 or num_shards < 1:
        raise ValueError(f"shard_assignment: rows {num_rows} and shards {num_shards} must be >= 1")
    perm = np.random.default_rng(seed).permutation(num_rows)
    owner = np.empty(num_rows, dtype=np.int64)
    for k, part in enumerate(np.array_split(perm, num_shards)):
        owner[part] = k
    return owner


@dataclass
class Layout:
    """Rows → shard of every table, with the shard actors; `layout_id` grows on every PS resize."""

    layout_id: int
    owners: dict[str, np.ndarray]
    shards: list[Any]

    def rows_of(self, table: str, shard: int) -> np.ndarray:
        return np.flatnonzero(self.owners[table] == shard)


def pack(obj: Any) -> bytes:
    """`obj` pickled into one bytes object, numpy buffers in-band, for a Ray message.

    Why: Ray serialises each numpy array of a call's arguments or return value as a zero-copy
    out-of-band buffer, which for the few-KB arrays of a batch (pushed tables, inline update logs)
    costs more than the message itself — on the 2-core VM two `run_batch` round trips with 10 KB
    pushed and 5 KB back took 1.8–1.9 ms as arrays and 1.4–1.5 ms as pickled bytes.

    The standard pickler first (a batch of 16 tasks with two pushed tables: 14 µs against
    cloudpickle's 35 µs); Ray's cloudpickle where the two differ: objects the standard one cannot
    pickle (closures, lambdas, local classes) and references to modules that cloudpickle sends by
    value — ``__main__`` (a worker's is not the driver's) and those registered with
    ``register_pickle_by_value`` (and their submodules). A reference names its module in the
    pickle, so a search of the bytes for those names finds every one (a false match only costs
    the slower pickler).
    """
    from ray import cloudpickle

    try:
        data = pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(obj, protocol=5)
    if b"__main__" in data:
        return cloudpickle.dumps(obj, protocol=5)
    for name in cloudpickle.list_registry_pickle_by_value():
        if name.encode() in data:
            return cloudpickle.dumps(obj, protocol=5)
    return data


def unpack(data: bytes | bytearray) -> Any:
    """The object `pack` pickled (its arrays are fresh and writable)."""
    return pickle.loads(data)
