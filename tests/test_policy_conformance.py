"""Conformance suite: every registered policy (pollux.policy.registry) on seeded random inputs.

Like Optuna's ``parametrize_sampler``: a policy added to the registry runs these tests with no change
here. Each job view carries what any policy may read — a fitted goodput model (adaptive), the user's
``fixed`` shape (rigid) and, for the policies that need one, an oracle (elastic) — and a feasible
current allocation, some of it pinned (running, not preemptible). The invariants:

* no node gets more GPUs than it has, no unknown node or job appears;
* a job that runs gets at least its ``min_replicas`` and at most its ``max_replicas`` (a rigid policy
  exactly its ``fixed`` replicas); pinned jobs keep their GPUs as they are;
* the same inputs and seed give the same allocation and state;
* the state is JSON as it is, and deciding with it after a JSON round trip gives the same result;
* empty, foreign and unknown inputs (no jobs, no nodes, unknown nodes, another policy's state) are
  handled without an error.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from policy_oracles import random_model
from pollux.policy.base import (
    Cluster,
    JobView,
    Oracle,
    allocation_of,
    check_allocation,
    fixed_shape,
    with_allocation,
)
from pollux.policy.registry import POLICY_NAMES, RIGID, make_policy, policy_info

SEEDS = range(12)


def random_oracle(rng: np.random.Generator, cap: int) -> Oracle:
    """True step times on 1 … cap GPUs: falling with diminishing returns, some sizes infeasible."""
    steps = np.full(cap + 1, math.inf)
    base = float(rng.uniform(0.1, 2.0))
    sync = float(rng.uniform(0.0, 0.3))
    for r in range(1, cap + 1):
        steps[r] = base / r + sync * math.log2(r)
    if cap > 1 and rng.random() < 0.3:
        steps[int(rng.integers(2, cap + 1))] = math.inf
    return Oracle(remaining_iterations=float(rng.uniform(10, 1e5)), step_time=steps)


def random_case(name: str, seed: int) -> tuple[list[JobView], Cluster]:
    """Random cluster and jobs with a feasible current allocation; some running jobs pinned."""
    info = policy_info(name)
    rng = np.random.default_rng(seed)
    num_nodes = int(rng.integers(1, 7))
    if rng.random() < 0.7:
        cluster = Cluster.uniform(num_nodes, int(rng.choice([1, 2, 4, 8])))
    else:
        cluster = Cluster(tuple(f"n{i}" for i in range(num_nodes)),
                          tuple(int(g) for g in rng.integers(0, 7, size=num_nodes)))
    free = cluster.capacity().copy()
    jobs = []
    for i in range(int(rng.integers(1, 13))):
        min_r = int(rng.integers(1, 4)) if rng.random() < 0.2 else 0
        max_r = max(int(rng.choice([1, 2, 4, 8, 64])), min_r, 1)
        replicas = int(rng.integers(max(min_r, 1), min(max_r, 6) + 1))
        row: dict[str, int] = {}
        if rng.random() < 0.5 and int(free.sum()) >= replicas:
            # The shape a running job of this kind may hold: a rigid job its whole gang.
            want = replicas if info.job_kind == RIGID else int(rng.integers(max(min_r, 1), replicas + 1))
            for n in np.argsort(-free, kind="stable"):
                if want == 0:
                    break
                t = int(min(want, free[n]))
                if t:
                    row[cluster.nodes[n]] = t
                    free[n] -= t
                    want -= t
        model, limits = random_model(rng) if rng.random() < 0.8 else (None, None)
        held = sum(row.values())
        jobs.append(JobView(
            id=f"j{i}", submit_time=float(rng.uniform(0, 1000)), age_s=float(rng.uniform(0, 3000)),
            restarts=int(rng.integers(0, 4)), attained_service=float(rng.uniform(0, 1e5)),
            allocation=row, min_replicas=min_r, max_replicas=max_r,
            preemptible=not (row and rng.random() < 0.25), model=model, limits=limits,
            max_replicas_seen=max(held, int(rng.choice([0, 1, 2, 4]))),
            fixed=fixed_shape(replicas, int(rng.choice([64, 256]))),
            oracle=random_oracle(rng, max_r) if info.needs_oracle else None,
        ))
    return jobs, cluster


def decide(name: str, jobs, cluster, state=None, seed: int = 0, now: float = 100.0):
    return make_policy(name).decide(jobs, cluster, state, now, np.random.default_rng(seed))


def positive(row) -> dict[str, int]:
    return {str(n): int(g) for n, g in row.items() if g > 0}


def assert_conforms(name: str, jobs: list[JobView], cluster: Cluster, out) -> None:
    check_allocation(out, cluster)
    ids = {j.id for j in jobs}
    assert set(out) <= ids, f"{name}: unknown jobs {set(out) - ids}"
    kind = policy_info(name).job_kind
    for job in jobs:
        row = positive(out.get(job.id, {}))
        r = sum(row.values())
        if not job.preemptible and job.allocation:
            assert row == positive(job.allocation), f"{name}: pinned job {job.id} moved"
            continue
        if r == 0:
            continue
        assert r >= job.min_replicas, f"{name}: {job.id} on {r} GPUs < min {job.min_replicas}"
        assert r <= job.max_replicas, f"{name}: {job.id} on {r} GPUs > max {job.max_replicas}"
        if kind == RIGID:
            assert job.fixed is not None and r == job.fixed[0], f"{name}: rigid {job.id} on {r} GPUs"


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("seed", SEEDS)
def test_capacity_replicas_and_pinned_jobs(name: str, seed: int) -> None:
    jobs, cluster = random_case(name, seed)
    out, state = decide(name, jobs, cluster, seed=seed)
    assert_conforms(name, jobs, cluster, out)
    # A second round from the first one's allocation and state conforms too.
    nxt = [replace(j, allocation=out.get(j.id, {})) for j in jobs]
    out2, _ = decide(name, nxt, cluster, state, seed=seed + 1, now=160.0)
    assert_conforms(name, nxt, cluster, out2)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_something_runs_when_something_fits(name: str) -> None:
    """Not vacuous: over the random cases, the policy does run jobs (and pins some)."""
    ran = pinned = 0
    for seed in SEEDS:
        jobs, cluster = random_case(name, seed)
        out, _ = decide(name, jobs, cluster, seed=seed)
        ran += len(out)
        pinned += sum(1 for j in jobs if not j.preemptible and j.allocation)
    assert ran > 0 and pinned > 0


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_same_seed_same_result(name: str, seed: int) -> None:
    jobs, cluster = random_case(name, seed)
    a, sa = decide(name, jobs, cluster, seed=seed)
    b, _ = decide(name, list(reversed(jobs)), cluster, seed=seed)
    assert a == b                                  # the order of the job list never matters
    c, sc = decide(name, jobs, cluster, seed=seed)
    assert a == c and json.dumps(sa, sort_keys=True) == json.dumps(sc, sort_keys=True)


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_state_survives_a_json_round_trip(name: str, seed: int) -> None:
    jobs, cluster = random_case(name, seed)
    out, state = decide(name, jobs, cluster, seed=seed)
    text = json.dumps(state)                       # JSON as it is: no codec needed
    back = json.loads(text)
    nxt = [replace(j, allocation=out.get(j.id, {})) for j in jobs]
    a, sa = decide(name, nxt, cluster, state, seed=seed + 7, now=160.0)
    b, sb = decide(name, nxt, cluster, back, seed=seed + 7, now=160.0)
    assert a == b
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_empty_and_unknown_inputs(name: str) -> None:
    jobs, cluster = random_case(name, 3)
    out, state = decide(name, [], cluster)
    assert out == {} and json.dumps(state)
    out, state = decide(name, jobs, Cluster((), ()))
    assert out == {} and json.dumps(state)
    out, _ = decide(name, jobs, Cluster(("n0",), (0,)))
    assert out == {}
    # A current allocation on nodes the cluster does not know is ignored.
    ghost = [replace(j, allocation={"gone": 2}, preemptible=True) for j in jobs]
    out, _ = decide(name, ghost, cluster)
    assert_conforms(name, ghost, cluster, out)
    assert all("gone" not in row for row in out.values())
    # Another policy's state, or an unrelated one, is handled.
    for other in POLICY_NAMES:
        _, foreign = decide(other, *random_case(other, 4))
        out, _ = decide(name, jobs, cluster, json.loads(json.dumps(foreign)))
        assert_conforms(name, jobs, cluster, out)
    out, _ = decide(name, jobs, cluster, {"unrelated": [1, 2, 3]})
    assert_conforms(name, jobs, cluster, out)


def test_allocation_helpers_of_the_one_seam() -> None:
    """``allocation_of`` reads the allocation the views hold; ``with_allocation`` sets it."""
    jobs, cluster = random_case(POLICY_NAMES[0], 2)
    held = allocation_of(jobs)
    assert held == {j.id: positive(j.allocation) for j in jobs if positive(j.allocation)}
    out, _ = decide(POLICY_NAMES[0], jobs, cluster)
    moved = with_allocation(jobs, out)
    assert allocation_of(moved) == {**{k: v for k, v in held.items() if k not in out}, **out}
    assert allocation_of(with_allocation(jobs, {"nobody": {"n0": 1}})) == held
    assert allocation_of([replace(jobs[0], allocation={"a": 0, "b": 2})]) == {jobs[0].id: {"b": 2}}
