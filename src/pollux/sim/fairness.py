"""Finish-time fairness (SPEC §7): a job's JCT run alone on an exclusive share of the GPUs, and
ρ = JCT / JCT_iso for every finished job of a run.

* :func:`isolated_jct` — a job's JCT run alone on ``gpus`` GPUs packed onto as few nodes as possible;
* :func:`isolated_share` — the GPUs a job would get on an equal split of the cluster;
* :func:`finish_time_fairness` — fills ``JobResult.rho`` for every finished job.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np

from pollux.goodput import gain
from pollux.goodput.model import accumulation_plan, batch_candidates
from pollux.policy.placement import packed_shape
from pollux.sim.engine import JobResult, SimResult
from pollux.sim.profiles import AppProfile

#: Geometric total-batch candidates tried per epoch by :func:`isolated_jct` (as the optimiser does).
NUM_CANDIDATES = 50
#: GPUs per node assumed when packing an isolated share onto as few nodes as possible.
GPUS_PER_NODE = 4

_ISO_CACHE: dict[tuple[Hashable, ...], float] = {}


def _profile_key(profile: AppProfile) -> tuple[Hashable, ...]:
    """Cache key of a profile: its name, plus its metadata and epoch ends as a cheap fingerprint."""
    name = getattr(profile, "name", None) or getattr(profile.meta, "name", None)
    meta = profile.meta
    try:
        hash(meta)
        meta_key: Hashable = meta
    except TypeError:
        meta_key = repr(meta)
    ends = tuple(float(x) for x in profile.epoch_ends)
    return (name, getattr(profile, "gpu_type", None), meta_key, ends)


def packed_placement(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> list[int]:
    """GPUs per node for ``gpus`` GPUs on as few nodes as possible: ``[4, 4, ..., rem]``
    (:func:`pollux.policy.placement.packed_shape`)."""
    return packed_shape(gpus, gpus_per_node)


def _candidates(profile: AppProfile, gpus: int, gpus_per_node: int = GPUS_PER_NODE
                ) -> list[tuple[int, float]]:
    """Feasible (total batch M, iteration time) pairs on ``gpus`` packed GPUs (deduplicated by M)."""
    limits = profile.meta.limits(accumulation=True)
    cands, exists = batch_candidates(gpus, limits)
    if not exists[0]:
        return []
    placement = packed_placement(gpus, gpus_per_node)
    _, ms, ss, within = accumulation_plan(cands[0], gpus, limits)
    step_cache: dict[int, tuple[float, float]] = {}
    out: dict[int, float] = {}
    for m, s, ok in zip(ms.astype(int).tolist(), ss.astype(int).tolist(), within.tolist(), strict=True):
        if not ok:
            continue
        if m not in step_cache:
            step, sync = profile.step_time(placement, m)
            step_cache[m] = (float(step), float(sync))
        step, sync = step_cache[m]
        if not (math.isfinite(step) and math.isfinite(sync)) or step <= 0:
            continue
        t_iter = step + s * (step - sync)
        batch = gpus * m * (s + 1)
        if t_iter > 0 and (batch not in out or t_iter < out[batch]):
            out[batch] = t_iter
    return sorted(out.items())


def _isolated_jct(profile: AppProfile, gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> float:
    cands = _candidates(profile, gpus, gpus_per_node)
    if not cands:
        return math.nan
    m0 = float(profile.meta.init_batch_size)
    batches = np.array([batch for batch, _ in cands], dtype=np.float64)
    t_iters = np.array([t_iter for _, t_iter in cands], dtype=np.float64)
    scales = batches / m0
    total = 0.0
    prev = 0.0
    # Every candidate of an epoch at once, with the same IEEE operations as one by one: looping over
    # the 50 candidates cost about 58 ms per (profile, share) on the pollux-osdi21 profiles, ~4 ms now.
    for e, end in enumerate(profile.epoch_ends):
        end = float(end)
        sqr, var = profile.grad_stats_many(e, batches)
        rates = gain(scales, sqr, var) / t_iters
        positive = rates[rates > 0.0]            # NaN rates fall out here too
        if positive.size == 0:
            return math.nan
        best = float(positive.max())
        total += (end - prev) / best
        prev = end
    return total


def isolated_jct(profile: AppProfile, gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> float:
    """JCT of the job run alone on ``gpus`` GPUs packed on as few nodes as possible (4 GPUs per
    node unless ``gpus_per_node`` says otherwise: the nodes of a GPU type).

    At every epoch the job runs its best configuration for that share by *true* goodput: over 50
    geometric total batches ``M`` from ``max(M0, min_local·g)`` to ``max_batch_size``, the smallest
    accumulation ``s`` with ``m = ceil(M/(g(s+1))) ≤ max_local_bsz`` (``s ≥ 1`` on one GPU above M0),
    ``T_iter = step + s·(step − sync)`` from the profile, and progress rate
    ``gain(M/M0, sqr, var)/T_iter`` with the profile's statistics for that epoch and batch. No
    restarts, no restart delay. If no configuration is feasible on exactly ``gpus`` GPUs (the
    profile cannot interpolate that placement, or ``min_local·g`` exceeds the max batch), the job
    uses the largest smaller share that works — an exclusive share does not force a job to use all of
    it. Cached per (profile, gpus).
    """
    gpus = int(gpus)
    if gpus < 1:
        raise ValueError(f"gpus: must be >= 1, got {gpus}")
    key = (*_profile_key(profile), gpus) if gpus_per_node == GPUS_PER_NODE else \
        (*_profile_key(profile), gpus, gpus_per_node)
    cached = _ISO_CACHE.get(key)
    if cached is not None:
        return cached
    value = math.nan
    for g in range(gpus, 0, -1):
        value = _isolated_jct(profile, g, gpus_per_node)
        if math.isfinite(value):
            break
    if not math.isfinite(value):
        name = key[0] if key[0] is not None else "profile"
        raise ValueError(f"{name}: no feasible configuration on {gpus} GPU(s) or fewer")
    _ISO_CACHE[key] = value
    return value


def isolated_share(job: JobResult, total_gpus: int) -> int:
    """GPUs of the job's isolated share: ``max(1, ⌊G / N̄⌋)``, 1 for ncf (its batch fits one replica)."""
    if job.application == "ncf":
        return 1
    mean_active = job.active_jobs_mean if job.active_jobs_mean and job.active_jobs_mean > 0 else 1.0
    return max(1, min(int(total_gpus), math.floor(total_gpus / mean_active + 1e-9)))


def finish_time_fairness(result: SimResult, profiles: dict[str, AppProfile], total_gpus: int) -> SimResult:
    """Fill ``rho = JCT / JCT_iso`` of every finished job of ``result`` (in place; returns it).

    ``JCT_iso`` is :func:`isolated_jct` on :func:`isolated_share` GPUs plus one start delay
    (``result.config.restart_delay``): a job run alone still pays its first start, which is not a
    restart. Without it, jobs shorter than a minute (ncf: ~46 s alone) would show ρ > 2 under every
    policy from the start delay alone. Unfinished jobs keep ``rho = None``.
    """
    start_delay = float(getattr(result.config, "restart_delay", 0.0))
    if total_gpus < 1:
        raise ValueError(f"total_gpus: must be >= 1, got {total_gpus}")
    for job in result.jobs:
        if job.jct is None:
            job.rho = None
            continue
        profile = profiles.get(job.application)
        if profile is None:
            raise ValueError(f"job {job.name}: no profile for application {job.application!r}")
        iso = isolated_jct(profile, isolated_share(job, total_gpus)) + start_delay
        job.rho = float(job.jct) / iso
    return result
