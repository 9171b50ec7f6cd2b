"""Which waiting jobs a Pollux round may leave out of its search (issue 38).

An overloaded cluster queues hundreds of jobs: on Sia's 64-GPU mix, 960 jobs submitted in eight hours
keep 128–511 jobs waiting in a third of the rounds (315 on average there), all of them new (they
have never run, so they have no model yet) and alike. Every part of the search costs time in
proportion to the jobs in the round, and those rounds took 62 % of the policy's time, mostly on
jobs that could not all get a GPU.

Two waiting jobs are *interchangeable* when their speedup tables and their replica limits are the
same: then swapping their rows maps every feasible allocation to a feasible one. Only their
re-allocation penalty factors may differ (a waiting job that gets GPUs always pays its factor, since
its row changes from nothing). Take an allocation that gives GPUs to job k but none to an
interchangeable job j whose factor is at least k's: swapping their rows gives j the speedup
``factor_j · table(row) ≥ factor_k · table(row)`` and k nothing, so the objective does not fall (the
unpenalised tie-break does not move). Hence some optimum gives GPUs, within each class of
interchangeable waiting jobs, only to a prefix of the class ordered by factor, highest first. No more
than ``G / max(min_replicas, 1)`` jobs of a class can hold GPUs at once on ``G`` GPUs, so the rest
of the class can be left out without losing an optimum. A waiting job whose limits let it take no
GPU at all (not movable) is left out too. The round's fair share and fitness still count the jobs
left out (``round_jobs`` of :class:`~.problem.PolluxProblem`): they hold nothing and weigh in
with speedup 0, so the fitness of an allocation is the same as over the whole round.

Jobs that hold GPUs are always kept: their rows are the current allocation, and their penalty
applies only if it changes.
"""

from __future__ import annotations

import numpy as np

from pollux.policy.pollux.problem import PolluxProblem


def surplus_waiting(prob: PolluxProblem) -> np.ndarray:
    """Per job of ``prob`` (in its priority order), whether the search may leave it out.

    A waiting job is left out when it cannot take a GPU, or when at least as many interchangeable
    waiting jobs as its class can run at once rank above it (by penalty factor, then priority).
    """
    waiting = np.flatnonzero(prob.cur.sum(axis=1) == 0)      # pinned jobs hold GPUs: never waiting
    drop = np.zeros(prob.num_jobs, dtype=bool)
    if waiting.size == 0:
        return drop
    # A class is the job's whole table and its limits (the table's size follows from the limits).
    # A waiting job's table ends at its replica cap (and as many nodes), zero beyond: the key reads
    # only as far as the largest of them, which for new jobs is a handful of entries.
    replicas = int(prob.max_replicas[waiting].max())
    nodes = min(prob.max_nodes, prob.num_nodes, replicas)
    keys = np.concatenate([
        prob.tables.table[waiting, : nodes + 1, : replicas + 1].reshape(waiting.size, -1),
        prob.min_replicas[waiting, None].astype(np.float64),
        prob.max_replicas[waiting, None].astype(np.float64),
    ], axis=1)
    rows = np.ascontiguousarray(keys).view(np.dtype((np.void, keys.shape[1] * keys.itemsize))).ravel()
    _, cls = np.unique(rows, return_inverse=True)
    cls = cls.ravel()
    # Within a class: highest penalty factor first, then the priority order (the waiting index).
    order = np.lexsort((waiting, -prob.pen[waiting], cls))
    sorted_cls = cls[order]
    starts = np.flatnonzero(np.r_[True, sorted_cls[1:] != sorted_cls[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, order.size]))
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size) - first
    runnable = prob.total_gpus // np.maximum(prob.min_replicas[waiting], 1)
    drop[waiting] = ~prob.movable[waiting] | (rank >= np.maximum(runnable, 1))
    return drop
