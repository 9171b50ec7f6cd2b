"""FIFO: rigid jobs, first in first out, consolidated placement (SPEC §6) — the floor baseline.

The skeleton it shares with Tiresias and Optimus is :mod:`pollux.policy.baseline`; placements are
:mod:`pollux.policy.placement`.

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
  gives all it can (:func:`pollux.policy.placement.place_packed`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pollux.policy.base import Allocation, Cluster, JobView, PolicyState
from pollux.policy.baseline import (
    Baseline,
    arrivals,
    rigid_replicas,
    rows_allocation,
    settle,
)
from pollux.policy.placement import place_packed

__all__ = ["FifoPolicy", "place_packed"]


class FifoPolicy(Baseline):
    """First in, first out, with blocking, for rigid jobs (``job.fixed = (replicas, batch)``)."""

    name = "fifo"

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        order, ids, cur = arrivals(jobs, cluster)
        want = {j.id: rigid_replicas(j, cur[j.id]) for j in order}
        # A running job keeps its row unless it no longer holds its full gang (a node vanished); the
        # others start in arrival order, blocking at the first that does not fit. A job that can never
        # fit here (more GPUs than the cluster has) is skipped rather than block the cluster for ever.
        startable = [jid for jid in ids if want[jid] <= cluster.total_gpus]
        rows = settle(cur, cluster.capacity().copy(), [], want, ids, startable, self.placement, block=True)
        return rows_allocation(rows, ids, cluster), {}
