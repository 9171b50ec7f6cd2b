"""A Pollux round keeps the running allocation without searching only when nothing but the jobs'
ages and attained service changed since the search that chose it (:mod:`pollux.policy.pollux.reuse`).

Each case plays two rounds: the first searches from nothing; the second sees the first's choice
running, the jobs 60 s older, and one change (or none). The policy's random generator is compared
before and after the second round: a round that did not search draws nothing from it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from policy_oracles import random_model
from pollux.policy.base import Cluster, JobView
from pollux.policy.pollux import PolluxPolicy
from pollux.policy.pollux.reuse import STATE_KEY

CLUSTER = Cluster.uniform(4, 4)
ROUND_S = 60.0


def steady_jobs(seed: int = 0, age_s: float = 1e5) -> list[JobView]:
    """Three old jobs whose attained services lie far apart, so a round's service keeps their order."""
    rng = np.random.default_rng(seed)
    jobs = []
    for i, service in enumerate((1e3, 1e5, 1e7)):
        model, limits = random_model(rng)
        jobs.append(JobView(id=f"j{i}", submit_time=float(i), age_s=age_s, restarts=1,
                            attained_service=service, model=model, limits=limits, max_replicas_seen=4))
    return jobs


def next_round(jobs: list[JobView], alloc: dict[str, dict[str, int]]) -> list[JobView]:
    """The same jobs one round later, holding ``alloc``."""
    return [replace(j, age_s=j.age_s + ROUND_S, allocation=dict(alloc.get(j.id, {})),
                    attained_service=j.attained_service + ROUND_S * sum(alloc.get(j.id, {}).values()))
            for j in jobs]


def play(policy: PolluxPolicy, jobs: list[JobView], change=None, seed: int = 0):
    """Round 1 from nothing, then round 2 on its choice (after ``change`` of the views, if given).
    Returns (first allocation, first state, second allocation, second state, whether round 2 drew
    from the generator)."""
    rng = np.random.default_rng(seed)
    alloc1, state1 = policy.decide(jobs, CLUSTER, None, 0.0, rng)
    views = next_round(jobs, alloc1)
    if change is not None:
        views = change(views)
    before = json.dumps(rng.bit_generator.state)
    alloc2, state2 = policy.decide(views, CLUSTER, json.loads(json.dumps(state1)), ROUND_S, rng)
    drew = json.dumps(rng.bit_generator.state) != before
    return alloc1, state1, alloc2, state2, drew


def test_a_steady_round_keeps_the_running_allocation_without_searching() -> None:
    alloc1, state1, alloc2, state2, drew = play(PolluxPolicy(population=20, generations=10), steady_jobs())
    assert alloc1, "the first round should start some job"
    assert state1["search"] != "reused"
    assert state2["search"] == "reused" and state2["generations"] == 0
    assert alloc2 == alloc1 and not drew
    # The record of the search travels on, so the penalties' drift adds up from that search.
    assert state2[STATE_KEY] == state1[STATE_KEY]
    assert state2["gpus"] == state1["gpus"]          # and so does its population
    # A third steady round is kept as well.
    rng = np.random.default_rng(5)
    views = next_round(next_round(steady_jobs(), alloc1), alloc1)
    alloc3, state3 = PolluxPolicy(population=20, generations=10).decide(views, CLUSTER, state2, 120.0, rng)
    assert state3["search"] == "reused" and alloc3 == alloc1


def test_without_reuse_every_round_searches() -> None:
    _, _, _, state2, drew = play(PolluxPolicy(population=20, generations=10, reuse_drift=None),
                                 steady_jobs())
    assert state2["search"] != "reused" and drew


def _new_job(views: list[JobView]) -> list[JobView]:
    model, limits = random_model(np.random.default_rng(99))
    return [*views, JobView(id="late", submit_time=50.0, age_s=10.0, model=model, limits=limits)]


def _refitted(views: list[JobView]) -> list[JobView]:
    model = views[1].model
    assert model is not None
    old = model.throughput_params
    params = replace(old, alpha_local=old.alpha_local * 10, alpha_node=old.alpha_node * 10)
    return [views[0], replace(views[1], model=replace(model, throughput_params=params)), views[2]]


def _not_applied(views: list[JobView]) -> list[JobView]:
    return [replace(v, allocation={}) for v in views]


def _moved(views: list[JobView]) -> list[JobView]:
    """The chosen counts, but each on the next node: the same GPUs per job, placed elsewhere."""
    nodes = CLUSTER.nodes
    shift = {n: nodes[(i + 1) % len(nodes)] for i, n in enumerate(nodes)}
    return [replace(v, allocation={shift[n]: g for n, g in v.allocation.items()}) for v in views]


def _reordered(views: list[JobView]) -> list[JobView]:
    return [replace(views[0], attained_service=1e9), *views[1:]]


@pytest.mark.parametrize("change", [_new_job, _refitted, _not_applied, _moved, _reordered],
                         ids=["job-arrives", "model-refitted", "choice-not-applied", "choice-on-other-nodes",
                              "priority-order"])
def test_any_other_change_makes_the_round_search(change) -> None:
    _, _, _, state2, drew = play(PolluxPolicy(population=20, generations=10), steady_jobs(), change)
    assert state2["search"] != "reused" and drew


def test_another_cluster_makes_the_round_search() -> None:
    policy = PolluxPolicy(population=20, generations=10)
    jobs = steady_jobs()
    alloc1, state1 = policy.decide(jobs, CLUSTER, None, 0.0, np.random.default_rng(0))
    bigger = Cluster((*CLUSTER.nodes, "extra"), (*CLUSTER.gpus, 4))
    _, state2 = policy.decide(next_round(jobs, alloc1), bigger, state1, ROUND_S, np.random.default_rng(1))
    assert state2["search"] != "reused"


def test_young_jobs_penalties_drift_past_the_tolerance() -> None:
    """A job 100 s old gains ~0.2 of penalty factor in a minute: the round searches again, unless the
    tolerance is wide enough to cover that."""
    young = steady_jobs(age_s=100.0)
    _, _, _, state2, _ = play(PolluxPolicy(population=20, generations=10), young)
    assert state2["search"] != "reused"
    _, _, _, state2, drew = play(PolluxPolicy(population=20, generations=10, reuse_drift=1.0), young)
    assert state2["search"] == "reused" and not drew


@pytest.mark.parametrize("record", [None, "text", {}, {"digest": 3, "penalty": []},
                                    {"digest": "x", "penalty": [1.0]},
                                    {"digest": "x", "penalty": ["a", "b", "c"]},
                                    {"digest": "x", "penalty": [float("nan")] * 3}])
def test_a_broken_reuse_record_means_a_search(record) -> None:
    policy = PolluxPolicy(population=20, generations=10)
    jobs = steady_jobs()
    alloc1, state1 = policy.decide(jobs, CLUSTER, None, 0.0, np.random.default_rng(0))
    state1 = dict(state1, **{STATE_KEY: record})
    _, state2 = policy.decide(next_round(jobs, alloc1), CLUSTER, state1, ROUND_S, np.random.default_rng(1))
    assert state2["search"] != "reused"


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf")])
def test_reuse_drift_must_be_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ValueError, match="reuse_drift"):
        PolluxPolicy(reuse_drift=bad)
