"""Elasticity while a job runs: moving executors between workers, and PS rows between shards.

Executor migration (thesis §4.4) needs no pause: the master re-maps the executor at once and sends
its later tasks to the new worker; the old worker's `release_executor` waits until the tasks it was
sent have run, then its package (state, sequence number and — on scale-out — input from memory)
goes to the new worker through Ray's object store, without passing through the master. On
scale-in the input is dropped and re-loaded from storage by the target, so the leaving worker is
freed as soon as possible. A record's `t_done` is when the last executor arrived (scale-out) or
when the last leaving actor was gone (scale-in).

Shard migration: every shard gives its rows under the new layout to their owners and forwards
requests for them from then on (`pollux.litz.ps`); retired shards are killed once no batch sent
under the old layout is still running.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError

from pollux.litz.master import Master
from pollux.litz.records import shard_assignment
from pollux.litz.resizes import ShardResize, WorkerResize


def _move(m: Master, e: int, dst: int, send_input: bool) -> Any:
    return m.members.move_executor(e, dst, m.queue.next_seq[e], send_input)


def resize_workers(m: Master, num_workers: int | None = None, node_ids: list[str] | None = None) -> None:
    """Start a resize; `advance_resizes` finishes it while the job runs.

    With `node_ids` the job ends with one worker per entry (Ray node ids; repeats allowed): workers
    already on a listed node stay, the others leave, missing ones are created there. Otherwise
    `num_workers` workers: new ones are added, or the newest ones leave.
    """
    members = m.members
    before = sorted(members.workers)
    if node_ids:
        members.node_ids = list(node_ids)  # the job's nodes from now on (new workers and shards go there)
        wanted = list(node_ids)
        staying: list[int] = []
        leaving: list[int] = []
        for w in before:
            node = members.nodes.get(w)
            if node is not None and node in wanted:
                wanted.remove(node)
                staying.append(w)
            else:
                leaving.append(w)
        new_nodes: list[str | None] = list(wanted)
    else:
        if num_workers is None or num_workers < 1:
            raise ValueError(f"resize: num_workers must be >= 1, got {num_workers}")
        staying, leaving = before[:num_workers], before[num_workers:]
        new_nodes = [members.default_node(len(before) + i) for i in range(num_workers - len(before))]
    if not leaving and not new_nodes:
        return
    new: list[int] = []
    try:
        for node in new_nodes:
            new.append(m.make_worker(node))
    except Exception as err:  # e.g. a malformed node id: the job goes on as it was
        members.remove(new)
        now = time.monotonic() - m.t0
        m.summary.resizes.append(
            {
                "kind": "workers",
                "from": len(before),
                "to": len(before),
                "t_trigger": now,
                "t_ready": None,
                "t_done": now,
                "moved": 0,
                "error": f"new workers could not be created: {err}",
            }
        )
        return
    rec: dict[str, Any] = {
        "kind": "workers",
        "from": len(before),
        "to": len(staying) + len(new),
        "t_trigger": time.monotonic() - m.t0,
        "t_ready": None,
        "t_done": None,
        "moved": 0,
        "state_bytes": 0,
    }
    m.summary.resizes.append(rec)
    # executors move only once the new workers run (their start takes seconds, the job goes on)
    starting = [members.workers[w].pid.remote() for w in new]
    item = WorkerResize(rec, staying=staying, leaving=leaving, new=new, starting=starting)
    m.resizes.begin_workers(item)
    if not new:
        _start_moves(m, item)


def _start_moves(m: Master, item: WorkerResize) -> None:
    staying, leaving, new = item.staying, item.leaving, item.new
    targets = staying + new
    item.record["t_ready"] = time.monotonic() - m.t0
    sizes = [len(b) for b in np.array_split(np.arange(m.cfg.num_executors), len(targets))]
    quota = dict(zip(targets, sizes, strict=True))
    loads = m.members.executors_of(targets)
    refs: list[Any] = []
    # scale-in part: executors of leaving workers re-load their input on the target
    for w in leaving:
        for e in m.members.executors_of([w])[w]:
            dst = max(targets, key=lambda x: (quota[x] - len(loads[x]), -x))
            loads[dst].append(e)
            refs.append(_move(m, e, dst, send_input=False))
    # scale-out part: new workers take executors (with their input, from memory) from full ones
    for dst in new:
        while len(loads[dst]) < quota[dst]:
            src = max(staying, key=lambda x: (len(loads[x]) - quota[x], -x), default=None)
            if src is None or len(loads[src]) <= quota[src]:
                break
            e = loads[src].pop()
            loads[dst].append(e)
            refs.append(_move(m, e, dst, send_input=True))
    item.record["moved"] = len(refs)
    item.moves = refs
    item.starting = []


def _new_workers_ready(m: Master, item: WorkerResize) -> bool:
    """True once every new worker answered; a worker that cannot start cancels the resize."""
    starting = item.starting
    if not starting:
        return True
    ready, _ = ray.wait(starting, num_returns=len(starting), timeout=0)
    waited = time.monotonic() - m.t0 - item.record["t_trigger"]
    if len(ready) < len(starting) and waited < m.cfg.worker_start_timeout_s:
        return False
    try:
        if len(ready) < len(starting):
            raise TimeoutError(f"not running after {waited:.0f} s (RuntimeConfig.worker_start_timeout_s)")
        pids = ray.get(starting)
    except (RayError, TimeoutError) as err:
        m.members.remove(item.new)
        item.record["error"] = f"new workers did not start: {type(err).__name__}: {err}"
        item.record["t_done"] = time.monotonic() - m.t0
        m.resizes.end_workers(item)
        return False
    m.members.record_pids(item.new, pids)
    _start_moves(m, item)
    return True


def advance_resizes(m: Master) -> None:
    """Finish resizes whose executors have arrived; kill leaving workers and retired shards that
    no running batch can still use."""
    for item in list(m.resizes.workers):
        if not _new_workers_ready(m, item):
            continue
        refs = item.moves
        if refs:
            ready, rest = ray.wait(refs, num_returns=len(refs), timeout=0)
            item.record["state_bytes"] = item.record.get("state_bytes", 0) + sum(m.get(ready))
            item.moves = rest
            if rest:
                continue
        leaving = item.leaving
        if any(info.worker_id in leaving for info in m.queue.inflight.values()):
            continue
        m.members.remove(leaving, wait=True)
        item.record["t_done"] = time.monotonic() - m.t0
        m.resizes.end_workers(item)
    for shard_item in list(m.resizes.shards):
        _advance_shard_resize(m, shard_item)
    m.shards.drop_retired(m.queue.oldest_inflight_batch())


def resize_shards(m: Master, num_shards: int, node_ids: list[str] | None = None) -> None:
    """Start re-spreading the PS rows over `num_shards` shards by the seeded rule.

    With `node_ids`, a shard on a node not listed is replaced by a new one on a listed node (its
    rows move there the same way), so a released node keeps no shard either. New shard actors are
    started first (the job goes on meanwhile); `advance_resizes` then migrates the rows.
    """
    if num_shards < 1:
        raise ValueError(f"resize: num_shards must be >= 1, got {num_shards}")
    old = list(m.layout.shards)
    keep = [
        k < len(old) and (not node_ids or m.shards.nodes.get(old[k]) in node_ids) for k in range(num_shards)
    ]
    if num_shards == len(old) and all(keep):
        return
    rec: dict[str, Any] = {
        "kind": "shards",
        "from": len(old),
        "to": num_shards,
        "t_trigger": time.monotonic() - m.t0,
        "t_ready": None,
        "t_done": None,
        "moved": 0,
        "replaced": sum(1 for k in range(min(num_shards, len(old))) if not keep[k]),
    }
    m.summary.resizes.append(rec)
    empty = {
        n: (np.empty(0, dtype=np.int64), np.empty((0, *meta.shape[1:]), dtype=meta.dtype))
        for n, meta in m.tables.items()
    }
    handles: list[Any] = []
    new: list[Any] = []
    try:
        for k in range(num_shards):
            if keep[k]:
                handles.append(old[k])
                continue
            node = node_ids[k % len(node_ids)] if node_ids else m.members.default_node(k)
            new.append(m.shards.make(k, empty, node, m.commits.commit_id))
            handles.append(new[-1])
    except Exception as err:  # e.g. a malformed node id: the job goes on as it was
        _cancel_shards(m, ShardResize(rec, handles, new), f"new shards could not be created: {err}")
        return
    m.resizes.begin_shards(ShardResize(rec, handles, new, starting=[h.pid.remote() for h in new]))


def _cancel_shards(m: Master, item: ShardResize, error: str) -> None:
    m.shards.discard(item.new)
    item.record["error"] = error
    item.record["t_done"] = time.monotonic() - m.t0
    m.resizes.end_shards(item)


def _advance_shard_resize(m: Master, item: ShardResize) -> None:
    """Once the new shards run: move rows to their owners under the new layout (forwarding)."""
    rec, starting = item.record, item.starting
    if starting:
        ready, _ = ray.wait(starting, num_returns=len(starting), timeout=0)
        waited = time.monotonic() - m.t0 - rec["t_trigger"]
        if len(ready) < len(starting):
            if waited >= m.cfg.worker_start_timeout_s:
                _cancel_shards(m, item, f"new shards did not start: not running after {waited:.0f} s")
            return
        try:
            ray.get(starting)
        except RayError as err:
            _cancel_shards(m, item, f"new shards did not start: {type(err).__name__}: {err}")
            return
    rec["t_ready"] = time.monotonic() - m.t0
    handles = item.handles
    m.commit()
    m.sync_commits()
    owners = {n: shard_assignment(meta.shape[0], len(handles), m.cfg.seed) for n, meta in m.tables.items()}
    old = list(m.layout.shards)
    retired = [h for h in old if h not in handles]
    index = {h: k for k, h in enumerate(handles)}
    moved = m.get(
        [h.migrate.remote(owners, handles, m.commits.commit_id, index.get(h, -1)) for h in handles + retired]
    )
    rec["moved"] = int(sum(moved))
    m.shards.install(owners, handles)
    m.mirror.relabel(m.layout.layout_id - 1, m.layout.layout_id)  # rows moved, values did not
    m.shards.retire(retired, m.queue.next_batch_id - 1)
    rec["t_done"] = time.monotonic() - m.t0
    m.resizes.end_shards(item)
