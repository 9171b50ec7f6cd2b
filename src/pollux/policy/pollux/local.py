"""Destroy-and-refill local search of the Pollux search (SPEC §5, step 2 of :mod:`pollux.policy.pollux`).

:func:`local_search` makes a few jobs give a GPU back, return to their current row (evicting what is in
the way, :func:`insert`) or drop to nothing, refills with :func:`pollux.policy.pollux.fill.greedy`, and
keeps the result when fitter; :func:`restore_rows` then tries moved jobs back on their current rows. The
greedy only ever grows, so shrinking is what lets capacity move to where it gains more.
"""

from __future__ import annotations

import numpy as np

from pollux.policy.pollux.fill import greedy
from pollux.policy.pollux.problem import PolluxProblem, _utility


def shrink_losses(prob: PolluxProblem, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every job: the node it would give one GPU back from (its largest share), the row
    after that, and the objective loss u(now) − u(after) (inf for jobs that cannot give)."""
    node = np.argmax(a, axis=1)
    after = a.copy()
    rows = np.arange(prob.num_jobs)
    after[rows, node] -= 1
    r = after.sum(axis=1)
    after[(r < prob.min_replicas) | (r <= 0)] = 0
    loss = _utility(prob.matrix_speedups(a), prob.p) - _utility(prob.matrix_speedups(after), prob.p)
    loss = np.where(prob.movable & (a.sum(axis=1) > 0), loss, np.inf)
    return node, after, loss


def insert(prob: PolluxProblem, a: np.ndarray, j: int, row: np.ndarray) -> np.ndarray:
    """Give job j exactly ``row`` (when within its caps), evicting what stands in the way: other
    distributed jobs on its nodes if it is distributed, then GPUs of the lowest-priority
    movable jobs on nodes over capacity. The result is feasible if ``a`` was."""
    r, nodes = int(row.sum()), np.flatnonzero(row)
    if r == 0 or r > prob.max_replicas[j] or r < prob.min_replicas[j] or nodes.size > prob.max_nodes:
        return a
    a = a.copy()
    a[j] = row
    if prob.interference:
        others = np.flatnonzero(np.count_nonzero(a, axis=1) > 1)
        others = others[others != j]
        if nodes.size > 1:
            clash = others[(a[np.ix_(others, nodes)] > 0).any(axis=1)]
        else:
            clash = others[:0]
        if (prob.pinned[clash]).any():
            return _undo(prob, a, j)
        a[np.ix_(clash, nodes)] = 0
    over = np.flatnonzero(a.sum(axis=0) > prob.cap)
    for n in over:
        excess = int(a[:, n].sum() - prob.cap[n])
        for i in np.flatnonzero(a[:, n])[::-1]:
            if i == j or prob.pinned[i]:
                continue
            t = min(excess, int(a[i, n]))
            a[i, n] -= t
            excess -= t
            if excess == 0:
                break
        if excess > 0:
            return _undo(prob, a, j)
    low = (a.sum(axis=1) < prob.min_replicas) & prob.movable
    a[low] = 0
    return a


def _undo(prob: PolluxProblem, a: np.ndarray, j: int) -> np.ndarray:
    a[j] = 0
    return prob.repair_one(a)


def local_search(prob: PolluxProblem, a: np.ndarray, rng: np.random.Generator, iterations: int,
                 fraction: float, max_jobs: int = 32, restore: int = 32) -> tuple[np.ndarray, float, float]:
    """Destroy-and-refill on one matrix; keeps each result that is fitter.

    Each round picks 1 … ``2·fraction`` of the movable jobs (at most ``max_jobs``; half of them,
    rounded up, among the running jobs whose objective term loses least by giving one GPU back)
    and applies to each, at random, one of: give one GPU back, return to its current row
    (evicting what stands in the way, see :func:`insert`), or drop to nothing. Then
    :func:`greedy` refills. Shrinking lets capacity move to where it gains more — the greedy
    only ever grows. Finally :func:`restore_rows` tries up to ``restore`` moved jobs back on their
    current rows. Returns (matrix, fitness, unpenalised fitness).
    """
    best = np.array(a, dtype=np.int64)
    bf, br = prob.fitness_pair(best)
    mov = np.flatnonzero(prob.movable)
    if mov.size == 0:
        return best, bf, br
    top = min(max(2, round(2 * fraction * mov.size)), max(int(max_jobs), 1), mov.size)
    losses = None
    for _ in range(iterations):
        if losses is None:
            losses = shrink_losses(prob, best)
        _, after, loss = losses
        size = int(rng.integers(1, top + 1))
        donors = np.flatnonzero(np.isfinite(loss))
        donors = donors[np.argsort(loss[donors], kind="stable")][: 2 * size]
        n_don = min((size + 1) // 2, donors.size)
        pick = rng.choice(donors, size=n_don, replace=False) if n_don else donors
        rest = np.setdiff1d(mov, pick)
        pick = np.concatenate([pick, rng.choice(rest, size=min(size - n_don, rest.size), replace=False)])
        op = rng.integers(0, 3, size=pick.size)
        cand = best.copy()
        cand[pick[op == 0]] = after[pick[op == 0]]
        cand[pick[op == 1]] = 0
        for j in pick[op == 2]:
            cand = insert(prob, cand, int(j), prob.cur[j])
        cand = greedy(prob, cand, loose=bool(rng.random() < 0.5))
        f, fr = prob.fitness_pair(cand)
        if (f, fr) > (bf, br):
            best, bf, br = cand, f, fr
            losses = None
    if restore > 0:
        return restore_rows(prob, best, bf, br, restore)
    return best, bf, br


def restore_rows(prob: PolluxProblem, a: np.ndarray, bf: float, br: float,
            max_jobs: int) -> tuple[np.ndarray, float, float]:
    """Try to put moved jobs back on their current rows (most promising first), refilling after
    each; keeps each fitter result. Catches a job moved only because another took its place."""
    best = a
    cur_u = _utility(prob.matrix_speedups(prob.cur, penalised=False), prob.p)
    now_u = _utility(prob.matrix_speedups(best), prob.p)
    moved = np.flatnonzero(prob.movable & (prob.cur.sum(axis=1) > 0) & (best != prob.cur).any(axis=1))
    moved = moved[np.argsort(now_u[moved] - cur_u[moved], kind="stable")][: max(int(max_jobs), 1)]
    for j in moved:
        if np.array_equal(best[j], prob.cur[j]):
            continue
        cand = greedy(prob, insert(prob, best, int(j), prob.cur[j]))
        f, fr = prob.fitness_pair(cand)
        if (f, fr) > (bf, br):
            best, bf, br = cand, f, fr
    return best, bf, br
