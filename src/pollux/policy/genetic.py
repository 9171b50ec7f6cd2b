"""A small genetic search over populations of allocation matrices, reusable by any policy.

A population is one float32 array ``(genes, individuals, nodes)`` of whole numbers — for a scheduling
policy, GPUs of each job (gene) on each node in each candidate allocation. This layout makes every
per-node and per-gene reduction a small matrix product. The search knows nothing of the problem beyond
the four methods of :class:`GeneticProblem`; the operators are plain functions:

* :func:`select` — the best distinct individuals (fitness, then a tie-breaking second score);
* :func:`crossover` — binary tournaments pick parent pairs; single-point crossover over the gene axis;
* :func:`mutate_allocation` — the SPEC §5 mutation of allocation matrices (reset a row to the current
  allocation, zero elements, grow into free capacity), given the current rows, node capacities and
  per-gene growth limits;
* :func:`genetic_search` — seeds, then generations of crossover → mutation → repair → selection until
  the best individual stalls.

Every random draw comes from the caller's seeded generator, in a fixed order, so a search is
deterministic for a seed.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

#: Reference mutation probabilities (SPEC §5): reset a row, pick a row for zeroing, zero an element.
RESET_PROB = 0.1
ZERO_ROW_PROB = 0.1
ZERO_ELEM_PROB = 0.1
#: Arrays up to this many elements are reduced by matrix products, larger ones by einsum (which stays
#: on one thread: a multi-threaded BLAS call competes for busy cores).
SMALL = 1 << 18


class GeneticProblem(Protocol):
    """What :func:`genetic_search` needs of a problem; populations are ``(genes, individuals, nodes)``."""

    def evaluate(self, pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(fitness, tie-breaking score) per individual; higher is better."""
        ...

    def repair(self, pop: np.ndarray) -> np.ndarray:
        """A feasible copy of the population."""
        ...

    def mutate(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The population mutated (in place allowed)."""
        ...

    def keys(self, pop: np.ndarray) -> np.ndarray:
        """One hashable key per individual, equal exactly for equal individuals (see :func:`keys`)."""
        ...


def row_sums(pop: np.ndarray) -> np.ndarray:
    """Sum over nodes per (gene, individual)."""
    nj, q, nn = pop.shape
    if pop.size <= SMALL:
        return (pop.reshape(-1, nn) @ np.ones(nn, dtype=np.float32)).reshape(nj, q)
    return np.einsum("jqn->jq", pop)


def col_sums(pop: np.ndarray) -> np.ndarray:
    """Sum over genes per (individual, node)."""
    nj, q, nn = pop.shape
    if pop.size <= SMALL:
        return (np.ones(nj, dtype=np.float32) @ pop.reshape(nj, -1)).reshape(q, nn)
    return np.einsum("jqn->qn", pop)


def keys(pop: np.ndarray, dtype: type[np.integer] = np.uint8) -> np.ndarray:
    """One bytes key per individual of a whole-number population, for exact duplicate detection
    (``dtype`` must hold the largest value)."""
    flat = np.ascontiguousarray(pop.transpose(1, 0, 2), dtype=dtype).reshape(pop.shape[1], -1)
    return flat.view(np.dtype((np.void, flat.shape[1] * flat.itemsize))).ravel()


def select(pop: np.ndarray, fit: np.ndarray, raw: np.ndarray, size: int,
           keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best ``size`` distinct individuals, fittest first (ties: ``raw``, then index); ``keys``
    identify duplicates (one per individual)."""
    order = np.lexsort((np.arange(pop.shape[1]), -raw, -fit))
    if pop.shape[0] * pop.shape[2]:
        _, first = np.unique(keys[order], return_index=True)
        keep = order[np.sort(first)][:size]
    else:
        keep = order[:1]
    return pop[:, keep, :], fit[keep], raw[keep]


def crossover(pop: np.ndarray, fit: np.ndarray, raw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Binary tournaments pick parent pairs; single-point crossover over the gene axis; as many
    children as parents (rounded up to even)."""
    size = pop.shape[1]
    nj = pop.shape[0]
    pairs = max((size + 1) // 2, 1)
    a = rng.integers(size, size=(2, 2 * pairs))
    better = (fit[a[0]] > fit[a[1]]) | ((fit[a[0]] == fit[a[1]]) & (raw[a[0]] >= raw[a[1]]))
    win = np.where(better, a[0], a[1])
    pa, pb = win[:pairs], win[pairs:]
    cut = rng.integers(1, nj, size=pairs) if nj > 1 else np.ones(pairs, dtype=np.int64)
    head = np.arange(nj)[:, None] < cut[None, :]                  # (J, pairs)
    sel = np.concatenate([np.where(head, pa, pb), np.where(head, pb, pa)], axis=1)
    return pop[np.arange(nj)[:, None], sel]


def mutate_allocation(pop: np.ndarray, rng: np.random.Generator, current: np.ndarray,
                      capacity: np.ndarray, grow_limit: np.ndarray) -> np.ndarray:
    """SPEC §5 mutation of a population of allocations; modifies ``pop`` in place and returns it.

    ``current`` ``(genes, nodes)`` is what a reset row becomes, ``capacity`` ``(nodes,)`` bounds growth
    per node and ``grow_limit`` ``(genes,)`` the row sums growth may reach (all float32).
    """
    nj, q, nn = pop.shape
    rows = pop.reshape(-1, nn)
    # Reset a row to the job's current allocation.
    ri = np.flatnonzero(rng.random(nj * q, dtype=np.float32) < RESET_PROB)
    if ri.size:
        rows[ri] = current[ri // q]
    # For ~10 % of rows, zero each element with probability 0.1.
    zi = np.flatnonzero(rng.random(nj * q, dtype=np.float32) < ZERO_ROW_PROB)
    if zi.size:
        rows[zi] *= rng.random((zi.size, nn), dtype=np.float32) >= ZERO_ELEM_PROB
    # Growth: element (j, n) grows to a uniform value in [value, max feasible] with probability
    # p1 + p2 − p1·p2 on nodes the job uses (p2 = 1/#such nodes), p1 elsewhere (p1 = 1/#nodes
    # where the job fits one more replica).
    free = np.maximum(capacity - col_sums(pop), 0.0)                 # (q, N)
    room = np.maximum(grow_limit[:, None] - row_sums(pop), 0.0)     # (J, q)
    has_free = free > 0
    n_free = has_free.sum(axis=1)
    # Rows (job, individual) that may grow: the job has room and its individual a free GPU.
    ri = np.flatnonzero((room > 0) & (n_free > 0)[None, :])
    if ri.size == 0:
        return pop
    rq = ri % q
    cand = has_free[rq]                                         # (R, N): nodes with a free GPU
    used = rows[ri] > 0
    np.logical_and(used, cand, out=used)
    p1 = (1.0 / n_free[rq]).astype(np.float32)[:, None]           # 1/#nodes that fit one more
    p2 = 1.0 / np.maximum(used.astype(np.float32) @ np.ones(nn, dtype=np.float32), 1.0)[:, None]
    prob = used * (p2 - p1 * p2)                                  # p1 + p2 − p1·p2 where used
    prob += p1
    prob *= cand
    u = rng.random(prob.shape, dtype=np.float32)
    gi = np.flatnonzero(u < prob)
    if gi.size:
        # Given growth, u/prob is uniform on [0, 1): reuse it for the new value.
        r_i, n_i = np.divmod(gi, nn)
        v = np.minimum(u.reshape(-1)[gi] / prob.reshape(-1)[gi], np.float32(0.999999))
        hi = np.minimum(free[rq[r_i], n_i], room.reshape(-1)[ri[r_i]])
        pop.reshape(-1)[ri[r_i] * nn + n_i] += np.floor(v * (hi + 1.0))
    return pop


def _step(problem: GeneticProblem, pop: np.ndarray, fit: np.ndarray, raw: np.ndarray, extra: np.ndarray,
          size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repair and evaluate ``extra``, then keep the best ``size`` of both."""
    extra = problem.repair(extra)
    ef, er = problem.evaluate(extra)
    both = np.concatenate([pop, extra], axis=1)
    return select(both, np.concatenate([fit, ef]), np.concatenate([raw, er]), size, problem.keys(both))


def genetic_search(problem: GeneticProblem, seeds: np.ndarray, rng: np.random.Generator, population: int,
                   generations: int, patience: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Genetic search from ``seeds`` ``(genes, k, nodes)``.

    The seeds (repaired, best distinct first) are topped up to ``population`` with mutants of
    themselves; then each generation breeds as many children (:func:`crossover`, ``mutate``,
    ``repair``) and keeps the best distinct ``population`` of parents and children, stopping after
    ``patience`` generations without a better best individual (None: run all ``generations``).
    Returns (population, fitness, score, generations run), fittest first.
    """
    seeds = problem.repair(seeds)
    fit, raw = problem.evaluate(seeds)
    pop, fit, raw = select(seeds, fit, raw, population, problem.keys(seeds))
    if pop.shape[1] < population:
        # Fill the initial population with mutants of the seeds.
        idx = np.arange(population - pop.shape[1]) % pop.shape[1]
        pop, fit, raw = _step(problem, pop, fit, raw, problem.mutate(pop[:, idx, :], rng), population)
    best = (float(fit[0]), float(raw[0]))
    stall = 0
    done = 0
    for _ in range(generations):
        children = problem.mutate(crossover(pop, fit, raw, rng), rng)
        pop, fit, raw = _step(problem, pop, fit, raw, children, population)
        done += 1
        now = (float(fit[0]), float(raw[0]))
        if now > best:
            best, stall = now, 0
        else:
            stall += 1
        if patience is not None and stall >= patience:
            break
    return pop, fit, raw, done
