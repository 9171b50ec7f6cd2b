"""PolluxPolicy: the round's search (SPEC §5), step by step over a :class:`PolluxProblem`.

See :mod:`pollux.policy.pollux` for the objective and the steps.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from pollux.goodput.threads import one_blas_thread
from pollux.policy.base import Allocation, Cluster, JobView, PolicyState, encode_state
from pollux.policy.genetic import genetic_search, select
from pollux.policy.pollux.fill import greedy
from pollux.policy.pollux.local import local_search
from pollux.policy.pollux.problem import PolluxProblem
from pollux.policy.pollux.prune import surplus_waiting
from pollux.policy.pollux.reuse import STATE_KEY, may_reuse, record


class PolluxPolicy:
    """PolluxSched: maximise FITNESS_p of the jobs' goodput speedups (SPEC §5).

    Parameters
    ----------
    p: power of the fitness mean (−1 default: harmonic; 0: geometric; 1: arithmetic).
    restart_penalty_s: δ of the re-allocation penalty ``(T − R·δ)/(T + δ)``.
    population, generations: size and (maximum) length of the genetic search (reference 100 × 100).
    max_nodes_per_job: most nodes one job may span (16).
    interference_avoidance: at most one distributed job per node (a hard constraint).
    patience: stop the genetic search after this many generations without a better best individual;
        None runs all ``generations``. With ``greedy_seed``, small problems get more:
        ``patience_work / (jobs × nodes)`` generations, at most ``10 × jobs``.
    greedy_seed: run the greedy fill (from the current allocation, from nothing but the pinned jobs,
        from the best carried individual) and the destroy-and-refill search before the genetic
        search, and seed it with their results. ``greedy_seed=False, patience=None`` is the plain
        100 × 100 genetic search of the reference (seeded by the current allocation and the carried
        population only).
    local_search_iters, local_search_iters_large: destroy-and-refill rounds (at most 4 per movable
        job) on clusters where the genetic search runs, and where it does not; each touches up to
        ``2 × local_search_fraction`` of the movable jobs (at most ``local_search_max_jobs``), from
        the best ``local_search_starts`` distinct greedy results.
    dense_limit: problems whose dense population ``population × jobs × nodes`` exceeds this (it would
        not fit in memory) run only the greedy fill (tight packing) and the local search, and carry
        their ``keep_large`` best individuals in the state.
    genetic_limit: the genetic search runs only when ``population × jobs × nodes`` is at most this
        (512 cells at the default population); larger problems that still fit ``dense_limit`` run
        every greedy fill and the local search and carry their best ``population`` results. Past
        that size the genetic search stopped finding anything its greedy seeds had not: it beat
        them in none of the 1,630 rounds above 512 cells of a 960-job run, which cost 69 s of its
        89 s, nor in the 237 of a 320-job one (docs/policy-pollux.md). None: wherever
        ``dense_limit`` allows, as without ``greedy_seed``.
    table_cache: how many speedup tables to memoise across rounds, keyed by (model, limits, fair
        share, table size); a table is a pure function of that key, so results do not depend on it.
    reuse_drift: keep the running allocation without searching when nothing but the jobs' ages and
        attained service changed since the search that chose it, and no job's re-allocation penalty
        factor has moved more than this since (:mod:`.reuse`); None searches every round.
    prune_waiting: leave out of the search the waiting jobs that cannot matter: interchangeable
        waiting jobs beyond what the cluster could run at once, and those that can take no GPU
        (:mod:`.prune`; an optimum is never lost). False searches over every job.

    ``decide`` returns the fittest allocation and a JSON-able state holding the final population
    (sparse, keyed by job and node ids; its arrays encoded by :func:`pollux.policy.base.encode_state`),
    the reuse record of :mod:`.reuse`, plus ``objective``, ``generations``, ``search`` and
    ``left_out`` (waiting jobs the search left out) for diagnostics (``search`` is ``"reused"`` in a
    round that kept the running allocation).
    """

    name = "pollux"

    def __init__(
        self,
        p: float = -1.0,
        restart_penalty_s: float = 30.0,
        population: int = 100,
        generations: int = 100,
        max_nodes_per_job: int = 16,
        interference_avoidance: bool = True,
        *,
        patience: int | None = 5,
        patience_work: int = 2000,
        greedy_seed: bool = True,
        dense_limit: int = 4_000_000,
        genetic_limit: int | None = 51_200,
        local_search_iters: int = 12,
        local_search_iters_large: int = 4,
        local_search_fraction: float = 0.1,
        local_search_max_jobs: int = 32,
        local_search_starts: int = 1,
        keep_large: int = 4,
        table_cache: int = 2048,
        reuse_drift: float | None = 1e-3,
        prune_waiting: bool = True,
    ) -> None:
        if not math.isfinite(p):
            raise ValueError(f"p: must be finite, got {p!r}")
        if restart_penalty_s < 0 or not math.isfinite(restart_penalty_s):
            raise ValueError(f"restart_penalty_s: must be finite and >= 0, got {restart_penalty_s!r}")
        if population < 2:
            raise ValueError(f"population: must be >= 2, got {population!r}")
        if generations < 0:
            raise ValueError(f"generations: must be >= 0, got {generations!r}")
        if max_nodes_per_job < 1:
            raise ValueError(f"max_nodes_per_job: must be >= 1, got {max_nodes_per_job!r}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience: must be >= 1 or None, got {patience!r}")
        if genetic_limit is not None and genetic_limit < 0:
            raise ValueError(f"genetic_limit: must be >= 0 or None, got {genetic_limit!r}")
        if reuse_drift is not None and not (math.isfinite(reuse_drift) and reuse_drift >= 0):
            raise ValueError(f"reuse_drift: must be finite and >= 0, or None, got {reuse_drift!r}")
        self.p = float(p)
        self.restart_penalty_s = float(restart_penalty_s)
        self.population = int(population)
        self.generations = int(generations)
        self.max_nodes_per_job = int(max_nodes_per_job)
        self.interference_avoidance = bool(interference_avoidance)
        self.patience = patience
        self.patience_work = int(patience_work)
        self.greedy_seed = bool(greedy_seed)
        self.dense_limit = int(dense_limit)
        self.genetic_limit = None if genetic_limit is None else int(genetic_limit)
        self.local_search_iters = int(local_search_iters)
        self.local_search_iters_large = int(local_search_iters_large)
        self.local_search_fraction = float(local_search_fraction)
        self.local_search_max_jobs = int(local_search_max_jobs)
        self.local_search_starts = max(int(local_search_starts), 1)
        self.keep_large = max(int(keep_large), 1)
        self.table_cache_size = max(int(table_cache), 0)
        self.reuse_drift = None if reuse_drift is None else float(reuse_drift)
        self.prune_waiting = bool(prune_waiting)
        self._tables: OrderedDict = OrderedDict()

    def problem(self, jobs: Sequence[JobView], cluster: Cluster,
                round_jobs: int | None = None) -> PolluxProblem:
        """This round's search problem (tables, constraints, objective) for the given inputs;
        ``round_jobs`` counts the round's jobs when ``jobs`` are only some of them."""
        return PolluxProblem(
            jobs, cluster, p=self.p, restart_penalty_s=self.restart_penalty_s,
            max_nodes_per_job=self.max_nodes_per_job, interference_avoidance=self.interference_avoidance,
            table_cache=self._tables, cache_size=self.table_cache_size, round_jobs=round_jobs,
        )

    def search_problem(self, jobs: Sequence[JobView], cluster: Cluster) -> PolluxProblem:
        """The problem the round searches: all of ``jobs``, or without the waiting jobs that cannot
        matter when ``prune_waiting`` (:mod:`.prune`)."""
        prob = self.problem(jobs, cluster)
        if not self.prune_waiting or prob.num_jobs == 0 or prob.num_nodes == 0:
            return prob
        drop = surplus_waiting(prob)
        if not drop.any():
            return prob
        kept = [job for job, left_out in zip(prob.jobs, drop.tolist(), strict=True) if not left_out]
        return self.problem(kept, cluster, round_jobs=prob.num_jobs)

    @one_blas_thread
    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]:
        prob = self.search_problem(jobs, cluster)
        if prob.num_jobs == 0 or prob.num_nodes == 0:
            out_state = prob.encode(np.zeros((prob.num_jobs, 0, prob.num_nodes), dtype=np.float32))
            out_state.update(objective=1.0, generations=0, search="none", left_out=0)
            return {}, encode_state(out_state)
        if state is not None and self.reuse_drift is not None and may_reuse(prob, state, self.reuse_drift):
            return self._reuse(prob, state)
        work = self.population * prob.num_jobs * prob.num_nodes
        dense = work <= self.dense_limit
        # Without greedy seeds the genetic search is the whole search: the limit does not apply.
        genetic = dense and (not self.greedy_seed or self.genetic_limit is None
                             or work <= self.genetic_limit)
        carried = prob.repair(prob.remap(state, self.population if dense else self.keep_large))
        current = prob.repair_one(prob.cur)
        found: list[np.ndarray] = []
        if self.greedy_seed or not dense:
            found = self._greedy_search(prob, current, carried, dense, rng)
        if genetic:
            seeds = np.concatenate([prob.stack([*found, current]), carried], axis=1)
            patience = self.patience
            if patience is not None and self.greedy_seed:
                # Small problems get more patience: their generations are cheap (but a handful of
                # jobs has little to recombine).
                cells = prob.num_jobs * prob.num_nodes
                extra = min(self.generations, self.patience_work // max(cells, 1), 10 * prob.num_jobs)
                patience = max(patience, extra)
            pop, fit, raw, gens = genetic_search(prob, seeds, rng, self.population, self.generations,
                                                 patience)
            search = "genetic"
        else:
            pop = np.concatenate([prob.stack([*found, current]), carried], axis=1)
            fit, raw = prob.evaluate(pop)
            pop, fit, raw = select(pop, fit, raw, self.population if dense else self.keep_large,
                                   prob.keys(pop))
            gens = 0
            search = "greedy"
        best = prob.unstack(pop, 0)
        if not prob.feasible(best):          # never expected; a guarantee all the same
            best = prob.repair_one(best)
            search += "+repair"
        out_state = prob.encode(pop)
        # The objective is the fitness of the allocation chosen (pollux.policy.base.state_objective).
        out_state.update(objective=prob.fitness(best), generations=int(gens), search=search,
                         left_out=prob.absent)
        out_state[STATE_KEY] = record(prob, best)
        return prob.to_allocation(best), encode_state(out_state)

    def _reuse(self, prob: PolluxProblem, state: PolicyState) -> tuple[Allocation, PolicyState]:
        """The running allocation, and the carried state as it was (its population, and the reuse
        record of the search that chose this allocation, so that the penalties' drift adds up)."""
        out_state = dict(state)
        out_state.update(objective=prob.fitness(prob.cur), generations=0, search="reused",
                         left_out=prob.absent)
        return prob.to_allocation(prob.cur), encode_state(out_state)

    def _greedy_search(self, prob: PolluxProblem, current: np.ndarray, carried: np.ndarray, dense: bool,
                       rng: np.random.Generator) -> list[np.ndarray]:
        """Greedy fills and the local search; their results, best-found first."""
        starts = [current, prob.repair_one(np.where(prob.pinned[:, None], prob.cur, 0))]
        if carried.shape[1]:
            cf, cr = prob.evaluate(carried)
            starts.append(prob.unstack(carried, int(np.lexsort((-cr, -cf))[0])))
        found = [greedy(prob, x) for x in starts]
        if dense:
            # The same two starts packing single-node jobs loosely (most room first), for variety.
            found += [greedy(prob, x, loose=True) for x in starts[:2]]
        ranked = sorted(range(len(found)), key=lambda i: prob.fitness_pair(found[i]), reverse=True)
        tops: list[np.ndarray] = []
        for i in ranked:
            if len(tops) < self.local_search_starts and not any(np.array_equal(found[i], t) for t in tops):
                tops.append(found[i])
        iters = self.local_search_iters if dense else self.local_search_iters_large
        iters = min(iters, 4 * int(prob.movable.sum()))        # a few jobs: few distinct moves
        for t in tops:
            improved, _, _ = local_search(prob, t, rng, iters, self.local_search_fraction,
                                         self.local_search_max_jobs,
                                         self.local_search_max_jobs if dense else 0)
            found.insert(0, improved)
        return found
