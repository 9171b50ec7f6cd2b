"""Candidate configurations of the Sia policy and their values (one round's mixed-integer program input).

A *configuration* is (GPU type t, GPU count n) for one job. :func:`build_configs` lists, for every
schedulable job, the counts it may get on each type it can run — 1, 2, 4, … up to one node of the
type, then whole multiples of the node size, capped by the free GPUs of the type, the job's
``max_replicas`` and an exploration cap like Pollux's (SPEC §3; its factor is an option of the
policy, 4 by default, see :data:`pollux.policy.sia.EXPLORE_FACTOR`) — together with the job's current
count (so keeping it is always possible) and its ``min_replicas``. Each configuration's goodput
comes from the job's model on that type (:meth:`JobView.model_for`), one vectorised
:func:`pollux.goodput.optimize` call per (job, type); a type missing from a non-None ``type_models``
cannot run the job and offers nothing.

Values (the program *minimises* a cost; p < 0 as in Sia):

* ``G`` — goodput normalised per job by its best 1-GPU goodput over the types it can run, so that
  jobs of very different speeds weigh alike (Sia's per-job normalisation);
* ``f`` — the re-allocation factor of SPEC §5, ``(T − R·δ)/(T + δ)``, on every configuration that
  differs from the job's current one (a job without GPUs has none, so its first start is
  penalised too, as in Pollux), floored at ``min_factor`` so a brand-new job still ranks its
  configurations by goodput instead of seeing them all as worthless;
* ``cost = (max(G, G_FLOOR) · f)^p`` — minimising Σ cost maximises the power-mean utility of
  ``problem.py`` (for p < 0 it is −Σ x^p);
* the cost of leaving the job without GPUs is ``λ_n ×`` the dearest cost among its cheapest sensible
  configurations (its fewest GPUs on each type it can run, restart factor included): with λ_n > 1
  leaving it out is worse than any of them, so a job never waits while one of them fits, whatever
  its type speeds or restart history, and a job whose restarts already cost it a lot (small f) is
  expensive to preempt. Larger counts with a worse cost than that (a sync-bound job on many slow
  GPUs) are simply never chosen.

Jobs without a goodput model yet get one candidate count (1 GPU, or their ``min_replicas``) on every
type they can run, worth G = 1 — as Pollux gives a new job one GPU (its exploration cap).

Cost (issue 38): a round lists every queued job (~400 at the peak of a 960-job run), and most of them
are the same as in the previous round. A job's rows are computed from a record of what they depend
on (:func:`row_inputs`, :func:`plan_rows`), so the policy memoises them by that record across rounds
(:mod:`.sia_job_rows`); what changes every round for every job — its age, in the re-allocation factor
— is applied to the whole table at once. The table is the same, bit for bit, with the memo or without
it (``tests/test_sia_config_memo.py``). The goodputs of the rows not memoised are computed for all
those jobs together (:mod:`.sia_goodput`; a job's rows are planned, asked for, then assembled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pollux.goodput import BatchLimits, exploration_cap
from pollux.policy.base import Cluster, JobView, restart_factors
from pollux.policy.sia_goodput import GoodputAsk, GoodputCache
from pollux.policy.sia_job_rows import (
    JobRows,
    RowInputs,
    RowMemo,
    RowPlan,
    TypeInput,
    TypePlan,
    candidate_bound,
    count_key,
    effective_limits,
)

#: Normalised goodputs below this count as this (bounds every cost for p < 0).
G_FLOOR = 1e-3


@dataclass(frozen=True, slots=True)
class ConfigTable:
    """One round's configurations, flattened: entry k is job ``job[k]`` on type ``gtype[k]`` with
    ``count[k]`` GPUs.

    ``goodput`` is the normalised goodput G, ``changed`` whether it differs from the job's current
    configuration, ``cost`` the program's per-configuration cost and ``idle_cost[j]`` the cost of
    leaving job j without GPUs. ``counts[j][t]`` lists job j's candidate counts on type t (the
    placement falls back along it). Jobs are the rows of ``job_ids``; types ``types``.
    """

    job_ids: tuple[str, ...]
    types: tuple[str, ...]
    job: np.ndarray
    gtype: np.ndarray
    count: np.ndarray
    goodput: np.ndarray
    changed: np.ndarray
    cost: np.ndarray
    idle_cost: np.ndarray
    counts: tuple[dict[int, tuple[int, ...]], ...]
    #: Per job: the goodput normaliser (G = goodput / norm; 1 for a job without a model, whose
    #: goodput is its GPUs over its fewest GPUs on the type), the re-allocation factor of a changed
    #: configuration, and whether it runs now (λ_a applies). With them :func:`config_cost` values a
    #: configuration the table does not list (the placement's fallbacks) exactly as the program would.
    norm: np.ndarray
    factor: np.ndarray
    running: np.ndarray

    @property
    def size(self) -> int:
        return int(self.job.size)


def restart_factor(job: JobView, delta: float) -> float:
    """SPEC §5 re-allocation factor ``(T − R·δ)/(T + δ)`` of one job (:func:`restart_factors`)."""
    return float(restart_factors([job], delta)[0])


def base_counts(node_size: int, upper: int) -> np.ndarray:
    """1, 2, 4, … up to one node of ``node_size`` GPUs, then whole multiples of it, all ≤ ``upper``."""
    if node_size <= 0 or upper <= 0:
        return np.zeros(0, dtype=np.int64)
    pows = [1 << i for i in range(max(node_size.bit_length(), 1)) if (1 << i) < node_size]
    mult = np.arange(node_size, upper + 1, node_size, dtype=np.int64)
    out = np.concatenate([np.asarray(pows, dtype=np.int64), mult])
    return out[out <= upper]


def current_config(job: JobView, cluster: Cluster, node_index: dict[str, int],
                   node_type: np.ndarray) -> tuple[int, int, int] | None:
    """(type index, GPUs, nodes) of the job's current allocation when it lies on one type; else None."""
    types: set[int] = set()
    gpus = nodes = 0
    for node, g in job.allocation.items():
        i = node_index.get(node)
        if i is None or g <= 0:
            continue
        types.add(int(node_type[i]))
        gpus += int(g)
        nodes += 1
    if gpus == 0 or len(types) != 1:
        return None
    return types.pop(), gpus, nodes


def _job_cap(inputs: RowInputs, limits: BatchLimits, factor: int) -> int:
    """Pollux's exploration cap with ``factor`` on a type (``limits`` of that type), raised to
    min_replicas."""
    cap = exploration_cap(inputs.max_replicas_seen, limits, inputs.max_replicas, factor)
    if 0 < inputs.min_replicas <= inputs.max_replicas:
        cap = max(cap, inputs.min_replicas)
    return int(cap)


def row_inputs(job: JobView, current: tuple[int, int, int] | None, types: tuple[str, ...],
               free_by_type: Sequence[int], node_size: Sequence[int], *, rigid_fixed: bool,
               explore_factor: int) -> RowInputs:
    """What ``job``'s rows of this round's table are computed from (:mod:`.sia_job_rows`).

    Everything :func:`plan_rows` reads and nothing more, so that equal inputs mean equal rows: a type
    the job cannot run on this round is None, and the GPUs it may get on a type are capped at the
    largest count it could list (:func:`candidate_bound`), so that free GPUs varying above that
    leave a waiting job's inputs, and its memoised rows, as they were.
    """
    # Called for every job every round: the job's fields are read once.
    min_replicas = int(job.min_replicas)
    max_replicas = int(job.max_replicas)
    seen = int(job.max_replicas_seen)
    lo = max(min_replicas, 1)
    fixed = int(job.fixed[0]) if rigid_fixed and job.fixed is not None else None
    bound = candidate_bound(current, min_replicas, seen, fixed, explore_factor)
    type_models = job.type_models
    per_type: list[TypeInput | None] = []
    for t, name in enumerate(types):
        upper_hw = min(free_by_type[t], max_replicas)
        no_profile = type_models is not None and name not in type_models
        if no_profile or upper_hw < lo or node_size[t] <= 0:
            per_type.append(None)                 # cannot run here this round
            continue
        per_type.append(TypeInput(job.model_for(name), job.limits_for(name), min(upper_hw, bound)))
    return RowInputs(current, min_replicas, max_replicas, seen, fixed, tuple(per_type))


def plan_rows(inputs: RowInputs, node_size: Sequence[int], explore_factor: int) -> RowPlan:
    """The candidate counts of one job on every type it may run, and the goodputs they need; its
    rows are a function of ``inputs`` alone (so they may be memoised by them)."""
    cur = inputs.current
    lo = max(inputs.min_replicas, 1)
    types: list[TypePlan] = []
    for t, given in enumerate(inputs.per_type):
        if given is None:
            continue
        model = given.model
        limits = effective_limits(given)
        keep = cur[1] if cur is not None and cur[0] == t else 0
        if inputs.fixed is not None:
            cand = np.asarray([inputs.fixed], dtype=np.int64)
        elif model is None:
            cand = np.asarray([lo, keep], dtype=np.int64)
        else:
            assert limits is not None
            # Every count up to the job's cap, free GPUs or not: the goodputs of this set are
            # memoised across rounds (the free GPUs change every round; the model seldom), and
            # the counts above the free GPUs are dropped after the lookup.
            cand = np.concatenate([base_counts(node_size[t], _job_cap(inputs, limits, explore_factor)),
                                   np.asarray([inputs.min_replicas, keep], dtype=np.int64)])
        cand = np.unique(cand)
        cand = cand[cand >= lo]
        fits = cand <= given.upper
        if not fits.any():
            continue
        if model is None:
            types.append(TypePlan(t, cand, fits, None))
            continue
        assert limits is not None
        nodes = -(-cand // node_size[t])
        if cur is not None and cur[0] == t:
            nodes = np.where(cand == cur[1], cur[2], nodes)
        # One ask per (job, type): the candidates plus the 1-GPU reference of the normaliser.
        # Each entry is computed on its own (optimize is elementwise), so dropping the counts that
        # do not fit afterwards gives exactly what computing only the others would.
        ask = GoodputAsk(model, limits, np.concatenate([nodes, [1]]), np.concatenate([cand, [1]]))
        types.append(TypePlan(t, cand, fits, ask))
    return RowPlan(cur, tuple(types))


def assemble_rows(plan: RowPlan, goodputs: Sequence[np.ndarray]) -> JobRows:
    """The rows of ``plan`` with ``goodputs``, the answers to its asks in order."""
    per_type: dict[int, tuple[int, ...]] = {}
    kept_types: list[int] = []
    kept_counts: list[np.ndarray] = []
    kept_goodputs: list[np.ndarray] = []                    # raw, before the normaliser
    best1 = 0.0
    no_model = True
    answers = iter(goodputs)
    for t_plan in plan.types:
        t, cand, fits = t_plan.gtype, t_plan.counts[t_plan.fits], t_plan.fits
        if t_plan.ask is None:
            good = cand.astype(np.float64) / float(cand[0])
        else:
            no_model = False
            every = next(answers)                             # the candidates, then the 1-GPU reference
            best1 = max(best1, float(every[-1]))
            good = every[:-1][fits]
            ok = good > 0.0
            if not ok.all():
                if not ok.any():
                    continue
                cand, good = cand[ok], good[ok]
        kept_types.append(t)
        kept_counts.append(cand)
        kept_goodputs.append(good)
        per_type[t] = tuple(cand.tolist())
    if not kept_types:
        return _NO_ROWS
    # G = goodput over the best 1-GPU goodput on any type (no model: G = GPUs / fewest GPUs).
    norm = 1.0
    if not no_model:
        norm = best1 if best1 > 0.0 else float(min(good.min() for good in kept_goodputs))
    count = np.concatenate(kept_counts).astype(np.int64, copy=False)
    gtype = np.repeat(np.asarray(kept_types, dtype=np.int64), [c.size for c in kept_counts])
    changed = np.ones(count.size, dtype=bool)
    cur = plan.current
    if cur is not None:
        changed &= (gtype != cur[0]) | (count != cur[1])
    return JobRows(gtype=gtype, count=count, goodput=np.concatenate(kept_goodputs) / norm,
                   changed=changed, counts=per_type, norm=norm)


#: The rows of a job that can run nowhere this round.
_NO_ROWS = JobRows(gtype=np.zeros(0, dtype=np.int64), count=np.zeros(0, dtype=np.int64),
                   goodput=np.zeros(0, dtype=np.float64), changed=np.zeros(0, dtype=bool), counts={},
                   norm=0.0)


def build_configs(
    jobs: Sequence[JobView],
    cluster: Cluster,
    free_by_type: np.ndarray,
    *,
    p: float,
    lambda_n: float,
    restart_penalty_s: float,
    min_factor: float,
    rigid_fixed: bool,
    cache: GoodputCache,
    lambda_a: float = 0.0,
    explore_factor: int = 2,
    memo: RowMemo | None = None,
) -> ConfigTable:
    """The configurations of ``jobs`` (already in priority order, pinned jobs excluded).

    ``free_by_type[t]`` is the GPUs of type t the program may hand out (capacity minus pinned jobs).
    ``rigid_fixed``: a job's ``fixed`` replicas is the only count it may get (TunedJobs-style rigid
    jobs); otherwise a rigid job is one with ``min_replicas == max_replicas``. ``lambda_a`` is a flat
    cost of changing a running job's configuration (or stopping it), Sia's λ_a. ``explore_factor``
    is the exploration cap's multiple of the most GPUs a job has held (SPEC §3's 2 for Pollux).
    ``memo`` keeps each job's rows across rounds (:mod:`.sia_job_rows`); the table is the same
    with it or without it, only cheaper to build when most jobs are unchanged since the last round.
    """
    types = cluster.type_names
    node_type = cluster.type_index()
    node_index = cluster.index()
    gpus = cluster.capacity()
    node_size = [int(gpus[node_type == t].max(initial=0)) for t in range(len(types))]
    free = [int(x) for x in free_by_type]
    if memo is not None:
        memo.bind((types, tuple(node_size), bool(rigid_fixed), int(explore_factor)))

    currents = [current_config(job, cluster, node_index, node_type) for job in jobs]
    rows: list[JobRows] = []
    missing: list[tuple[int, RowInputs, tuple, RowPlan]] = []  # (place in rows, inputs, count key, plan)
    for job, cur in zip(jobs, currents, strict=True):
        inputs = row_inputs(job, cur, types, free, node_size, rigid_fixed=rigid_fixed,
                            explore_factor=explore_factor)
        found = memo.get(job.id, inputs) if memo is not None else None
        if found is None:
            key = count_key(inputs)
            plan = memo.plan(job.id, inputs, key) if memo is not None else None
            if plan is None:
                plan = plan_rows(inputs, node_size, explore_factor)
            missing.append((len(rows), inputs, key, plan))
            found = _NO_ROWS                       # a place holder, filled below
        rows.append(found)
    # The rows not memoised: every goodput they need asked at once (one batched optimisation).
    answers = iter(cache.goodput_many([ask for _, _, _, plan in missing for ask in plan.asks]))
    for i, inputs, key, plan in missing:
        made = assemble_rows(plan, [next(answers) for _ in plan.asks])
        if memo is not None:
            memo.put(jobs[i].id, inputs, made, key, plan)
        rows[i] = made

    sizes = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
    listed = sizes > 0
    # Where a job has rows: its normaliser, and its re-allocation factor (floored) on the changed ones.
    norm_a = np.fromiter((r.norm for r in rows), dtype=np.float64, count=len(rows))
    f_all = np.maximum(restart_factors(jobs, restart_penalty_s), min_factor)
    f_a = np.where(listed, f_all, 1.0)
    job_a = np.repeat(np.arange(len(jobs), dtype=np.int64), sizes)

    def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    type_a = cat([r.gtype for r in rows], np.int64)
    count_a = cat([r.count for r in rows], np.int64)
    good_a = cat([r.goodput for r in rows], np.float64)
    changed_a = cat([r.changed for r in rows], bool)
    factor_a = np.where(changed_a, f_a[job_a], 1.0)
    running = np.array([cur is not None for cur in currents], dtype=bool)
    cost = config_cost(good_a, factor_a, changed_a & running[job_a], p, lambda_a)
    idle = np.zeros(len(jobs))
    if job_a.size:
        # The cheapest sensible configuration of a job on a type is its fewest GPUs there (entries
        # are in ascending count per (job, type)); the idle cost is λ_n times the dearest of those.
        first = np.ones(job_a.size, dtype=bool)
        first[1:] = (job_a[1:] != job_a[:-1]) | (type_a[1:] != type_a[:-1])
        worst = np.full(len(jobs), -np.inf)
        np.maximum.at(worst, job_a[first], cost[first])
        has = np.isfinite(worst)
        # (For p > 0 the cost is negative: "worse" is then closer to zero by the same margin.)
        idle[has] = worst[has] + (lambda_n - 1.0) * np.abs(worst[has])
    idle = idle + lambda_a * running
    return ConfigTable(
        job_ids=tuple(job.id for job in jobs), types=types, job=job_a, gtype=type_a, count=count_a,
        goodput=good_a, changed=changed_a, cost=cost,
        idle_cost=idle, counts=tuple(r.counts for r in rows), norm=norm_a, factor=f_a, running=running,
    )


def config_cost(goodput: np.ndarray, factor: np.ndarray, changed_running: np.ndarray, p: float,
                lambda_a: float) -> np.ndarray:
    """The program's cost of configurations: ``utility_cost(max(G, G_FLOOR) · f, p)`` plus λ_a where a
    running job would change (``f`` is 1 on a job's current configuration)."""
    cost = utility_cost(np.maximum(goodput, G_FLOOR) * factor, p)
    return cost + lambda_a * changed_running if lambda_a else cost


def utility_cost(x: np.ndarray, p: float) -> np.ndarray:
    """Cost whose sum the program minimises: ``x^p`` for p < 0, ``−x^p`` for p > 0 (−u of problem.py)."""
    if p < 0.0:
        return np.power(x, p)
    if p > 0.0:
        return -np.power(x, p)
    raise ValueError("p: must be non-zero for the sia policy")


def check_options(p: float, lambda_n: float, restart_penalty_s: float, min_factor: float) -> None:
    """``ValueError`` naming the bad option of :class:`pollux.policy.sia.SiaPolicy`."""
    if not math.isfinite(p) or p == 0.0:
        raise ValueError(f"p: must be finite and non-zero, got {p!r}")
    if not math.isfinite(lambda_n) or lambda_n <= 1.0:
        raise ValueError(f"lambda_n: must be finite and > 1 (leaving a job out must cost more than "
                         f"running it), got {lambda_n!r}")
    if not math.isfinite(restart_penalty_s) or restart_penalty_s < 0:
        raise ValueError(f"restart_penalty_s: must be finite and >= 0, got {restart_penalty_s!r}")
    if not 0.0 < min_factor <= 1.0:
        raise ValueError(f"min_factor: must be in (0, 1], got {min_factor!r}")
