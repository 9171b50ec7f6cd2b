"""The Pollux scheduling policy, PolluxSched (SPEC §5).

Every round the policy maximises ``FITNESS_p(A) = ((1/J)·Σ_j (SPEEDUP_j(A_j) + 1e-3)^p)^(1/p)`` over
integer allocation matrices ``A[job, node]`` (GPUs of a job on a node). ``SPEEDUP_j`` is looked up in a
per-job table built once per round by :func:`pollux.goodput.speedup_table` (capped by the exploration
cap, scaled by ``d·num_nodes``) and multiplied by the re-allocation penalty ``(T_j − R_j·δ)/(T_j + δ)``
when the job's row changes. Because FITNESS_p is a monotone function of ``Σ_j u(SPEEDUP_j)`` (u a power
or a log), the objective is separable per job, which the greedy search exploits.

The search, every part of it on that exact objective:

1. **Lazy greedy fill** (:func:`.fill.greedy`) from the current allocation, from nothing but
   the pinned jobs, and from the best carried individual: jobs sit in a priority queue keyed by their
   best gain per GPU over jumps of k = 1, 2, … GPUs, each placed the best of three ways (grow on its
   own nodes, move onto one node — tightest fit, or roomiest in a "loose" variant — or spread over
   nodes without another distributed job); the top job is re-evaluated against the current free
   capacity and applied if it still beats the next one.
2. **Destroy-and-refill local search** (:func:`.local.local_search`): a few jobs give a GPU
   back, return to their current row (evicting what is in the way) or drop to nothing; the greedy
   refills; the result is kept if fitter. A last pass tries moved jobs back on their current rows.
3. **Genetic search of SPEC §5** (:func:`pollux.policy.genetic.genetic_search`): mutation,
   single-point crossover after binary tournaments, repair, keep the best distinct individuals.
   Vectorised over the whole population, held as one float32 ``(jobs, population, nodes)`` array of
   whole numbers (per-node and per-job sums are then small matrix products; the repair touches only
   the conflicting columns).
   Seeded by the above, the current allocation and the population carried over from the previous
   round (rows remapped by job and node id), and stopped when the best individual stalls.

Before the search, waiting jobs that cannot matter are left out: interchangeable ones (the same
table and limits) beyond what the cluster could run at once, ranked by their penalty factors
(:mod:`.prune`; no optimum is lost, and the fitness still counts them).

Step 3 runs only on problems of at most ``genetic_limit / population`` jobs × nodes (512 by
default): above that it was measured to find nothing steps 1–2 had not. On clusters where the dense
population would exceed ``dense_limit`` elements (e.g. 1024 × 4 GPUs with 1000 jobs) steps 1–2 run
with fewer starts and a few best individuals are carried. Internally jobs are
sorted by priority (pinned, then least attained service, then submission time), so the repair's
"later jobs lose" rules are cumulative sums along the job axis.
See ``docs/policy-pollux.md``.

Modules: :mod:`.problem` (:class:`PolluxProblem`: jobs in priority order, penalty, evaluation, fitness),
:mod:`.tables` (speedup tables and their one lookup), :mod:`.constraints` (feasibility, repair),
:mod:`.population` (population layout, the carried state's codec), :mod:`.fill` (greedy fill),
:mod:`.fill_state` (the free GPUs and node orders of one fill), :mod:`.local` (destroy-and-refill),
:mod:`.prune` (the waiting jobs a round may leave out),
:mod:`.reuse` (when a steady round may skip the search), :mod:`.policy` (:class:`PolluxPolicy`); the
genetic operators are the generic :mod:`pollux.policy.genetic`.
"""

from pollux.policy.genetic import RESET_PROB, ZERO_ELEM_PROB, ZERO_ROW_PROB
from pollux.policy.pollux.fill import IN_PLACE, SINGLE, SPREAD
from pollux.policy.pollux.fill_state import FillState
from pollux.policy.pollux.policy import PolluxPolicy
from pollux.policy.pollux.population import STATE_VERSION
from pollux.policy.pollux.problem import (
    SPEEDUP_EPS,
    PolluxProblem,
    _power_mean,
    _utility,
)

__all__ = [
    "IN_PLACE",
    "RESET_PROB",
    "SINGLE",
    "SPEEDUP_EPS",
    "SPREAD",
    "STATE_VERSION",
    "ZERO_ELEM_PROB",
    "ZERO_ROW_PROB",
    "FillState",
    "PolluxPolicy",
    "PolluxProblem",
    "_power_mean",
    "_utility",
]
