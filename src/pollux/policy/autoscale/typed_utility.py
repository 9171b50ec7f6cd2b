"""The cluster's utility on a cloud of several GPU types, and the cheapest way to grow it.

The untyped module (:mod:`.utility`) reads one number per size. A cloud with GPU types has a size
per type, so a size is a vector ``n`` (nodes per type) and there are many of them; this module
reduces them to one ordered *path* and keeps everything else as it was for one type:

* **a job's speedup on ``k`` GPUs of type ``t``** is its best goodput on ``k`` GPUs of ``t`` over its
  best goodput on one GPU of its *best* type (its model on ``t`` when the view has one,
  :meth:`JobView.model_for`; else its one model for every type). A job that is faster on ``t``
  therefore gains more from a GPU of ``t``, on the same scale as from any other type. Jobs without a
  model and rigid jobs are worth what :mod:`.utility` says, on any type.
* **the utility ``U(n)``**: grants (job, type, ``d`` GPUs) handed out greedily by gain per GPU within
  each type's GPUs, a job staying on the type of its first grant (a job runs on one type at a time).
* **the ideal ``ideal(n) = Σ_t n_t · gpus_t · r_t``** with ``r_t`` the mean over jobs of (one GPU of
  ``t`` over one GPU of the job's best type): what the GPUs would give with perfect scaling, counting
  a slow GPU for less. ``E(n) = U(n) / ideal(n)``.
* **the path**: from no node, one node at a time, of the type whose next node adds the most utility
  per price (``ΔU / price_per_node_hour``; a free node is the cheapest; ties go to the cheaper pool,
  then to the earlier one). The path is what the rule chooses among: "the largest step with
  ``E ≥ grow_to``" is then a single vector, and the nodes it adds are the best value for money.

With one type ``r = 1``, the path is 1, 2, …, ``max_nodes`` nodes and every number is computed by the
same arithmetic as the untyped module's, so the typed rule decides exactly as the untyped one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pollux.policy.autoscale.api import NodePool
from pollux.policy.autoscale.utility import Measure, best_values
from pollux.policy.base import JobView

__all__ = ["TypedCurves", "UtilityPath", "typed_curves", "typed_greedy", "utility_path"]


@dataclass(frozen=True)
class TypedCurves:
    """Per pool, every job's speedup on 0..(the pool's GPUs) GPUs of its type (``curves[t]``, shape
    (jobs, gpus_t + 1)), and per pool ``r_t`` (``ratios``: a GPU of the type against one of each
    job's best type, averaged over the jobs; 1 without jobs)."""

    pools: tuple[NodePool, ...]
    curves: tuple[np.ndarray, ...]
    ratios: np.ndarray

    @property
    def jobs(self) -> int:
        return int(self.curves[0].shape[0]) if self.curves else 0

    def ideal(self, nodes: np.ndarray) -> float:
        """``Σ_t n_t · gpus_t · r_t``: the utility of ``nodes`` under perfect scaling."""
        gpus = np.array([p.gpus_per_node for p in self.pools], dtype=np.int64)
        return float(np.sum(nodes * gpus * self.ratios))


def _rigid_curve(job: JobView, width: int) -> np.ndarray:
    out = np.zeros(width + 1)
    replicas = max(int(job.fixed[0]), 1) if job.fixed is not None else 1
    if replicas <= width:
        out[replicas:] = replicas                  # a rigid job: its GPUs are worth one each, at its size
    return out


def _unknown_curve(width: int) -> np.ndarray:
    out = np.zeros(width + 1)
    out[1:] = 1.0                                  # no model: one GPU is worth one, more nothing
    return out


def _job_curves(job: JobView, pools: Sequence[NodePool],
                measure: Measure) -> tuple[list[np.ndarray], list[float]]:
    """One job's speedup curve on every pool's type, and its one-GPU ratio there (see the module)."""
    widths = [p.max_nodes * p.gpus_per_node for p in pools]
    if job.fixed is not None and job.model is None:
        return [_rigid_curve(job, w) for w in widths], [1.0] * len(pools)
    values: list[np.ndarray | None] = []
    tops: list[int] = []
    for pool, width in zip(pools, widths, strict=True):
        model, limits = job.model_for(pool.gpu_type), job.limits_for(pool.gpu_type)
        top = min(width, max(int(job.max_replicas), 1))
        tops.append(top)
        values.append(None if model is None or limits is None
                      else best_values(model, limits, top, pool.gpus_per_node, measure))
    ones = [float(v[0]) for v in values if v is not None]
    best_one = max(ones) if ones else 0.0
    if best_one <= 0:
        return [_unknown_curve(w) for w in widths], [1.0] * len(pools)
    curves: list[np.ndarray] = []
    ratios: list[float] = []
    for value, top, width in zip(values, tops, widths, strict=True):
        if value is None:
            curves.append(_unknown_curve(width))
            ratios.append(1.0)
            continue
        out = np.zeros(width + 1)
        out[1:top + 1] = value / best_one
        out[top + 1:] = out[top]
        curves.append(out)
        ratios.append(float(value[0]) / best_one)
    return curves, ratios


def typed_curves(jobs: Sequence[JobView], pools: Sequence[NodePool],
                 measure: Measure = "goodput") -> TypedCurves:
    """Every job's speedup curve on every pool's type, and the pools' ``r_t`` (see the module)."""
    pools = tuple(pools)
    if not jobs:
        empty = tuple(np.zeros((0, p.max_nodes * p.gpus_per_node + 1)) for p in pools)
        return TypedCurves(pools, empty, np.ones(len(pools)))
    per_job = [_job_curves(j, pools, measure) for j in jobs]
    curves = tuple(np.stack([c[t] for c, _ in per_job]) for t in range(len(pools)))
    ratios = np.array([[r[t] for _, r in per_job] for t in range(len(pools))]).mean(axis=1)
    return TypedCurves(pools, curves, ratios)


def typed_greedy(curves: Sequence[np.ndarray], budgets: Sequence[int]) -> float:
    """Utility of ``budgets[t]`` GPUs of each type, granted greedily: each grant (1 or more GPUs of one
    type to one job, within what is left of the type) the one with the highest gain per GPU, a job
    keeping to the type of its first grant, until no grant gains. Between types whose best grants
    gain alike, the one with more GPUs left per job on it wins: a job that scales the same on both
    then starts where it will have room to grow, instead of crowding the first type while the other
    stays idle (a grant is chosen one step at a time and never moves a job).

    With one type this is :func:`pollux.policy.autoscale.utility._greedy` operation for operation
    (the same arrays, the same first-maximum tie-break), which the one-type parity relies on."""
    jobs = curves[0].shape[0] if curves else 0
    if jobs == 0:
        return 0.0
    held = np.zeros(jobs, dtype=np.int64)
    on = np.full(jobs, -1, dtype=np.int64)       # the type each job runs on (-1: none yet)
    rows = np.arange(jobs)
    used = [0] * len(curves)
    value = 0.0
    while True:
        best: tuple[float, float, int, int, int] | None = None   # (gain per GPU, share, type, job, GPUs - 1)
        for t, curve in enumerate(curves):
            room = int(budgets[t]) - used[t]
            if room <= 0:
                continue
            width = curve.shape[1] - 1
            base = np.where(on == t, held, 0)
            steps = np.arange(1, room + 1)
            reach = base[:, None] + steps[None, :]
            ahead = np.where(reach <= width, curve[rows[:, None], np.minimum(reach, width)], -np.inf)
            rate = (ahead - curve[rows, base][:, None]) / steps[None, :]
            elsewhere = (on >= 0) & (on != t)
            if elsewhere.any():
                rate[elsewhere] = -np.inf
            j, d = divmod(int(np.argmax(rate)), room)
            gain = float(rate[j, d])
            share = room / (int(np.count_nonzero(on == t)) + 1)
            if best is None or gain > best[0] or (gain == best[0] and share > best[1]):
                best = (gain, share, t, j, d)
        if best is None or not best[0] > 1e-12:
            break
        gain, _, t, j, d = best
        on[j] = t
        held[j] += d + 1
        used[t] += d + 1
        value += gain * (d + 1)
    return value


@dataclass
class UtilityPath:
    """The path of the module docstring: ``steps[s]`` the nodes per pool after ``s`` additions
    (``steps[0]`` is none), ``added[s - 1]`` the pool index step ``s`` added, ``efficiency[s]`` its
    ``E`` (``E`` of no node is 0). :meth:`efficiency_of` reads ``E`` of any vector, on the path or not
    (the fleet may hold one that is not), from the same cache of utilities."""

    curves: TypedCurves
    steps: np.ndarray
    added: tuple[int, ...]
    efficiency: np.ndarray
    _utility: dict[tuple[int, ...], float] = field(default_factory=dict, repr=False)

    def utility_of(self, nodes: np.ndarray) -> float:
        key = tuple(int(n) for n in nodes)
        if key not in self._utility:
            budgets = [n * p.gpus_per_node for n, p in zip(key, self.curves.pools, strict=True)]
            self._utility[key] = typed_greedy(self.curves.curves, budgets)
        return self._utility[key]

    def efficiency_of(self, nodes: np.ndarray) -> float:
        ideal = self.curves.ideal(nodes)
        return self.utility_of(nodes) / ideal if ideal > 0 else 0.0

    def first_with_gpus(self, gpus: int) -> int:
        """The first step whose nodes hold at least ``gpus`` GPUs (the last step if none does)."""
        per_node = np.array([p.gpus_per_node for p in self.curves.pools], dtype=np.int64)
        enough = np.flatnonzero(self.steps @ per_node >= gpus)
        return int(enough[0]) if enough.size else len(self.steps) - 1


def _score(gain: float, price: float) -> float:
    """Utility per price of a node; a free node that gains anything outranks every priced one."""
    if price > 0:
        return gain / price
    return math.inf if gain > 1e-12 else 0.0


def utility_path(curves: TypedCurves) -> UtilityPath:
    """The path from no node to every pool's ``max_nodes`` (see the module docstring)."""
    pools = curves.pools
    limit = np.array([p.max_nodes for p in pools], dtype=np.int64)
    path = UtilityPath(curves, np.zeros((1, len(pools)), dtype=np.int64), (), np.zeros(1))
    here = np.zeros(len(pools), dtype=np.int64)
    steps = [here.copy()]
    added: list[int] = []
    efficiency = [0.0]
    while np.any(here < limit):
        base = path.utility_of(here)
        choice: tuple[float, float, int] | None = None           # (score, -price, -pool index)
        for t, pool in enumerate(pools):
            if here[t] >= limit[t]:
                continue
            nxt = here.copy()
            nxt[t] += 1
            price = pool.price_per_node_hour
            key = (_score(path.utility_of(nxt) - base, price), -price, -t)
            if choice is None or key > choice:
                choice = key
        assert choice is not None
        t = -choice[2]
        here[t] += 1
        steps.append(here.copy())
        added.append(t)
        efficiency.append(path.efficiency_of(here))
    path.steps = np.stack(steps)
    path.added = tuple(added)
    path.efficiency = np.array(efficiency)
    return path
