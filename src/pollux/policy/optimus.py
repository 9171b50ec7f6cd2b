"""Optimus+Oracle: fixed batch, elastic GPU count, oracle knowledge of step times (SPEC §6).

Each job keeps its user batch size (``job.fixed``'s batch; the simulator accumulates gradients when it
does not fit) and Optimus chooses only how many GPUs it gets, knowing — as an oracle — the job's
remaining iterations and its true step time on r replicas (``job.oracle``: ``step_time[r]``, r GPUs
packed 4 per node, ``inf`` where infeasible). Reference behaviour behind the published comparison:

1. In arrival order ``(submit_time, id)`` every job first gets one GPU (``max(1, min_replicas)``, or the
   fewest replicas with a finite step time) while GPUs remain; a job that does not fit is skipped.
2. Then GPUs go one at a time to the job with the largest marginal gain
   ``(step_time[r] − step_time[r + 1]) × remaining_iterations`` (ties: arrival order), never beyond
   ``job.max_replicas`` (the simulator passes ``batch // min_local_bsz``, and 1 for ncf) nor to a size
   with an infinite step time. Handing out goes on while GPUs remain and some job may grow, even when the
   best gain is ≤ 0: that is what reproduces the published comparison (stopping at gain ≤ 0 leaves GPUs
   idle and was measured about 8 % worse in mean JCT on the shared workloads than the published numbers,
   against about 1 % when handing them all out).
3. Jobs whose replica count is unchanged keep their placement; the others are placed on the most-free
   nodes, smallest jobs first — packed onto as few nodes as possible by default, or one GPU at a time
   from the most-free node with ``placement="spread"``.

A running non-preemptible job keeps its GPUs as they are. A job without an oracle gets only its first
GPU (there is nothing to rank it by). The policy keeps no state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from pollux.policy.base import Allocation, Cluster, JobView, PolicyState
from pollux.policy.baseline import Baseline, arrivals, rows_allocation, settle


def _cap(job: JobView) -> int:
    cap = int(job.max_replicas)
    if job.oracle is not None:
        cap = min(cap, len(job.oracle.step_time) - 1)
    return max(cap, 0)


def _step(job: JobView, r: int) -> float:
    if job.oracle is None:
        return math.nan
    st = job.oracle.step_time
    return float(st[r]) if 0 < r < len(st) else math.inf


def _first_size(job: JobView) -> int:
    """Smallest replica count a job starts with, or 0 if it cannot run at all."""
    cap = _cap(job)
    need = max(1, int(job.min_replicas))
    if job.oracle is None:
        return need if need <= cap else 0
    for r in range(need, cap + 1):
        if math.isfinite(_step(job, r)):
            return r
    return 0


def _gain(job: JobView, r: int) -> float:
    """Marginal gain of giving a job on r replicas one more GPU; -inf when it may not grow."""
    if job.oracle is None or r + 1 > _cap(job):
        return -math.inf
    gain = (_step(job, r) - _step(job, r + 1)) * float(job.oracle.remaining_iterations)
    return gain if not math.isnan(gain) else -math.inf


class OptimusPolicy(Baseline):
    """Greedy marginal-gain GPU allocation with oracle step times (Optimus+Oracle)."""

    name = "optimus"

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        order, ids, cur = arrivals(jobs, cluster)

        pinned = [j.id for j in order if cur[j.id].sum() > 0 and not j.preemptible]
        pinned_set = set(pinned)
        left = cluster.total_gpus - sum(int(cur[jid].sum()) for jid in pinned)

        # 1. One GPU (the smallest feasible size) per job, in arrival order, while GPUs remain.
        replicas: dict[str, int] = {}
        for job in order:
            if job.id in pinned_set:
                continue
            first = _first_size(job)
            if 0 < first <= left:
                replicas[job.id] = first
                left -= first

        # 2. The rest one at a time to the largest marginal gain.
        rank = {jid: i for i, jid in enumerate(ids)}
        by_id = {j.id: j for j in order}
        heap = [(-_gain(by_id[jid], r), rank[jid], jid) for jid, r in replicas.items()]
        heapq.heapify(heap)
        while left > 0 and heap:
            neg, _, jid = heapq.heappop(heap)
            if neg == math.inf:  # the best job may not grow (capped or infeasible): none may
                break
            replicas[jid] += 1
            left -= 1
            heapq.heappush(heap, (-_gain(by_id[jid], replicas[jid]), rank[jid], jid))

        # 3. Unchanged jobs keep their placement; the others go to the most-free nodes, smallest first.
        grown = [jid for jid in ids if jid in replicas]
        smallest = sorted(replicas, key=lambda jid: (replicas[jid], rank[jid]))
        rows = settle(cur, cluster.capacity().copy(), pinned, replicas, grown, smallest, self.placement)
        return rows_allocation(rows, ids, cluster), {}
