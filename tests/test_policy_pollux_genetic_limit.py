"""Pollux's ``genetic_limit``: above it the round's greedy fills and local search decide alone.

The limit exists because on large problems the genetic search found nothing its greedy seeds had
not (issue 38, docs/policy-pollux.md). These tests check that the switch happens where it should,
that the search without it still carries a full population and stays feasible, and that on a
problem above the limit its answer is as fit as the plain 100 × 100 genetic search's.
"""

from __future__ import annotations

import numpy as np
import pytest

from policy_oracles import random_mixed_round
from pollux.policy.base import Cluster, JobView, to_matrix, with_allocation
from pollux.policy.pollux import PolluxPolicy

CLUSTER = Cluster.uniform(16, 4)


def jobs_and_allocation(seed: int, count: int) -> tuple[list[JobView], dict[str, dict[str, int]]]:
    """``count`` random jobs on :data:`CLUSTER`, every other one running."""
    return random_mixed_round(np.random.default_rng(seed), CLUSTER, count)


def decide(policy: PolluxPolicy, jobs, alloc, state=None, seed: int = 0):
    return policy.decide(with_allocation(jobs, alloc), CLUSTER, state, 0.0, np.random.default_rng(seed))


def carried(policy: PolluxPolicy, jobs, alloc, state) -> int:
    """How many individuals the state carries into the next round."""
    return policy.problem(with_allocation(jobs, alloc), CLUSTER).remap(state, 1000).shape[1]


def test_above_the_limit_the_greedy_search_decides_and_carries_a_full_population() -> None:
    jobs, alloc = jobs_and_allocation(0, 40)              # 40 jobs × 16 nodes = 640 cells > 512
    # keep_large=1: what a large cluster would carry; this problem carries up to its population.
    policy = PolluxPolicy(keep_large=1)
    out, state = decide(policy, jobs, alloc)
    assert state["search"] == "greedy" and state["generations"] == 0
    assert policy.keep_large < carried(policy, jobs, alloc, state) <= policy.population
    prob = policy.problem(with_allocation(jobs, alloc), CLUSTER)
    assert prob.feasible(to_matrix(out, prob.job_ids, CLUSTER))
    # The next round starts from that population and stays feasible.
    out2, state2 = decide(policy, jobs, out, state, seed=1)
    prob2 = policy.problem(with_allocation(jobs, out), CLUSTER)
    assert prob2.feasible(to_matrix(out2, prob2.job_ids, CLUSTER))
    assert state2["search"] in ("greedy", "reused")


def test_the_genetic_search_runs_at_or_below_the_limit_without_it_or_without_greedy_seeds() -> None:
    small, small_alloc = jobs_and_allocation(1, 8)         # 128 cells
    assert decide(PolluxPolicy(), small, small_alloc)[1]["search"] == "genetic"
    large, large_alloc = jobs_and_allocation(1, 40)
    assert decide(PolluxPolicy(genetic_limit=None), large, large_alloc)[1]["search"] == "genetic"
    # 100 × 640 = 64,000 work: just above a limit of 63,999, at a limit of 64,000.
    assert decide(PolluxPolicy(genetic_limit=63_999), large, large_alloc)[1]["search"] == "greedy"
    assert decide(PolluxPolicy(genetic_limit=64_000), large, large_alloc)[1]["search"] == "genetic"
    plain = PolluxPolicy(greedy_seed=False, patience=None, generations=5)
    assert decide(plain, large, large_alloc)[1]["search"] == "genetic"


@pytest.mark.parametrize("seed", range(3))
def test_above_the_limit_the_answer_is_as_fit_as_the_plain_genetic_search(seed: int) -> None:
    jobs, alloc = jobs_and_allocation(10 + seed, 40)
    ours, state = decide(PolluxPolicy(), jobs, alloc, seed=seed)
    assert state["search"] == "greedy"
    plain, _ = decide(PolluxPolicy(patience=None, greedy_seed=False), jobs, alloc, seed=seed)
    prob = PolluxPolicy().problem(with_allocation(jobs, alloc), CLUSTER)
    f_ours = prob.fitness(to_matrix(ours, prob.job_ids, CLUSTER))
    f_plain = prob.fitness(to_matrix(plain, prob.job_ids, CLUSTER))
    assert f_ours >= 0.99 * f_plain


@pytest.mark.parametrize("bad", [-1, -51_200])
def test_genetic_limit_must_be_non_negative_or_none(bad: int) -> None:
    with pytest.raises(ValueError, match="genetic_limit"):
        PolluxPolicy(genetic_limit=bad)
