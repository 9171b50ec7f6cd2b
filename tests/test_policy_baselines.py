"""Tests of the baseline policies (SPEC §6): Tiresias, Optimus+Oracle and FIFO."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pollux.policy.base import (
    Cluster,
    JobView,
    Oracle,
    check_allocation,
)
from pollux.policy.baseline import settle
from pollux.policy.fifo import FifoPolicy
from pollux.policy.optimus import OptimusPolicy
from pollux.policy.placement import packed_shape, place, place_packed, place_spread
from pollux.policy.tiresias import TiresiasPolicy, gittins_index

RNG = np.random.default_rng(0)
H = 3600.0


def rigid(jid: str, t: float, replicas: int, service: float = 0.0, alloc=None, **kw) -> JobView:
    return JobView(jid, submit_time=t, fixed=(replicas, 32 * replicas), attained_service=service,
                   allocation=dict(alloc or {}), **kw)


def oracle_job(jid: str, t: float, steps, remaining: float = 1000.0, max_replicas: int | None = None,
               alloc=None, **kw) -> JobView:
    st = np.asarray([math.inf, *steps], dtype=np.float64)
    cap = len(steps) if max_replicas is None else max_replicas
    return JobView(jid, submit_time=t, fixed=(1, 128), max_replicas=cap, allocation=dict(alloc or {}),
                   oracle=Oracle(remaining_iterations=remaining, step_time=st), **kw)


def decide(policy, jobs, cluster, state=None, now=0.0):
    out, new_state = policy.decide(jobs, cluster, state, now, RNG)
    check_allocation(out, cluster)
    return out, new_state


def n_gpus(row) -> int:
    return sum(row.values())


# --------------------------------------------------------------------------------------------
# A tiny driver: jobs arrive, accumulate service while they hold GPUs, and finish.
# --------------------------------------------------------------------------------------------


def random_cluster(rng: np.random.Generator) -> Cluster:
    n = int(rng.integers(1, 6))
    return Cluster(tuple(f"n{i}" for i in range(n)), tuple(int(g) for g in rng.integers(1, 9, size=n)))


def random_specs(rng: np.random.Generator, total: int, count: int) -> list[dict]:
    specs = []
    for i in range(count):
        r = int(rng.choice([1, 1, 2, 2, 3, 4, 6, 8, total, total + 1]))
        steps = np.cumsum(rng.uniform(0.0, 1.0, size=12))[::-1] + rng.uniform(0.05, 1.0)
        if rng.random() < 0.2:
            steps[int(rng.integers(1, 12)):] = math.inf
        specs.append({
            "id": f"j{i:02d}", "t": float(rng.integers(0, 20)) * 60.0, "replicas": r,
            "work": float(rng.uniform(60.0, 3000.0)) * r, "steps": steps,
            "max": int(rng.choice([1, 4, 8, 12])), "preemptible": bool(rng.random() > 0.1),
        })
    return specs


def drive(policy, cluster: Cluster, specs: list[dict], rounds: int, dt: float = 60.0,
          shrink_at: int | None = None, codec_at: int | None = None):
    """Run ``rounds`` scheduling rounds; returns the per-round allocations and states."""
    service = {s["id"]: 0.0 for s in specs}
    done: set[str] = set()
    alloc: dict[str, dict[str, int]] = {}
    state = None
    history = []
    for k in range(rounds):
        now = k * dt
        if shrink_at is not None and k == shrink_at and cluster.num_nodes > 1:
            cluster = Cluster(cluster.nodes[1:], (max(cluster.gpus[1] - 1, 0), *cluster.gpus[2:]))
        views = []
        for s in specs:
            if s["t"] > now or s["id"] in done:
                continue
            views.append(JobView(
                s["id"], submit_time=s["t"], age_s=now - s["t"], attained_service=service[s["id"]],
                allocation=dict(alloc.get(s["id"], {})), max_replicas=s["max"],
                preemptible=s["preemptible"], fixed=(s["replicas"], 64 * s["replicas"]),
                oracle=Oracle(remaining_iterations=max(s["work"] - service[s["id"]], 0.0) / 10,
                              step_time=np.asarray([math.inf, *s["steps"]])),
            ))
        if codec_at is not None and k == codec_at and state is not None:
            state = json.loads(json.dumps(state))
        alloc, state = policy.decide(views, cluster, state, now, np.random.default_rng(k))
        json.dumps(state)  # always serialisable as it is
        history.append((views, cluster, alloc, state))
        for jid, row in alloc.items():
            service[jid] += n_gpus(row) * dt
        for s in specs:
            if s["id"] in alloc and service[s["id"]] >= s["work"]:
                done.add(s["id"])
    return history


POLICIES = {
    "tiresias": lambda: TiresiasPolicy(threshold_gpu_s=600.0),
    "tiresias-gittins": lambda: TiresiasPolicy(threshold_gpu_s=600.0, gittins=True),
    "tiresias-k3-promote": lambda: TiresiasPolicy(threshold_gpu_s=300.0, num_queues=3, promote_knob=2.0),
    "tiresias-spread": lambda: TiresiasPolicy(threshold_gpu_s=600.0, placement="spread"),
    "tiresias-all-options": lambda: TiresiasPolicy(threshold_gpu_s=[120.0, 900.0], num_queues=3,
                                                   gittins=True, promote_knob=1.0),
    "optimus": OptimusPolicy,
    "optimus-spread": lambda: OptimusPolicy(placement="spread"),
    "fifo": FifoPolicy,
}


# --------------------------------------------------------------------------------------------
# Properties on random inputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_random_capacity_and_job_constraints(name):
    for seed in range(25):
        rng = np.random.default_rng(seed)
        cluster = random_cluster(rng)
        specs = random_specs(rng, cluster.total_gpus, int(rng.integers(1, 14)))
        by_id = {s["id"]: s for s in specs}
        shrink = int(rng.integers(5, 20)) if seed % 3 == 0 else None
        for views, cl, alloc, _ in drive(POLICIES[name](), cluster, specs, 30, shrink_at=shrink):
            check_allocation(alloc, cl)
            ids = {v.id for v in views}
            assert set(alloc) <= ids
            for jid, row in alloc.items():
                assert all(g > 0 for g in row.values())
                s = by_id[jid]
                prev = next(v for v in views if v.id == jid).allocation
                if name.startswith(("tiresias", "fifo")):
                    assert n_gpus(row) == s["replicas"], (seed, jid, row)
                else:
                    assert 1 <= n_gpus(row) <= max(s["max"], n_gpus(prev)), (seed, jid, row)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_deterministic_and_independent_of_input_order(name):
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        cluster = random_cluster(rng)
        specs = random_specs(rng, cluster.total_gpus, 10)
        a = drive(POLICIES[name](), cluster, specs, 20)
        b = drive(POLICIES[name](), cluster, specs, 20)
        assert [(h[2], h[3]) for h in a] == [(h[2], h[3]) for h in b]
        # The same round with the job list reversed gives the same answer.
        for views, cl, _, _ in a[::5]:
            prev_state = None
            policy = POLICIES[name]()
            fwd = policy.decide(views, cl, prev_state, 0.0, np.random.default_rng(1))
            rev = policy.decide(views[::-1], cl, prev_state, 0.0, np.random.default_rng(2))
            assert fwd == rev


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_state_round_trip_continues_identically(name):
    for seed in range(6):
        rng = np.random.default_rng(200 + seed)
        cluster = random_cluster(rng)
        specs = random_specs(rng, cluster.total_gpus, 12)
        plain = drive(POLICIES[name](), cluster, specs, 40)
        coded = drive(POLICIES[name](), cluster, specs, 40, codec_at=17)
        assert [(h[2], h[3]) for h in plain] == [(h[2], h[3]) for h in coded]


def test_inputs_are_not_mutated():
    cluster = Cluster.uniform(2, 4)
    jobs = [rigid("a", 0, 4, service=2 * H, alloc={"node-0": 4}), rigid("b", 1, 2)]
    state = {"queues": [["x"]], "offsets": {}, "samples": [1.0], "service": {"x": 5.0}}
    snapshot = json.dumps(state)
    TiresiasPolicy(threshold_gpu_s=H, gittins=True).decide(jobs, cluster, state, 0.0, RNG)
    assert json.dumps(state) == snapshot and dict(jobs[0].allocation) == {"node-0": 4}


# --------------------------------------------------------------------------------------------
# Placement helper
# --------------------------------------------------------------------------------------------


def test_place_packed_uses_fewest_nodes():
    assert place_packed(2, np.array([4, 4])).tolist() == [2, 0]
    assert place_packed(4, np.array([4, 4, 4, 4])).tolist() == [4, 0, 0, 0]
    assert place_packed(6, np.array([3, 4, 2])).tolist() == [2, 4, 0]
    assert place_packed(3, np.array([1, 1, 1])).tolist() == [1, 1, 1]
    assert place_packed(4, np.array([1, 2])) is None
    assert place_packed(0, np.array([1, 2])).tolist() == [0, 0]


def test_placements_of_the_one_placement_module():
    assert place_spread(4, np.array([4, 4, 4, 4])).tolist() == [1, 1, 1, 1]
    assert place_spread(3, np.array([2, 0, 3])).tolist() == [1, 0, 2]
    assert place_spread(5, np.array([2, 2])) is None
    assert place(4, np.array([4, 4]), "packed").tolist() == [4, 0]
    assert place(4, np.array([4, 4]), "spread").tolist() == [2, 2]
    # The simulator's packed shape on an empty cluster is the packed placement.
    assert packed_shape(10) == [4, 4, 2] and packed_shape(3, 8) == [3] and packed_shape(16, 8) == [8, 8]
    for gpus in range(1, 20):
        assert packed_shape(gpus, 4) == [g for g in place_packed(gpus, np.full(8, 4)).tolist() if g]
    with pytest.raises(ValueError, match="placement"):
        place(1, np.array([1]), "diagonal")
    with pytest.raises(ValueError, match="gpus"):
        packed_shape(0)


def test_settle_pinned_then_kept_then_placed():
    """The baselines' skeleton: pinned rows first, unchanged rows kept, the rest placed in order;
    a pinned row that no longer fits is placed again first; ``block`` stops at the first misfit."""
    cur = {"p": np.array([2, 0]), "k": np.array([0, 2]), "m": np.array([1, 0]), "n": np.array([0, 0]),
           "q": np.array([0, 0])}
    rows = settle(cur, np.array([4, 4]), ["p"], {"k": 2, "m": 3, "n": 1, "q": 9},
                  ["k", "m", "n"], ["m", "n"], "packed")
    assert {j: r.tolist() for j, r in rows.items()} == {"p": [2, 0], "k": [0, 2], "m": [2, 1],
                                                        "n": [0, 1]}
    # Node 0 shrank to 1 GPU: the pinned row no longer fits and is placed again, before the others.
    rows = settle(cur, np.array([1, 4]), ["p"], {"k": 2, "m": 1, "n": 1, "q": 9}, ["k"], ["q", "m"],
                  "packed", block=True)
    assert {j: r.tolist() for j, r in rows.items()} == {"k": [0, 2], "p": [0, 2]}
    rows = settle(cur, np.array([1, 4]), ["p"], {"k": 2, "m": 1, "n": 1, "q": 9}, ["k"], ["q", "m"],
                  "packed")
    assert {j: r.tolist() for j, r in rows.items()} == {"k": [0, 2], "p": [0, 2], "m": [1, 0]}


# --------------------------------------------------------------------------------------------
# Tiresias
# --------------------------------------------------------------------------------------------


def test_tiresias_demotion_lets_new_job_run():
    cluster = Cluster.uniform(1, 4)
    pol = TiresiasPolicy()  # 16 GPU-hours
    a = rigid("A", 0, 4)
    out, st = decide(pol, [a], cluster)
    assert out == {"A": {"node-0": 4}}
    # B arrives while A is still in queue 1: both in arrival order, B does not fit.
    a = rigid("A", 0, 4, service=8 * H, alloc=out["A"])
    out, st = decide(pol, [a, rigid("B", 60, 2)], cluster, st)
    assert out == {"A": {"node-0": 4}} and st["queues"] == [[]]
    # A crosses 16 GPU-hours: demoted behind B; B runs and A is preempted (4 > 2 left).
    a = rigid("A", 0, 4, service=16 * H, alloc=out["A"])
    out, st = decide(pol, [a, rigid("B", 60, 2)], cluster, st)
    assert out == {"B": {"node-0": 2}} and st["queues"] == [["A"]]


def test_tiresias_skips_not_blocks():
    cluster = Cluster.uniform(2, 4)
    jobs = [rigid("A", 0, 2, alloc={"node-1": 2}), rigid("BIG", 1, 8), rigid("C", 2, 2), rigid("D", 3, 4)]
    out, _ = decide(TiresiasPolicy(), jobs, cluster)
    # BIG (8) does not fit next to A; C and D do, and start although BIG is ahead of them. New jobs
    # take the most-free node first: C lands on node-0, so D has to span both nodes.
    assert out == {"A": {"node-1": 2}, "C": {"node-0": 2}, "D": {"node-0": 2, "node-1": 2}}
    # FIFO, for contrast, blocks behind BIG.
    out, _ = decide(FifoPolicy(), jobs, cluster)
    assert out == {"A": {"node-1": 2}}


def test_tiresias_preempts_lower_queue_and_reuses_its_gpus():
    cluster = Cluster.uniform(2, 4)
    pol = TiresiasPolicy(threshold_gpu_s=H)
    old = rigid("OLD", 0, 4, service=2 * H, alloc={"node-0": 2, "node-1": 2})
    keep = rigid("KEEP", 5, 2, service=0.5 * H, alloc={"node-0": 2})
    new = rigid("NEW", 10, 4)
    out, st = decide(pol, [old, keep, new], cluster)
    assert st["queues"] == [["OLD"]]
    # KEEP keeps its placement; NEW gets what OLD released, packed on the most-free node.
    assert out == {"KEEP": {"node-0": 2}, "NEW": {"node-1": 4}}
    # With a different kept placement NEW has to span the two halves OLD released.
    keep = rigid("KEEP", 5, 2, service=0.5 * H, alloc={"node-0": 1, "node-1": 1})
    out, _ = decide(pol, [old, keep, new], cluster)
    assert out == {"KEEP": {"node-0": 1, "node-1": 1}, "NEW": {"node-0": 3, "node-1": 1}}


def test_tiresias_queue_two_in_demotion_order():
    cluster = Cluster.uniform(1, 4)
    pol = TiresiasPolicy(threshold_gpu_s=H)
    # Round 1: B (later arrival) crosses the threshold first.
    jobs = [rigid("A", 0, 2, service=0.9 * H, alloc={"node-0": 2}),
            rigid("B", 10, 2, service=H, alloc={"node-0": 2})]
    out, st = decide(pol, jobs, cluster)
    assert out == {"A": {"node-0": 2}, "B": {"node-0": 2}}
    assert st["queues"] == [["B"]]
    # Round 2: A crosses too; queue 2 is [B, A] although A arrived first.
    jobs = [rigid("A", 0, 2, service=1.5 * H), rigid("B", 10, 2, service=1.6 * H)]
    out, st = decide(pol, jobs, cluster, st)
    assert st["queues"] == [["B", "A"]]
    # A new queue-1 job takes 2 GPUs; of the demoted jobs B (demoted first) gets the other two.
    jobs.append(rigid("C", 20, 2))
    out, st = decide(pol, jobs, cluster, st)
    assert set(out) == {"C", "B"}
    # Without state (arrival order within queue 2) it would have been A.
    out2, _ = decide(pol, jobs, cluster, None)
    assert set(out2) == {"C", "A"}


def test_tiresias_simultaneous_demotions_keep_arrival_order():
    cluster = Cluster.uniform(1, 2)
    pol = TiresiasPolicy(threshold_gpu_s=H)
    jobs = [rigid("Y", 5, 1, service=2 * H), rigid("X", 0, 1, service=3 * H), rigid("Z", 9, 1)]
    out, st = decide(pol, jobs, cluster)
    assert st["queues"] == [["X", "Y"]]
    assert out == {"Z": {"node-0": 1}, "X": {"node-0": 1}}


def test_tiresias_forgets_finished_jobs_and_keeps_running_placement():
    cluster = Cluster.uniform(2, 4)
    pol = TiresiasPolicy(threshold_gpu_s=H)
    out, st = decide(pol, [rigid("A", 0, 1, service=2 * H)], cluster)
    assert st["queues"] == [["A"]]
    out, st = decide(pol, [rigid("B", 1, 3, alloc={"node-0": 1, "node-1": 2})], cluster, st)
    assert st["queues"] == [[]]
    assert out == {"B": {"node-0": 1, "node-1": 2}}


def test_tiresias_job_bigger_than_cluster_never_runs():
    cluster = Cluster.uniform(1, 4)
    out, _ = decide(TiresiasPolicy(), [rigid("X", 0, 5), rigid("Y", 1, 4)], cluster)
    assert out == {"Y": {"node-0": 4}}


def test_tiresias_non_preemptible_running_job_is_pinned():
    cluster = Cluster.uniform(1, 4)
    pol = TiresiasPolicy(threshold_gpu_s=H)
    jobs = [rigid("OLD", 0, 4, service=5 * H, alloc={"node-0": 4}, preemptible=False), rigid("NEW", 1, 2)]
    out, _ = decide(pol, jobs, cluster)
    assert out == {"OLD": {"node-0": 4}}
    jobs[0] = rigid("OLD", 0, 4, service=5 * H, alloc={"node-0": 4})
    out, _ = decide(pol, jobs, cluster)
    assert out == {"NEW": {"node-0": 2}}


def test_tiresias_three_queues_double_thresholds():
    pol = TiresiasPolicy(threshold_gpu_s=H, num_queues=3)
    assert pol.thresholds == (H, 2 * H)
    cluster = Cluster.uniform(1, 1)
    jobs = [rigid("A", 0, 1, service=2.5 * H), rigid("B", 1, 1, service=1.5 * H)]
    out, st = decide(pol, jobs, cluster)
    assert st["queues"] == [["B"], ["A"]]
    assert out == {"B": {"node-0": 1}}
    assert TiresiasPolicy(threshold_gpu_s=[10.0, 50.0], num_queues=3).thresholds == (10.0, 50.0)
    with pytest.raises(ValueError):
        TiresiasPolicy(threshold_gpu_s=[10.0], num_queues=3)
    with pytest.raises(ValueError):
        TiresiasPolicy(threshold_gpu_s=[50.0, 10.0], num_queues=3)
    with pytest.raises(ValueError):
        TiresiasPolicy(placement="scatter")


def test_gittins_index_hand_values():
    s = np.array([10.0, 100.0])
    # a = 0, Δ = 50: P(S ≤ 50) = 1/2, E[min(S, 50)] = (10 + 50)/2 = 30.
    assert gittins_index(s, 0.0, 50.0) == pytest.approx(0.5 / 30.0)
    # a = 5, Δ = 45: P = 1/2, E = (5 + 45)/2 = 25.
    assert gittins_index(s, 5.0, 45.0) == pytest.approx(0.02)
    # a = 20: only S = 100 remains, it does not finish within Δ = 30.
    assert gittins_index(s, 20.0, 30.0) == 0.0
    # Outlived every sample.
    assert gittins_index(s, 200.0, 30.0) == 0.0


def test_tiresias_gittins_records_samples_and_reorders_queue_one():
    cluster = Cluster.uniform(1, 2)
    pol = TiresiasPolicy(threshold_gpu_s=50.0, gittins=True)
    # Round 1: short jobs S1, S2 run; X and Y wait.
    jobs = [rigid("S1", 0, 1, service=10.0, alloc={"node-0": 1}),
            rigid("S2", 0, 1, service=100.0)]
    _, st = decide(pol, jobs, cluster)
    assert st["service"] == {"S1": 10.0, "S2": 100.0} and st["samples"] == []
    # Round 2: S1 and S2 are gone (completed with 10 and 100 GPU-s).
    jobs = [rigid("X", 1, 2, service=20.0), rigid("Y", 2, 2, service=0.0)]
    out, st = decide(pol, jobs, cluster, st)
    assert sorted(st["samples"]) == [10.0, 100.0]
    # LAS would run X (earlier arrival); Gittins prefers Y (index 1/60 against 0).
    assert out == {"Y": {"node-0": 2}}
    out_las, _ = decide(TiresiasPolicy(threshold_gpu_s=50.0), jobs, cluster)
    assert out_las == {"X": {"node-0": 2}}


def test_tiresias_promote_knob():
    cluster = Cluster.uniform(1, 2)
    # L: 2 GPUs, 2 GPU-hours of service (1 h executed), waiting since, 3 h old; N keeps queue 1 busy.
    jobs = [rigid("L", 0.0, 2, service=2 * H), rigid("N", 100.0, 2, service=0.0)]
    now = 3 * H
    out, st = decide(TiresiasPolicy(threshold_gpu_s=H), jobs, cluster, now=now)
    assert out == {"N": {"node-0": 2}} and st["queues"] == [["L"]]
    # Waiting 2 h ≥ 2 × 1 h executed: promoted to queue 1, where it is ahead of N by arrival.
    pol = TiresiasPolicy(threshold_gpu_s=H, promote_knob=2.0)
    out, st = decide(pol, jobs, cluster, now=now)
    assert out == {"L": {"node-0": 2}} and st["queues"] == [[]]
    assert st["offsets"] == {"L": [now, 2 * H]}
    # Its counters restart: it is not demoted until it earns another threshold's worth.
    jobs[0] = rigid("L", 0.0, 2, service=2.5 * H, alloc={"node-0": 2})
    out, st = decide(pol, jobs, cluster, st, now=now + 900)
    assert out == {"L": {"node-0": 2}} and st["queues"] == [[]]
    jobs[0] = rigid("L", 0.0, 2, service=3 * H, alloc={"node-0": 2})
    out, st = decide(pol, jobs, cluster, st, now=now + 1800)
    assert out == {"N": {"node-0": 2}} and st["queues"] == [["L"]]
    # A knob of 3 does not promote (2 h waiting < 3 × 1 h executed).
    jobs[0] = rigid("L", 0.0, 2, service=2 * H)
    out, st = decide(TiresiasPolicy(threshold_gpu_s=H, promote_knob=3.0), jobs, cluster, now=now)
    assert out == {"N": {"node-0": 2}} and st["queues"] == [["L"]]


# --------------------------------------------------------------------------------------------
# Optimus+Oracle
# --------------------------------------------------------------------------------------------


def test_optimus_steep_curve_gets_more_gpus():
    cluster = Cluster.uniform(2, 4)
    steep = oracle_job("steep", 1, [1.0 / r for r in range(1, 9)])
    flat = oracle_job("flat", 0, [1.0 - 0.01 * r for r in range(1, 9)])
    out, _ = decide(OptimusPolicy(), [steep, flat], cluster)
    assert n_gpus(out["steep"]) > n_gpus(out["flat"]) >= 1
    assert n_gpus(out["steep"]) + n_gpus(out["flat"]) == 8


def test_optimus_greedy_hand_checked():
    cluster = Cluster.uniform(1, 4)
    a = oracle_job("A", 0, [10, 6, 5, 4.5], remaining=1.0)
    b = oracle_job("B", 1, [10, 8, 7, 6.5], remaining=1.0)
    # One each; then A (gain 4 > 2); then B (gain 2 > A's 1).
    out, _ = decide(OptimusPolicy(), [a, b], cluster)
    assert out == {"A": {"node-0": 2}, "B": {"node-0": 2}}
    # Remaining iterations weigh the gains: with 5× the work B wins both extra GPUs (10 > 4, 5 > 4).
    b = oracle_job("B", 1, [10, 8, 7, 6.5], remaining=5.0)
    out, _ = decide(OptimusPolicy(), [a, b], cluster)
    assert out == {"A": {"node-0": 1}, "B": {"node-0": 3}}


def test_optimus_one_gpu_each_in_arrival_order_when_scarce():
    cluster = Cluster.uniform(1, 3)
    steps = [1.0 / r for r in range(1, 5)]
    jobs = [oracle_job(f"J{i}", float(t), steps) for i, t in enumerate([5, 1, 4, 2, 3])]
    out, _ = decide(OptimusPolicy(), jobs, cluster)
    assert sorted(out) == ["J1", "J3", "J4"]  # submit times 1, 2, 3
    assert all(n_gpus(r) == 1 for r in out.values())


def test_optimus_caps_and_hands_out_every_usable_gpu():
    cluster = Cluster.uniform(2, 4)
    ncf = oracle_job("ncf", 0, [1.0 / r for r in range(1, 9)], remaining=1e6, max_replicas=1)
    slow = oracle_job("slow", 1, [1.0, 1.0, 1.2, 1.5])  # more GPUs never help, yet it gets the rest
    capped = oracle_job("capped", 2, [1.0 / r for r in range(1, 9)], max_replicas=3)
    out, _ = decide(OptimusPolicy(), [ncf, slow, capped], cluster)
    # capped grows first (positive gains), then slow takes what is left up to its 4 sizes. Placed
    # smallest first on the most-free node: ncf node-0, capped node-1 (4 > 3), slow node-0.
    assert out == {"ncf": {"node-0": 1}, "capped": {"node-1": 3}, "slow": {"node-0": 3, "node-1": 1}}
    # When every job is at its cap, the remaining GPUs stay idle.
    out, _ = decide(OptimusPolicy(), [ncf, capped], cluster)
    assert n_gpus(out["ncf"]) == 1 and n_gpus(out["capped"]) == 3
    # Infeasible sizes (inf step time) are never chosen.
    gap = oracle_job("gap", 0, [1.0, 0.5, math.inf, 0.2])
    out, _ = decide(OptimusPolicy(), [gap], cluster)
    assert out == {"gap": {"node-0": 2}}
    # A job infeasible on 1 GPU starts at its smallest feasible size.
    big = oracle_job("big", 0, [math.inf, math.inf, 1.0, 0.9])
    out, _ = decide(OptimusPolicy(), [big], cluster)
    assert out == {"big": {"node-0": 4}}


def test_optimus_unchanged_jobs_keep_placement_and_smallest_placed_first():
    cluster = Cluster.uniform(2, 4)
    a = oracle_job("A", 0, [1.0 / r for r in range(1, 9)], remaining=100.0)
    b = oracle_job("B", 1, [1.0 / r**0.2 for r in range(1, 9)], remaining=100.0)
    out, _ = decide(OptimusPolicy(), [a, b], cluster)
    # A gets 5, B 3; B is placed first (node-0), A takes node-1 and what is left of node-0.
    assert out == {"A": {"node-0": 1, "node-1": 4}, "B": {"node-0": 3}}
    # Same counts next round from an unusual placement: both rows are kept as they are.
    odd = {"A": {"node-0": 3, "node-1": 2}, "B": {"node-0": 1, "node-1": 2}}
    a2 = oracle_job("A", 0, [1.0 / r for r in range(1, 9)], remaining=100.0, alloc=odd["A"])
    b2 = oracle_job("B", 1, [1.0 / r**0.2 for r in range(1, 9)], remaining=100.0, alloc=odd["B"])
    out, _ = decide(OptimusPolicy(), [a2, b2], cluster)
    assert out == odd
    # A flat third job arrives and takes one GPU from A (gains after 1 each: A 50, 16.7, then B 12.9,
    # A 8.3, B 6.8 > A 5): A shrinks to 4 and is re-placed, B keeps 3 GPUs and its row.
    c = oracle_job("C", 2, [1.0] * 8, remaining=100.0)
    out, _ = decide(OptimusPolicy(), [a2, b2, c], cluster)
    assert out == {"A": {"node-0": 2, "node-1": 2}, "B": odd["B"], "C": {"node-0": 1}}


def test_optimus_without_oracle_gets_one_gpu():
    cluster = Cluster.uniform(1, 4)
    out, _ = decide(OptimusPolicy(), [JobView("x", 0.0, max_replicas=4)], cluster)
    assert out == {"x": {"node-0": 1}}


# --------------------------------------------------------------------------------------------
# FIFO
# --------------------------------------------------------------------------------------------


def test_fifo_blocks_in_order_and_never_preempts():
    cluster = Cluster.uniform(1, 4)
    jobs = [rigid("C", 2, 2), rigid("B", 1, 4), rigid("A", 0, 2, alloc={"node-0": 2})]
    out, _ = decide(FifoPolicy(), jobs, cluster)
    assert out == {"A": {"node-0": 2}}  # B is next and does not fit: C waits behind it
    jobs = [rigid("C", 2, 2), rigid("B", 1, 4)]
    out, _ = decide(FifoPolicy(), jobs, cluster)
    assert out == {"B": {"node-0": 4}}
    # A running later arrival keeps its GPUs even when an earlier job waits.
    jobs = [rigid("C", 2, 4, alloc={"node-0": 4}), rigid("B", 1, 4)]
    out, _ = decide(FifoPolicy(), jobs, cluster)
    assert out == {"C": {"node-0": 4}}


def test_fifo_consolidated_placement():
    cluster = Cluster.uniform(3, 4)
    jobs = [rigid("A", 0, 2), rigid("B", 1, 4), rigid("C", 2, 6)]
    out, _ = decide(FifoPolicy(), jobs, cluster)
    assert out == {"A": {"node-0": 2}, "B": {"node-1": 4}, "C": {"node-0": 2, "node-2": 4}}
    # An impossible job (more than the cluster) is skipped, not blocking.
    out, _ = decide(FifoPolicy(), [rigid("X", 0, 13), rigid("Y", 1, 4)], cluster)
    assert out == {"Y": {"node-0": 4}}


def test_fifo_capacity_shrink_requeues_running_job():
    small = Cluster(("node-0",), (2,))
    jobs = [rigid("A", 0, 4, alloc={"node-0": 4}), rigid("B", 1, 2)]
    out, _ = decide(FifoPolicy(), jobs, small)
    assert out == {"B": {"node-0": 2}}
