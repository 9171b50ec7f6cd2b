"""Tests for pollux.goodput.efficiency and the validation in pollux.goodput.records (SPEC §2)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pollux.goodput.efficiency import (
    EMA_DECAY,
    LEGW,
    VAR_FLOOR,
    AdaScale,
    GradNoiseState,
    Linear,
    SquareRoot,
    combine_groups,
    efficiency,
    estimate_differenced,
    estimate_from_grads,
    estimate_from_norms,
    gain,
    pgns,
    scaling_rule_for,
)
from pollux.goodput.records import GradStats, ThroughputParams

PROPS = settings(max_examples=200, deadline=None)

finite_nonneg = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
scales = st.floats(min_value=1.0, max_value=1e4, allow_nan=False, allow_infinity=False)


# --------------------------------------------------------------------------------------------
# 1. Formulas against hand-computed values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "sqr", "var", "expected"),
    [
        # (3 + 1) / (3/4 + 1) = 4 / 1.75 = 16/7
        (4.0, 1.0, 3.0, 16.0 / 7.0),
        # (2 + 2) / (2/2 + 2) = 4/3
        (2.0, 2.0, 2.0, 4.0 / 3.0),
        # (9 + 1) / (9/10 + 1) = 10 / 1.9 = 100/19
        (10.0, 1.0, 9.0, 100.0 / 19.0),
        # (0.5 + 4) / (0.5/8 + 4) = 4.5 / 4.0625 = 72/65
        (8.0, 4.0, 0.5, 72.0 / 65.0),
        # (1 + 1) / (1/1.5 + 1) = 2 / (5/3) = 6/5 (non-integer scale)
        (1.5, 1.0, 1.0, 1.2),
    ],
)
def test_gain_hand_values(scale, sqr, var, expected):
    assert float(gain(scale, sqr, var)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("m", "m0", "sqr", "var", "expected"),
    [
        # S = 400/100 = 4; gain = 16/7; efficiency = (16/7)/4 = 4/7
        (400.0, 100.0, 1.0, 3.0, 4.0 / 7.0),
        # S = 64/32 = 2; gain = (2+2)/(1+2) = 4/3; efficiency = 2/3
        (64.0, 32.0, 2.0, 2.0, 2.0 / 3.0),
        # S = 1: efficiency is exactly 1 whatever the statistics
        (128.0, 128.0, 0.3, 7.0, 1.0),
        # S = 10; gain = 100/19; efficiency = 10/19
        (10.0, 1.0, 1.0, 9.0, 10.0 / 19.0),
    ],
)
def test_efficiency_hand_values(m, m0, sqr, var, expected):
    assert float(efficiency(m, m0, sqr, var)) == pytest.approx(expected, rel=1e-12)


def test_efficiency_equals_phi_form():
    # sqr = 1, var = 3, M0 = 100 -> phi = 3*100/1 = 300
    # EFFICIENCY(400) = (300 + 100)/(300 + 400) = 4/7, the same as gain(4)/4 above.
    assert float(pgns(1.0, 3.0, 100.0)) == pytest.approx(300.0, rel=1e-12)
    assert float(efficiency(400.0, 100.0, 1.0, 3.0)) == pytest.approx(4.0 / 7.0, rel=1e-12)
    # Random grid: (phi + M0)/(phi + M) with phi = var*M0/sqr.
    rng = np.random.default_rng(1)
    m0 = rng.uniform(1.0, 512.0, 200)
    m = m0 * rng.uniform(1.0, 64.0, 200)
    sqr = rng.uniform(1e-3, 10.0, 200)
    var = rng.uniform(0.0, 10.0, 200)
    phi = var * m0 / sqr
    np.testing.assert_allclose(pgns(sqr, var, m0), phi, rtol=1e-12)
    np.testing.assert_allclose(efficiency(m, m0, sqr, var), (phi + m0) / (phi + m), rtol=1e-10)
    np.testing.assert_allclose(
        efficiency(m, m0, sqr, var), gain(m / m0, sqr, var) / (m / m0), rtol=1e-12
    )


def test_pgns_hand_values_and_zero_sqr():
    # var*M0/sqr = 0.5*64/2 = 16
    assert float(pgns(2.0, 0.5, 64.0)) == pytest.approx(16.0)
    assert float(pgns(0.0, 0.5, 64.0)) == math.inf
    assert GradStats(sqr=2.0, var=0.5).pgns(64) == pytest.approx(16.0)
    assert GradStats(sqr=0.0, var=0.5).pgns(64) == math.inf
    np.testing.assert_array_equal(pgns([0.0, 1.0], [1.0, 2.0], 4.0), [np.inf, 8.0])


@pytest.mark.parametrize("scale", [1.0, 2.0, 7.5, 32.0])
def test_gain_edge_cases(scale):
    # sqr = 0 (pure noise): gain = var/(var/S) = S, efficiency 1.
    assert float(gain(scale, 0.0, 5.0)) == pytest.approx(scale, rel=1e-12)
    assert float(efficiency(scale * 16.0, 16.0, 0.0, 5.0)) == pytest.approx(1.0, rel=1e-12)
    # sqr = 0 and var = 0 (no information at all): still defined, gain = S.
    assert float(gain(scale, 0.0, 0.0)) == pytest.approx(scale, rel=1e-12)
    # var = 0 (no noise): gain = sqr/sqr = 1.
    assert float(gain(scale, 3.0, 0.0)) == pytest.approx(1.0, rel=1e-12)
    assert float(efficiency(scale * 16.0, 16.0, 3.0, 0.0)) == pytest.approx(1.0 / scale)


@given(sqr=finite_nonneg, var=finite_nonneg)
@PROPS
def test_gain_at_one_is_one(sqr, var):
    if sqr == 0.0 and var == 0.0:
        assert float(gain(1.0, sqr, var)) == 1.0
    else:
        assert float(gain(1.0, sqr, var)) == pytest.approx(1.0, rel=1e-12)


def test_gain_and_efficiency_broadcast():
    s = np.array([1.0, 2.0, 4.0])[:, None]  # (3, 1)
    sqr = np.array([1.0, 0.0])  # (2,)
    var = 3.0
    out = gain(s, sqr, var)
    assert out.shape == (3, 2)
    # column sqr=1: gain = 4/(3/S + 1) -> S=1: 1, S=2: 4/2.5=1.6, S=4: 16/7
    # column sqr=0: gain = S
    expected = np.array([[1.0, 1.0], [1.6, 2.0], [16.0 / 7.0, 4.0]])
    np.testing.assert_allclose(out, expected, rtol=1e-12)

    m = np.array([[32.0], [64.0], [128.0]])
    eff = efficiency(m, 32.0, sqr, var)
    assert eff.shape == (3, 2)
    np.testing.assert_allclose(eff, expected / s, rtol=1e-12)

    # Elementwise agreement with scalar calls on a random grid.
    rng = np.random.default_rng(2)
    ss = rng.uniform(1.0, 50.0, (4, 5))
    q = rng.uniform(0.0, 5.0, (4, 5))
    v = rng.uniform(0.0, 5.0, (4, 5))
    vec = gain(ss, q, v)
    for idx in np.ndindex(ss.shape):
        assert vec[idx] == pytest.approx(float(gain(ss[idx], q[idx], v[idx])), rel=1e-14)


# --------------------------------------------------------------------------------------------
# 2. Properties
# --------------------------------------------------------------------------------------------


@given(
    m0=st.floats(min_value=1.0, max_value=1e4),
    s1=scales,
    s2=scales,
    sqr=finite_nonneg,
    var=finite_nonneg,
)
# Found by hypothesis: a subnormal var divided by S=2 underflowed to 0 but not by S=1.5.
@example(m0=1.0, s1=2.0, s2=1.5, sqr=0.0, var=5e-324)
@PROPS
def test_efficiency_in_unit_interval_and_monotone(m0, s1, s2, sqr, var):
    lo, hi = sorted((s1, s2))
    e_lo = float(efficiency(lo * m0, m0, sqr, var))
    e_hi = float(efficiency(hi * m0, m0, sqr, var))
    for e in (e_lo, e_hi):
        assert 0.0 < e <= 1.0 + 1e-12
    assert e_hi <= e_lo * (1.0 + 1e-12)


@given(s=scales, sqr=finite_nonneg, var=finite_nonneg)
@PROPS
def test_gain_between_one_and_scale(s, sqr, var):
    g = float(gain(s, sqr, var))
    assert 1.0 - 1e-12 <= g <= s * (1.0 + 1e-12)


@given(s1=scales, s2=scales, sqr=finite_nonneg, var=finite_nonneg)
@PROPS
def test_gain_monotone_non_decreasing_in_scale(s1, s2, sqr, var):
    lo, hi = sorted((s1, s2))
    assert float(gain(hi, sqr, var)) >= float(gain(lo, sqr, var)) * (1.0 - 1e-12)


# --------------------------------------------------------------------------------------------
# 3. Estimators
# --------------------------------------------------------------------------------------------


def test_estimate_from_norms_hand_values():
    # local=10, total=4, n=4, S=2: sqr = (4*4 - 10)/3 = 2; var = (10 - 4)*2/3 = 4
    sqr, var = estimate_from_norms(10.0, 4.0, 4, 2.0)
    assert sqr == pytest.approx(2.0, rel=1e-12)
    assert var == pytest.approx(4.0, rel=1e-12)
    # local=5, total=3, n=2, S=1: sqr = (6 - 5)/1 = 1; var = (5 - 3)*1/1 = 2
    sqr, var = estimate_from_norms(5.0, 3.0, 2, 1.0)
    assert (sqr, var) == pytest.approx((1.0, 2.0), rel=1e-12)
    # Single estimates may be negative: local=10, total=1, n=2, S=3 -> sqr = 2-10 = -8, var = 27
    sqr, var = estimate_from_norms(10.0, 1.0, 2, 3.0)
    assert (sqr, var) == pytest.approx((-8.0, 27.0), rel=1e-12)


@pytest.mark.parametrize("count", [1, 0, -3])
def test_estimate_from_norms_rejects_small_count(count):
    with pytest.raises(ValueError, match="count"):
        estimate_from_norms(1.0, 1.0, count, 1.0)


def test_estimate_from_grads_hand_values_and_shape():
    # Micro-batch gradients (1,0) and (0,1): local = mean(1, 1) = 1; mean = (.5,.5) -> total = .5
    # n=2, S=2: sqr = (2*.5 - 1)/1 = 0; var = (1 - .5)*2/1 = 1
    sqr, var = estimate_from_grads(np.array([[1.0, 0.0], [0.0, 1.0]]), 2.0)
    assert (sqr, var) == pytest.approx((0.0, 1.0), abs=1e-12)
    # With precond (2, 3): rows become (2,0) and (0,3): local = (4 + 9)/2 = 6.5,
    # mean = (1, 1.5) -> total = 3.25; n=2, S=1: sqr = 6.5 - 6.5 = 0; var = 6.5 - 3.25 = 3.25
    sqr, var = estimate_from_grads(np.array([[1.0, 0.0], [0.0, 1.0]]), 1.0, np.array([2.0, 3.0]))
    assert (sqr, var) == pytest.approx((0.0, 3.25), abs=1e-12)
    # Identical micro-batch gradients: no noise, sqr = |g|^2 = 1 + 4 = 5
    sqr, var = estimate_from_grads(np.array([[1.0, 2.0]] * 3), 4.0)
    assert (sqr, var) == pytest.approx((5.0, 0.0), abs=1e-12)
    with pytest.raises(ValueError, match="grads"):
        estimate_from_grads(np.ones(5), 1.0)
    with pytest.raises(ValueError, match="count"):
        estimate_from_grads(np.ones((1, 5)), 1.0)


def _problem(seed: int, d: int, m0: float, *, diagonal: bool):
    """True gradient g and per-example covariance Sigma with |g|^2 ~ tr(Sigma)/M0."""
    rng = np.random.default_rng(seed)
    if diagonal:
        sigma = np.diag(rng.uniform(0.05, 5.0, d))
    else:
        a = rng.normal(size=(d, d))
        sigma = a @ a.T / d + np.diag(rng.uniform(0.1, 4.0, d))
    g = rng.normal(size=d)
    g *= np.sqrt(np.trace(sigma) / m0 / (g @ g)) * rng.uniform(0.5, 2.0)
    return rng, g, sigma


def _draw(rng, g, sigma, shape, batch):
    """Gradients averaged over `batch` examples: N(g, Sigma/batch), stacked with leading `shape`."""
    chol = np.linalg.cholesky(sigma)
    z = rng.standard_normal((*shape, g.size))
    return g + (z @ chol.T) / np.sqrt(batch)


DRAWS = 4000
M0 = 8.0


@pytest.mark.parametrize(
    ("n", "s", "d", "diagonal", "seed"),
    [
        (2, 1.0, 20, True, 10),
        (4, 2.0, 30, False, 11),
        (8, 4.0, 40, False, 12),
        (3, 16.0, 50, True, 13),
        (2, 32.0, 25, False, 14),
    ],
)
def test_estimate_from_grads_unbiased(n, s, d, diagonal, seed):
    rng, g, sigma = _problem(seed, d, M0, diagonal=diagonal)
    m = s * M0
    grads = _draw(rng, g, sigma, (DRAWS, n), m / n)
    est = np.array([estimate_from_grads(x, s) for x in grads])
    true_sqr = float(g @ g)
    true_var = float(np.trace(sigma)) / M0
    assert est[:, 0].mean() == pytest.approx(true_sqr, rel=0.05)
    assert est[:, 1].mean() == pytest.approx(true_var, rel=0.05)


@pytest.mark.parametrize(
    ("n", "s", "d", "diagonal", "seed"),
    [
        (2, 2.0, 20, True, 20),
        (4, 1.0, 35, False, 21),
        (6, 8.0, 50, False, 22),
    ],
)
def test_estimate_from_grads_preconditioned_unbiased(n, s, d, diagonal, seed):
    rng, g, sigma = _problem(seed, d, M0, diagonal=diagonal)
    p = 1.0 / (np.sqrt(rng.uniform(0.01, 1.0, d)) + 1e-8)  # Adam-like diagonal of P, in [1, 10]
    m = s * M0
    grads = _draw(rng, g, sigma, (DRAWS, n), m / n)
    est = np.array([estimate_from_grads(x, s, p) for x in grads])
    pg = p * g
    true_sqr = float(pg @ pg)
    true_var = float(np.trace(np.diag(p) @ sigma @ np.diag(p))) / M0
    # Guard against a test that cannot tell P from I.
    assert true_sqr > 1.5 * float(g @ g)
    assert true_var > 1.5 * float(np.trace(sigma)) / M0
    assert est[:, 0].mean() == pytest.approx(true_sqr, rel=0.05)
    assert est[:, 1].mean() == pytest.approx(true_var, rel=0.05)


def test_estimate_from_norms_unbiased_vectorised():
    # The same check through estimate_from_norms directly (arrays broadcast).
    rng, g, sigma = _problem(30, 30, M0, diagonal=False)
    n, s = 5, 4.0
    grads = _draw(rng, g, sigma, (DRAWS, n), s * M0 / n)
    local = np.mean(np.sum(grads**2, axis=2), axis=1)
    mean = grads.mean(axis=1)
    total = np.sum(mean**2, axis=1)
    sqr, var = estimate_from_norms(local, total, n, s)
    assert np.mean(sqr) == pytest.approx(float(g @ g), rel=0.05)
    assert np.mean(var) == pytest.approx(float(np.trace(sigma)) / M0, rel=0.05)


@pytest.mark.parametrize(("s", "d", "seed"), [(1.0, 20, 40), (4.0, 40, 41), (16.0, 30, 42)])
def test_estimate_differenced_unbiased_at_fixed_weights(s, d, seed):
    # Two independent batch gradients (each of M = S*M0 examples) at the same weights.
    rng, g, sigma = _problem(seed, d, M0, diagonal=False)
    m = s * M0
    pair = _draw(rng, g, sigma, (DRAWS, 2), m)
    a, b = pair[:, 0], pair[:, 1]
    prev = np.sum(a * a, axis=1)
    cur = np.sum(b * b, axis=1)
    mid = np.sum(((a + b) / 2) ** 2, axis=1)
    est = np.array([estimate_differenced(p, c, q, s) for p, c, q in zip(prev, cur, mid, strict=True)])
    assert est[:, 0].mean() == pytest.approx(float(g @ g), rel=0.05)
    assert est[:, 1].mean() == pytest.approx(float(np.trace(sigma)) / M0, rel=0.05)


def test_estimate_differenced_hand_values():
    # prev=6, cur=2, mean=3, S=1: local = (6+2)/2 = 4, total = 3, n = 2, S' = 2
    # sqr = (2*3 - 4)/1 = 2; var = (4 - 3)*2/1 = 2
    assert estimate_differenced(6.0, 2.0, 3.0, 1.0) == pytest.approx((2.0, 2.0), rel=1e-12)
    # Same norms at S=3: S' = 6, var = 1*6 = 6
    assert estimate_differenced(6.0, 2.0, 3.0, 3.0) == pytest.approx((2.0, 6.0), rel=1e-12)


# --------------------------------------------------------------------------------------------
# 4. GradNoiseState smoother
# --------------------------------------------------------------------------------------------


def test_initial_state():
    st0 = GradNoiseState()
    assert not st0.has_unbiased
    assert st0.stats() == GradStats(sqr=1.0, var=VAR_FLOOR)
    assert VAR_FLOOR == 1e-6
    # Pessimistic: efficiency ≈ M0/M before measurements arrive (1e-6 is negligible).
    stats = st0.stats()
    assert float(efficiency(800.0, 100.0, stats.sqr, stats.var)) == pytest.approx(0.125, rel=1e-5)


@pytest.mark.parametrize("scale", [1.0, 3.0, 250.0])
@pytest.mark.parametrize("biased", [False, True])
def test_single_update_is_bias_corrected(scale, biased):
    st1 = GradNoiseState().update(2.5, 0.75, scale, biased=biased)
    assert st1.has_unbiased is (not biased)
    stats = st1.stats()
    assert stats.sqr == pytest.approx(2.5, rel=1e-12)
    assert stats.var == pytest.approx(0.75, rel=1e-12)


def test_constant_inputs_stay_constant():
    rng = np.random.default_rng(5)
    state = GradNoiseState()
    for _ in range(300):
        state = state.update(0.3, 4.2, float(rng.uniform(1.0, 20.0)))
        stats = state.stats()
        assert stats.sqr == pytest.approx(0.3, rel=1e-9)
        assert stats.var == pytest.approx(4.2, rel=1e-9)


@pytest.mark.parametrize("scale", [1.0, 2.0, 8.0, 100.0])
def test_decay_is_0999_pow_scale(scale):
    assert EMA_DECAY == 0.999
    state = GradNoiseState()
    for k in range(1, 51):
        state = state.update(1.0, 1.0, scale)
        weight = state.to_dict()["unbiased"]["weight"]
        assert weight == pytest.approx(1.0 - 0.999 ** (scale * k), rel=1e-9)
    # Two updates a=0 then b=1 at decay d = 0.999**S: the bias-corrected mean is
    # ((1-d)*d*0 + (1-d)*1) / (1 - d^2) = 1/(1+d).
    d = 0.999**scale
    two = GradNoiseState().update(0.0, 0.0, scale).update(1.0, 2.0, scale).stats()
    assert two.sqr == pytest.approx(1.0 / (1.0 + d), rel=1e-9)
    assert two.var == pytest.approx(2.0 / (1.0 + d), rel=1e-9)


def test_biased_used_only_until_first_unbiased():
    state = GradNoiseState().update(4.0, 2.0, 1.0, biased=True)
    assert state.stats().sqr == pytest.approx(4.0, rel=1e-12)
    assert state.stats().var == pytest.approx(2.0, rel=1e-12)
    state = state.update(8.0, 6.0, 1.0, biased=True)
    # Two biased updates at d = .999: (d*4 + 8)/(1+d) ≈ 6.001; still biased-only.
    assert state.stats().sqr == pytest.approx((0.999 * 4.0 + 8.0) / 1.999, rel=1e-9)
    assert not state.has_unbiased
    state = state.update(1.0, 0.5, 2.0)
    assert state.has_unbiased
    assert state.stats().sqr == pytest.approx(1.0, rel=1e-12)
    assert state.stats().var == pytest.approx(0.5, rel=1e-12)
    # Later biased estimates are ignored.
    for _ in range(20):
        state = state.update(100.0, 100.0, 1.0, biased=True)
    assert state.stats().sqr == pytest.approx(1.0, rel=1e-12)
    assert state.stats().var == pytest.approx(0.5, rel=1e-12)


def test_floors():
    state = GradNoiseState().update(-3.0, 1e-9, 1.0)
    assert state.stats() == GradStats(sqr=0.0, var=VAR_FLOOR)
    state = GradNoiseState().update(2.0, -5.0, 1.0)
    assert state.stats() == GradStats(sqr=2.0, var=VAR_FLOOR)
    # The floor applies to the average, not each estimate: -1 then +3 averages to positive.
    state = GradNoiseState().update(-1.0, 1.0, 1.0).update(3.0, 1.0, 1.0)
    assert state.stats().sqr == pytest.approx((0.999 * -1.0 + 3.0) / 1.999, rel=1e-9)


@pytest.mark.parametrize(
    ("sqr", "var"),
    [(math.nan, 1.0), (1.0, math.nan), (math.inf, 1.0), (1.0, -math.inf), (math.nan, math.nan)],
)
@pytest.mark.parametrize("biased", [False, True])
def test_non_finite_estimates_skipped(sqr, var, biased):
    empty = GradNoiseState()
    assert empty.update(sqr, var, 1.0, biased=biased) == empty
    state = GradNoiseState().update(2.0, 3.0, 4.0).update(1.0, 1.0, 1.0, biased=True)
    after = state.update(sqr, var, 4.0, biased=biased)
    assert after == state
    assert after.to_dict() == state.to_dict()
    assert math.isfinite(after.stats().sqr) and math.isfinite(after.stats().var)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_update_rejects_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        GradNoiseState().update(1.0, 1.0, scale)


def test_to_dict_from_dict_round_trip():
    rng = np.random.default_rng(6)
    state = GradNoiseState()
    for i in range(25):
        state = state.update(
            float(rng.uniform(0, 3)), float(rng.uniform(0, 3)), float(rng.uniform(1, 9)),
            biased=i < 5,
        )
    data = json.loads(json.dumps(state.to_dict()))
    back = GradNoiseState.from_dict(data)
    assert back == state
    assert back.stats() == state.stats()
    assert back.has_unbiased == state.has_unbiased
    assert GradNoiseState.from_dict(GradNoiseState().to_dict()) == GradNoiseState()


def test_combine_groups_sums():
    a = GradNoiseState().update(1.5, 0.25, 1.0)
    b = GradNoiseState().update(2.0, 3.0, 2.0, biased=True)
    c = GradNoiseState()
    stats = combine_groups([a, b, c])
    # 1.5 + 2 + 1 (initial) ; 0.25 + 3 + 1e-6 (floored initial var)
    assert stats.sqr == pytest.approx(4.5, rel=1e-12)
    assert stats.var == pytest.approx(3.25 + 1e-6, rel=1e-12)
    assert combine_groups((a,)) == a.stats()
    assert combine_groups([]) == GradStats(sqr=1.0, var=VAR_FLOOR)


# --------------------------------------------------------------------------------------------
# 5. Learning-rate scaling rules
# --------------------------------------------------------------------------------------------

STATS = GradStats(sqr=1.0, var=3.0)


def test_adascale_is_gain():
    # gain(4) with sqr=1, var=3 is 16/7
    assert AdaScale()(4.0, STATS) == pytest.approx(16.0 / 7.0, rel=1e-12)
    assert AdaScale()(1.0, STATS) == pytest.approx(1.0, rel=1e-12)
    assert isinstance(AdaScale()(4.0, STATS), float)


def test_square_root_rules():
    assert SquareRoot()(4.0, STATS) == pytest.approx(math.sqrt(16.0 / 7.0), rel=1e-12)
    assert SquareRoot(plain=True)(4.0, STATS) == pytest.approx(2.0, rel=1e-12)
    assert SquareRoot(plain=True)(9.0, GradStats(sqr=0.0, var=0.0)) == pytest.approx(3.0)


def test_linear_rule():
    assert Linear()(4.0, STATS) == 4.0
    assert Linear()(2.5, STATS, epoch=7.0) == 2.5


def test_legw_ramp():
    rule = LEGW(warmup_epochs=2.0)
    s = 4.0  # span = 2*4 = 8 epochs, target sqrt(4) = 2
    assert rule(s, STATS, epoch=0.0) == pytest.approx(0.0)
    assert rule(s, STATS, epoch=-3.0) == pytest.approx(0.0)  # before training: clamped to 0
    assert rule(s, STATS, epoch=2.0) == pytest.approx(0.5)  # 2 * 2/8
    assert rule(s, STATS, epoch=4.0) == pytest.approx(1.0)  # 2 * 4/8
    assert rule(s, STATS, epoch=6.0) == pytest.approx(1.5)  # 2 * 6/8
    assert rule(s, STATS, epoch=8.0) == pytest.approx(2.0)
    assert rule(s, STATS, epoch=50.0) == pytest.approx(2.0)
    # S = 9: span 18 epochs, target 3; epoch 9 is halfway -> 1.5
    assert rule(9.0, STATS, epoch=9.0) == pytest.approx(1.5)
    assert rule(9.0, STATS, epoch=17.9) < 3.0
    assert rule(9.0, STATS, epoch=18.0) == pytest.approx(3.0)
    # Default warm-up of 1 epoch per unit scale; S = 1 -> target 1 after 1 epoch.
    assert LEGW()(1.0, STATS, epoch=0.5) == pytest.approx(0.5)
    assert LEGW()(1.0, STATS, epoch=1.0) == pytest.approx(1.0)
    # No warm-up: sqrt(S) straight away.
    assert LEGW(warmup_epochs=0.0)(16.0, STATS, epoch=0.0) == pytest.approx(4.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "x"])
def test_legw_rejects_bad_warmup(bad):
    with pytest.raises(ValueError, match="warmup_epochs"):
        LEGW(warmup_epochs=bad)


def test_scaling_rule_for():
    for name in ("Adam", "AdamW", "adam"):
        rule = scaling_rule_for(name)
        assert isinstance(rule, SquareRoot)
        assert rule(4.0, STATS) == pytest.approx(math.sqrt(16.0 / 7.0))
    for name in ("SGD", "RMSprop"):
        rule = scaling_rule_for(name)
        assert isinstance(rule, AdaScale)
        assert rule(4.0, STATS) == pytest.approx(16.0 / 7.0)


# --------------------------------------------------------------------------------------------
# 6. Validation in records.py
# --------------------------------------------------------------------------------------------

BAD_VALUES = [math.nan, math.inf, -math.inf, -1.0, -1e-300, True, False, None, "abc", [1.0], 1j]

GOOD_TP = {
    "alpha_grad": 0.1,
    "beta_grad": 0.01,
    "alpha_local": 0.02,
    "beta_local": 0.001,
    "alpha_node": 0.05,
    "beta_node": 0.002,
    "gamma": 2.0,
}


@pytest.mark.parametrize("field", ["sqr", "var"])
@pytest.mark.parametrize("bad", BAD_VALUES)
def test_grad_stats_rejects(field, bad):
    kwargs = {"sqr": 1.0, "var": 1.0, field: bad}
    with pytest.raises(ValueError) as exc:
        GradStats(**kwargs)
    assert field in str(exc.value)


def test_grad_stats_accepts_and_converts():
    stats = GradStats(sqr=0, var=np.float32(2.5))
    assert stats == GradStats(sqr=0.0, var=2.5)
    assert type(stats.sqr) is float and type(stats.var) is float
    assert GradStats.from_dict(stats.to_dict()) == stats


@pytest.mark.parametrize("field", list(GOOD_TP))
@pytest.mark.parametrize("bad", BAD_VALUES)
def test_throughput_params_rejects(field, bad):
    with pytest.raises(ValueError) as exc:
        ThroughputParams(**{**GOOD_TP, field: bad})
    assert field in str(exc.value)


@pytest.mark.parametrize("gamma", [0.0, 0.999, 10.001, 11.0, 100.0])
def test_gamma_outside_range_rejected(gamma):
    with pytest.raises(ValueError) as exc:
        ThroughputParams(**{**GOOD_TP, "gamma": gamma})
    assert "gamma" in str(exc.value)


@pytest.mark.parametrize("gamma", [1.0, 1, 5.5, 10.0, 10])
def test_gamma_bounds_inclusive(gamma):
    tp = ThroughputParams(**{**GOOD_TP, "gamma": gamma})
    assert tp.gamma == float(gamma)


def test_throughput_params_round_trip_and_zero_allowed():
    tp = ThroughputParams.from_dict(dict(GOOD_TP))
    assert tp.to_dict() == GOOD_TP
    assert tp.as_array() == tuple(GOOD_TP.values())
    zeros = ThroughputParams(**{**{k: 0 for k in GOOD_TP}, "gamma": 1})
    assert all(type(x) is float for x in zeros.as_array())


def test_throughput_from_dict_errors_name_fields():
    data = dict(GOOD_TP)
    del data["beta_node"]
    del data["gamma"]
    with pytest.raises(ValueError) as exc:
        ThroughputParams.from_dict(data, where="hint.throughput")
    msg = str(exc.value)
    assert msg.startswith("hint.throughput")
    assert "beta_node" in msg and "gamma" in msg and "missing" in msg

    with pytest.raises(ValueError) as exc:
        ThroughputParams.from_dict({**GOOD_TP, "delta": 1.0}, where="job7")
    msg = str(exc.value)
    assert msg.startswith("job7") and "delta" in msg and "unknown" in msg

    with pytest.raises(ValueError) as exc:
        ThroughputParams.from_dict({**GOOD_TP, "gamma": 20.0}, where="hint.throughput")
    assert str(exc.value).startswith("hint.throughput.gamma")

    with pytest.raises(ValueError) as exc:
        ThroughputParams.from_dict({**GOOD_TP, "alpha_node": -2.0})
    assert str(exc.value).startswith("throughput.alpha_node")

    with pytest.raises(ValueError) as exc:
        ThroughputParams.from_dict([1, 2, 3], where="tp")
    assert str(exc.value).startswith("tp")


def test_grad_from_dict_errors_name_fields():
    with pytest.raises(ValueError) as exc:
        GradStats.from_dict({"sqr": 1.0}, where="hint.grad")
    msg = str(exc.value)
    assert msg.startswith("hint.grad") and "var" in msg and "missing" in msg

    with pytest.raises(ValueError) as exc:
        GradStats.from_dict({}, where="g")
    assert "sqr" in str(exc.value) and "var" in str(exc.value)

    with pytest.raises(ValueError) as exc:
        GradStats.from_dict({"sqr": 1.0, "var": math.nan}, where="hint.grad")
    assert str(exc.value).startswith("hint.grad.var")

    with pytest.raises(ValueError) as exc:
        GradStats.from_dict({"sqr": -1.0, "var": 1.0})
    assert str(exc.value).startswith("grad.sqr")

    with pytest.raises(ValueError) as exc:
        GradStats.from_dict("sqr=1", where="hint.grad")
    assert str(exc.value).startswith("hint.grad")


def test_grad_from_dict_reports_unknown_fields():
    with pytest.raises(ValueError) as exc:
        GradStats.from_dict({"sqr": 1.0, "var": 2.0, "sqrt": 3.0}, where="hint.grad")
    assert str(exc.value).startswith("hint.grad") and "sqrt" in str(exc.value)


@pytest.mark.parametrize("field", ["sqr", "var"])
def test_huge_int_rejected_with_value_error(field):
    # json.loads("1" + "0"*400) yields a Python int that float() cannot convert.
    huge = json.loads("1" + "0" * 400)
    with pytest.raises(ValueError) as exc:
        GradStats(**{"sqr": 1.0, "var": 1.0, field: huge})
    assert field in str(exc.value)


@pytest.mark.parametrize("bad", ["1.5", " 3 ", b"2"])
def test_numeric_strings_rejected(bad):
    with pytest.raises(ValueError) as exc:
        GradStats(sqr=bad, var=1.0)
    assert "sqr" in str(exc.value)
