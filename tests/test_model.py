"""Tests of goodput optimisation and speedup tables (SPEC §4): pollux.goodput.model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.goodput import (
    BatchLimits,
    BatchPlan,
    GoodputModel,
    GradStats,
    ThroughputParams,
    exploration_cap,
    fair_share,
    optimize,
    should_switch,
    speedup_table,
)
from reference_throughput import t_iter

EPS = 1e-9

TP_A = ThroughputParams(0.05, 0.002, 0.1, 0.005, 0.3, 0.01, 1.5)
TP_B = ThroughputParams(0.2, 0.0005, 0.02, 0.002, 0.15, 0.004, 2.5)
TP_C = ThroughputParams(0.01, 0.001, 0.05, 0.001, 0.08, 0.02, 1.0)


# --------------------------------------------------------------------------------------------
# Independent reference: plain-Python SPEC §4 brute force
# --------------------------------------------------------------------------------------------


def ref_efficiency(model: GoodputModel, batch: float) -> float:
    g = model.grad_stats
    m0 = model.init_batch_size
    if g.sqr == 0.0:
        return 1.0
    phi = g.var * m0 / g.sqr
    return (phi + m0) / (phi + batch)


def ref_candidates(lim: BatchLimits, k: int) -> list[float]:
    low = max(lim.init_batch_size, lim.min_local_bsz * k)
    high = lim.max_batch_size
    return [low * (high / low) ** (i / 49) for i in range(50)]


def ref_choose_steps(lim: BatchLimits, k: int, total: float) -> tuple[int, int]:
    """(m, s): smallest s with ceil(M/(K(s+1))) <= max_local (s >= 1 on one replica above M0)."""
    if not lim.accumulation:
        return math.ceil(total / k - EPS), 0
    s = 1 if (k == 1 and total > lim.init_batch_size * (1 + EPS)) else 0
    while math.ceil(total / (k * (s + 1)) - EPS) > lim.max_local_bsz:
        s += 1
    return math.ceil(total / (k * (s + 1)) - EPS), s


def ref_optimize(model: GoodputModel, lim: BatchLimits, n: int, k: int):
    """(goodput, batch, m, s) by a plain per-candidate loop; (0, 0, 0, 0) if nothing is valid."""
    if k < 1 or n < 1 or n > k:
        return 0.0, 0, 0, 0
    if max(lim.init_batch_size, lim.min_local_bsz * k) > lim.max_batch_size:
        return 0.0, 0, 0, 0
    best = (0.0, 0, 0, 0)
    for total in ref_candidates(lim, k):
        m, s = ref_choose_steps(lim, k, total)
        if m < lim.min_local_bsz or m > lim.max_local_bsz:
            continue
        batch = k * m * (s + 1)
        good = batch / t_iter(model.throughput_params, n, k, m, s) * ref_efficiency(model,
                                                                                          batch)
        if good > best[0]:
            best = (good, batch, m, s)
    return best


def model_for(tp: ThroughputParams, m0: float, sqr: float = 1.0, var: float = 5.0) -> GoodputModel:
    return GoodputModel(tp, GradStats(sqr=sqr, var=var), m0)


# --------------------------------------------------------------------------------------------
# 1. BatchLimits
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"init_batch_size": 128, "max_batch_size": 64}, "max_batch_size"),
    ({"init_batch_size": 128, "max_batch_size": 1024, "min_local_bsz": 32, "max_local_bsz": 16},
     "max_local_bsz"),
    ({"init_batch_size": math.nan}, "init_batch_size"),
    ({"init_batch_size": 128, "max_batch_size": math.nan}, "max_batch_size"),
    ({"init_batch_size": 128, "min_local_bsz": math.nan}, "min_local_bsz"),
    ({"init_batch_size": 128, "max_local_bsz": math.nan}, "max_local_bsz"),
    ({"init_batch_size": 128, "max_batch_size": math.inf}, "max_batch_size"),
    ({"init_batch_size": 0}, "init_batch_size"),
    ({"init_batch_size": 128, "min_local_bsz": 0}, "min_local_bsz"),
    ({"init_batch_size": -5}, "init_batch_size"),
])
def test_batch_limits_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BatchLimits(**kwargs)


def test_batch_limits_defaults():
    lim = BatchLimits(128)
    assert lim.max_batch_size == 128.0            # fixed batch: M0 only
    assert lim.max_local_bsz == 128.0             # max_local defaults to max_batch_size
    assert lim.min_local_bsz == 1.0
    assert lim.accumulation is False
    assert lim.adaptive is False
    lim = BatchLimits(128, 4096, min_local_bsz=16)
    assert lim.max_local_bsz == 4096.0
    assert lim.adaptive is True
    lim = BatchLimits(128, 4096, 16, 256, True)
    assert (lim.max_local_bsz, lim.accumulation) == (256.0, True)


# --------------------------------------------------------------------------------------------
# 2. optimize against the brute force
# --------------------------------------------------------------------------------------------

CASES = [
    (model_for(TP_A, 128), BatchLimits(128, 4096, 16, 256, accumulation=True)),
    (model_for(TP_A, 128), BatchLimits(128, 4096, 16, 256, accumulation=False)),
    (model_for(TP_B, 64, sqr=0.5, var=40.0), BatchLimits(64, 8192, 8, 128, accumulation=True)),
    # fixed batch; sqr = 0 makes efficiency 1 whether or not the SPEC §2 rule is special-cased
    (model_for(TP_C, 100, sqr=0.0, var=0.5), BatchLimits(100, 100, 1, None)),
    (model_for(TP_C, 32, sqr=1.0, var=1e-3), BatchLimits(32, 2048, 32, 64, accumulation=True)),
    (model_for(TP_B, 256, sqr=1.0, var=1e3), BatchLimits(256, 1024, 64, 512)),
]
GRID = [(n, k) for n in range(1, 7) for k in range(0, 25)]


@pytest.mark.parametrize(("model", "lim"), CASES)
def test_optimize_matches_brute_force(model, lim):
    ns = np.array([n for n, _ in GRID])
    ks = np.array([k for _, k in GRID])
    plan = optimize(model, ns, ks, lim)
    assert isinstance(plan, BatchPlan)
    assert plan.goodput.shape == ns.shape
    some_valid = False
    for i, (n, k) in enumerate(GRID):
        good, batch, m, s = ref_optimize(model, lim, n, k)
        assert plan.goodput[i] == pytest.approx(good, rel=1e-9, abs=1e-12), (n, k)
        if good > 0:
            some_valid = True
            assert (plan.batch_size[i], plan.local_bsz[i], plan.accum_steps[i]) == (batch, m, s), (
                n, k)
            assert plan.efficiency[i] == pytest.approx(ref_efficiency(model, batch), rel=1e-9)
            assert plan.throughput[i] == pytest.approx(
                batch / t_iter(model.throughput_params, n, k, m, s), rel=1e-9)
            # the plan agrees with the model's own goodput at the chosen point
            assert plan.goodput[i] == pytest.approx(float(model.goodput(n, k, m, s)), rel=1e-9)
        else:
            assert plan.batch_size[i] == plan.local_bsz[i] == plan.accum_steps[i] == 0
    assert some_valid


def test_optimize_scalar_and_vectorised_shapes():
    model, lim = CASES[0]
    nodes = np.array([[1], [2], [4]])           # (3, 1)
    replicas = np.array([[1, 2, 4, 8, 16]])     # (1, 5)
    plan = optimize(model, nodes, replicas, lim)
    for arr in (plan.goodput, plan.batch_size, plan.local_bsz, plan.accum_steps,
                plan.efficiency, plan.throughput):
        assert arr.shape == (3, 5)
    for i in range(3):
        for j in range(5):
            one = optimize(model, int(nodes[i, 0]), int(replicas[0, j]), lim)
            assert np.shape(one.goodput) == ()
            assert float(one.goodput) == pytest.approx(plan.goodput[i, j], rel=1e-12)
            assert float(one.batch_size) == plan.batch_size[i, j]
    # the method form agrees with the function
    again = model.optimize(nodes, replicas, lim)
    assert np.array_equal(again.goodput, plan.goodput)


def test_measured_goodput_of_a_predicted_step_is_the_predicted_goodput():
    """Timed steps weigh by the same efficiency as the model: given the model's own step time for a
    configuration, measured goodput equals :meth:`GoodputModel.goodput` there; twice as slow, half."""
    model, _ = CASES[0]
    nodes, replicas, local, accum = 2, 8, 64, 1
    batch = replicas * local * (accum + 1)
    step = t_iter(model.throughput_params, nodes, replicas, local, accum)
    predicted = float(model.goodput(nodes, replicas, local, accum))
    assert float(model.measured_goodput(batch, step)) == pytest.approx(predicted, rel=1e-12)
    assert float(model.measured_goodput(batch, 2 * step)) == pytest.approx(predicted / 2, rel=1e-12)
    assert float(model.measured_goodput(batch, step)) == pytest.approx(
        batch / step * ref_efficiency(model, batch), rel=1e-12)


def test_single_replica_above_m0_uses_accumulation():
    model, lim = CASES[0]
    plan = optimize(model, 1, 1, lim)
    assert float(plan.goodput) > 0
    if float(plan.batch_size) > lim.init_batch_size:
        assert float(plan.accum_steps) >= 1


# --------------------------------------------------------------------------------------------
# 3. Properties (hypothesis)
# --------------------------------------------------------------------------------------------


@st.composite
def scenarios(draw):
    vals = [10.0 ** draw(st.floats(min_value=-4.0, max_value=0.0)) for _ in range(6)]
    tp = ThroughputParams(*vals, draw(st.floats(min_value=1.0, max_value=10.0)))
    m0 = draw(st.integers(min_value=1, max_value=512))
    adaptive = draw(st.booleans())
    mx = m0 * draw(st.integers(min_value=2, max_value=64)) if adaptive else m0
    lo = draw(st.integers(min_value=1, max_value=64))
    hi = lo + draw(st.integers(min_value=0, max_value=1024))
    acc = draw(st.booleans())
    lim = BatchLimits(m0, mx, lo, hi, acc)
    sqr = draw(st.floats(min_value=1e-3, max_value=10.0))
    var = draw(st.floats(min_value=0.0, max_value=1e3))
    model = GoodputModel(tp, GradStats(sqr, var), m0)
    return model, lim


@settings(max_examples=80, deadline=None)
@given(sc=scenarios())
def test_optimize_properties(sc):
    model, lim = sc
    ns, ks = np.meshgrid(np.arange(0, 6), np.arange(0, 33), indexing="ij")
    plan = optimize(model, ns, ks, lim)
    good = plan.goodput
    assert good.shape == ns.shape
    assert np.all(np.isfinite(good))
    assert np.all(good >= 0)
    ok = good > 0
    m0 = lim.init_batch_size
    for n, k in zip(ns.ravel(), ks.ravel(), strict=True):
        exists = ref_optimize(model, lim, int(n), int(k))[0] > 0
        assert bool(ok[n, k]) == exists, (n, k)
    assert np.all(plan.batch_size[ok] >= m0)
    assert np.all(plan.local_bsz[ok] >= lim.min_local_bsz)
    assert np.all(plan.local_bsz[ok] <= lim.max_local_bsz)
    assert np.all(plan.batch_size[ok] == ks[ok] * plan.local_bsz[ok] * (plan.accum_steps[ok] + 1))
    assert np.all(plan.efficiency[ok] <= 1.0 + 1e-12)
    assert np.all(plan.efficiency[ok] > 0.0)
    assert np.all(plan.accum_steps[ok] == np.round(plan.accum_steps[ok]))
    if not lim.accumulation:
        assert np.all(plan.accum_steps == 0)
    if not lim.adaptive:
        # a fixed batch: the only candidate is M0, rounded up to a multiple of K
        assert np.all(plan.batch_size[ok] < m0 + ks[ok] * (plan.accum_steps[ok] + 1))
        exact = ok & (plan.batch_size == m0)
        assert np.all(plan.efficiency[exact] == 1.0)
    # nothing allowed where the allocation itself is invalid
    assert np.all(good[ns > ks] == 0)
    assert np.all(good[ks == 0] == 0)
    assert np.all(good[ns == 0] == 0)


def test_non_adaptive_efficiency_is_one_for_any_replica_count():
    model = model_for(TP_A, 100, sqr=1.0, var=5.0)       # φ = 500
    lim = BatchLimits(100)                               # max_batch_size = M0: non-adaptive
    plan = optimize(model, 1, np.arange(1, 9), lim)
    assert np.all(plan.goodput > 0)
    assert np.all(plan.efficiency == 1.0), plan.efficiency


def test_non_adaptive_efficiency_is_one_when_replicas_divide_m0():
    model = model_for(TP_A, 96, sqr=1.0, var=5.0)
    lim = BatchLimits(96)
    ks = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96])
    plan = optimize(model, 1, ks, lim)
    assert np.all(plan.batch_size == 96)
    assert np.all(plan.efficiency == 1.0)
    assert np.all(plan.accum_steps == 0)


def test_fractional_max_local_bsz_still_finds_accumulation():
    model = model_for(TP_A, 201)
    assert float(optimize(model, 1, 2, BatchLimits(201, 201, 1, 100, True)).goodput) > 0
    plan = optimize(model, 1, 2, BatchLimits(201, 201, 1, 100.5, True))
    assert float(plan.goodput) > 0
    assert (float(plan.local_bsz), float(plan.accum_steps)) == (51.0, 1.0)


# --------------------------------------------------------------------------------------------
# 4. Invalid allocations
# --------------------------------------------------------------------------------------------


def test_invalid_pairs_have_zero_goodput():
    model, lim = CASES[0]
    plan = optimize(model, np.array([3, 1, 0, 5, 2]), np.array([2, 0, 4, 4, 2]), lim)
    assert plan.goodput.tolist() == [0.0, 0.0, 0.0, 0.0, plan.goodput[4]]
    assert plan.goodput[4] > 0
    for arr in (plan.batch_size, plan.local_bsz, plan.accum_steps, plan.efficiency,
                plan.throughput):
        assert np.all(arr[:4] == 0)


def test_too_many_replicas_for_the_batch_has_zero_goodput():
    model = model_for(TP_A, 128)
    lim = BatchLimits(128, 1024, min_local_bsz=32, max_local_bsz=256)
    plan = optimize(model, 1, np.array([32, 33, 64]), lim)      # 32·33 > 1024
    assert plan.goodput[0] > 0
    assert plan.goodput[1] == 0 and plan.goodput[2] == 0


# --------------------------------------------------------------------------------------------
# 5. Speedup tables, fair share, exploration cap, hysteresis
# --------------------------------------------------------------------------------------------


def test_speedup_table_structure_and_consistency():
    model, lim = CASES[0]
    fair = (1, 4)
    table = speedup_table(model, lim, max_nodes=4, max_replicas=16, fair=fair, replica_cap=12)
    assert table.shape == (5, 17)
    assert np.all(table[0, :] == 0)
    assert np.all(table[:, 0] == 0)
    assert table[fair] == pytest.approx(1.0, rel=1e-12)
    assert np.all(table[:, 13:] == 0)
    base = float(optimize(model, *fair, lim).goodput)
    for n in range(5):
        for r in range(17):
            if n > r:
                assert table[n, r] == 0
            elif 1 <= n and 1 <= r <= 12:
                want = float(optimize(model, n, r, lim).goodput) / base
                assert table[n, r] == pytest.approx(want, rel=1e-12)
                assert table[n, r] > 0
    # more replicas on one node help this job (near-linear speedup at small K)
    assert table[1, 8] > table[1, 4] > table[1, 2] > table[1, 1]


def test_speedup_table_without_cap_and_invalid_fair_share():
    model = model_for(TP_A, 128)
    lim = BatchLimits(128, 1024, min_local_bsz=32)
    # The fair share (1, 64) admits no valid batch (64·32 > 1024): one replica is the reference.
    table = speedup_table(model, lim, max_nodes=2, max_replicas=40, fair=(1, 64))
    assert np.all(np.isfinite(table))
    assert table[1, 1] == pytest.approx(1.0, rel=1e-12)
    assert np.all(table[:, 33:] == 0)     # more than 1024/32 replicas: no valid batch
    assert table[2, 32] > 0


@pytest.mark.parametrize(("jobs", "want"), [
    (1, (1, 64)), (2, (1, 32)), (10, (1, 7)), (64, (1, 1)), (65, (1, 1)), (100, (1, 1)),
    (3, (1, 22)),
])
def test_fair_share_16x4(jobs, want):
    assert fair_share(16, 4, jobs) == want


def test_fair_share_gpus_per_replica():
    # d = 4/64: 16/J replicas, ceil(16·1/16) = 1 node
    assert fair_share(16, 4, 1, gpus_per_replica=4) == (1, 16)
    assert fair_share(16, 4, 5, gpus_per_replica=4) == (1, 4)
    # d = 1/8 on 4 × 2: ceil(4/8) = 1 node
    assert fair_share(4, 2, 1) == (1, 8)
    # the node count is capped by the replica count
    assert fair_share(2, 1, 4, gpus_per_replica=1) == (1, 1)


def test_fair_share_exact_on_non_power_of_two_clusters():
    assert fair_share(7, 7, 1) == (1, 49)
    assert fair_share(7, 7, 7) == (1, 7)
    assert fair_share(49, 1, 1) == (1, 49)


@settings(max_examples=200, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), per_node=st.sampled_from([1, 2, 4, 8]),
       jobs=st.integers(1, 300))
def test_fair_share_power_of_two_clusters(nodes, per_node, jobs):
    n, r = fair_share(nodes, per_node, jobs)
    total = nodes * per_node
    assert r == max(-(-total // jobs), 1)        # ceil(total / J), exactly
    assert r <= total
    assert n == min(max(-(-nodes // total), 1), r) == 1


def test_exploration_cap():
    lim = BatchLimits(128, 4096, min_local_bsz=16)       # 4096 // 16 = 256
    assert exploration_cap(0, lim) == 1                  # never run: one replica
    assert exploration_cap(1, lim) == 2
    assert exploration_cap(3, lim) == 6                  # 2 × seen
    assert exploration_cap(100, lim) == 200
    assert exploration_cap(200, lim) == 256              # capped by max_batch // min_local
    assert exploration_cap(3, lim, max_replicas=4) == 4  # capped by max_replicas
    assert exploration_cap(0, lim, max_replicas=8) == 1
    small = BatchLimits(64, 256, min_local_bsz=32)       # 256 // 32 = 8
    assert exploration_cap(16, small) == 8
    assert exploration_cap(2, small) == 4
    fixed = BatchLimits(64, min_local_bsz=32)            # fixed batch: 64 // 32 = 2
    assert exploration_cap(5, fixed) == 2
    assert exploration_cap(3, lim, factor=4) == 12       # another multiple (the sia policy's)
    assert exploration_cap(0, lim, factor=4) == 1
    assert exploration_cap(100, lim, factor=4) == 256
    with pytest.raises(ValueError, match="factor"):
        exploration_cap(1, lim, factor=0)


def test_should_switch_hysteresis():
    assert should_switch(100.0, 106.0) is True
    assert should_switch(100.0, 105.5) is True
    assert should_switch(100.0, 105.0) is False          # exactly 5 %: not enough
    assert should_switch(100.0, 104.9) is False
    assert should_switch(100.0, 90.0) is False
    assert should_switch(2.0, 2.2) is True
    assert should_switch(2.0, 2.09) is False
    assert should_switch(0.0, 1e-9) is True              # anything beats nothing
    assert should_switch(0.0, 0.0) is False
    assert should_switch(100.0, 120.0, threshold=0.25) is False
    assert should_switch(100.0, 126.0, threshold=0.25) is True
