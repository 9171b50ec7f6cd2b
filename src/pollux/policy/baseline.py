"""The skeleton the baselines (FIFO, Tiresias, Optimus) share: pinned → keep → place.

Each baseline decides *how many* GPUs every job gets its own way (FIFO: arrival order with blocking;
Tiresias: 2D-LAS queues; Optimus: marginal gains). Turning those counts into rows is the same for all
three, and lives here once (:func:`settle`):

1. **pinned** rows (running jobs that may not be preempted) are kept first, while they fit;
2. **kept** rows: a job whose count is unchanged keeps its placement, while it fits;
3. **placed** rows: the pinned jobs that no longer fit, then the other jobs in the policy's order, are
   placed on the GPUs left (:mod:`pollux.policy.placement`).

Rows that no longer fit (a node shrank or vanished under them) are dropped and placed again. All
functions are pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pollux.policy.base import Allocation, Cluster, JobView, from_matrix
from pollux.policy.placement import check_placement, place


class Baseline:
    """Base class of the baselines: the placement option every one of them takes.

    ``placement`` is how newly (re)started jobs are placed: ``packed`` (default, the published
    comparison) or ``spread`` (:mod:`pollux.policy.placement`).
    """

    name: str

    def __init__(self, placement: str = "packed") -> None:
        self.placement = check_placement(placement)


def arrival_order(jobs: Sequence[JobView]) -> list[JobView]:
    """Jobs sorted by ``(submit_time, id)``: the deterministic FIFO order."""
    return sorted(jobs, key=lambda j: (float(j.submit_time), j.id))


def current_row(job: JobView, cluster: Cluster) -> np.ndarray:
    """The job's current GPUs per node (its ``JobView.allocation``) as a dense row; nodes the cluster
    does not know are dropped."""
    idx = cluster.index()
    row = np.zeros(cluster.num_nodes, dtype=np.int64)
    for node, gpus in job.allocation.items():
        if node in idx and gpus > 0:
            row[idx[node]] += int(gpus)
    return row


def arrivals(jobs: Sequence[JobView], cluster: Cluster
             ) -> tuple[list[JobView], list[str], dict[str, np.ndarray]]:
    """The jobs in arrival order, their ids, and each job's current row: every baseline's start."""
    order = arrival_order(jobs)
    return order, [j.id for j in order], {j.id: current_row(j, cluster) for j in order}


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


def settle(cur: Mapping[str, np.ndarray], free: np.ndarray, pinned: Sequence[str],
           targets: Mapping[str, int], keep_order: Sequence[str], place_order: Sequence[str],
           placement: str, *, block: bool = False) -> dict[str, np.ndarray]:
    """Rows of one round: pinned rows, then unchanged rows, then placements (see the module doc).

    ``cur`` holds every job's current row and ``free`` the cluster's capacity (updated in place).
    ``targets`` is the GPU count of every job that should run other than the pinned ones; among them,
    those in ``keep_order`` whose count equals what they hold keep their rows (in that order). The
    pinned rows that no longer fit are placed first (at their current size), then the jobs of
    ``place_order`` without a row yet. A placement that does not fit is skipped, or with ``block``
    stops all further placements (FIFO's head-of-line blocking).
    """
    rows: dict[str, np.ndarray] = {}
    replace = keep_rows(pinned, cur, free)
    rows.update({jid: cur[jid] for jid in pinned if jid not in replace})
    keepers = [jid for jid in keep_order if int(cur[jid].sum()) == targets[jid]]
    dropped = set(keep_rows(keepers, cur, free))
    rows.update({jid: cur[jid] for jid in keepers if jid not in dropped})
    todo = [(jid, int(cur[jid].sum())) for jid in replace]
    todo += [(jid, int(targets[jid])) for jid in place_order if jid not in rows]
    for jid, n in todo:
        row = place(n, free, placement)
        if row is None:
            if block:
                break
            continue   # cannot happen when the policy counted GPUs; never over-allocate
        free -= row
        rows[jid] = row
    return rows


def rows_allocation(rows: Mapping[str, np.ndarray], ids: Sequence[str], cluster: Cluster) -> Allocation:
    """The allocation of the rows (jobs in ``ids`` order; jobs without a row or GPUs omitted)."""
    pos = {jid: i for i, jid in enumerate(ids)}
    out = np.zeros((len(ids), cluster.num_nodes), dtype=np.int64)
    for jid, row in rows.items():
        out[pos[jid]] = row
    return from_matrix(out, ids, cluster)
