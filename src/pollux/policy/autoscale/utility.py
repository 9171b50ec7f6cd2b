"""The cluster's utility at every size: each job's speedup curve, and the curves shared out.

A job's speedup on ``k`` GPUs is its best goodput there over its best goodput on one GPU (the
thesis's ``max_{m,s} GOODPUT(a, m, s) / max_{m,s} GOODPUT(1, m, s)``), packed on as few nodes as
``k`` needs; with ``measure="throughput"`` it is Or et al.'s: the throughput of a fixed batch per GPU
over one GPU's, statistical efficiency left out. The cluster's utility on ``B`` GPUs is the sum of
the jobs' speedups when the GPUs go, one grant at a time, to the job whose next grant gains the most
per GPU. Perfect scaling makes it ``B``: so utility per GPU is the cluster-wide form of the thesis's
"goodput per GPU against the ideal", and for one job it is exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel
from pollux.policy.base import JobView

__all__ = ["Measure", "best_values", "speedup_curves", "utility_by_size"]

Measure = Literal["goodput", "throughput"]


def best_values(model: GoodputModel, limits: BatchLimits, top: int, gpus_per_node: int,
                measure: Measure) -> np.ndarray:
    """A job's best goodput (or, for ``"throughput"``, its fixed batch per GPU's throughput) on
    1..``top`` GPUs packed ``gpus_per_node`` to a node: the raw values a speedup curve divides."""
    k = np.arange(1, top + 1)
    nodes = -(-k // gpus_per_node)
    if measure == "goodput":
        return model.optimize(nodes, k, limits).goodput
    local = float(limits.init_batch_size)
    fits = k * local <= float(limits.max_batch)     # the batch grows with the GPUs, to the max
    value = np.where(fits, model.throughput(nodes, k, local), 0.0)
    return np.maximum.accumulate(value)


def _curve(job: JobView, gpus: int, gpus_per_node: int, measure: Measure) -> np.ndarray:
    """Speedup on 0..``gpus`` GPUs of one job (0 on none)."""
    out = np.zeros(gpus + 1)
    if job.fixed is not None and job.model is None:
        replicas = max(int(job.fixed[0]), 1)
        if replicas <= gpus:
            out[replicas:] = replicas              # a rigid job: its GPUs are worth one each, at its size
        return out
    if job.model is None or job.limits is None:
        out[1:] = 1.0                              # no model yet: one GPU is worth one, more nothing
        return out
    top = min(gpus, max(int(job.max_replicas), 1))
    value = best_values(job.model, job.limits, top, gpus_per_node, measure)
    one = float(value[0])
    if one <= 0:
        out[1:] = 1.0
        return out
    out[1:top + 1] = value / one
    out[top + 1:] = out[top]
    return out


def speedup_curves(jobs: Sequence[JobView], gpus: int, gpus_per_node: int,
                   measure: Measure = "goodput") -> np.ndarray:
    """Shape (jobs, gpus + 1): each job's speedup on 0..``gpus`` GPUs (see the module docstring)."""
    if not jobs:
        return np.zeros((0, gpus + 1))
    return np.stack([_curve(j, gpus, gpus_per_node, measure) for j in jobs])


def _greedy(curves: np.ndarray, budget: int) -> float:
    """Utility of ``budget`` GPUs granted greedily: each grant (1 or more GPUs to one job, within
    what is left) the one with the highest gain per GPU, until no grant gains."""
    jobs = curves.shape[0]
    held = np.zeros(jobs, dtype=np.int64)
    rows = np.arange(jobs)
    used = 0
    value = 0.0
    width = curves.shape[1] - 1
    while used < budget:
        room = budget - used
        steps = np.arange(1, room + 1)
        reach = held[:, None] + steps[None, :]
        ahead = np.where(reach <= width, curves[rows[:, None], np.minimum(reach, width)], -np.inf)
        rate = (ahead - curves[rows, held][:, None]) / steps[None, :]
        j, d = divmod(int(np.argmax(rate)), room)
        gain = float(rate[j, d])
        if not gain > 1e-12:
            break
        held[j] += d + 1
        used += d + 1
        value += gain * (d + 1)
    return value


def utility_by_size(curves: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Utility of the cluster on each of ``sizes`` GPUs (``curves``: the jobs' speedup curves), the
    GPUs of each size granted greedily by gain per GPU (:func:`_greedy`, one run per size: a grant
    that suits a large cluster may not fit a small one)."""
    if curves.shape[0] == 0:
        return np.zeros(len(sizes))
    return np.array([_greedy(curves, int(b)) for b in sizes])
