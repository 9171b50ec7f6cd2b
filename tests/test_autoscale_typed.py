"""GPU types and prices in cloud autoscaling (issue 36): the typed rule, the typed simulated cloud.

Hand-checked paths (which type the rule adds first, and why), the per-type target, parity with the
untyped rule on one pool (random cases), bad input, billing per type on a scripted fleet, and a small
typed simulation whose fleet grows and shrinks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams
from pollux.policy.autoscale import (
    Fleet,
    NodePool,
    PoolNodes,
    ScaleDecision,
    autoscaler_names,
    make_autoscaler,
)
from pollux.policy.autoscale.api import AutoscaleState
from pollux.policy.autoscale.rules import ThresholdRule
from pollux.policy.autoscale.typed_utility import TypedCurves, typed_curves, typed_greedy, utility_path
from pollux.policy.autoscale.utility import _greedy
from pollux.policy.base import JobView
from pollux.sim.fleet import CloudFleet, TypedCloudConfig

FREE_SYNC = ThroughputParams(0.01, 0.001, 1e-8, 1e-8, 1e-8, 1e-8, 1.0)
COSTLY = ThroughputParams(0.01, 0.001, 1e-8, 1e-8, 0.05, 0.002, 1.0)
#: FREE_SYNC four times faster: a GPU of the type it describes is worth four of FREE_SYNC's.
FAST = ThroughputParams(0.0025, 0.00025, 2.5e-9, 2.5e-9, 2.5e-9, 2.5e-9, 1.0)
LIMITS = BatchLimits(init_batch_size=32, max_batch_size=32 * 64, min_local_bsz=16, max_local_bsz=64)
NOISY = GradStats(sqr=0.0, var=1.0)          # every batch size fully efficient: linear speedup
QUIET = GradStats(sqr=1.0, var=0.0)          # larger batches gain nothing: a flat speedup


def job(name: str, grad: GradStats = NOISY, params: ThroughputParams = FREE_SYNC,
        per_type: dict[str, ThroughputParams] | None = None) -> JobView:
    models = None if per_type is None else {t: GoodputModel(p, grad, 32) for t, p in per_type.items()}
    return JobView(id=name, submit_time=0.0, model=GoodputModel(params, grad, 32), limits=LIMITS,
                   type_models=models)


def typed_fleet(*held: tuple[NodePool, int, int], delay: float = 120.0) -> Fleet:
    return Fleet.typed([PoolNodes(pool, ready, pending) for pool, ready, pending in held], delay)


CHEAP = NodePool("cheap", 4, min_nodes=0, max_nodes=2, price_per_node_hour=1.0)
DEAR = NodePool("dear", 4, min_nodes=0, max_nodes=2, price_per_node_hour=3.0)


# ------------------------------------------------------------------------------ hand-checked cases


def test_the_path_adds_the_best_utility_per_price_first_and_a_job_keeps_to_one_type():
    """One job: 0.5 per GPU on `slow` (4-GPU nodes at 1/h, at most 2), 1 per GPU on `fast` (one 8-GPU
    node at 6/h). Step 1: slow adds 2 for 1 (2/price), fast adds 8 for 6 (1.33): slow. Step 2 from
    (1, 0): slow adds 2 (score 2); fast: the job moves to fast's 8 GPUs, U = 8, adds 6 (score 1): slow.
    Step 3: fast, U = 8 (the job runs on one type: slow's GPUs go unused). r = (0.5, 1), so
    E = 2/2, 4/4, 8/12."""
    slow = NodePool("slow", 4, max_nodes=2, price_per_node_hour=1.0)
    fast = NodePool("fast", 8, max_nodes=1, price_per_node_hour=6.0)
    curves = TypedCurves((slow, fast), (0.5 * np.arange(9.0)[None, :], np.arange(9.0)[None, :]),
                         np.array([0.5, 1.0]))
    path = utility_path(curves)
    assert path.added == (0, 0, 1)
    assert path.steps.tolist() == [[0, 0], [1, 0], [2, 0], [2, 1]]
    assert path.efficiency == pytest.approx([0.0, 1.0, 1.0, 8 / 12])
    assert typed_greedy(curves.curves, [8, 8]) == pytest.approx(8.0)
    # With the fast node free it comes first whatever it gains (a free node is the cheapest).
    free = replace(curves, pools=(slow, replace(fast, price_per_node_hour=0.0)))
    assert utility_path(free).added[0] == 1


def test_which_type_the_rule_adds_first_follows_speed_against_price():
    """A linear job four times faster on `dear` (per_type model): one GPU of `cheap` is worth 0.25.
    A dear node adds 4 for 3 (1.33 per price), a cheap one 1 for 1: dear first. At a price of 5 the
    dear node adds 0.8 per price: cheap first."""
    fast_there = job("a", per_type={"cheap": FREE_SYNC, "dear": FAST})
    curves = typed_curves([fast_there], [CHEAP, DEAR])
    assert curves.ratios == pytest.approx([0.25, 1.0], rel=0.02)
    assert utility_path(curves).added[0] == 1
    pricier = NodePool("dear", 4, max_nodes=2, price_per_node_hour=5.0)
    assert utility_path(typed_curves([fast_there], [CHEAP, pricier])).added[0] == 0
    # The rule starts the job on the whole path (E ≈ 1 everywhere: it scales perfectly on each type).
    decision, _ = make_autoscaler("goodput").decide([fast_there], typed_fleet((CHEAP, 0, 0), (DEAR, 0, 0)),
                                                    None, now=0.0)
    assert decision.targets == {"cheap": 2, "dear": 2} and decision.target == 4
    assert decision.path == ("dear", "dear", "cheap", "cheap") and decision.reason == "start"


def test_a_flat_job_gets_one_node_of_the_cheapest_type_and_a_held_mix_shrinks_after_the_cooldown():
    quiet = job("q", QUIET)               # the same model on both types: the cheap type is better value
    rule = ThresholdRule()
    start, state = rule.decide([quiet], typed_fleet((CHEAP, 0, 0), (DEAR, 0, 0)), None, now=0.0)
    assert start.targets == {"cheap": 1, "dear": 0} and start.reason == "1 job(s) need a GPU each"
    assert state["grown_at"] == 0.0
    big = typed_fleet((CHEAP, 2, 0), (DEAR, 2, 0))
    assert rule.decide([quiet], big, state, now=300.0)[0].targets == {"cheap": 2, "dear": 2}   # cooldown
    shrunk, _ = rule.decide([quiet], big, state, now=900.0)
    assert shrunk.targets == {"cheap": 1, "dear": 0} and shrunk.efficiency is not None
    assert shrunk.efficiency < 1 / 3
    # Nothing to run: every pool to its minimum at once.
    floor = NodePool("cheap", 4, min_nodes=1, max_nodes=2, price_per_node_hour=1.0)
    idle, _ = rule.decide([], typed_fleet((floor, 2, 0), (DEAR, 1, 1)), state, now=10.0)
    assert idle.targets == {"cheap": 1, "dear": 0} and idle.reason == "nothing to run"


def test_a_grow_keeps_the_nodes_held_of_another_type():
    """The fleet holds a dear node; the path prefers cheap ones: the grow adds cheap nodes and keeps
    the dear one (only a shrink, after the cooldown, gives a held node back). One linear job runs on
    one type only, so the whole cloud is worth 8 of its 16 GPUs to it: E(2, 2) is just under 1/2 and
    the path stops at (2, 1) (E = 8/12); two such jobs use both types and take everything."""
    linear = [job("a")]
    one, _ = ThresholdRule().decide(linear, typed_fleet((CHEAP, 0, 0), (DEAR, 1, 0)), None, now=0.0)
    assert one.path == ("cheap", "cheap", "dear", "dear") and one.utility is not None
    assert one.utility[3] == pytest.approx(8 / 12, rel=0.02) and one.utility[4] < 0.5
    assert one.targets == {"cheap": 2, "dear": 1} and one.reason.startswith("utility per GPU")
    pair = [job("a"), job("b")]
    two, _ = ThresholdRule().decide(pair, typed_fleet((CHEAP, 0, 0), (DEAR, 1, 0)), None, now=0.0)
    assert two.targets == {"cheap": 2, "dear": 2}
    costly = job("c", NOISY, COSTLY)     # scales badly across nodes: the target stops short
    eff = utility_path(typed_curves([costly], [CHEAP, DEAR])).efficiency
    assert eff[1] > 2 / 3
    grown, _ = ThresholdRule().decide([costly], typed_fleet((CHEAP, 1, 0), (DEAR, 0, 0)), None, now=0.0)
    assert grown.targets is not None and grown.targets["dear"] == 0 and grown.targets["cheap"] >= 1


def test_fixed_fills_the_pools_in_order():
    fleet = typed_fleet((CHEAP, 0, 0), (DEAR, 0, 0))
    cases = ((4, {"cheap": 2, "dear": 2}), (3, {"cheap": 2, "dear": 1}), (1, {"cheap": 1, "dear": 0}))
    for nodes, targets in cases:
        assert make_autoscaler("fixed", nodes=nodes).decide([], fleet, None, 0.0)[0].targets == targets


# ------------------------------------------------------------------------------ parity on one pool


def _random_view(rng: np.random.Generator, i: int) -> JobView:
    kind = int(rng.integers(5))
    if kind == 0:
        return JobView(id=f"w{i}", submit_time=0.0)                                  # no model yet
    if kind == 1:
        return JobView(id=f"r{i}", submit_time=0.0, fixed=(int(rng.integers(1, 6)), 64))   # rigid
    grad = GradStats(sqr=float(rng.uniform(0, 1)), var=float(rng.uniform(0, 1)))
    params = ThroughputParams(0.01, 0.001, 1e-8, 1e-8, float(rng.uniform(0, 0.05)),
                              float(rng.uniform(0, 0.003)), 1.0)
    return replace(job(f"m{i}", grad, params), max_replicas=int(rng.integers(1, 40)))


@pytest.mark.parametrize("seed", range(8))
def test_one_pool_decides_exactly_as_the_untyped_rule(seed):
    rng = np.random.default_rng(seed)
    gpus = int(rng.choice([1, 2, 4, 8]))
    lo = int(rng.integers(0, 3))
    hi = int(rng.integers(max(lo, 1), 9))
    pool = NodePool("only", gpus, lo, hi, float(rng.uniform(0, 5)))
    measure = "goodput" if seed % 2 == 0 else "throughput"
    rule = ThresholdRule(measure=measure, cooldown_s=float(rng.choice([0.0, 600.0])))
    for _ in range(4):
        views = [_random_view(rng, i) for i in range(int(rng.integers(0, 6)))]
        ready = int(rng.integers(0, hi + 1))
        pending = int(rng.integers(0, hi - ready + 1))
        state = {"grown_at": float(rng.uniform(0, 1000))} if rng.random() < 0.5 else None
        now = float(rng.uniform(0, 2000))
        untyped = Fleet(ready=ready, pending=pending, min_nodes=lo, max_nodes=hi, gpus_per_node=gpus,
                        provision_delay_s=120.0)
        plain, plain_state = rule.decide(views, untyped, state, now)
        typed, typed_state = rule.decide(views, typed_fleet((pool, ready, pending)), state, now)
        assert (typed.target, typed.reason, typed.efficiency, typed.utility) == \
            (plain.target, plain.reason, plain.efficiency, plain.utility)
        assert typed.targets == {"only": plain.target} and typed_state == plain_state


def test_the_typed_greedy_is_the_untyped_one_on_one_type():
    rng = np.random.default_rng(3)
    curves = np.maximum.accumulate(rng.uniform(0, 2, size=(5, 13)), axis=1)
    curves[:, 0] = 0
    for budget in range(13):
        assert typed_greedy([curves], [budget]) == _greedy(curves, budget)


# ------------------------------------------------------------------------------ bad input


def test_bad_pools_and_targets_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="price_per_node_hour"):
        NodePool("aws", 4, 0, 2, price_per_node_hour=-1.0)
    with pytest.raises(ValueError, match="gpus_per_node"):
        NodePool("aws", 0, 0, 2)
    with pytest.raises(ValueError, match="gpu_type"):
        NodePool("", 4, 0, 2)
    with pytest.raises(ValueError, match="initial_nodes"):
        NodePool("aws", 4, 0, 2, initial_nodes=3)
    with pytest.raises(ValueError, match="duplicate GPU type 'aws'"):
        TypedCloudConfig((NodePool("aws", 4), NodePool("aws", 8)))
    with pytest.raises(ValueError, match="duplicate GPU type 'aws'"):
        typed_fleet((NodePool("aws", 4), 0, 0), (NodePool("aws", 8), 0, 0))
    with pytest.raises(ValueError, match="pools"):
        TypedCloudConfig(())
    with pytest.raises(ValueError, match="ready"):
        Fleet(ready=3, pending=0, min_nodes=0, max_nodes=2, gpus_per_node=4,
              pools=(PoolNodes(CHEAP, 1, 0),))
    fleet = CloudFleet(TypedCloudConfig((CHEAP, DEAR)), Scripted([{"tpu": 1}]))
    with pytest.raises(ValueError, match=r"unknown GPU type.*'tpu'"):
        fleet.after_round([], np.zeros(4, dtype=np.int64), 0.0)


# ------------------------------------------------------------------------------ the simulated cloud


@dataclass
class Scripted:
    """A rule that answers the per-type targets it was given, one per call."""

    script: list[dict[str, int]]
    name: str = "scripted"

    def decide(self, jobs, fleet, state: AutoscaleState | None, now: float):
        targets = self.script.pop(0)
        return ScaleDecision(sum(targets.values()), "scripted", targets=targets), {}


def test_the_typed_fleet_bills_every_node_at_its_pools_price():
    a = NodePool("a", 2, min_nodes=0, max_nodes=2, price_per_node_hour=2.0, initial_nodes=1)
    b = NodePool("b", 4, min_nodes=0, max_nodes=1, price_per_node_hour=10.0)
    fleet = CloudFleet(TypedCloudConfig((a, b), provision_delay_s=60.0),
                       Scripted([{"a": 2, "b": 1}, {"a": 1, "b": 1}]))
    assert fleet.full.types == ("a", "a", "b") and fleet.full.nodes == ("a-0", "a-1", "b-0")
    assert fleet.offered(0.0).nodes == ("a-0",)
    none = np.zeros(3, dtype=np.int64)
    fleet.after_round([], none, 0.0)                    # a-1 and b-0 asked for, here at 60 s
    assert fleet.report.held_by_type[-1] == {"a": 2, "b": 1}
    offered = fleet.offered(60.0)
    assert offered.nodes == ("a-0", "a-1", "b-0") and offered.types == ("a", "a", "b")
    fleet.after_round([], np.array([1, 0, 0]), 60.0)    # shrink a: the idle a-1 goes at once
    assert fleet.status == [CloudFleet.READY, CloudFleet.ABSENT, CloudFleet.READY]
    fleet.finish(120.0)
    rep = fleet.report
    assert rep.type_node_seconds == pytest.approx({"a": 60 * 2 + 60 * 1, "b": 120.0})
    assert rep.node_seconds == pytest.approx(300.0)
    assert rep.type_cost == pytest.approx({"a": 180 / 3600 * 2.0, "b": 120 / 3600 * 10.0})
    assert rep.cost == pytest.approx(180 / 3600 * 2.0 + 120 / 3600 * 10.0)
    assert rep.target_by_type == [{"a": 2, "b": 1}, {"a": 1, "b": 1}]


@pytest.mark.parametrize("name", autoscaler_names())
def test_every_registered_autoscaler_keeps_the_contract_on_a_typed_fleet(name):
    """Targets per type within each pool's bounds, summing to ``target``, a JSON-able state, the same
    answer for the same input."""
    rule = make_autoscaler(name, **({"nodes": 3} if name == "fixed" else {}))
    lo = NodePool("cheap", 4, min_nodes=1, max_nodes=3, price_per_node_hour=1.0)
    views = [job("a"), job("b", QUIET), JobView(id="w", submit_time=0.0),
             JobView(id="r", submit_time=0.0, fixed=(2, 64))]
    state = None
    for now, (jobs, held) in enumerate([([], (0, 0, 0, 0)), (views, (1, 0, 0, 0)),
                                        (views[:2], (2, 1, 1, 0)), (views[2:], (3, 0, 2, 0)),
                                        ([], (3, 0, 2, 0))]):
        fleet = typed_fleet((lo, held[0], held[1]), (DEAR, held[2], held[3]))
        decision, new_state = rule.decide(jobs, fleet, state, float(now) * 1000.0)
        assert decision.targets is not None and sum(decision.targets.values()) == decision.target
        assert 1 <= decision.targets["cheap"] <= 3 and 0 <= decision.targets["dear"] <= 2
        json.dumps(new_state)
        assert rule.decide(jobs, fleet, state, float(now) * 1000.0) == (decision, new_state)
        state = new_state


SIA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sia-sosp23"


@pytest.mark.skipif(not (SIA / "traces").is_dir(), reason=f"sia data not found at {SIA}")
def test_a_small_typed_cloud_simulation_grows_shrinks_and_completes():
    from pollux.policy.registry import make_policy
    from pollux.sim.engine import SimConfig, sia_slowdown, simulate
    from pollux.sim.typed_profiles import load_typed_profiles
    from pollux.sim.workload import WorkloadJob

    typed = load_typed_profiles(SIA / "traces", ("aws", "dgx-ext"), apps=["cifar10"])
    jobs = [WorkloadJob(f"cifar10-{i}", 600.0 * i, "cifar10", 1, 128) for i in range(3)]   # ~40 min
    pools = (NodePool("aws", 4, max_nodes=2, price_per_node_hour=3.912),
             NodePool("dgx-ext", 8, max_nodes=1, price_per_node_hour=32.77))
    fleet = CloudFleet(TypedCloudConfig(pools, provision_delay_s=120.0), make_autoscaler("goodput"))
    config = SimConfig(seed=0, slowdown=sia_slowdown(["cifar10"]), bootstrap_s=60.0)
    result = simulate(jobs, {}, make_policy("sia"), config, "typed-toy", typed_profiles=typed, fleet=fleet)
    assert all(j.completion is not None for j in result.jobs)
    rep = fleet.report
    totals = [sum(h.values()) for h in rep.held_by_type]
    assert rep.held == totals
    steps = np.diff(totals)
    assert steps.max() > 0 and steps.min() < 0                       # it grew and it shrank
    assert max(h["dgx-ext"] for h in rep.held_by_type) >= 1           # both types were used
    assert set(rep.type_node_seconds) == {"aws", "dgx-ext"}
    assert rep.node_seconds == pytest.approx(sum(rep.type_node_seconds.values()))
    assert rep.cost == pytest.approx(sum(rep.type_cost.values())) and rep.cost > 0
    assert any(j.type_gpu_hours for j in result.jobs)
