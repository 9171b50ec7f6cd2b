"""Goodput, its optimisation over batch size and accumulation, and speedup tables (SPEC §4).

``GOODPUT = THROUGHPUT × EFFICIENCY``. For any allocation the agent picks the total batch M (and so
the local batch m and accumulation steps s) that maximises it; the scheduler needs that best goodput
for every (nodes, replicas) it might give a job, relative to what the job would get on a fair share.
Everything here is vectorised over arrays of (nodes, replicas): a whole 16 × 64 speedup table is a
handful of numpy operations on a (pairs × 50 candidates) grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from pollux.goodput.efficiency import efficiency as _efficiency
from pollux.goodput.records import GradStats, ThroughputParams, check_number
from pollux.goodput.threads import one_blas_thread
from pollux.goodput.throughput import overlap, t_grad, t_iter, t_sync

#: Number of geometrically spaced total-batch candidates per allocation.
NUM_CANDIDATES = 50
#: The agent switches (m, s) only when the predicted goodput improves by more than this fraction.
HYSTERESIS = 0.05


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What a job allows the optimiser to choose (from the application, reported in its hints).

    ``max_batch_size`` None means a fixed batch (M0 only). ``min_local_bsz``/``max_local_bsz`` bound
    the per-replica batch (memory, or a lower bound below which a GPU is badly used); ``accumulation``
    allows gradient-accumulation steps when the local batch would exceed ``max_local_bsz``.
    """

    init_batch_size: float
    max_batch_size: float | None = None
    min_local_bsz: float = 1.0
    max_local_bsz: float | None = None
    accumulation: bool = False

    def __post_init__(self) -> None:
        m0 = check_number("init_batch_size", self.init_batch_size, minimum=1.0)
        object.__setattr__(self, "init_batch_size", m0)
        if self.max_batch_size is None:
            object.__setattr__(self, "max_batch_size", m0)
        mx = check_number("max_batch_size", self.max_batch_size, minimum=1.0)
        if mx < m0:
            raise ValueError(f"max_batch_size: {mx:g} is below init_batch_size {m0:g}")
        object.__setattr__(self, "max_batch_size", mx)
        lo = check_number("min_local_bsz", self.min_local_bsz, minimum=1.0)
        object.__setattr__(self, "min_local_bsz", lo)
        hi = mx if self.max_local_bsz is None else self.max_local_bsz
        hi = check_number("max_local_bsz", hi, minimum=1.0)
        if hi < lo:
            raise ValueError(f"max_local_bsz: {hi:g} is below min_local_bsz {lo:g}")
        object.__setattr__(self, "max_local_bsz", hi)

    @property
    def max_batch(self) -> float:
        """``max_batch_size`` as set by ``__post_init__`` (never None after construction)."""
        assert self.max_batch_size is not None
        return self.max_batch_size

    @property
    def max_local(self) -> float:
        """``max_local_bsz`` as set by ``__post_init__`` (never None after construction)."""
        assert self.max_local_bsz is not None
        return self.max_local_bsz

    @property
    def adaptive(self) -> bool:
        return self.max_batch > self.init_batch_size


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Best (M, m, s) per allocation; arrays shaped like the broadcast (nodes, replicas) input.

    ``goodput`` is 0 (and m, s, M are 0) where no candidate fits the local-batch bounds.
    """

    goodput: np.ndarray
    batch_size: np.ndarray
    local_bsz: np.ndarray
    accum_steps: np.ndarray
    efficiency: np.ndarray
    throughput: np.ndarray


@dataclass(frozen=True, slots=True)
class GoodputModel:
    """A job's goodput model: fitted throughput parameters, gradient statistics and its M0."""

    throughput_params: ThroughputParams
    grad_stats: GradStats
    init_batch_size: float

    def __post_init__(self) -> None:
        check_number("init_batch_size", self.init_batch_size, minimum=1.0)

    def efficiency(self, batch_size: ArrayLike) -> np.ndarray:
        return _efficiency(batch_size, self.init_batch_size, self.grad_stats.sqr, self.grad_stats.var)

    def throughput(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike,
                   accum_steps: ArrayLike = 0) -> np.ndarray:
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        s = np.asarray(accum_steps, dtype=np.float64)
        return k * m * (s + 1.0) / t_iter(self.throughput_params, nodes, replicas, m, s)

    def goodput(self, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike,
                accum_steps: ArrayLike = 0) -> np.ndarray:
        k = np.asarray(replicas, dtype=np.float64)
        m = np.asarray(local_bsz, dtype=np.float64)
        s = np.asarray(accum_steps, dtype=np.float64)
        batch = k * m * (s + 1.0)
        return self.throughput(nodes, replicas, m, s) * self.efficiency(batch)

    def measured_goodput(self, batch_size: ArrayLike, step_time: ArrayLike) -> np.ndarray:
        """The goodput of steps that were timed rather than predicted: ``batch_size`` examples per
        ``step_time`` seconds, weighted by the statistical efficiency at that batch, so that it
        compares with :meth:`goodput` of the same configuration."""
        batch = np.asarray(batch_size, dtype=np.float64)
        return batch / np.asarray(step_time, dtype=np.float64) * self.efficiency(batch)

    def optimize(self, nodes: ArrayLike, replicas: ArrayLike, limits: BatchLimits) -> BatchPlan:
        """Best goodput and its (M, m, s) for every (nodes, replicas) pair, all at once."""
        return optimize(self, nodes, replicas, limits)


def local_bounds(limits: BatchLimits) -> tuple[int, int]:
    """Whole-example local batch bounds: fractional bounds rounded inwards."""
    return math.ceil(limits.min_local_bsz - 1e-9), math.floor(float(limits.max_local) + 1e-9)


def batch_candidates(replicas: ArrayLike, limits: BatchLimits,
                     valid: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The total-batch candidates of SPEC §4 for each replica count, shape (P, 50).

    50 geometric values from ``max(M0, min_local_bsz·K)`` to ``max_batch_size``. Returns the
    candidates and, per replica count, whether any candidate exists (the low end is not above the max).
    """
    k = np.atleast_1d(np.asarray(replicas, dtype=np.float64))
    ok = np.ones(k.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool).copy()
    lo, _ = local_bounds(limits)
    low = np.maximum(limits.init_batch_size, lo * k)
    mmax = float(limits.max_batch)
    ok &= low <= mmax
    ratio = np.where(ok, mmax / low, 1.0)
    frac = np.linspace(0.0, 1.0, NUM_CANDIDATES)
    return low[:, None] * ratio[:, None] ** frac[None, :], ok


def accumulation_plan(batch: ArrayLike, replicas: ArrayLike, limits: BatchLimits, *,
                      force_single: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """How a total batch runs on K replicas: (actual M, local m, accumulation s, m within bounds).

    s is the smallest with ``m = ceil(M/(K·(s+1))) ≤ max_local_bsz`` (0 without accumulation), and at
    least 1 on one replica above M0 so that real multi-sample gradient statistics get measured — unless
    ``force_single`` is False (the agent measures them with probe steps instead, see
    ``pollux.torch.data``). The actual total batch is ``K·m·(s+1)`` (m rounds up). Arrays broadcast.
    """
    cand = np.asarray(batch, dtype=np.float64)
    kk = np.asarray(replicas, dtype=np.float64)
    lo, hi = local_bounds(limits)
    m0 = limits.init_batch_size
    if limits.accumulation:
        s = np.maximum(np.ceil(cand / (kk * hi) - 1e-9) - 1.0, 0.0)
        force = (kk == 1.0) & (cand > m0 * (1.0 + 1e-9)) & force_single
        s = np.where(force, np.maximum(s, 1.0), s)
    else:
        s = np.zeros(np.broadcast(cand, kk).shape)
    m = np.ceil(cand / (kk * (s + 1.0)) - 1e-9)
    return kk * m * (s + 1.0), m, s, (m >= lo) & (m <= hi)


def bounded_step_time(params: ThroughputParams, nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike,
                      accum_steps: ArrayLike = 0, grad_floor: float | None = None) -> np.ndarray:
    """``t_iter`` with the pass time beyond the largest measured local batch bounded by the prior.

    ``grad_floor = m_ref`` (the largest local batch with a measured step): for ``m > m_ref`` the pass
    time is at least ``T_grad(m_ref)·(1 + m/m_ref)/2`` — the linear extrapolation the SPEC §3 prior
    makes from a single measured batch (half the time fixed, half per example) — so a fit whose
    per-example slope came out too small cannot promise near-free larger batches. None: plain ``t_iter``.
    """
    if grad_floor is None:
        return t_iter(params, nodes, replicas, local_bsz, accum_steps)
    m = np.asarray(local_bsz, dtype=np.float64)
    tg = t_grad(params, m)
    ref = float(grad_floor)
    floor = float(t_grad(params, ref)) * (1.0 + m / ref) / 2.0
    tg = np.where(m > ref, np.maximum(tg, floor), tg)
    ts = t_sync(params, nodes, replicas)
    gamma = float(params.gamma) if isinstance(params, ThroughputParams) else float(np.asarray(params)[6])
    return np.asarray(accum_steps, dtype=np.float64) * tg + overlap(tg, ts, gamma)


@one_blas_thread
def optimize(model: GoodputModel, nodes: ArrayLike, replicas: ArrayLike,
             limits: BatchLimits, *, force_single_accumulation: bool = True,
             grad_floor: float | None = None) -> BatchPlan:
    """Vectorised batch-size optimisation (SPEC §4).

    Candidates: 50 geometric values from ``max(M0, min_local_bsz·K)`` to ``max_batch_size``. For
    each, the smallest s with ``m = ceil(M/(K·(s+1))) ≤ max_local_bsz`` (s = 0 without accumulation;
    s ≥ 1 on one replica above M0, so that real multi-sample gradient statistics get measured);
    a candidate whose m falls outside the local bounds is worth 0. The argmax wins.
    ``force_single_accumulation=False`` drops the one-replica rule (see :func:`accumulation_plan`);
    ``grad_floor`` bounds extrapolated pass times (see :func:`bounded_step_time`).
    """
    nodes_b, replicas_b = np.broadcast_arrays(np.asarray(nodes), np.asarray(replicas))
    shape = nodes_b.shape
    n = nodes_b.reshape(-1).astype(np.float64)
    k = replicas_b.reshape(-1).astype(np.float64)
    valid_pair = (k >= 1) & (n >= 1) & (n <= k)
    k_safe = np.where(valid_pair, k, 1.0)
    n_safe = np.where(valid_pair, n, 1.0)
    if model.init_batch_size != limits.init_batch_size:
        raise ValueError(f"limits.init_batch_size: {limits.init_batch_size:g} differs from the model's "
                         f"init_batch_size {model.init_batch_size:g}")
    cand, valid_pair = batch_candidates(k_safe, limits, valid_pair)
    kk = k_safe[:, None]
    batch, m, s, ok = accumulation_plan(cand, kk, limits, force_single=force_single_accumulation)
    ok &= valid_pair[:, None]
    tp = batch / bounded_step_time(model.throughput_params, n_safe[:, None], kk, m, s, grad_floor)
    if limits.adaptive:
        eff = model.efficiency(batch)
    else:
        # A fixed-batch job's step is worth the same whatever its batch rounding (SPEC §2).
        eff = np.ones_like(batch)
    good = np.where(ok, tp * eff, 0.0)
    best = np.argmax(good, axis=1)
    rows = np.arange(good.shape[0])
    g = good[rows, best]
    found = g > 0.0

    def pick(a: np.ndarray) -> np.ndarray:
        return np.where(found, a[rows, best], 0.0).reshape(shape)

    return BatchPlan(
        goodput=g.reshape(shape),
        batch_size=pick(batch),
        local_bsz=pick(m),
        accum_steps=pick(s),
        efficiency=pick(eff),
        throughput=pick(tp),
    )


def exploration_cap(max_replicas_seen: int, limits: BatchLimits,
                    max_replicas: int | None = None, factor: int = 2) -> int:
    """Most replicas a job may be given now (SPEC §3).

    ``max(factor × most replicas ever held, 1)`` (``factor`` 2 as SPEC §3), capped by the job's
    ``max_replicas`` and by ``max_batch_size // min_local_bsz`` (more replicas could not each get a
    valid local batch).
    """
    if int(factor) < 1:
        raise ValueError(f"factor: must be >= 1, got {factor!r}")
    cap = max(int(factor) * int(max_replicas_seen), 1)
    if max_replicas is not None:
        cap = min(cap, int(max_replicas))
    cap = min(cap, int(limits.max_batch // limits.min_local_bsz))
    return max(cap, 0)


def fair_share(num_nodes: int, gpus_per_node: int, num_jobs: int,
               gpus_per_replica: int = 1) -> tuple[int, int]:
    """(nodes, replicas) of an exclusive 1/J share of the cluster, through the dominant share.

    With dominant resource share ``d`` of one replica (``gpus_per_replica / total GPUs``), the fair
    share is ``ceil(1/d/J)`` replicas on ``ceil(num_nodes·d)`` nodes. The node count is the reference
    implementation's quirk (one node on 16 × 4 GPUs, however many replicas the share holds); it is
    reproduced to match the published comparison.
    """
    total = num_nodes * gpus_per_node
    jobs = max(int(num_jobs), 1)
    # Integer arithmetic: 1/d = total/gpus_per_replica exactly, so no float rounding creeps in.
    replicas = max(-(-total // (gpus_per_replica * jobs)), 1)
    nodes = max(-(-(num_nodes * gpus_per_replica) // total), 1)
    return min(nodes, replicas), replicas


@one_blas_thread
def speedup_table(
    model: GoodputModel,
    limits: BatchLimits,
    max_nodes: int,
    max_replicas: int,
    fair: tuple[int, int] = (1, 1),
    replica_cap: int | None = None,
) -> np.ndarray:
    """Speedup of a job at every (nodes ≤ max_nodes, replicas ≤ max_replicas), shape (N+1, R+1).

    Entry ``[n, r]`` is the best goodput on r replicas over n nodes divided by the best goodput on
    the fair share ``fair = (nodes, replicas)``; row and column 0, entries with ``n > r`` and entries
    above ``replica_cap`` (the exploration cap) are 0. If the fair share itself admits no valid batch,
    goodput on one replica is the reference instead (and failing that, the best in the table), so
    the table is never divided by zero.
    """
    n_idx, r_idx = np.meshgrid(np.arange(max_nodes + 1), np.arange(max_replicas + 1), indexing="ij")
    plan = optimize(model, n_idx, r_idx, limits)
    good = plan.goodput
    if replica_cap is not None:
        good = np.where(r_idx <= replica_cap, good, 0.0)
    base = float(optimize(model, fair[0], fair[1], limits).goodput)
    if base <= 0.0:
        base = float(optimize(model, 1, 1, limits).goodput)
    if base <= 0.0:
        base = float(good.max())
    if base <= 0.0:
        return np.zeros_like(good)
    return good / base


def should_switch(current_goodput: float, candidate_goodput: float,
                  threshold: float = HYSTERESIS) -> bool:
    """Hysteresis of the agent: change (m, s) only for a predicted gain above ``threshold``."""
    if current_goodput <= 0.0:
        return candidate_goodput > 0.0
    return candidate_goodput > current_goodput * (1.0 + threshold)
