"""What a round expects of each job on the allocation it gave: the batch configuration its goodput
model chooses there, its statistical efficiency, goodput and speedup over one GPU, and its gradient
noise scale. The agent makes the same choice from the same model (SPEC §4), so this is also what the
job runs with once it has adapted. Shown in ``/metrics`` and the web view; the policies never read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pollux.cluster.state.records import JobOutlook
from pollux.policy.base import Allocation, JobView

__all__ = ["round_outlook"]


def _outlook(view: JobView, row: Mapping[str, int], now: float) -> JobOutlook:
    gpus = int(sum(row.values()))
    nodes = sum(1 for g in row.values() if int(g) > 0)
    if view.model is None or view.limits is None or gpus <= 0:
        return JobOutlook(job_id=view.id, time=now, gpus=gpus, nodes=nodes)
    # One call for the allocation and for one GPU (the speedup's reference).
    plan = view.model.optimize(np.array([nodes, 1]), np.array([gpus, 1]), view.limits)
    alone = float(plan.goodput[1])
    goodput = float(plan.goodput[0])
    return JobOutlook(
        job_id=view.id, time=now, gpus=gpus, nodes=nodes,
        batch_size=float(plan.batch_size[0]), local_bsz=float(plan.local_bsz[0]),
        accum_steps=int(plan.accum_steps[0]), efficiency=float(plan.efficiency[0]), goodput=goodput,
        speedup=goodput / alone if alone > 0 else None,
        pgns=float(view.model.grad_stats.pgns(view.model.init_batch_size)),
    )


def round_outlook(views: Sequence[JobView], allocation: Allocation, now: float) -> dict[str, JobOutlook]:
    """Each scheduled job's outlook on its new allocation (no GPUs: only the zero counts)."""
    return {v.id: _outlook(v, allocation.get(v.id, {}), now) for v in views}
