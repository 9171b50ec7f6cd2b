"""Tests of the Pollux policy (SPEC §5): pollux.policy.pollux."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policy_oracles import estimate_oracle, growth_options, random_mixed_round, random_model
from pollux.goodput import (
    BatchLimits,
    GoodputModel,
    GradStats,
    ThroughputParams,
    exploration_cap,
    fair_share,
    speedup_table,
)
from pollux.policy.base import (
    Cluster,
    JobView,
    check_allocation,
    decode_state,
    encode_state,
    to_matrix,
    with_allocation,
)
from pollux.policy.pollux import FillState, PolluxPolicy, _utility
from pollux.policy.pollux import fill as fill_module
from pollux.policy.pollux.fill import best_option, estimates, greedy, place_growth
from pollux.policy.pollux.local import local_search

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def random_case(seed: int, *, uniform: bool = True, max_nodes: int = 6, max_jobs: int = 14,
                pinned_prob: float = 0.15, min_prob: float = 0.2):
    """Random cluster, jobs and a feasible current allocation (consolidated, in random order)."""
    rng = np.random.default_rng(seed)
    num_nodes = int(rng.integers(1, max_nodes + 1))
    if uniform:
        cluster = Cluster.uniform(num_nodes, int(rng.choice([1, 2, 4, 8])))
    else:
        cluster = Cluster(tuple(f"n{i}" for i in range(num_nodes)),
                          tuple(int(g) for g in rng.integers(0, 7, size=num_nodes)))
    free = cluster.capacity().copy()
    jobs, alloc = [], {}
    for i in range(int(rng.integers(1, max_jobs + 1))):
        jid = f"j{i}"
        row: dict[str, int] = {}
        if rng.random() < 0.6:
            want = int(rng.integers(1, 6))
            for n in np.argsort(-free, kind="stable"):
                if want == 0 or free[n] == 0:
                    break
                t = int(min(want, free[n]))
                row[cluster.nodes[n]] = t
                free[n] -= t
                want -= t
        held = sum(row.values())
        if rng.random() < 0.8:
            model, limits = random_model(rng)
        else:
            model, limits = None, None
        seen = max(held, int(rng.choice([0, 1, 2, 4])))
        min_r = int(rng.integers(1, 4)) if rng.random() < min_prob else 0
        if held and min_r > held:
            min_r = held
        jobs.append(JobView(
            id=jid, submit_time=float(rng.uniform(0, 1000)), age_s=float(rng.uniform(0, 3000)),
            restarts=int(rng.integers(0, 4)), attained_service=float(rng.uniform(0, 1e4)),
            allocation=row, min_replicas=min_r, max_replicas=int(rng.choice([2, 8, 64])),
            preemptible=not (row and rng.random() < pinned_prob), model=model, limits=limits,
            max_replicas_seen=seen,
        ))
        if row:
            alloc[jid] = row
    return jobs, cluster, alloc


def expected_cap(job: JobView) -> int:
    if job.limits is not None:
        cap = exploration_cap(job.max_replicas_seen, job.limits, job.max_replicas)
    else:
        cap = min(max(2 * job.max_replicas_seen, 1), job.max_replicas)
    if 0 < job.min_replicas <= job.max_replicas:
        cap = max(cap, job.min_replicas)
    return cap


def assert_feasible(out, jobs, cluster, alloc, max_nodes: int = 16, interference: bool = True) -> None:
    check_allocation(out, cluster)
    idx = cluster.index()
    dist_on_node: dict[str, list[str]] = {}
    for job in jobs:
        row = {n: g for n, g in out.get(job.id, {}).items() if g > 0}
        r = sum(row.values())
        pinned = not job.preemptible and bool(alloc.get(job.id))
        if pinned:
            assert row == {n: g for n, g in alloc[job.id].items() if g > 0}, f"{job.id}: pinned row moved"
            continue
        assert all(n in idx for n in row)
        if r:
            assert r >= job.min_replicas, f"{job.id}: {r} < min {job.min_replicas}"
            assert r <= expected_cap(job), f"{job.id}: {r} > cap {expected_cap(job)}"
            assert len(row) <= max_nodes, f"{job.id}: on {len(row)} nodes"
        if len(row) > 1:
            for n in row:
                dist_on_node.setdefault(n, []).append(job.id)
    if interference:
        for n, ids in dist_on_node.items():
            assert len(ids) <= 1, f"node {n}: distributed jobs {ids}"


def linear_model(m0: float = 64.0) -> tuple[GoodputModel, BatchLimits]:
    """Perfect scaling: no synchronisation cost, fixed batch (efficiency 1), time ∝ local batch."""
    params = ThroughputParams(1e-8, 1e-3, 1e-8, 1e-8, 1e-8, 1e-8, 1.0)
    return GoodputModel(params, GradStats(1.0, 0.0), m0), BatchLimits(m0, m0, 1.0, m0)


def flat_model(m0: float = 64.0) -> tuple[GoodputModel, BatchLimits]:
    """No scaling at all: any second replica costs a huge synchronisation time."""
    params = ThroughputParams(1e-8, 1e-3, 100.0, 1e-8, 100.0, 1e-8, 1.0)
    return GoodputModel(params, GradStats(1.0, 0.0), m0), BatchLimits(m0, m0, 1.0, m0)


def job(jid: str, model_limits=None, **kw) -> JobView:
    model, limits = model_limits if model_limits is not None else (None, None)
    base = dict(id=jid, submit_time=0.0, age_s=1e6, restarts=0, max_replicas_seen=8,
                model=model, limits=limits)
    base.update(kw)
    return JobView(**base)


def decide(policy, jobs, cluster, alloc, state=None, seed: int = 0):
    """One round with the current allocation ``alloc`` (held by the views it names)."""
    return policy.decide(with_allocation(jobs, alloc), cluster, state, 0.0, np.random.default_rng(seed))


# --------------------------------------------------------------------------------------------
# Feasibility
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_feasible_on_random_inputs(seed: int) -> None:
    jobs, cluster, alloc = random_case(seed, uniform=seed % 3 != 0)
    max_nodes = 2 if seed % 2 else 16
    policy = PolluxPolicy(max_nodes_per_job=max_nodes, population=20, generations=10)
    out, state = decide(policy, jobs, cluster, alloc, seed=seed)
    assert_feasible(out, jobs, cluster, alloc, max_nodes=max_nodes)
    assert "repair" not in state["search"]      # the search itself ends feasible
    # The next round, seeded by this one's population, is feasible too.
    out2, _ = decide(policy, jobs, cluster, out, state, seed=seed + 1)
    assert_feasible(out2, jobs, cluster, out, max_nodes=max_nodes)


@pytest.mark.parametrize("seed", range(8))
def test_feasible_large_path_and_without_interference_avoidance(seed: int) -> None:
    jobs, cluster, alloc = random_case(100 + seed, max_nodes=8)
    # dense_limit=0 forces the path used on large clusters (greedy + local search only).
    policy = PolluxPolicy(dense_limit=0, max_nodes_per_job=3)
    out, state = decide(policy, jobs, cluster, alloc, seed=seed)
    assert state["search"] == "greedy"          # (and no final repair was needed)
    assert_feasible(out, jobs, cluster, alloc, max_nodes=3)
    policy = PolluxPolicy(interference_avoidance=False, population=20, generations=10)
    out, _ = decide(policy, jobs, cluster, alloc, seed=seed)
    assert_feasible(out, jobs, cluster, alloc, interference=False)


def test_repair_rules_vectorised() -> None:
    """Repair on a hand-made population: interference, caps, capacity in priority order, minimum."""
    cluster = Cluster.uniform(3, 4)
    jobs = [
        job("a", attained_service=1.0, max_replicas_seen=4),           # highest priority
        job("b", attained_service=2.0, max_replicas_seen=4),
        job("c", attained_service=3.0, max_replicas_seen=1, max_replicas=64),   # cap 2
        job("d", attained_service=4.0, min_replicas=3),
    ]
    prob = PolluxPolicy().problem(jobs, cluster)
    assert prob.job_ids == ["a", "b", "c", "d"]
    mats = [
        # a and b both distributed over nodes 0 and 1: b loses its replicas there.
        np.array([[2, 2, 0], [1, 1, 1], [0, 0, 0], [0, 0, 0]]),
        # c over its cap of 2: keeps the first GPUs in node order.
        np.array([[0, 0, 0], [0, 0, 0], [1, 1, 3], [0, 0, 0]]),
        # node 0 over capacity: the later job loses; d then falls below its minimum.
        np.array([[4, 0, 0], [0, 0, 0], [0, 0, 0], [3, 0, 0]]),
    ]
    out = prob.repair(prob.stack(mats))
    got = [prob.unstack(out, i) for i in range(3)]
    assert got[0].tolist() == [[2, 2, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]]
    assert got[1].tolist() == [[0, 0, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert got[2].tolist() == [[4, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("seed", range(10))
def test_greedy_and_local_search_stay_feasible(seed: int) -> None:
    jobs, cluster, alloc = random_case(300 + seed, max_nodes=8, max_jobs=16)
    prob = PolluxPolicy(max_nodes_per_job=1 + seed % 3).problem(with_allocation(jobs, alloc), cluster)
    rng = np.random.default_rng(seed)
    pop = prob.repair(prob.stack([prob.cur, rng.integers(0, 5, size=prob.cur.shape)]))
    for i in range(pop.shape[1]):
        a = prob.unstack(pop, i)
        assert prob.feasible(a)
        for loose in (False, True):
            assert prob.feasible(greedy(prob, a, loose=loose))
        b, f, _ = local_search(prob, a, rng, 6, 0.3, 8, 8)
        assert prob.feasible(b) and f == pytest.approx(prob.fitness(b)) and f >= prob.fitness(a)
    over = prob.cur.copy()
    over[:, 0] += prob.cap[0] + 1
    assert not prob.feasible(over)


@pytest.mark.parametrize("seed", range(4))
def test_a_repeated_fill_is_answered_from_the_memo_as_a_fresh_fill_would(seed: int, monkeypatch) -> None:
    """greedy remembers its fills per problem: a repeat gives the fill a fresh problem makes, as a
    new array (a caller that changes it cannot change the next answer); matrices too large to keep
    are filled afresh every time."""
    jobs, cluster, alloc = random_case(400 + seed, max_nodes=8, max_jobs=16)
    policy = PolluxPolicy()
    prob = policy.problem(with_allocation(jobs, alloc), cluster)
    for loose in (False, True):
        first = greedy(prob, prob.cur, loose=loose)
        again = greedy(prob, prob.cur, loose=loose)
        fresh = greedy(policy.problem(with_allocation(jobs, alloc), cluster), prob.cur, loose=loose)
        assert np.array_equal(first, again) and np.array_equal(first, fresh)
        assert again is not first
        again[:] = 0
        assert np.array_equal(greedy(prob, prob.cur, loose=loose), first)
    assert len(prob.fills) == 2 and all(v.dtype == np.int64 for v in prob.fills.values())
    big = policy.problem(with_allocation(jobs, alloc), cluster)
    monkeypatch.setattr(fill_module, "MEMO_MAX_ENTRIES", 0)
    assert np.array_equal(greedy(big, big.cur), greedy(prob, prob.cur))
    assert big.fills == {}


def test_tables_match_the_goodput_core() -> None:
    """Tables (built to 2 nodes and copied beyond) equal speedup_table's full table × d·num_nodes,
    and a job without a model scales as replicas / fair replicas."""
    rng = np.random.default_rng(1)
    cluster = Cluster.uniform(16, 4)
    jobs = [job(f"j{i}", random_model(rng), max_replicas_seen=int(s)) for i, s in enumerate([1, 4, 8, 32])]
    # Jobs without a model, of two sizes, among the others: each size's table is written to all its jobs.
    jobs[1:1] = [job("none", max_replicas_seen=4), job("none1", max_replicas_seen=1)]
    jobs.append(job("none2", max_replicas_seen=4))
    prob = PolluxPolicy(table_cache=0).problem(jobs, cluster)
    assert prob.tables.fair == fair_share(16, 4, 7) == (1, 10)
    for j, jv in enumerate(prob.jobs):
        cap = int(prob.max_replicas[j])
        nt = min(16, cap)
        got = prob.tables.table[j, : nt + 1, : cap + 1]
        if jv.model is None:
            r = np.arange(cap + 1)
            n = np.arange(nt + 1)[:, None]
            want = np.where((n >= 1) & (n <= r), r / 10, 0.0)
        else:
            want = speedup_table(jv.model, jv.limits, nt, cap, prob.tables.fair, replica_cap=cap)
        np.testing.assert_allclose(got, want * 16 / 64, rtol=1e-12, atol=1e-15)
        assert not prob.tables.table[j, :, cap + 1:].any()


def test_greedy_placement_predictions_match_placement() -> None:
    """The greedy's option list predicts exactly the rows its placement rule builds."""
    rng = np.random.default_rng(3)
    seen = {"none": 0, "gain": 0, "no gain": 0}
    for seed in range(12):
        jobs, cluster, alloc = random_case(200 + seed, max_nodes=8, max_jobs=10)
        policy = PolluxPolicy(max_nodes_per_job=int(rng.integers(1, 4)))
        prob = policy.problem(with_allocation(jobs, alloc), cluster)
        a = prob.repair_one(prob.cur)
        st = FillState(prob.cap - a.sum(axis=0), prob.owners(a), prob.interference)
        for j in np.flatnonzero(prob.movable):
            ks, ns, modes, vals = growth_options(prob, a, int(j), st)
            for k, n, mode, val in zip(ks, ns, modes, vals, strict=True):
                row = place_growth(prob, a, int(j), int(k), int(mode), st)
                assert row is not None
                r = int(a[j].sum()) + int(k)
                assert int(row.sum()) == r
                assert int(np.count_nonzero(row)) == int(n)
                assert np.all(row <= a[j] + st.free)
                assert val == prob.tables.table[j, int(n), r]
            # The greedy's fast scalar loop picks the same best option as the vectorised table.
            u_now = float(_utility(prob.matrix_speedups(a)[j], prob.p))
            g, k, mode = best_option(prob, a, int(j), st, u_now)
            if not ks.size:
                # No way to grow the job: no option at all, so the greedy drops it.
                assert (g, k, mode) == (0.0, 0, 0)
                seen["none"] += 1
                continue
            gains = (_utility(vals * prob.pen[j], prob.p) - u_now) / ks
            i = int(np.argmax(gains))
            if gains[i] > 0:
                assert g == pytest.approx(gains[i], rel=1e-12)
                assert (k, mode) == (int(ks[i]), int(modes[i]))
                seen["gain"] += 1
            else:
                # Options exist but none gains: the greedy's skip test (k == 0 or g <= 0) must hold.
                assert k == 0 or g <= 0.0
                seen["no gain"] += 1
    # Every branch above ran (so none of its assertions is vacuous).
    assert min(seen.values()) > 0, seen


def _fill_state(prob, a: np.ndarray) -> FillState:
    """The state a fill of ``a`` starts from (owners are kept only where distributed jobs may not
    share a node, as :func:`pollux.policy.pollux.fill.greedy` keeps them)."""
    owner = prob.owners(a) if prob.interference else np.full(prob.num_nodes, -1)
    return FillState(prob.cap - a.sum(axis=0), owner, prob.interference)


def _node_orders(st: FillState, a: np.ndarray, nodes: int) -> tuple:
    """Everything a fill reads of the node orders: the Python lists, the spread order, and the node
    single_node picks (tight) for every job and size."""
    picks = [st.single_node(total, np.flatnonzero(a[j]), a[j]) for j in range(a.shape[0])
             for total in range(1, 10)]
    return st.free_list(), st.owner_list(), st.spread_prefix(nodes + 1), picks


@pytest.mark.parametrize("interference", [True, False])
def test_fill_state_kept_by_updates_matches_a_fresh_one(interference: bool) -> None:
    """What :meth:`FillState.update` keeps incrementally (free GPUs, their total, the distributed
    owners, each job's node and GPU lists, the node orders kept sorted) equals a state built afresh
    from the changed matrix."""
    checked = moved = 0
    for seed in range(10):
        jobs, cluster, alloc = random_case(300 + seed, max_nodes=8, max_jobs=10)
        policy = PolluxPolicy(max_nodes_per_job=3, interference_avoidance=interference)
        prob = policy.problem(with_allocation(jobs, alloc), cluster)
        a = np.array(prob.repair_one(prob.cur), dtype=np.int64)
        st = _fill_state(prob, a)
        for j in range(prob.num_jobs):
            st.row_lists(j, a[j])                  # every job's lists cached before any change
        _node_orders(st, a, prob.num_nodes)        # the sorted orders built: updates must keep them
        rng = np.random.default_rng(seed)
        for _ in range(100):
            # Any placement mode and jump, not only the greedy's pick: moves off a job's nodes too.
            j, k, mode = int(rng.integers(prob.num_jobs)), int(rng.integers(1, 4)), int(rng.integers(3))
            # Now and then a job gives its GPUs back, so that the cluster never stays full.
            new = np.zeros_like(a[j]) if rng.random() < 0.25 else place_growth(prob, a, j, k, mode, st)
            if new is None:
                continue
            moved += bool(np.count_nonzero(a[j]) > 1 and ((a[j] > 0) & (new == 0)).any())
            st.update(j, a[j], new)
            a[j] = new
            checked += 1
            fresh = _fill_state(prob, a)
            np.testing.assert_array_equal(st.free, fresh.free)
            assert st.total_free == fresh.total_free
            np.testing.assert_array_equal(st.owner, fresh.owner)
            for i in range(prob.num_jobs):
                assert st.row_lists(i, a[i]) == fresh.row_lists(i, a[i])
            assert _node_orders(st, a, prob.num_nodes) == _node_orders(fresh, a, prob.num_nodes)
    assert checked > 100 and moved > 5, (checked, moved)


def test_fill_estimates_match_a_job_by_job_oracle() -> None:
    """The greedy's first queue (vectorised over the cells that hold GPUs) against the plain loop."""
    checked = 0
    for seed in range(12):
        # Nodes of unequal sizes too: a job's own node may then offer more than any free node.
        jobs, cluster, alloc = random_case(400 + seed, uniform=seed % 2 == 0, max_nodes=8, max_jobs=12)
        for p in (-1.0, 0.0, 0.5):
            prob = PolluxPolicy(p=p, max_nodes_per_job=3).problem(with_allocation(jobs, alloc), cluster)
            rng = np.random.default_rng(seed)
            # The current rows with some jobs dropped (GPUs free on many nodes), and a full cluster
            # with one running job dropped (a few free GPUs, next to the jobs' own).
            loose = np.array(prob.repair_one(prob.cur), dtype=np.int64)
            loose[rng.random(prob.num_jobs) < 0.3] = 0
            tight = greedy(prob, prob.repair_one(prob.cur))
            running = np.flatnonzero(tight.sum(axis=1) > 0)
            tight[running[rng.integers(running.size)]] = 0
            # Many jobs on two nodes each (distributed jobs weigh in-place, one-node and spread apart).
            spread = np.zeros_like(loose)
            for j in rng.permutation(prob.num_jobs):
                for n in rng.choice(prob.num_nodes, size=min(2, prob.num_nodes), replace=False):
                    room = int(prob.cap[n] - spread[:, n].sum())
                    spread[j, n] += max(min(int(rng.integers(1, 3)), room), 0)
            for a in (loose, tight, spread):
                free = prob.cap - a.sum(axis=0)
                owner = prob.owners(a)
                u_now = _utility(prob.matrix_speedups(a), p)
                got = estimates(prob, a, free, owner, u_now)
                np.testing.assert_allclose(got, estimate_oracle(prob, a, free, owner, u_now), rtol=1e-12)
                checked += int(np.isfinite(got).sum())
    assert checked > 100


# --------------------------------------------------------------------------------------------
# Determinism and state
# --------------------------------------------------------------------------------------------


def test_same_seed_same_result_and_seeds_matter() -> None:
    jobs, cluster, alloc = random_case(7, max_nodes=6, max_jobs=14, pinned_prob=0.0)
    policy = PolluxPolicy(population=30, generations=20)
    out1, st1 = decide(policy, jobs, cluster, alloc, seed=11)
    out2, st2 = decide(PolluxPolicy(population=30, generations=20), jobs, cluster, alloc, seed=11)
    assert out1 == out2
    assert json.dumps(st1) == json.dumps(st2)
    states = {json.dumps(decide(policy, jobs, cluster, alloc, seed=s)[1]) for s in range(4)}
    assert len(states) > 1


def test_state_round_trip_and_remap() -> None:
    jobs, cluster, alloc = random_case(5, max_nodes=5, max_jobs=10)
    policy = PolluxPolicy(population=20, generations=10)
    out, state = decide(policy, jobs, cluster, alloc, seed=1)
    back = json.loads(json.dumps(state))         # the state is JSON as it is
    a, sa = decide(policy, jobs, cluster, out, state, seed=2)
    b, sb = decide(policy, jobs, cluster, out, back, seed=2)
    assert a == b
    assert json.dumps(sa) == json.dumps(sb)

    # The carried population lands on the same (job id, node id) cells after jobs and nodes change.
    prob = policy.problem(with_allocation(jobs, out), cluster)
    carried = prob.remap(back, 100)
    first = {(jid, node): int(carried[j, 0, n]) for j, jid in enumerate(prob.job_ids)
             for n, node in enumerate(cluster.nodes) if carried[j, 0, n] > 0}
    gone_job, gone_node = prob.job_ids[0], cluster.nodes[-1]
    new_cluster = Cluster((*cluster.nodes[:-1], "extra"), (*cluster.gpus[:-1], 4))
    new_jobs = [j for j in jobs if j.id != gone_job] + [job("newcomer", age_s=60.0)]
    prob2 = policy.problem(new_jobs, new_cluster)
    carried2 = prob2.remap(back, 100)
    assert carried2.shape[1] == carried.shape[1]
    second = {(jid, node): int(carried2[j, 0, n]) for j, jid in enumerate(prob2.job_ids)
              for n, node in enumerate(new_cluster.nodes) if carried2[j, 0, n] > 0}
    assert second == {k: v for k, v in first.items() if k[0] != gone_job and k[1] != gone_node}
    assert not carried2[prob2.job_ids.index("newcomer")].any()
    assert not carried2[:, :, new_cluster.nodes.index("extra")].any()
    out3, _ = decide(policy, new_jobs, new_cluster, {}, back, seed=3)
    assert_feasible(out3, new_jobs, new_cluster, {})


def test_state_is_json_with_encoded_arrays_and_decoded_state_is_accepted() -> None:
    """The state is JSON as it is (arrays as tagged base64, the format the store wrote before issue 11,
    so old rows read back the same); a decoded state (numpy arrays) is accepted too."""
    jobs, cluster, alloc = random_case(5, max_nodes=5, max_jobs=10)
    policy = PolluxPolicy(population=20, generations=10)
    out, state = decide(policy, jobs, cluster, alloc, seed=1)
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    assert set(state["gpus"]) == {"__ndarray__", "dtype", "shape"}
    assert encode_state(decode_state(state)) == state
    decoded = decode_state(state)
    assert isinstance(decoded["gpus"], np.ndarray) and decoded["gpus"].size > 0
    a, sa = decide(policy, jobs, cluster, out, state, seed=2)
    b, sb = decide(policy, jobs, cluster, out, decoded, seed=2)
    assert a == b and json.dumps(sa) == json.dumps(sb)


def test_bad_or_foreign_state_is_ignored() -> None:
    jobs, cluster, alloc = random_case(9)
    policy = PolluxPolicy(population=10, generations=5)
    bad_blob = {"__ndarray__": "not base64!", "dtype": "int32", "shape": [3]}
    for state in ({}, {"version": 99}, {"version": 1, "size": 3}, {"version": 1, "size": "x",
                                                                    "job_ids": [], "node_ids": []},
                  {"version": 1, "size": 1, "job_ids": [], "node_ids": [], "gpus": bad_blob},
                  ["not", "a", "dict"], "text"):
        out, _ = decide(policy, jobs, cluster, alloc, state)
        assert_feasible(out, jobs, cluster, alloc)


def test_empty_inputs() -> None:
    policy = PolluxPolicy()
    out, state = decide(policy, [], Cluster.uniform(2, 4), {})
    assert out == {} and state["search"] == "none"
    out, _ = decide(policy, [job("a")], Cluster((), ()), {})
    assert out == {}
    out, _ = decide(policy, [job("a")], Cluster(("n0",), (0,)), {})
    assert out == {}


# --------------------------------------------------------------------------------------------
# Behaviour on hand-checkable cases
# --------------------------------------------------------------------------------------------


def test_scaling_job_gets_more_gpus() -> None:
    """2 jobs on one node of 4 GPUs: the linearly scaling job gets 3, the flat one 1."""
    cluster = Cluster.uniform(1, 4)
    jobs = [job("flat", flat_model()), job("lin", linear_model())]
    prob = PolluxPolicy().problem(jobs, cluster)
    lin = prob.job_ids.index("lin")
    flat = prob.job_ids.index("flat")
    assert prob.tables.table[lin, 1, 4] > 1.9 * prob.tables.table[lin, 1, 2]          # linear
    assert prob.tables.table[flat, 1, 2] < 0.1 * prob.tables.table[flat, 1, 1]        # no scaling at all
    for p in (-1.0, 0.0, 1.0):
        policy = PolluxPolicy(p=p)
        out, state = decide(policy, jobs, cluster, {})
        assert out == {"lin": {"node-0": 3}, "flat": {"node-0": 1}}, p
        prob_p = policy.problem(jobs, cluster)
        assert state["objective"] == pytest.approx(prob_p.fitness(to_matrix(out, prob_p.job_ids, cluster)))


def test_fitness_matches_formula() -> None:
    """FITNESS_p by hand: speedup tables, d·num_nodes, the penalty and the 1e-3 term."""
    cluster = Cluster.uniform(2, 4)
    jobs = [job("a", age_s=90.0, restarts=1, allocation={"node-0": 2}),
            job("b", age_s=10.0), job("c", age_s=1e6, allocation={"node-1": 1})]
    alloc = {"a": {"node-0": 2}, "c": {"node-1": 1}}
    prob = PolluxPolicy(p=-1.0).problem(with_allocation(jobs, alloc), cluster)
    # No models: speedup = replicas / fair replicas (ceil(8/3) = 3) × d·num_nodes (2/8).
    cand = {"a": {"node-0": 3}, "b": {"node-1": 1}, "c": {"node-1": 1}}
    s = {"a": 3 / 3 * 0.25 * (90 - 30) / (90 + 30), "b": 1 / 3 * 0.25 * 10 / 40, "c": 1 / 3 * 0.25}
    want = 3 / sum(1 / (v + 1e-3) for v in s.values())
    assert prob.fitness(to_matrix(cand, prob.job_ids, cluster)) == pytest.approx(want)
    geo = PolluxPolicy(p=0.0).problem(with_allocation(jobs, alloc), cluster)
    want0 = float(np.exp(np.mean([np.log(v + 1e-3) for v in s.values()])))
    assert geo.fitness(to_matrix(cand, geo.job_ids, cluster)) == pytest.approx(want0)

    # The pair the searches rank by: the penalised fitness, then the fitness without the penalty.
    m = to_matrix(cand, prob.job_ids, cluster)
    unpenalised = {"a": 3 / 3 * 0.25, "b": 1 / 3 * 0.25, "c": 1 / 3 * 0.25}
    want_raw = 3 / sum(1 / (v + 1e-3) for v in unpenalised.values())
    assert prob.fitness_pair(m) == (prob.fitness(m), pytest.approx(want_raw))


def test_restart_penalty_keeps_a_young_job_in_place() -> None:
    """A young job holding 1 GPU would grow without the penalty; with δ = 30 s it stays put."""
    cluster = Cluster.uniform(2, 4)
    jobs = [job("young", linear_model(), age_s=40.0, restarts=1, allocation={"node-0": 1}),
            job("old", linear_model(), age_s=1e6, allocation={"node-1": 4})]
    alloc = {"young": {"node-0": 1}, "old": {"node-1": 4}}
    out, _ = decide(PolluxPolicy(restart_penalty_s=30.0), jobs, cluster, alloc)
    assert out["young"] == {"node-0": 1}
    out, _ = decide(PolluxPolicy(restart_penalty_s=0.0), jobs, cluster, alloc)
    assert sum(out["young"].values()) > 1


def test_harmonic_mean_is_fairer_than_arithmetic() -> None:
    """p = 1 starves a young job (its start is heavily penalised); p = −1 runs it anyway."""
    cluster = Cluster.uniform(1, 4)
    jobs = [job("old", age_s=1e6, max_replicas_seen=4), job("young", age_s=10.0, max_replicas_seen=4)]
    out1, _ = decide(PolluxPolicy(p=1.0), jobs, cluster, {})
    outm, _ = decide(PolluxPolicy(p=-1.0), jobs, cluster, {})
    assert out1 == {"old": {"node-0": 4}}
    assert sum(outm.get("young", {}).values()) >= 1 and sum(outm.get("old", {}).values()) >= 1


def test_pinned_job_is_kept_even_if_suboptimal() -> None:
    cluster = Cluster.uniform(1, 4)
    jobs = [job("flat", flat_model(), preemptible=False, allocation={"node-0": 3}),
            job("lin", linear_model())]
    alloc = {"flat": {"node-0": 3}}
    out, _ = decide(PolluxPolicy(), jobs, cluster, alloc)
    assert out == {"flat": {"node-0": 3}, "lin": {"node-0": 1}}


def test_new_jobs_get_one_gpu_under_the_exploration_cap() -> None:
    """Jobs never run (max_replicas_seen 0) are capped at 1 replica, whatever their model says."""
    cluster = Cluster.uniform(2, 4)
    jobs = [job(f"j{i}", linear_model(), max_replicas_seen=0) for i in range(3)]
    out, _ = decide(PolluxPolicy(), jobs, cluster, {})
    assert sorted(sum(r.values()) for r in out.values()) == [1, 1, 1]


# --------------------------------------------------------------------------------------------
# Search quality
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_search_reaches_plain_genetic_search(seed: int) -> None:
    """Our search (greedy + local search + short GA) ≥ 0.99 × the plain 100 × 100 GA."""
    cluster = Cluster.uniform(4, 4)
    jobs, alloc = random_mixed_round(np.random.default_rng(seed), cluster, 10)
    ours, _ = decide(PolluxPolicy(), jobs, cluster, alloc, seed=seed)
    plain, _ = decide(PolluxPolicy(patience=None, greedy_seed=False), jobs, cluster, alloc, seed=seed)
    prob = PolluxPolicy().problem(with_allocation(jobs, alloc), cluster)
    f_ours = prob.fitness(to_matrix(ours, prob.job_ids, cluster))
    f_plain = prob.fitness(to_matrix(plain, prob.job_ids, cluster))
    assert f_ours >= 0.99 * f_plain
    assert_feasible(plain, jobs, cluster, alloc)
