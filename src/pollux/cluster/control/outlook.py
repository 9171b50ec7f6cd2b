"""What a round expects of each job on the allocation it gave: the batch configuration its goodput
model chooses there, its statistical efficiency, goodput and speedup over one GPU, and its gradient
noise scale. The agent makes the same choice from the same model (SPEC §4), so this is also what the
job runs with once it has adapted. Shown in ``/metrics`` and the web view; the policies never read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from pollux.cluster.state.records import JobOutlook
from pollux.policy.base import Allocation, JobView

__all__ = ["OutlookCache"]


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


class OutlookCache:
    """The last round's outlooks, by job, with what each was computed from (the job's hints and the
    cluster — the scheduler's fingerprint — and its allocation). A round recomputes only the jobs
    whose hints or allocation changed, so its time does not grow with the jobs that just run on."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[str, tuple[tuple[str, int], ...]], JobOutlook]] = {}

    def round(self, views: Sequence[JobView], allocation: Allocation, now: float,
              prints: Mapping[str, str]) -> dict[str, JobOutlook]:
        """Each job's outlook on its new allocation, from the cache where nothing changed."""
        entries = {}
        out: dict[str, JobOutlook] = {}
        for view in views:
            row = allocation.get(view.id, {})
            key = (prints.get(view.id, ""), tuple(sorted(row.items())))
            cached = self._entries.get(view.id)
            if cached is not None and cached[0] == key:
                outlook = dataclasses.replace(cached[1], time=now)
            else:
                outlook = _outlook(view, row, now)
            entries[view.id] = (key, outlook)
            out[view.id] = outlook
        self._entries = entries
        return out
