"""A Pollux round leaves out interchangeable waiting jobs beyond what the cluster could run, and never
loses an optimum by it (:mod:`pollux.policy.pollux.prune`).

The exactness is checked against brute force: on small random rounds every feasible allocation is
enumerated, and the best one that gives nothing to the jobs left out is as fit as the best one of all.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from policy_oracles import random_model
from pollux.policy.base import Cluster, JobView
from pollux.policy.pollux import PolluxPolicy
from pollux.policy.pollux.problem import PolluxProblem
from pollux.policy.pollux.prune import surplus_waiting


def new_job(i: int, age_s: float, **kw) -> JobView:
    """A waiting job that has never run: no model, so every such job has the same table."""
    return JobView(id=f"new{i}", submit_time=100.0 + i, age_s=age_s, **kw)


def random_round(seed: int) -> tuple[list[JobView], Cluster]:
    """A running job with a model; waiting new jobs of random ages, more than the GPUs: most may take
    one GPU, some two, and some are gang jobs that need two (the same table as those that may take
    two, other limits); and two to five waiting jobs that share one model (a class of their
    own). Three GPUs on one node, or on three nodes of one."""
    rng = np.random.default_rng(seed)
    cluster = Cluster.uniform(3, 1) if seed % 2 else Cluster.uniform(1, 3)
    model, limits = random_model(rng)
    jobs = [JobView(id="run", submit_time=0.0, age_s=float(rng.uniform(300, 3000)), restarts=1,
                    attained_service=float(rng.uniform(0, 1e4)), allocation={cluster.nodes[0]: 1},
                    model=model, limits=limits, max_replicas_seen=1)]
    for i in range(int(rng.integers(6, 9))):
        kind = rng.choice(["plain", "plain", "gang", "wide"])    # gang and wide share one table
        jobs.append(new_job(i, float(rng.choice([0.0, 30.0, 120.0, 600.0, 3600.0])),
                            min_replicas=2 if kind == "gang" else 0,
                            max_replicas_seen=0 if kind == "plain" else 1))
    model, limits = random_model(rng)
    for i in range(int(rng.integers(2, 6))):
        jobs.append(JobView(id=f"twin{i}", submit_time=50.0 + i, age_s=float(rng.uniform(60, 600)),
                            restarts=1, attained_service=100.0, model=model, limits=limits,
                            max_replicas_seen=1))
    return jobs, cluster


def all_feasible(prob: PolluxProblem) -> np.ndarray:
    """Every feasible allocation of a tiny problem, as a population ``(jobs, k, nodes)``: rows within
    each job's cap, enumerated job by job within the free GPUs, then kept where the repair (which
    enforces every hard constraint) leaves them as they are."""
    rows = [[row for row in itertools.product(range(prob.gpn + 1), repeat=prob.num_nodes)
             if sum(row) <= int(prob.max_replicas[j])] for j in range(prob.num_jobs)]
    found: list[list[tuple[int, ...]]] = []

    def walk(j: int, free: tuple[int, ...], chosen: list[tuple[int, ...]]) -> None:
        if j == prob.num_jobs:
            found.append(list(chosen))
            return
        for row in rows[j]:
            if all(r <= f for r, f in zip(row, free, strict=True)):
                chosen.append(row)
                walk(j + 1, tuple(f - r for r, f in zip(row, free, strict=True)), chosen)
                chosen.pop()

    walk(0, tuple(int(c) for c in prob.cap), [])
    pop = np.ascontiguousarray(np.array(found, dtype=np.float32).transpose(1, 0, 2))
    ok = (prob.repair(pop) == pop).all(axis=(0, 2))
    return pop[:, ok, :]


def best(prob: PolluxProblem, pop: np.ndarray) -> tuple[float, float]:
    fit, raw = prob.evaluate(pop)
    i = int(np.lexsort((-raw, -fit))[0])
    return float(fit[i]), float(raw[i])


@pytest.mark.parametrize("seed", range(12))
def test_the_jobs_left_out_lose_no_optimum(seed: int) -> None:
    jobs, cluster = random_round(seed)
    prob = PolluxPolicy().problem(jobs, cluster)
    drop = surplus_waiting(prob)
    pop = all_feasible(prob)
    without = pop[:, (pop[drop] == 0).all(axis=(0, 2)), :]
    assert best(prob, without) == best(prob, pop)


def test_gang_jobs_are_not_interchangeable_with_jobs_of_the_same_table() -> None:
    # Three old gangs of two and a younger job that may take one or two GPUs (the same table): one
    # gang and the younger job share three GPUs best. Ranked among the gangs, the younger job would
    # come fourth and be left out.
    jobs = [new_job(i, 3600.0 * (i + 2), min_replicas=2, max_replicas_seen=1) for i in range(3)]
    jobs.append(new_job(3, 600.0, max_replicas_seen=1))
    prob = PolluxPolicy().problem(jobs, Cluster.uniform(1, 3))
    assert prob.tables.table[0].tolist() == prob.tables.table[3].tolist()
    drop = surplus_waiting(prob)
    assert not drop[prob.job_ids.index("new3")]
    pop = all_feasible(prob)
    without = pop[:, (pop[drop] == 0).all(axis=(0, 2)), :]
    assert best(prob, without) == best(prob, pop)


def test_the_oldest_new_jobs_are_kept_up_to_the_cluster_size() -> None:
    ages = [10.0, 3600.0, 60.0, 7200.0, 600.0, 0.0, 120.0]
    jobs = [new_job(i, age) for i, age in enumerate(ages)]
    prob = PolluxPolicy().problem(jobs, Cluster.uniform(1, 4))
    kept = sorted(job.age_s for job, d in zip(prob.jobs, surplus_waiting(prob), strict=True) if not d)
    assert kept == [120.0, 600.0, 3600.0, 7200.0]


def test_gang_jobs_count_by_their_minimum() -> None:
    jobs = [new_job(i, 100.0 * (i + 1), min_replicas=2, max_replicas_seen=1) for i in range(4)]
    prob = PolluxPolicy().problem(jobs, Cluster.uniform(1, 4))
    assert int((~surplus_waiting(prob)).sum()) == 2


def test_running_jobs_and_jobs_with_their_own_tables_are_kept() -> None:
    rng = np.random.default_rng(3)
    jobs = [new_job(i, 60.0, allocation={"node-0": 1}) for i in range(4)]     # running: kept
    for i in range(6):
        model, limits = random_model(rng)
        jobs.append(JobView(id=f"m{i}", submit_time=float(i), age_s=600.0, restarts=1, model=model,
                            limits=limits, max_replicas_seen=1))
    prob = PolluxPolicy().problem(jobs, Cluster.uniform(1, 4))
    assert not surplus_waiting(prob).any()


def test_a_waiting_job_that_can_take_no_gpu_is_left_out() -> None:
    jobs = [new_job(0, 60.0), new_job(1, 60.0, max_replicas=0)]
    prob = PolluxPolicy().problem(jobs, Cluster.uniform(1, 4))
    left_out = dict(zip(prob.job_ids, surplus_waiting(prob).tolist(), strict=True))
    assert left_out == {"new0": False, "new1": True}


def test_the_smaller_problem_scores_an_allocation_as_the_whole_round_does() -> None:
    jobs, cluster = random_round(4)
    jobs += [new_job(10 + i, 30.0 * i) for i in range(8)]
    policy = PolluxPolicy()
    full = policy.problem(jobs, cluster)
    sub = policy.search_problem(jobs, cluster)
    assert sub.absent > 0 and sub.num_jobs + sub.absent == full.num_jobs
    assert sub.tables.fair == full.tables.fair and sub.tables.scale == full.tables.scale
    rows = {job_id: i for i, job_id in enumerate(full.job_ids)}
    pop = all_feasible(sub)
    wide = np.zeros((full.num_jobs, pop.shape[1], full.num_nodes), dtype=np.float32)
    wide[[rows[job_id] for job_id in sub.job_ids]] = pop
    for p in (-1.0, 0.0, 0.5):
        sub.p = full.p = p
        np.testing.assert_allclose(np.stack(sub.evaluate(pop)), np.stack(full.evaluate(wide)), rtol=1e-12)


def test_round_jobs_fewer_than_the_jobs_is_refused() -> None:
    with pytest.raises(ValueError, match="round_jobs"):
        PolluxPolicy().problem([new_job(0, 1.0), new_job(1, 1.0)], Cluster.uniform(1, 4), round_jobs=1)


def test_an_overloaded_round_starts_the_oldest_jobs_and_says_how_many_it_left_out() -> None:
    jobs = [new_job(i, 60.0 * i) for i in range(40)]
    policy = PolluxPolicy(population=20, generations=10)
    alloc, state = policy.decide(jobs, Cluster.uniform(2, 4), None, 0.0, np.random.default_rng(0))
    assert state["left_out"] == 32
    assert sorted(alloc) == sorted(f"new{i}" for i in range(32, 40))
    again, _ = policy.decide(jobs, Cluster.uniform(2, 4), None, 0.0, np.random.default_rng(0))
    assert again == alloc
    # Without pruning the same round searches every job and starts the same ones.
    plain, plain_state = PolluxPolicy(population=20, generations=10, prune_waiting=False).decide(
        jobs, Cluster.uniform(2, 4), None, 0.0, np.random.default_rng(0))
    assert plain_state["left_out"] == 0 and sorted(plain) == sorted(alloc)
    assert plain_state["objective"] == pytest.approx(state["objective"], rel=1e-12)


def test_a_job_left_out_is_searched_again_once_it_ranks_among_the_runnable() -> None:
    jobs = [new_job(i, 60.0 * (i + 1)) for i in range(6)]
    policy = PolluxPolicy(population=20, generations=10)
    cluster = Cluster.uniform(1, 4)
    assert policy.search_problem(jobs, cluster).absent == 2
    older = [replace(job, age_s=1e4) if job.id == "new0" else job for job in jobs]
    assert "new0" in policy.search_problem(older, cluster).job_ids


def test_the_fair_share_counts_the_jobs_left_out() -> None:
    # Three-GPU gangs on eight GPUs: two can run, so two of the four are left out; the fair share is
    # still that of four jobs (two GPUs each), not of the two searched (four each).
    jobs = [new_job(i, 100.0 * (i + 1), min_replicas=3, max_replicas_seen=1) for i in range(4)]
    policy = PolluxPolicy()
    cluster = Cluster.uniform(1, 8)
    sub = policy.search_problem(jobs, cluster)
    assert sub.absent == 2
    assert sub.tables.fair == policy.problem(jobs, cluster).tables.fair
    assert sub.tables.fair != policy.problem(jobs[:2], cluster).tables.fair
