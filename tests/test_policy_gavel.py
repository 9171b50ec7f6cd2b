"""Gavel's max-sum-throughput baseline (pollux.policy.gavel): the LP against brute force, capacity per
GPU type, rigid gangs on one type, placement rules, the round-based shares and determinism.

The conformance suite (tests/test_policy_conformance.py) runs it too, on untyped clusters.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import replace

import numpy as np
import pytest

from policy_oracles import random_model
from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.policy.base import Cluster, JobView, check_allocation, fixed_shape
from pollux.policy.clusterspec import parse_cluster
from pollux.policy.gavel import (
    GavelPolicy,
    fixed_step_times,
    max_sum_throughput,
    normalised,
    place_on_type,
)
from pollux.policy.registry import make_policy, policy_info

HETERO = "aws:6x4,rtx:3x8,dgx-ext:2x8"


def decide(jobs, cluster, state=None, now: float = 100.0):
    return GavelPolicy().decide(jobs, cluster, state, now, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------------
# The program against brute force
# ------------------------------------------------------------------------------------------------


def vertex_optimum(norm: np.ndarray, replicas: np.ndarray, capacity: np.ndarray) -> float:
    """Best objective over every vertex of the polytope: each choice of n active constraints among
    the job rows, type rows and the 0/1 bounds, solved exactly and kept when feasible."""
    n_jobs, n_types = norm.shape
    n = n_jobs * n_types
    rows, rhs = [], []
    for j in range(n_jobs):                       # Σ_t X[j,t] ≤ 1
        a = np.zeros((n_jobs, n_types))
        a[j] = 1.0
        rows.append(a.ravel())
        rhs.append(1.0)
    for t in range(n_types):                      # Σ_j r_j X[j,t] ≤ G_t
        a = np.zeros((n_jobs, n_types))
        a[:, t] = replicas
        rows.append(a.ravel())
        rhs.append(float(capacity[t]))
    eye = np.eye(n)
    rows += list(eye) + list(-eye)                # X ≤ 1, −X ≤ 0
    rhs += [1.0] * n + [0.0] * n
    a_all, b_all = np.asarray(rows), np.asarray(rhs)
    combos = np.asarray(list(itertools.combinations(range(len(rows)), n)))
    mats, vecs = a_all[combos], b_all[combos]
    ok = np.abs(np.linalg.det(mats)) > 1e-9
    xs = np.linalg.solve(mats[ok], vecs[ok][..., None])[..., 0]
    feasible = np.all(xs @ a_all.T <= b_all + 1e-9, axis=1)
    return float((xs[feasible] @ norm.ravel()).max())


@pytest.mark.parametrize("seed", range(30))
def test_lp_optimum_matches_vertex_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_jobs, n_types = int(rng.integers(1, 4)), 2
    norm = rng.uniform(0.05, 1.0, size=(n_jobs, n_types))
    norm[rng.random(norm.shape) < 0.2] = 0.0      # some jobs cannot run on some types
    replicas = rng.integers(1, 5, size=n_jobs)
    capacity = rng.integers(0, 7, size=n_types)
    x = max_sum_throughput(norm, replicas, capacity)
    assert np.all(x >= 0) and np.all(x <= 1 + 1e-9)
    assert np.all(x.sum(axis=1) <= 1 + 1e-9)
    assert np.all(replicas @ x <= capacity + 1e-9)
    assert np.all(x[norm == 0] == 0)
    assert float((x * norm).sum()) == pytest.approx(vertex_optimum(norm, replicas, capacity), abs=1e-7)


def test_lp_favours_each_job_on_its_fast_type() -> None:
    # Two 1-GPU jobs, one GPU of each type: each goes where it is relatively fastest.
    norm = np.array([[1.0, 0.2], [0.6, 1.0]])
    x = max_sum_throughput(norm, np.array([1, 1]), np.array([1, 1]))
    np.testing.assert_allclose(x, np.eye(2), atol=1e-9)


def test_normalised_throughput() -> None:
    step = np.array([[1.0, 0.5, np.inf], [np.nan, np.nan, np.inf], [np.inf, np.inf, np.inf]])
    np.testing.assert_allclose(normalised(step), [[0.5, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


# ------------------------------------------------------------------------------------------------
# Random heterogeneous inputs
# ------------------------------------------------------------------------------------------------


def scaled(model: GoodputModel, factor: float) -> GoodputModel:
    """The same job on a GPU ``factor`` times slower (pass and sync times scaled)."""
    p = model.throughput_params
    return replace(model, throughput_params=ThroughputParams(
        p.alpha_grad * factor, p.beta_grad * factor, p.alpha_local * factor, p.beta_local * factor,
        p.alpha_node * factor, p.beta_node * factor, p.gamma))


SPEED = {"aws": 3.0, "rtx": 1.6, "dgx-ext": 1.0, "gpu": 1.0}


def hetero_jobs(rng: np.random.Generator, cluster: Cluster, n_jobs: int) -> list[JobView]:
    """Rigid jobs with per-type models (some types missing: no profile), some already running on one
    type, some pinned."""
    types = cluster.type_names
    free = cluster.capacity().copy()
    tix = cluster.type_index()
    jobs = []
    for i in range(n_jobs):
        model, limits = random_model(rng)
        replicas = int(rng.choice([1, 1, 1, 2, 2, 4, 8, 16]))
        allowed = [t for t in types if rng.random() < 0.85] or [types[0]]
        tm = {t: scaled(model, SPEED.get(t, 1.0) * float(rng.uniform(0.7, 1.4))) for t in allowed}
        row: dict[str, int] = {}
        if rng.random() < 0.4:
            t = int(rng.integers(len(types)))
            nodes = np.flatnonzero(tix == t)
            if types[t] in allowed and int(free[nodes].sum()) >= replicas:
                need = replicas
                for n in nodes[np.argsort(-free[nodes], kind="stable")]:
                    take = int(min(need, free[n]))
                    if take:
                        row[cluster.nodes[n]] = take
                        free[n] -= take
                        need -= take
                    if need == 0:
                        break
        jobs.append(JobView(
            id=f"j{i:02d}", submit_time=float(rng.uniform(0, 1000)), age_s=100.0,
            allocation=row, max_replicas=64, preemptible=not (row and rng.random() < 0.15),
            model=model, limits=limits, fixed=fixed_shape(replicas, int(limits.init_batch_size) * replicas),
            type_models=tm if rng.random() < 0.9 else None,
            type_limits={t: limits for t in allowed},
        ))
    return jobs


def check_round(jobs: list[JobView], cluster: Cluster, out) -> None:
    check_allocation(out, cluster)
    node_type = dict(zip(cluster.nodes, cluster.node_types, strict=True))
    distributed_on: dict[str, int] = {}
    for job in jobs:
        row = {n: g for n, g in out.get(job.id, {}).items() if g > 0}
        if not job.preemptible and job.allocation:
            assert row == dict(job.allocation), f"pinned {job.id} moved"
            continue
        if not row:
            continue
        assert job.fixed is not None and sum(row.values()) == job.fixed[0], f"{job.id}: not its gang"
        kinds = {node_type[n] for n in row}
        assert len(kinds) == 1, f"{job.id} spans types {kinds}"
        if job.type_models is not None:
            assert kinds <= set(job.type_models), f"{job.id} on a type it has no profile for"
        if len(row) > 1:
            for n in row:
                distributed_on[n] = distributed_on.get(n, 0) + 1
    pinned_nodes = {n for j in jobs if not j.preemptible and len(j.allocation) > 1 for n in j.allocation}
    assert all(c <= 1 for n, c in distributed_on.items() if n not in pinned_nodes), distributed_on


@pytest.mark.parametrize("seed", range(10))
def test_capacity_per_type_and_rigid_gangs_on_random_inputs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    spec = HETERO if seed % 2 == 0 else "aws:2x4,dgx-ext:1x8"
    cluster = parse_cluster(spec)
    jobs = hetero_jobs(rng, cluster, int(rng.integers(3, 30)))
    out, state = decide(jobs, cluster)
    check_round(jobs, cluster, out)
    assert out, "nothing ran"
    # Per-type totals never exceed the type's GPUs (implied by nodes, checked directly anyway).
    node_type = dict(zip(cluster.nodes, cluster.node_types, strict=True))
    used = dict.fromkeys(cluster.type_names, 0)
    for row in out.values():
        for n, g in row.items():
            used[node_type[n]] += g
    cap = cluster.type_capacity()
    assert all(used[t] <= cap[t] for t in cap)
    # A few more rounds from the previous allocation keep all invariants.
    for k in range(3):
        jobs = [replace(j, allocation=out.get(j.id, {})) for j in jobs]
        out, state = decide(jobs, cluster, json.loads(json.dumps(state)), now=160.0 + 60 * k)
        check_round(jobs, cluster, out)


def test_determinism_and_job_order() -> None:
    rng = np.random.default_rng(7)
    cluster = parse_cluster(HETERO)
    jobs = hetero_jobs(rng, cluster, 25)
    a, sa = decide(jobs, cluster)
    shuffled = list(jobs)
    random.Random(3).shuffle(shuffled)
    b, sb = GavelPolicy().decide(shuffled, cluster, None, 100.0, np.random.default_rng(99))
    assert a == b and json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)


def test_untyped_homogeneous_cluster() -> None:
    rng = np.random.default_rng(1)
    cluster = Cluster.uniform(4, 4)
    jobs = []
    for i in range(8):
        model, limits = random_model(rng)
        jobs.append(JobView(id=f"j{i}", submit_time=float(i), model=model, limits=limits,
                            fixed=fixed_shape([1, 2, 4, 8][i % 4], int(limits.init_batch_size))))
    out, _ = decide(jobs, cluster)
    check_round(jobs, cluster, out)
    # No GPU idles that a waiting job could use (16 GPUs; gangs 1+2+4+8 twice = 30 wanted).
    assert_no_waiting_job_fits(jobs, cluster, out)
    assert sum(sum(r.values()) for r in out.values()) >= 12
    # Without any model the jobs are still scheduled (all types equal).
    bare = [replace(j, model=None, limits=None) for j in jobs]
    out2, _ = decide(bare, cluster)
    assert_no_waiting_job_fits(bare, cluster, out2)
    assert sum(sum(r.values()) for r in out2.values()) >= 12


def assert_no_waiting_job_fits(jobs: list[JobView], cluster: Cluster, out) -> None:
    free = cluster.total_gpus - sum(sum(r.values()) for r in out.values())
    waiting = [j.fixed[0] for j in jobs if j.id not in out and j.fixed is not None]
    assert all(w > free for w in waiting), (waiting, free)


def test_job_goes_to_its_fast_type_and_stays() -> None:
    cluster = parse_cluster("aws:1x4,dgx-ext:1x4")
    rng = np.random.default_rng(5)
    model, limits = random_model(rng)
    fast_a = {"aws": model, "dgx-ext": scaled(model, 4.0)}
    fast_d = {"aws": scaled(model, 4.0), "dgx-ext": model}
    jobs = [JobView(id="a", submit_time=0.0, model=model, limits=limits, fixed=(4, 64), type_models=fast_a),
            JobView(id="d", submit_time=1.0, model=model, limits=limits, fixed=(4, 64), type_models=fast_d)]
    out, state = decide(jobs, cluster)
    assert out == {"a": {"aws-0": 4}, "d": {"dgx-ext-0": 4}}
    again = [replace(j, allocation=out[j.id]) for j in jobs]
    out2, _ = decide(again, cluster, state, now=160.0)
    assert out2 == out


def test_type_without_a_profile_is_never_used() -> None:
    cluster = parse_cluster("aws:2x4,rtx:1x8")
    rng = np.random.default_rng(2)
    jobs = []
    for i in range(6):
        model, limits = random_model(rng)
        jobs.append(JobView(id=f"j{i}", submit_time=float(i), model=model, limits=limits, fixed=(2, 64),
                            type_models={"rtx": model}))
    out, _ = decide(jobs, cluster)
    assert len(out) == 4 and all(n.startswith("rtx") for row in out.values() for n in row)


def test_running_job_keeps_its_gpus_when_its_type_is_still_chosen() -> None:
    cluster = parse_cluster("aws:2x4")
    model, limits = random_model(np.random.default_rng(4))
    jobs = [JobView(id=f"j{i}", submit_time=float(i), model=model, limits=limits, fixed=(2, 64))
            for i in range(3)]
    # j0 sits on the second half of aws-1; placing from scratch would have put it elsewhere.
    jobs[0] = replace(jobs[0], allocation={"aws-1": 2})
    out, _ = decide(jobs, cluster)
    assert out["j0"] == {"aws-1": 2}
    assert sum(sum(r.values()) for r in out.values()) == 6


def test_rounds_share_time_in_proportion_to_the_fractions() -> None:
    """Two 3-GPU jobs on 4 GPUs: the LP gives fractions summing to 4/3 (which split is the solver's
    choice); only one runs at a time, and over many rounds each receives time in proportion to its
    fraction."""
    cluster = Cluster.uniform(1, 4)
    jobs = [JobView(id="a", submit_time=0.0, fixed=(3, 64)), JobView(id="b", submit_time=1.0, fixed=(3, 64))]
    state, ran = None, {"a": 0, "b": 0}
    for k in range(40):
        out, state = decide(jobs, cluster, state, now=60.0 * k)
        assert len(out) == 1
        ran[next(iter(out))] += 1
        jobs = [replace(j, allocation=out.get(j.id, {})) for j in jobs]
    x = max_sum_throughput(np.ones((2, 1)), np.array([3, 3]), np.array([4]))[:, 0]
    assert x.sum() == pytest.approx(4 / 3)
    assert ran["a"] == pytest.approx(40 * x[0] / x.sum(), abs=2)
    assert ran["b"] == pytest.approx(40 * x[1] / x.sum(), abs=2)


def test_at_most_one_distributed_job_per_node() -> None:
    free = np.array([2, 2, 4, 4])
    dist = np.array([False, True, False, False])
    nodes = np.arange(4)
    row = place_on_type(6, nodes, free, dist)
    assert row is not None and row[1] == 0 and row.sum() == 6 and np.count_nonzero(row) == 2
    assert place_on_type(3, nodes, free, dist).tolist() == [0, 0, 3, 0]   # one node: fullest that fits
    assert place_on_type(11, nodes, free, dist) is None                    # 12 free, 10 usable


def test_step_times_follow_the_type_models() -> None:
    cluster = parse_cluster("aws:1x4,dgx-ext:1x8")
    params = ThroughputParams(0.1, 0.001, 0.02, 0.001, 0.1, 0.01, 1.0)
    model = GoodputModel(params, GradStats(1.0, 1.0), 32.0)
    limits = BatchLimits(32.0, max_local_bsz=64.0, accumulation=True)
    job = JobView(id="x", submit_time=0.0, model=model, limits=limits, fixed=(2, 256),
                  type_models={"aws": scaled(model, 2.0), "dgx-ext": model}, type_limits={"aws": limits})
    step = fixed_step_times([job], [2], cluster.type_names, np.array([4, 8]), np.array([4, 8]))
    # 256 on 2 replicas, max 64 local: m = 64, s = 1 (one accumulation pass + the synced pass).
    tg, ts = 0.1 + 0.001 * 64, 0.02
    assert step[0, 1] == pytest.approx(tg + tg + ts)
    assert step[0, 0] == pytest.approx(2 * (tg + tg + ts))
    too_big = fixed_step_times([job], [6], cluster.type_names, np.array([4, 8]), np.array([4, 8]))
    assert np.isinf(too_big[0, 0]) and np.isfinite(too_big[0, 1])


def test_registered_type_aware_and_rigid() -> None:
    info = policy_info("gavel")
    assert info.type_aware and info.job_kind == "rigid" and info.live and not info.default_compare
    assert make_policy("gavel").name == "gavel"


def test_decide_time_at_64_gpus() -> None:
    cluster = parse_cluster(HETERO)
    jobs = hetero_jobs(np.random.default_rng(11), cluster, 40)
    policy, state = GavelPolicy(), None
    times = []
    for k in range(5):
        t0 = time.perf_counter()
        out, state = policy.decide(jobs, cluster, state, 60.0 * k, np.random.default_rng(k))
        times.append(time.perf_counter() - t0)
        jobs = [replace(j, allocation=out.get(j.id, {})) for j in jobs]
    assert float(np.median(times)) < 1.0
