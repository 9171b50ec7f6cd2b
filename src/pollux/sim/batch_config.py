"""The batch configuration a simulated job runs, and the bounds it is chosen within (SPEC §7).

Split from :class:`pollux.sim.job.SimJob`: the rules here depend only on the job's kind, its
application and its model, not on the job's running state. A rigid or elastic job keeps its
workload's global batch and splits it over its replicas (:func:`fixed_batch_config`); an adaptive
(Pollux) job re-chooses the goodput-optimal batch of its fitted model at each re-allocation and epoch
end (:func:`adaptive_batch_config`). :func:`job_limits` holds the per-kind bounds of both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pollux.goodput import BatchLimits, GoodputModel, optimize
from pollux.goodput.model import accumulation_plan
from pollux.policy.registry import ADAPTIVE, ELASTIC, JobKind
from pollux.sim.profile_meta import AppMeta
from pollux.sim.workload import WorkloadJob

__all__ = ["JobLimits", "adaptive_batch_config", "fixed_batch_config", "job_limits", "limits_on_type"]


@dataclass(frozen=True)
class JobLimits:
    """A job's batch limits and the most replicas it may ask for when submitted."""

    batch: BatchLimits
    max_replicas: int


def fixed_batch_config(batch: int, replicas: int, init_batch_size: int, max_local_bsz: int
                       ) -> tuple[int, int, int]:
    """(M, m, s) of a fixed global batch on ``replicas`` GPUs: accumulate when m would exceed the max.

    On one GPU a batch above M0 always accumulates at least once (as the Pollux agent would), so
    gradient statistics are measured from several micro-batches.
    """
    limits = BatchLimits(init_batch_size, max(init_batch_size, batch), 1, max_local_bsz, accumulation=True)
    total, m, s, _ = accumulation_plan(batch, replicas, limits)
    return int(total), int(m), int(s)


def adaptive_batch_config(model: GoodputModel | None, nodes: int, replicas: int, limits: BatchLimits,
                          init_batch_size: int, start_at_max: bool) -> tuple[int, int, int]:
    """(M, m, s) a Pollux agent chooses on ``nodes`` nodes and ``replicas`` GPUs within ``limits``.

    The goodput-optimal configuration of the job's fitted ``model``; before it has one (or when no
    configuration has a positive goodput) it starts from its initial batch (its maximum when
    ``start_at_max``: ncf's reference setting), at least the smallest local batch on every replica.
    """
    if model is not None:
        plan = optimize(model, nodes, replicas, limits)
        if float(plan.goodput) > 0:
            return int(plan.batch_size), int(plan.local_bsz), int(plan.accum_steps)
    # (BatchLimits fills its optional bounds: both are numbers here.)
    top, local_top = limits.max_batch_size, limits.max_local_bsz
    assert top is not None and local_top is not None
    start = int(top if start_at_max else limits.init_batch_size)
    return fixed_batch_config(max(start, replicas * int(limits.min_local_bsz)), replicas, init_batch_size,
                              int(local_top))


def job_limits(spec: WorkloadJob, meta: AppMeta, kind: JobKind, max_replicas: int) -> JobLimits:
    """The limits of a job of ``kind`` running ``spec`` (``max_replicas``: the run's cap).

    An adaptive job chooses within its application's limits, except ncf, whose reference setting under
    Pollux runs its maximum batch on one replica. A rigid or elastic job's batch is the workload's; an
    elastic job may shrink to one replica and grow while every replica keeps the smallest local batch,
    and a rigid job asks for the workload's replica count.
    """
    m0 = meta.init_batch_size
    if spec.application == "ncf" and kind == ADAPTIVE:
        top = meta.max_batch_size
        return JobLimits(BatchLimits(m0, top, top, top, accumulation=False), 1)
    if kind == ADAPTIVE:
        return JobLimits(meta.limits(accumulation=True), max_replicas)
    limits = BatchLimits(m0, max(m0, spec.batch_size), meta.min_local_bsz, meta.max_local_bsz,
                         accumulation=True)
    if kind == ELASTIC:
        cap = 1 if spec.application == "ncf" else spec.batch_size // meta.min_local_bsz
        return JobLimits(limits, max(1, min(cap, max_replicas)))
    return JobLimits(limits, spec.num_replicas)


def limits_on_type(limits: BatchLimits, type_meta: AppMeta, fixed: bool) -> BatchLimits:
    """A job's batch ``limits`` on a GPU type whose profile metadata is ``type_meta``: its memory bound
    sets the largest local batch, unless the limits are ``fixed`` (ncf under Pollux)."""
    if fixed:
        return limits
    return replace(limits, max_local_bsz=float(max(type_meta.max_local_bsz, limits.min_local_bsz)))
