"""Tests of the throughput model and its fit (SPEC §3): pollux.goodput.throughput, throughput_fit."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import approx_fprime

import reference_throughput
from pollux.goodput import (
    ThroughputFit,
    ThroughputParams,
    exploration_priors,
    fit_throughput,
    t_grad,
    t_iter,
    t_sync,
    throughput,
)
from pollux.goodput.throughput_fit import INITIAL_PARAMS, PARAM_CEIL, PARAM_FLOOR, fit_objective

NAMES = ("alpha_grad", "beta_grad", "alpha_local", "beta_local", "alpha_node", "beta_node", "gamma")

# A hand-friendly parameter set used by the arithmetic tests below.
P1 = ThroughputParams(
    alpha_grad=0.1, beta_grad=0.01,      # T_grad(m) = 0.1 + 0.01·m
    alpha_local=0.2, beta_local=0.05,    # one node:  0.2 + 0.05·(K−2)
    alpha_node=0.5, beta_node=0.1,       # many nodes: 0.5 + 0.1·(K−2)
    gamma=1.0,
)


def with_gamma(p: ThroughputParams, gamma: float) -> ThroughputParams:
    d = p.to_dict()
    d["gamma"] = gamma
    return ThroughputParams(**d)



def true_optim_time(p: ThroughputParams, n: int, k: int, m: float) -> float:
    """Independent plain-Python optimiser-step time (s = 0) from the SPEC formulas."""
    return reference_throughput.t_iter(p, n, k, m)


def true_t_iter(p: ThroughputParams, n: int, k: int, m: float, s: int) -> float:
    return s * (p.alpha_grad + p.beta_grad * m) + true_optim_time(p, n, k, m)


# --------------------------------------------------------------------------------------------
# 1. Hand-computed values
# --------------------------------------------------------------------------------------------


def test_t_grad_hand_values():
    # 0.1 + 0.01·10 = 0.2 ; 0.1 + 0.01·50 = 0.6
    assert float(t_grad(P1, 10)) == pytest.approx(0.2, rel=1e-12)
    assert float(t_grad(P1, 50)) == pytest.approx(0.6, rel=1e-12)


def test_t_sync_single_replica_is_zero():
    # K = 1 → no all-reduce at all, whatever the sync parameters are.
    assert float(t_sync(P1, 1, 1)) == 0.0
    assert float(t_iter(P1, 1, 1, 10, 0)) == pytest.approx(0.2, rel=1e-12)   # just T_grad
    # γ = 1, s = 3: 3·0.2 + 0.2 + 0 = 0.8
    assert float(t_iter(P1, 1, 1, 10, 3)) == pytest.approx(0.8, rel=1e-12)


def test_t_sync_one_node_uses_local_params():
    # N = 1, K = 2: α_local + β_local·0 = 0.2
    assert float(t_sync(P1, 1, 2)) == pytest.approx(0.2, rel=1e-12)
    # N = 1, K = 4: 0.2 + 0.05·2 = 0.3
    assert float(t_sync(P1, 1, 4)) == pytest.approx(0.3, rel=1e-12)
    # N = 1, K = 6: 0.2 + 0.05·4 = 0.4
    assert float(t_sync(P1, 1, 6)) == pytest.approx(0.4, rel=1e-12)
    # The node parameters play no part on a single node.
    other = ThroughputParams(0.1, 0.01, 0.2, 0.05, 99.0, 99.0, 1.0)
    assert float(t_sync(other, 1, 6)) == pytest.approx(0.4, rel=1e-12)


def test_t_sync_many_nodes_uses_node_params():
    # N = 2, K = 2: α_node = 0.5
    assert float(t_sync(P1, 2, 2)) == pytest.approx(0.5, rel=1e-12)
    # N = 2, K = 4: 0.5 + 0.1·2 = 0.7
    assert float(t_sync(P1, 2, 4)) == pytest.approx(0.7, rel=1e-12)
    # N = 4, K = 16: 0.5 + 0.1·14 = 1.9
    assert float(t_sync(P1, 4, 16)) == pytest.approx(1.9, rel=1e-12)
    # The local parameters play no part across nodes.
    other = ThroughputParams(0.1, 0.01, 99.0, 99.0, 0.5, 0.1, 1.0)
    assert float(t_sync(other, 4, 16)) == pytest.approx(1.9, rel=1e-12)


def test_t_iter_gamma_one_is_sum():
    # γ = 1, m = 10 (Tg = 0.2), N = 2, K = 4 (Ts = 0.7), s = 3: 3·0.2 + 0.2 + 0.7 = 1.5
    assert float(t_iter(P1, 2, 4, 10, 3)) == pytest.approx(1.5, rel=1e-12)
    # s = 0: 0.2 + 0.7 = 0.9 ; throughput = K·m·(s+1)/T = 4·10·1/0.9
    assert float(t_iter(P1, 2, 4, 10, 0)) == pytest.approx(0.9, rel=1e-12)
    assert float(throughput(P1, 2, 4, 10, 0)) == pytest.approx(40 / 0.9, rel=1e-12)


def test_t_iter_gamma_two_hand_value():
    p = with_gamma(P1, 2.0)
    # m = 20 → Tg = 0.3 ; N = 1, K = 6 → Ts = 0.4 ; sqrt(0.09 + 0.16) = 0.5
    # s = 2: 2·0.3 + 0.5 = 1.1 ; throughput = 6·20·3 / 1.1 = 327.27…
    assert float(t_iter(p, 1, 6, 20, 0)) == pytest.approx(0.5, rel=1e-12)
    assert float(t_iter(p, 1, 6, 20, 2)) == pytest.approx(1.1, rel=1e-12)
    assert float(throughput(p, 1, 6, 20, 2)) == pytest.approx(360 / 1.1, rel=1e-12)


def test_t_iter_large_gamma_approaches_max():
    p = with_gamma(P1, 10.0)
    # m = 10 → Tg = 0.2 ; N = 2, K = 4 → Ts = 0.7 ; (0.2^10 + 0.7^10)^(1/10) ≈ 0.7·(1 + 3.6e-6)
    tg, ts = 0.2, 0.7
    got = float(t_iter(p, 2, 4, 10, 2))
    assert got == pytest.approx(2 * tg + max(tg, ts), rel=1e-5)
    assert got >= 2 * tg + max(tg, ts)
    # m = 90 → Tg = 1.0 ; N = 1, K = 2 → Ts = 0.2: compute dominates
    got = float(t_iter(p, 1, 2, 90, 1))
    assert got == pytest.approx(1.0 + 1.0, rel=1e-6)
    # γ = 1 gives the plain sum instead, which is much larger here.
    assert float(t_iter(P1, 2, 4, 10, 2)) == pytest.approx(2 * 0.2 + 0.2 + 0.7, rel=1e-12)


def test_params_accepted_as_array():
    arr = np.array(P1.as_array())
    assert float(t_iter(arr, 2, 4, 10, 3)) == pytest.approx(1.5, rel=1e-12)
    assert float(throughput(list(P1.as_array()), 1, 1, 10)) == pytest.approx(10 / 0.2, rel=1e-12)


def test_vectorised_broadcasting():
    p = with_gamma(P1, 1.7)
    nodes = np.array([[1], [2], [3]])                 # (3, 1)
    replicas = np.array([[1, 2, 4, 8, 12]])           # (1, 5)
    m = np.array([4.0, 16.0, 32.0, 64.0, 100.0])      # (5,)
    s = np.array([[0], [1], [3]])                     # (3, 1)
    ti = t_iter(p, nodes, replicas, m, s)
    tp = throughput(p, nodes, replicas, m, s)
    ts = t_sync(p, nodes, replicas)
    tg = t_grad(p, m)
    assert ti.shape == (3, 5)
    assert tp.shape == (3, 5)
    assert ts.shape == (3, 5)
    assert tg.shape == (5,)
    for i in range(3):
        for j in range(5):
            n, k, mm, ss = int(nodes[i, 0]), int(replicas[0, j]), float(m[j]), int(s[i, 0])
            if n > k:
                continue  # not a real allocation; the formula still evaluates but is not checked
            want = true_t_iter(p, n, k, mm, ss)
            assert ti[i, j] == pytest.approx(want, rel=1e-12)
            assert tp[i, j] == pytest.approx(k * mm * (ss + 1) / want, rel=1e-12)
            assert float(t_iter(p, n, k, mm, ss)) == pytest.approx(ti[i, j], rel=1e-14)


# --------------------------------------------------------------------------------------------
# 2. Properties of T_iter
# --------------------------------------------------------------------------------------------

log_param = st.floats(min_value=-6.0, max_value=2.0)


@st.composite
def params_strategy(draw):
    vals = [10.0 ** draw(log_param) for _ in range(6)]
    gamma = draw(st.floats(min_value=1.0, max_value=10.0))
    return ThroughputParams(*vals, gamma)


@st.composite
def allocation(draw):
    k = draw(st.integers(min_value=1, max_value=64))
    n = draw(st.integers(min_value=1, max_value=min(k, 16)))
    m = draw(st.floats(min_value=1.0, max_value=4096.0))
    return n, k, m


@settings(max_examples=150, deadline=None)
@given(p=params_strategy(), a=allocation(),
       s1=st.integers(min_value=0, max_value=50), ds=st.integers(min_value=1, max_value=50))
def test_t_iter_strictly_increasing_in_accum_steps(p, a, s1, ds):
    n, k, m = a
    lo = float(t_iter(p, n, k, m, s1))
    hi = float(t_iter(p, n, k, m, s1 + ds))
    assert hi > lo
    # and the increment is exactly ds passes
    assert hi - lo == pytest.approx(ds * float(t_grad(p, m)), rel=1e-6)


@settings(max_examples=150, deadline=None)
@given(p=params_strategy(), a=allocation(), s=st.integers(min_value=0, max_value=50))
def test_t_iter_between_max_and_sum(p, a, s):
    n, k, m = a
    tg = float(t_grad(p, m))
    ts = float(t_sync(p, n, k))
    ti = float(t_iter(p, n, k, m, s))
    assert ti >= s * tg + max(tg, ts)
    assert ti <= (s * tg + tg + ts) * (1 + 1e-12)
    assert ti == pytest.approx(true_t_iter(p, n, k, m, s), rel=1e-9)
    assert float(throughput(p, n, k, m, s)) == pytest.approx(k * m * (s + 1) / ti, rel=1e-12)


# --------------------------------------------------------------------------------------------
# 3. The fit recovers the model
# --------------------------------------------------------------------------------------------

HOLDOUT_PAIRS = [(1, 3), (2, 5), (3, 7), (4, 10), (4, 13)]
TRAIN_PAIRS = [(n, k) for n in range(1, 5) for k in range(n, 4 * n + 1)
               if (n, k) not in HOLDOUT_PAIRS] + [(8, 32), (16, 64)]
TRAIN_M = [8, 32, 128]
TEST_CONFIGS = [(n, k, m, s)
                for (n, k) in [*HOLDOUT_PAIRS, (6, 24), (8, 20), (12, 48)]
                for m in (16, 64, 96)
                for s in (0, 1, 3)]


def synth_records(p: ThroughputParams, rng: np.random.Generator, pairs, ms, noise: float = 0.03):
    rows = []
    for n, k in pairs:
        for m in ms:
            tg = p.alpha_grad + p.beta_grad * m
            rows.append((n, k, m, true_optim_time(p, n, k, m) * rng.normal(1.0, noise),
                         tg * rng.normal(1.0, noise)))
    return tuple(np.array(c, dtype=float) for c in zip(*rows, strict=True))


@pytest.mark.parametrize(("seed", "true"), [
    (0, ThroughputParams(0.05, 0.002, 0.1, 0.005, 0.3, 0.01, 1.5)),
    (1, ThroughputParams(0.2, 0.0005, 0.02, 0.002, 0.15, 0.004, 2.5)),
    (2, ThroughputParams(0.01, 0.001, 0.05, 0.001, 0.08, 0.02, 1.0)),
])
def test_fit_recovers_model_on_held_out_configurations(seed, true):
    rng = np.random.default_rng(seed)
    n, k, m, optim, accum = synth_records(true, rng, TRAIN_PAIRS, TRAIN_M)
    fit = fit_throughput(n, k, m, optim, accum)
    assert fit.ok, fit.message
    assert fit.records == len(TRAIN_PAIRS) * len(TRAIN_M)
    assert fit.pinned == ()   # every dimension observed: nothing pinned
    tn, tk, tm, ts = (np.array(c, dtype=float) for c in zip(*TEST_CONFIGS, strict=True))
    # held-out configurations are really new
    train_keys = {(a, b, c) for a, b, c in zip(n, k, m, strict=True)}
    assert not any((a, b, c) in train_keys for a, b, c in zip(tn, tk, tm, strict=True))
    pred = t_iter(fit.params, tn, tk, tm, ts)
    want = np.array([true_t_iter(true, *c) for c in TEST_CONFIGS])
    rel = np.abs(pred - want) / want
    assert rel.mean() <= 0.05, rel.mean()
    assert rel.max() <= 0.12, rel.max()
    # in sample, too, the optimiser-step time fits to within the noise
    in_sample = np.abs(t_iter(fit.params, n, k, m) - optim) / optim
    assert in_sample.mean() <= 0.05


def test_fit_noise_free_single_node_data_is_accurate():
    # Exact data on one node (1..4 replicas, 4 local batches): in-sample error tiny.
    true = ThroughputParams(0.08, 0.004, 0.12, 0.01, 0.4, 0.02, 1.3)
    pairs = [(1, 1), (1, 2), (1, 3), (1, 4)]
    ms = [4, 16, 64, 256]
    n, k, m, optim, accum = synth_records(true, np.random.default_rng(0), pairs, ms, noise=0.0)
    fit = fit_throughput(n, k, m, optim, accum)
    assert fit.ok
    rel = np.abs(t_iter(fit.params, n, k, m) - optim) / optim
    assert rel.max() < 0.02
    assert float(t_grad(fit.params, 64)) == pytest.approx(0.08 + 0.004 * 64, rel=0.01)


def test_objective_gradient_matches_finite_differences():
    """The analytic gradient L-BFGS-B is fed agrees with central finite differences."""
    from pollux.goodput.throughput_fit import _Objective

    rng = np.random.default_rng(7)
    true = ThroughputParams(0.05, 0.002, 0.1, 0.005, 0.3, 0.01, 1.5)
    n, k, m, optim, accum = synth_records(true, rng, TRAIN_PAIRS, TRAIN_M, noise=0.05)
    accum[::3] = np.nan   # accumulation time observed for only part of the records
    free = np.arange(7)
    z = np.array([np.log(v) for v in true.as_array()[:6]] + [1.5])
    obj = _Objective(n, k, m, optim, accum, free, z.copy())
    for trial in range(3):
        x = z + rng.normal(0.0, 0.3, size=7)
        x[6] = 1.0 + abs(x[6] - 1.0) + 0.2 * trial
        _, grad = obj(x)
        num = approx_fprime(x, lambda v: obj(v)[0], 1e-7)
        assert np.allclose(grad, num, rtol=1e-3, atol=1e-5), (grad, num)


# A job's first records: the fit must not stall at the kink of |log error| or sink to the floor
# (tests/test_fit_subsets.py checks the same on subsets of the measured profiles).


@pytest.mark.parametrize(("optim", "accum"), [(0.06, 0.045), (0.05823, 0.04393)])
def test_single_record_fit_does_not_stall_at_the_kink(optim, accum):
    # One record, 4 replicas on one node: both series fit exactly (T_grad = accum, sync = the rest);
    # what remains is the regulariser of the pinned node pair, β/α = 1 at the floor: 1e-2.
    # A single descent from the SPEC start stopped at 0.33 and 0.65 here.
    fit = fit_throughput([1], [4], [32], [optim], [accum])
    assert fit.ok
    assert fit.loss == pytest.approx(1e-2, abs=1e-4)
    assert float(t_grad(fit.params, 32)) == pytest.approx(accum, rel=1e-3)
    assert float(t_iter(fit.params, 1, 4, 32)) == pytest.approx(optim, rel=1e-3)


def test_pinned_alpha_grad_leaves_the_other_half_of_the_pass_to_beta_grad():
    # One local batch: prior 4 pins α_grad at half the accumulation time (0.375 s), so β_grad·m must
    # carry the other half. A single descent from β_grad = 0.01 (a 10 s pass) overshot to 4e-7,
    # where the log-space gradient vanishes, and predicted half the measured pass.
    fit = fit_throughput([2], [8], [1024], [0.86], [0.75])
    assert fit.ok
    assert "alpha_grad" in fit.pinned
    assert fit.params.alpha_grad == pytest.approx(0.375, rel=1e-9)
    assert fit.params.beta_grad * 1024 == pytest.approx(0.375, rel=1e-3)
    assert float(t_iter(fit.params, 2, 8, 1024)) == pytest.approx(0.86, rel=1e-3)


def test_previous_at_the_floor_does_not_trap_the_fit():
    # A previous fit with every α and β at the floor (where log-space gradients vanish) is one of
    # the starts; the records show a pass that grows with m and a real single-node sync.
    floor = ThroughputParams(*([PARAM_FLOOR] * 6), 1.0)
    n, k, m, optim, accum = synth_records(PRIOR_TRUE, np.random.default_rng(2),
                                          [(1, 1), (1, 2), (1, 4)], [16, 64])
    fit = fit_throughput(n, k, m, optim, accum, previous=floor)
    assert fit.ok
    assert fit.params.beta_grad == pytest.approx(PRIOR_TRUE.beta_grad, rel=0.2)
    assert fit.params.alpha_local == pytest.approx(PRIOR_TRUE.alpha_local, rel=0.3)


def test_fit_objective_is_the_reported_loss():
    rng = np.random.default_rng(4)
    n, k, m, optim, accum = synth_records(PRIOR_TRUE, rng, [(1, 1), (1, 2), (2, 4)], [8, 32])
    accum[1] = np.nan
    fit = fit_throughput(n, k, m, optim, accum)
    assert fit.ok and fit.pinned == ()
    assert fit_objective(fit.params, n, k, m, optim, accum) == pytest.approx(fit.loss, rel=1e-9)
    # the loss of other parameters is larger, and duplicates are averaged as the fit averages them
    assert fit_objective(PRIOR_TRUE, n, k, m, optim, accum) >= fit.loss
    twice = [np.concatenate([a, a]) for a in (n, k, m, optim, accum)]
    assert fit_objective(fit.params, *twice) == pytest.approx(fit.loss, rel=1e-9)


# --------------------------------------------------------------------------------------------
# 4. Fit never leaves the bounds
# --------------------------------------------------------------------------------------------


@st.composite
def record_sets(draw):
    count = draw(st.integers(min_value=1, max_value=8))
    rows = []
    for _ in range(count):
        k = draw(st.integers(min_value=1, max_value=64))
        n = draw(st.integers(min_value=1, max_value=min(k, 16)))
        m = draw(st.sampled_from([1, 2, 7, 32, 128, 1000, 10000]))
        optim = 10.0 ** draw(st.floats(min_value=-9.0, max_value=7.0))
        accum = draw(st.one_of(st.just(math.nan),
                               st.floats(min_value=-9.0, max_value=7.0).map(lambda e: 10.0**e)))
        rows.append((n, k, m, optim, accum))
    return tuple(np.array(c, dtype=float) for c in zip(*rows, strict=True))


def assert_in_bounds(params: ThroughputParams):
    vals = params.as_array()
    for name, v in zip(NAMES[:6], vals[:6], strict=True):
        assert PARAM_FLOOR <= v <= PARAM_CEIL, (name, v)
    assert 1.0 <= vals[6] <= 10.0
    assert all(math.isfinite(v) for v in vals)


@settings(max_examples=60, deadline=None)
@given(rec=record_sets())
def test_fit_params_stay_within_bounds(rec):
    n, k, m, optim, accum = rec
    fit = fit_throughput(n, k, m, optim, accum)
    assert isinstance(fit, ThroughputFit)
    assert_in_bounds(fit.params)
    assert fit.records == len({(a, b, c) for a, b, c in zip(n, k, m, strict=True)})
    assert set(fit.pinned) <= set(NAMES)
    if fit.ok:
        assert math.isfinite(fit.loss)
        assert set(fit.pinned) == set(exploration_priors(n, k, m))
        for name in ("alpha_local", "beta_local"):
            if name in fit.pinned:
                assert getattr(fit.params, name) == pytest.approx(PARAM_FLOOR, rel=1e-9)
    else:
        assert fit.params == INITIAL_PARAMS
        assert fit.message


def test_fit_extreme_single_records_in_bounds():
    for t in (1e-12, 1e-9, 1.0, 1e6, 1e9):
        for n, k in ((1, 1), (1, 4), (3, 12)):
            fit = fit_throughput([n], [k], [64], [t], [t])
            assert_in_bounds(fit.params)
    # huge local batch and huge time together
    fit = fit_throughput([2, 2], [8, 8], [1, 1e6], [1e-6, 1e8])
    assert_in_bounds(fit.params)


# --------------------------------------------------------------------------------------------
# 5. Exploration priors
# --------------------------------------------------------------------------------------------

PRIOR_TRUE = ThroughputParams(0.05, 0.002, 0.1, 0.005, 0.3, 0.01, 1.5)


def fit_pairs(pairs, ms, *, seed=0, noise=0.02, true=PRIOR_TRUE):
    n, k, m, optim, accum = synth_records(true, np.random.default_rng(seed), pairs, ms, noise)
    return fit_throughput(n, k, m, optim, accum)


def test_exploration_priors_function():
    assert exploration_priors([1], [1], [32]) == [
        "alpha_node", "beta_node", "alpha_local", "beta_local", "alpha_grad"]
    assert set(exploration_priors([1, 2], [4, 8], [16, 32])) == set()
    assert set(exploration_priors([1, 1], [2, 2], [16, 32])) == {
        "alpha_node", "beta_node", "beta_local"}
    assert set(exploration_priors([2, 1], [2, 1], [16, 32])) == {
        "alpha_local", "beta_local", "beta_node"}
    assert set(exploration_priors([2, 1], [4, 2], [16, 16])) == {"alpha_grad"}


def test_prior1_no_multinode_pins_node_then_prior5_lifts_it():
    fit = fit_pairs([(1, 1), (1, 2), (1, 3), (1, 4)], [8, 32, 128])
    assert fit.ok
    assert "alpha_node" in fit.pinned and "beta_node" in fit.pinned
    assert "alpha_local" not in fit.pinned and "beta_local" not in fit.pinned
    p = fit.params
    assert p.alpha_local > 1e-3          # single-node sync was really measured
    # prior 5: multi-node assumed no cheaper than single-node
    assert p.alpha_node >= 1.1 * p.alpha_local * (1 - 1e-12)
    assert p.beta_node >= 1.1 * p.beta_local * (1 - 1e-12)
    # the pinned value was the floor, so it is exactly 1.1·α_local now
    assert p.alpha_node == pytest.approx(1.1 * p.alpha_local, rel=1e-9)
    assert p.beta_node == pytest.approx(max(PARAM_FLOOR, 1.1 * p.beta_local), rel=1e-9)
    # and predictions across nodes are never cheaper than on one node
    for kk in (2, 3, 4, 8):
        assert float(t_sync(p, 2, kk)) >= float(t_sync(p, 1, kk))


def test_prior2_no_single_node_multi_replica_pins_local_at_floor():
    fit = fit_pairs([(1, 1), (2, 2), (2, 4), (3, 6), (4, 8)], [8, 32, 128])
    assert fit.ok
    assert {"alpha_local", "beta_local"} <= set(fit.pinned)
    assert "alpha_node" not in fit.pinned
    assert fit.params.alpha_local == pytest.approx(PARAM_FLOOR, rel=1e-9)
    assert fit.params.beta_local == pytest.approx(PARAM_FLOOR, rel=1e-9)
    assert fit.params.alpha_node > 1e-3
    # a single-node multi-replica allocation therefore predicts ~no sync cost
    assert float(t_sync(fit.params, 1, 4)) < 1e-7


def test_prior3_no_more_than_two_replicas_pins_betas():
    fit = fit_pairs([(1, 1), (1, 2), (2, 2)], [8, 32, 128])
    assert fit.ok
    assert {"beta_node", "beta_local"} <= set(fit.pinned)
    assert "alpha_local" not in fit.pinned and "alpha_node" not in fit.pinned
    assert fit.params.beta_local == pytest.approx(PARAM_FLOOR, rel=1e-9)
    assert fit.params.beta_node == pytest.approx(PARAM_FLOOR, rel=1e-9)
    assert fit.params.alpha_local > 1e-3 and fit.params.alpha_node > 1e-3
    # sync time then does not grow with the replica count
    assert float(t_sync(fit.params, 4, 64)) == pytest.approx(float(t_sync(fit.params, 2, 2)),
                                                           rel=1e-5)


def test_prior3_not_applied_with_three_replicas():
    fit = fit_pairs([(1, 1), (1, 2), (1, 3), (2, 2)], [8, 32])
    assert "beta_local" not in fit.pinned
    assert "beta_node" not in fit.pinned


def test_prior4_single_local_batch_fixes_alpha_grad_at_half_mean_accum():
    pairs = [(1, 1), (1, 2), (1, 4), (2, 4), (4, 8)]
    n, k, m, optim, accum = synth_records(PRIOR_TRUE, np.random.default_rng(3), pairs, [32])
    fit = fit_throughput(n, k, m, optim, accum)
    assert fit.ok
    assert fit.pinned == ("alpha_grad",)
    assert fit.params.alpha_grad == pytest.approx(float(np.mean(accum)) / 2.0, rel=1e-9)
    # β_grad remains free: T_grad(32) still matches the accumulation times
    assert float(t_grad(fit.params, 32)) == pytest.approx(float(np.mean(accum)), rel=0.05)


def test_prior4_not_applied_with_two_local_batches():
    fit = fit_pairs([(1, 1), (1, 2), (1, 4)], [16, 32])
    assert "alpha_grad" not in fit.pinned


def test_prior5_not_applied_when_multinode_records_exist():
    # Here multi-node sync really is cheaper than single-node sync; the fit must say so.
    true = ThroughputParams(0.05, 0.002, 0.4, 0.02, 0.1, 0.005, 1.2)
    pairs = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (2, 8), (4, 8), (4, 16)]
    fit = fit_pairs(pairs, [8, 32, 128], noise=0.0, true=true)
    assert fit.ok
    assert fit.pinned == ()
    assert fit.params.alpha_node < fit.params.alpha_local
    assert fit.params.alpha_node == pytest.approx(0.1, rel=0.2)
    assert fit.params.alpha_local == pytest.approx(0.4, rel=0.2)


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_single_gpu_job_predicts_linear_speedup(noise):
    fit = fit_pairs([(1, 1)], [16, 32, 64, 128], noise=noise, seed=11)
    assert fit.ok
    assert {"alpha_node", "beta_node", "alpha_local", "beta_local"} <= set(fit.pinned)
    for m in (16, 48, 128):
        one = float(throughput(fit.params, 1, 1, m))
        for n, k in ((1, 2), (1, 4), (2, 2), (2, 8), (4, 16), (16, 64)):
            got = float(throughput(fit.params, n, k, m))
            assert got == pytest.approx(k * one, rel=1e-3), (n, k, m)


# --------------------------------------------------------------------------------------------
# 6. Failure handling, validation, aggregation
# --------------------------------------------------------------------------------------------

PREV = ThroughputParams(0.3, 0.03, 0.2, 0.02, 0.6, 0.06, 2.0)


def test_empty_records_keep_previous():
    fit = fit_throughput([], [], [], [], previous=PREV)
    assert fit.ok is False
    assert fit.params == PREV
    assert fit.message
    assert fit.records == 0
    fit = fit_throughput([], [], [], [])
    assert fit.ok is False
    assert fit.params == INITIAL_PARAMS


GOOD = {"nodes": [1, 1, 2], "replicas": [1, 2, 4], "local_bsz": [16, 32, 64],
        "optim_step_time": [0.1, 0.2, 0.4], "accum_step_time": [0.09, 0.15, 0.3]}


def call_fit(**over):
    kw = {**GOOD, **over}
    return fit_throughput(kw["nodes"], kw["replicas"], kw["local_bsz"], kw["optim_step_time"],
                          kw["accum_step_time"], previous=PREV)


def test_good_inputs_fit():
    fit = call_fit()
    assert fit.ok
    assert fit.records == 3


@pytest.mark.parametrize(("field", "bad"), [
    ("optim_step_time", [0.1, math.nan, 0.4]),
    ("optim_step_time", [0.1, -0.2, 0.4]),
    ("optim_step_time", [0.1, 0.0, 0.4]),
    ("optim_step_time", [0.1, math.inf, 0.4]),
    ("accum_step_time", [0.1, -0.2, 0.4]),
    ("accum_step_time", [0.1, math.inf, 0.4]),
    ("local_bsz", [16, math.nan, 64]),
    ("local_bsz", [16, -32, 64]),
    ("replicas", [1, 0, 4]),
    ("replicas", [1, math.nan, 4]),
    ("nodes", [1, 0, 2]),
    ("nodes", [1, -1, 2]),
    ("nodes", [1, 3, 2]),          # nodes > replicas
    ("local_bsz", [16, 32]),       # mismatched lengths
    ("accum_step_time", [0.1]),
    ("replicas", [1, 2, 4, 4]),
])
def test_invalid_inputs_raise_naming_field(field, bad):
    with pytest.raises(ValueError, match=field):
        call_fit(**{field: bad})


def test_nan_accum_means_not_observed():
    fit = call_fit(accum_step_time=[math.nan, 0.15, math.nan])
    assert fit.ok
    fit_none = fit_throughput(GOOD["nodes"], GOOD["replicas"], GOOD["local_bsz"],
                              GOOD["optim_step_time"], None)
    assert fit_none.ok


def _assert_same_params(a: ThroughputParams, b: ThroughputParams, rel=1e-6):
    for name in NAMES:
        va, vb = getattr(a, name), getattr(b, name)
        assert va == pytest.approx(vb, rel=rel, abs=1e-7), name


def test_duplicate_keys_are_averaged():
    rng = np.random.default_rng(5)
    n, k, m, optim, accum = synth_records(PRIOR_TRUE, rng, [(1, 1), (1, 2), (1, 4), (2, 4)],
                                          [16, 64])
    # Split each record into two noisy copies whose arithmetic mean is the original.
    delta = rng.uniform(-0.1, 0.1, size=optim.size)
    dup_optim = np.concatenate([optim * (1 + delta), optim * (1 - delta)])
    dup_accum = np.concatenate([accum * (1 - delta), accum * (1 + delta)])
    order = rng.permutation(2 * optim.size)
    dn, dk, dm = (np.concatenate([a, a])[order] for a in (n, k, m))
    dup = fit_throughput(dn, dk, dm, dup_optim[order], dup_accum[order])
    avg = fit_throughput(n, k, m, optim, accum)
    assert dup.ok and avg.ok
    assert dup.records == avg.records == optim.size
    assert dup.loss == pytest.approx(avg.loss, rel=1e-9)
    _assert_same_params(dup.params, avg.params)


def test_duplicate_with_missing_accum_uses_observed_one():
    n, k, m = [1, 1, 1, 2], [1, 2, 2, 4], [16, 32, 32, 64]
    optim = [0.1, 0.3, 0.3, 0.5]
    fit_dup = fit_throughput(n, k, m, optim, [0.09, 0.2, math.nan, 0.35])
    fit_one = fit_throughput([1, 1, 2], [1, 2, 4], [16, 32, 64], [0.1, 0.3, 0.5],
                             [0.09, 0.2, 0.35])
    assert fit_dup.records == 3
    _assert_same_params(fit_dup.params, fit_one.params)


# --------------------------------------------------------------------------------------------
# 7. The shared measured profiles (Pollux OSDI'21 artifact)
# --------------------------------------------------------------------------------------------

TRACES = Path(__file__).resolve().parents[2] / "shared/data/pollux-osdi21/traces"
APPS = ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]


def load_profile(app_dir: Path):
    nodes, replicas, bsz, optim, accum = [], [], [], [], []
    with open(app_dir / "placements.csv", newline="") as f:
        for row in csv.DictReader(f):
            digits = [int(c) for c in row["placement"].strip()]
            step, sync = float(row["step_time"]), float(row["sync_time"])
            nodes.append(sum(1 for d in digits if d > 0))
            replicas.append(sum(digits))
            bsz.append(float(row["local_bsz"]))
            optim.append(step)
            accum.append(step - sync)
    with open(app_dir / "scalability.csv", newline="") as f:
        for row in csv.DictReader(f):
            step, sync = float(row["step_time"]), float(row["sync_time"])
            nodes.append(int(row["num_nodes"]))
            replicas.append(int(row["num_replicas"]))
            bsz.append(float(row["local_bsz"]))
            optim.append(step)
            accum.append(step - sync)
    return tuple(np.array(c, dtype=float) for c in (nodes, replicas, bsz, optim, accum))


@pytest.mark.parametrize("app", APPS)
def test_fit_quality_on_shared_profiles(app):
    if not TRACES.is_dir():
        pytest.skip(f"shared profiles not found at {TRACES}")
    app_dir = TRACES / app
    assert app_dir.is_dir(), f"missing application folder {app_dir}"
    n, k, m, optim, accum = load_profile(app_dir)
    assert n.size > 100
    assert np.all(accum > 0)
    fit = fit_throughput(n, k, m, optim, accum)
    assert fit.ok, fit.message
    assert fit.pinned == ()
    pred = t_iter(fit.params, n, k, m, 0)      # optimiser-step time, s = 0
    err = float(np.mean(np.abs(pred - optim) / optim))
    limit = 0.15 if app == "ncf" else 0.10
    assert err <= limit, f"{app}: mean relative error {err:.3f} > {limit}"
