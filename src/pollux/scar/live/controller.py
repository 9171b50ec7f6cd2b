"""SCAR's fault-tolerance controller for Litz jobs (thesis §5.4.3, Fig. 5.4).

    ctl = ScarController(ScarConfig(directory="ckpt", strategy="priority", fraction=1/8,
                                    every_tasks=tasks_per_epoch, recovery="partial"))
    summary = LitzRuntime(app, RuntimeConfig(num_shards=4, fault_tolerance=ctl)).run()

It plugs into the runtime through `RuntimeConfig.fault_tolerance` (Litz does not import SCAR) as a
`pollux.litz.api.FaultTolerance`, and sees the job only as a `pollux.litz.api.RunningJob`; it
plays both coordinators of the thesis's architecture; the failure detector is Ray's (a call to a dead
shard fails, the runtime hands the error here).

**Checkpoint coordinator** (every `every_tasks` completed micro-tasks; the runtime pauses dispatch
and lets in-flight tasks drain, so the tables do not move under it): (1) every shard computes the
distance of each of its rows from its in-memory running copy (`pollux.scar.live.running.RunningCopy`,
the shard's extension object) — L2 by default, or per table (`ScarConfig.distances`) the total
variation of the row distributions scaled by the row's length, for count rows such as LDA's;
(2) the distances come back; (3) `select_blocks` — the same top-r selection as the rework
experiments — picks the blocks (rows of every table) to save; (4) every
shard copies its selected rows into its running copy and returns them, and they go to the
store's writer thread (`pollux.scar.live.store.RunningStore`, each save committed atomically). Training
resumes once the commit and the distance requests are sent: steps (2)–(4) run on a collector
thread while the next iteration computes. In Litz a row changes only at a commit, and
`before_commit` holds the next commit until every copy is taken, which is the thesis's "resume once
the in-memory copies are updated" without waiting in the pause (Ray does not order an async
actor's calls, so that hold is needed for exactness). The pause is the commit and the requests,
plus any wait at that next commit; `CheckpointRecord` keeps both parts (the initial checkpoint,
which saves everything, does all of it before training starts).

**Recovery coordinator** (a PS shard died): partial recovery (`recovery="partial"`) settles what
was in flight (the micro-tasks sent and not completed are queued again, in their order; their
staged updates are never committed), finds the dead shards, and starts a replacement for each that
holds its rows reloaded from the running checkpoint on disk — only the lost rows are read (the store
keeps row groups = shards in their own files) — and a fresh running copy of them. Every other row
keeps its current value; the driver, the executors and the workers go on; no global restart. Full
recovery (`recovery="full"`, the traditional baseline) restores *every* row from the checkpoint and
puts the whole job back to the cut of the last checkpoint (driver, queued tasks, executor states;
kept in memory, as the master survives a shard loss), like Litz's own checkpoint recovery.

What it does not do: follow PS shard migrations (an elastic PS resize invalidates the running
copies), recover a lost worker (that is Litz's own checkpoint recovery, which still applies), or
restore executor state touched by a replayed task (MLR's executors have none).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError

from pollux.litz.api import RunningJob
from pollux.scar.api import STRATEGIES, ScarError, SelectionState, select_blocks
from pollux.scar.live.running import DISTANCES, RunningCopy
from pollux.scar.live.store import RunningStore, TableInfo

__all__ = ["CheckpointRecord", "RecoveryRecord", "ScarConfig", "ScarController"]


@dataclass(frozen=True)
class ScarConfig:
    """Settings of the controller.

    `every_tasks`: checkpoint period in completed micro-tasks (an epoch of MLR is
    ``ceil(n / batch_size)`` tasks). `strategy`/`fraction`: which blocks a checkpoint saves
    (`pollux.scar.api.select_blocks`). `recovery`: "partial" or "full". `inspect` keeps the tables
    and distances in the records (tests). `detect_timeout_s` bounds the wait for in-flight work and
    for each shard's liveness answer during a recovery. `distances` maps a table name to its row
    distance, "l2" (the default for tables not named) or "tv" (`pollux.scar.live.running.row_distances`:
    total variation × row length, for count rows — LDA's word-topic or document-topic counts).
    Every table's distances go into one top-r selection, so a table's distances should be in
    units comparable to the others' (for LDA both count changes, in tokens). `full_first`: the
    first so many periodic checkpoints save every row — for applications whose tables start empty
    and are filled by their first tasks (LDA's counts are zero until the init tasks have added the
    random assignments): without it the running checkpoint starts from the empty tables, and a
    lost row that no checkpoint has chosen yet would come back empty.
    """

    directory: str
    strategy: str = "priority"
    fraction: float = 1 / 8
    every_tasks: int = 100
    recovery: str = "partial"
    seed: int = 0
    compact_every: int = 1
    inspect: bool = False
    detect_timeout_s: float = 10.0
    distances: Mapping[str, str] = field(default_factory=dict)
    full_first: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ScarError(
                f"ScarConfig.strategy: expected one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        if not 0.0 < self.fraction <= 1.0:
            raise ScarError(f"ScarConfig.fraction: must be in (0, 1], got {self.fraction}")
        if self.every_tasks < 1:
            raise ScarError(f"ScarConfig.every_tasks: must be >= 1, got {self.every_tasks}")
        if self.recovery not in ("partial", "full"):
            raise ScarError(f"ScarConfig.recovery: expected 'partial' or 'full', got {self.recovery!r}")
        if self.full_first < 0:
            raise ScarError(f"ScarConfig.full_first: must be >= 0, got {self.full_first}")
        for table, kind in dict(self.distances).items():
            if kind not in DISTANCES:
                raise ScarError(
                    f"ScarConfig.distances[{table!r}]: expected one of {', '.join(DISTANCES)}, got {kind!r}"
                )


@dataclass
class CheckpointRecord:
    """One checkpoint: when (seconds since the run started, completed tasks), how long training was
    paused for it (`pause_s`: the commit and the distance requests; plus `commit_wait_s`, any wait
    at the next commit for the selection and the shards' copies), rows selected (filled in by the
    collector thread)."""

    t: float
    tasks_completed: int
    pause_s: float
    rows_saved: int
    commit_wait_s: float = 0.0  # training held at the next commit until the copies were taken
    distances: dict[str, np.ndarray] | None = None  # inspect only: global distance per row
    chosen: dict[str, np.ndarray] | None = None  # inspect only: the rows saved
    tables: dict[str, np.ndarray] | None = None  # inspect only: the tables at the checkpoint


@dataclass
class RecoveryRecord:
    """One recovery: the shards lost, rows reloaded and bytes read (vs a full checkpoint's),
    tasks completed before and after (a full recovery goes back), tasks queued again."""

    t: float
    kind: str
    dead_shards: list[int]
    rows_lost: int
    bytes_read: int
    full_bytes: int
    duration_s: float
    tasks_before: int
    tasks_after: int
    requeued: int
    restored: dict[str, np.ndarray] | None = None  # inspect: {table: lost rows}
    tables_after: dict[str, np.ndarray] | None = None  # inspect: the tables right after recovery


@dataclass
class _Cut:
    """The non-table part of the last full checkpoint (for full recovery)."""

    cp: Any = None
    tasks_completed: int = 0


class ScarController:
    """The fault-tolerance object handed to `RuntimeConfig.fault_tolerance` (one per run)."""

    #: every PS shard gets one (see `pollux.litz.records.RuntimeConfig`)
    shard_extension = RunningCopy

    def __init__(self, config: ScarConfig) -> None:
        self.config = config
        self.selection = SelectionState(rng=np.random.default_rng(config.seed))
        self.checkpoints: list[CheckpointRecord] = []
        self.recoveries: list[RecoveryRecord] = []
        self.store: RunningStore | None = None
        self.next_due = config.every_tasks
        self._cut = _Cut()
        self._order: list[str] = []
        self._kinds: dict[str, str] = {}  # table -> row distance, sent with each distances call
        self._collector = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scar-collect")
        self._collected: list[Future[None]] = []
        # set once the last checkpoint's copies are taken at every shard (or given up)
        self._copies_taken: threading.Event | None = None
        self.lost_saves = 0  # shard copies that never came back (the shard died first)

    # ------------------------------------------------------------------ runtime hooks
    def start(self, job: RunningJob) -> None:
        """Open the store and save the starting parameters: the running checkpoint's first state."""
        unknown = sorted(set(self.config.distances) - set(job.tables))
        if unknown:
            raise ScarError(
                f"ScarConfig.distances: no table {', '.join(map(repr, unknown))} in this application "
                f"(tables: {', '.join(sorted(job.tables))})"
            )
        self._kinds = {t: self.config.distances.get(t, "l2") for t in sorted(job.tables)}
        Path(self.config.directory).mkdir(parents=True, exist_ok=True)
        self._order = sorted(job.tables)
        infos = {
            t: TableInfo(tuple(job.tables[t].shape), job.tables[t].dtype, np.asarray(job.layout.owners[t]))
            for t in self._order
        }
        self.store = RunningStore(self.config.directory, infos, self.config.compact_every)
        self.next_due = job.summary.tasks_completed + self.config.every_tasks
        self._checkpoint(job, initial=True)

    def before_commit(self, job: RunningJob) -> None:
        """Wait until the last checkpoint's copies are taken (Ray does not order an async actor's
        calls, so the commit could otherwise overtake them); the wait counts as overhead."""
        if self._copies_taken is not None:
            t0 = time.perf_counter()
            taken, self._copies_taken = self._copies_taken, None
            taken.wait()
            if self.checkpoints:
                self.checkpoints[-1].commit_wait_s += time.perf_counter() - t0

    def due(self, job: RunningJob) -> bool:
        return bool(job.summary.tasks_completed >= self.next_due)

    def checkpoint(self, job: RunningJob) -> None:
        self._checkpoint(job, initial=False)
        while self.next_due <= job.summary.tasks_completed:
            self.next_due += self.config.every_tasks

    def close(self, job: RunningJob) -> None:
        try:
            if self.store is not None:
                self._drain()
                self.store.close()
        finally:
            self._collector.shutdown(wait=True)

    def recover_in_place(self, job: RunningJob, err: BaseException) -> bool:
        """A shard died under a driver callback: repair only if the master need not go back (a full
        recovery rewinds the driver, so it waits until the callback has unwound)."""
        return self.config.recovery == "partial" and self.recover(job, err)

    def recover(self, job: RunningJob, err: BaseException) -> bool:
        if self.store is None:
            return False
        if self.config.recovery == "full":
            return self._recover_full(job)
        return self._recover_partial(job)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self, job: RunningJob, initial: bool) -> None:
        """Commit, ask every shard for its rows' distances, and let training go on: the selection
        and the shards' copies of the chosen rows follow on the collector thread, and
        `before_commit` holds the next commit until the copies are taken, so they are of this
        commit's values. (Only the initial checkpoint, which saves everything, waits here.)"""
        assert self.store is not None
        t0 = time.perf_counter()
        cfg = self.config
        job.commit()
        shards = list(job.layout.shards)
        owners = {t: np.asarray(job.layout.owners[t]) for t in self._order}
        commit_id = job.commit_id
        dist_refs = [s.extension_call.remote("distances", (self._kinds,), commit_id) for s in shards]
        full = initial or len(self.checkpoints) <= cfg.full_first  # checkpoints[0] is the initial
        record = CheckpointRecord(
            t=job.elapsed_s(),
            tasks_completed=job.summary.tasks_completed,
            pause_s=0.0,
            rows_saved=0,
            tables=job.ps_tables() if cfg.inspect else None,
        )
        plan = (record, dist_refs, shards, owners, commit_id, full)
        if initial:
            job.get(dist_refs)  # a lost shard is the runtime's error here, before training starts
            self._select_and_copy(*plan, threading.Event())
        else:
            self._copies_taken = threading.Event()
            self._collected.append(self._collector.submit(self._select_and_copy, *plan, self._copies_taken))
        if cfg.recovery == "full":
            cut = job.consistent_cut(len(self.checkpoints))
            cut.tables = {}  # the tables come back from the store at recovery
            self._cut = _Cut(cut, job.summary.tasks_completed)
        record.pause_s = time.perf_counter() - t0
        self.checkpoints.append(record)

    def _select_and_copy(
        self,
        record: CheckpointRecord,
        dist_refs: list[Any],
        shards: list[Any],
        owners: dict[str, np.ndarray],
        commit_id: int,
        full: bool,
        taken: threading.Event,
    ) -> None:
        """The rest of a checkpoint (on the collector thread, in checkpoint order): the top rows by
        distance over every shard, their copies taken at the shards (then `taken` is set), and the
        copies queued on the store. A shard lost meanwhile saves nothing this time (its rows come
        back from older saves); the master notices the loss on its own."""
        cfg = self.config
        try:
            try:
                replies = ray.get(dist_refs)
            except RayError:
                self.lost_saves += 1
                return
            dist = {t: np.zeros(owners[t].shape[0]) for t in self._order}
            for reply in replies:
                for t, (rows, d) in reply.items():
                    dist[t][rows] = d
            flat = np.concatenate([dist[t] for t in self._order])
            strategy, fraction = ("full", 1.0) if full else (cfg.strategy, cfg.fraction)
            mask = select_blocks(flat, fraction, strategy, self.selection)
            chosen: dict[str, np.ndarray] = {}
            start = 0
            for t in self._order:
                n = owners[t].shape[0]
                chosen[t] = np.flatnonzero(mask[start : start + n])
                start += n
            mine = [{t: r[owners[t][r] == k] for t, r in chosen.items()} for k in range(len(shards))]
            refs = [s.extension_call.remote("update", (mine[k],), commit_id) for k, s in enumerate(shards)]
            ray.wait(refs, num_returns=len(refs))  # a dead shard's ref is ready too (with an error)
            taken.set()
            record.rows_saved = int(mask.sum())
            if cfg.inspect:
                record.distances, record.chosen = dist, chosen
            self._persist(refs)
        finally:
            taken.set()

    def _persist(self, refs: list[Any]) -> None:
        """Wait for the shards' copies of the selected rows and queue them on the store (a shard
        that died before answering contributes nothing; its rows come back from older saves)."""
        assert self.store is not None
        parts = []
        for ref in refs:
            try:
                parts.append(ray.get(ref))
            except RayError:
                self.lost_saves += 1
        merged = {
            t: (np.concatenate([p[t][0] for p in parts]), np.concatenate([p[t][1] for p in parts]))
            for t in self._order
            if parts
        }
        if merged:
            self.store.save_async(merged)

    def _drain(self) -> None:
        """Every checkpoint taken so far queued on the store, and the store flushed."""
        done, self._collected = self._collected, []
        for f in done:
            f.result()
        assert self.store is not None
        self.store.flush()

    # ------------------------------------------------------------------ recovery
    def _settle(self, job: RunningJob) -> int:
        """Wait for in-flight batches (they may have failed), queue their tasks again, drop commits
        that cannot complete. Returns the number of tasks queued again."""
        return job.requeue_inflight(self.config.detect_timeout_s)

    def _dead_shards(self, job: RunningJob) -> list[int]:
        dead = []
        for k, s in enumerate(job.layout.shards):
            try:
                ray.get(s.ping.remote(), timeout=self.config.detect_timeout_s)
            except (RayError, GetTimeoutError):
                dead.append(k)
        return dead

    def _recover_partial(self, job: RunningJob) -> bool:
        assert self.store is not None
        t0 = time.perf_counter()
        before = job.summary.tasks_completed
        requeued = self._settle(job)
        dead = self._dead_shards(job)
        if not dead:
            return False  # a worker died: Litz's own recovery (if configured) applies
        self._drain()
        lost = {t: np.flatnonzero(np.isin(job.layout.owners[t], dead)) for t in self._order}
        res = self.store.load(lost)
        for t in self._order:
            if not np.array_equal(res.rows[t], lost[t]):
                raise ScarError(f"running checkpoint {self.config.directory}: table {t!r} lacks lost rows")
        replacements: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for k in dead:
            tables = {}
            for t in self._order:
                rows = np.flatnonzero(job.layout.owners[t] == k)
                vals = res.values[t][np.searchsorted(res.rows[t], rows)]
                tables[t] = (rows, vals.astype(job.tables[t].dtype))
            replacements[k] = tables
        job.replace_shards(replacements)
        job.summary.recoveries += 1
        job.summary.checkpoints_loaded += 1
        self.recoveries.append(
            RecoveryRecord(
                t=job.elapsed_s(),
                kind="partial",
                dead_shards=dead,
                rows_lost=int(sum(r.size for r in lost.values())),
                bytes_read=res.bytes_read,
                full_bytes=self.store.full_bytes(),
                duration_s=time.perf_counter() - t0,
                tasks_before=before,
                tasks_after=job.summary.tasks_completed,
                requeued=requeued,
                restored=lost if self.config.inspect else None,
                tables_after=job.ps_tables() if self.config.inspect else None,
            )
        )
        return True

    def _recover_full(self, job: RunningJob) -> bool:
        assert self.store is not None
        if self._cut.cp is None:
            return False
        t0 = time.perf_counter()
        before = job.summary.tasks_completed
        self._drain()
        res = self.store.load()
        cp = copy.deepcopy(self._cut.cp)
        cp.tables = {}
        for t in self._order:
            if res.rows[t].size != job.tables[t].shape[0]:
                raise ScarError(f"running checkpoint {self.config.directory}: table {t!r} is incomplete")
            cp.tables[t] = res.values[t].astype(job.tables[t].dtype)
        job.restore_cut(cp)  # every actor rebuilt, the master back at the cut
        self.next_due = job.summary.tasks_completed + self.config.every_tasks
        self.recoveries.append(
            RecoveryRecord(
                t=job.elapsed_s(),
                kind="full",
                dead_shards=[],
                rows_lost=int(sum(job.tables[t].shape[0] for t in self._order)),
                bytes_read=res.bytes_read,
                full_bytes=self.store.full_bytes(),
                duration_s=time.perf_counter() - t0,
                tasks_before=before,
                tasks_after=job.summary.tasks_completed,
                requeued=0,
                tables_after=job.ps_tables() if self.config.inspect else None,
            )
        )
        return True

    def report(self) -> dict[str, Any]:
        """Records without the inspect arrays (JSON-friendly)."""
        drop = {"distances", "chosen", "tables", "restored", "tables_after"}
        return {
            "checkpoints": [{k: v for k, v in asdict(c).items() if k not in drop} for c in self.checkpoints],
            "recoveries": [{k: v for k, v in asdict(r).items() if k not in drop} for r in self.recoveries],
        }
