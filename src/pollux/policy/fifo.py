"""FIFO: rigid jobs, first in first out, consolidated placement (SPEC §6) — the floor baseline.

Also home of the small helpers the rigid/elastic baselines share (placement and reading the current
allocation); they are pure functions of their arguments.

Behaviour, per round:

* Jobs are ordered by ``(submit_time, id)``.
* Running jobs keep their placement and are never preempted (a row that no longer fits the cluster or
  no longer holds the job's full gang, e.g. after a node shrank or vanished, is dropped and the job
  queues again in FIFO order).
* Pending jobs are started in FIFO order while they fit in the free GPUs. The walk *blocks*: the first
  pending job that does not fit stops the walk, so no later job jumps ahead of it (head-of-line
  blocking is what FIFO means as a floor). A job that could never fit — it asks for more GPUs than the
  whole cluster has — is skipped instead of blocking the cluster for ever.
* A started job is placed on as few nodes as possible: repeatedly the node with the most free GPUs
  gives all it can (:func:`place_packed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pollux.policy.base import Allocation, Cluster, JobView, PolicyState, from_matrix, place_spread

PLACEMENTS = ("packed", "spread")


def place_packed(replicas: int, free: np.ndarray) -> np.ndarray | None:
    """Place ``replicas`` GPUs on as few nodes as possible.

    Repeatedly take every GPU still needed from the node with the most free GPUs (ties: lowest
    index) — largest-first, so the number of nodes used is minimal. Returns the per-node counts, or
    None if fewer than ``replicas`` GPUs are free. ``free`` is not modified.
    """
    free = np.asarray(free, dtype=np.int64)
    row = np.zeros_like(free)
    if replicas <= 0:
        return row
    if int(free.sum()) < replicas:
        return None
    left = free.copy()
    need = int(replicas)
    while need > 0:
        n = int(np.argmax(left))
        take = min(need, int(left[n]))
        row[n] += take
        left[n] -= take
        need -= take
    return row


def place(replicas: int, free: np.ndarray, placement: str) -> np.ndarray | None:
    """Placement of a newly (re)started job: ``packed`` (:func:`place_packed`) or ``spread``
    (:func:`pollux.policy.base.place_spread`, one GPU at a time from the most-free node)."""
    if placement == "packed":
        return place_packed(replicas, free)
    if placement == "spread":
        return place_spread(replicas, np.asarray(free, dtype=np.int64))
    raise ValueError(f"placement: expected one of {PLACEMENTS}, got {placement!r}")


def check_placement(placement: str) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: expected one of {PLACEMENTS}, got {placement!r}")
    return placement


def arrival_order(jobs: Sequence[JobView]) -> list[JobView]:
    """Jobs sorted by ``(submit_time, id)``: the deterministic FIFO order."""
    return sorted(jobs, key=lambda j: (float(j.submit_time), j.id))


def current_row(job: JobView, allocation: Mapping[str, Mapping[str, int]], cluster: Cluster) -> np.ndarray:
    """The job's current GPUs per node as a dense row.

    The ``allocation`` argument of ``decide`` is authoritative when it names the job; otherwise the
    job view's own allocation is used. Nodes the cluster does not know are dropped.
    """
    src = allocation[job.id] if job.id in allocation else job.allocation
    idx = cluster.index()
    row = np.zeros(cluster.num_nodes, dtype=np.int64)
    for node, gpus in src.items():
        if node in idx and gpus > 0:
            row[idx[node]] += int(gpus)
    return row


def rigid_replicas(job: JobView, current: np.ndarray) -> int:
    """GPUs a rigid job asks for: ``fixed[0]``; without ``fixed``, what it holds now, else
    ``max(min_replicas, 1)``."""
    if job.fixed is not None:
        return max(int(job.fixed[0]), 1)
    held = int(current.sum())
    return held if held > 0 else max(int(job.min_replicas), 1)


def keep_rows(order: Sequence[str], rows: Mapping[str, np.ndarray], free: np.ndarray) -> list[str]:
    """Keep the given rows, in ``order``, while they fit ``free`` (updated in place).

    Returns the ids whose row did not fit (only possible when the cluster shrank under them).
    """
    dropped = []
    for jid in order:
        row = rows[jid]
        if np.all(row <= free):
            free -= row
        else:
            dropped.append(jid)
    return dropped


class FifoPolicy:
    """First in, first out, with blocking, for rigid jobs (``job.fixed = (replicas, batch)``)."""

    name = "fifo"

    def __init__(self, placement: str = "packed") -> None:
        self.placement = check_placement(placement)

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        allocation: Allocation,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        order = arrival_order(jobs)
        ids = [j.id for j in order]
        cur = {j.id: current_row(j, allocation, cluster) for j in order}
        free = cluster.capacity().copy()
        out = np.zeros((len(order), cluster.num_nodes), dtype=np.int64)
        pos = {jid: i for i, jid in enumerate(ids)}
        want = {j.id: rigid_replicas(j, cur[j.id]) for j in order}

        # A running job keeps its row unless it no longer holds its full gang (a node vanished).
        running = [jid for jid in ids if int(cur[jid].sum()) == want[jid]]
        runs = set(running)
        dropped = set(keep_rows(running, cur, free))
        for jid in running:
            if jid not in dropped:
                out[pos[jid]] = cur[jid]

        total = cluster.total_gpus
        for job in order:
            if job.id in runs and job.id not in dropped:
                continue
            if want[job.id] > total:
                continue  # can never run here: skip rather than block the cluster for ever
            row = place(want[job.id], free, self.placement)
            if row is None:
                break  # head-of-line blocking
            free -= row
            out[pos[job.id]] = row
        return from_matrix(out, ids, cluster), {}
