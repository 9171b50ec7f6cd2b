"""The gradient-noise estimator for micro-batches of unequal sizes (LB-BSP shares; SPEC §2, §10).

Synthetic linear loss as in test_efficiency.py: per-example gradients are g + noise with covariance
Σ (known), so the true ``sqr = |Pg|²`` and ``var = tr(PΣPᵀ)/M0`` are known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from pollux.goodput.efficiency import estimate_from_norms, estimate_unequal

M0 = 8.0
TRIALS = 4000


def _problem(seed: int, d: int):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    sigma = a @ a.T / d + np.diag(rng.uniform(0.1, 4.0, d))
    g = rng.normal(size=d)
    g *= np.sqrt(np.trace(sigma) / M0 / (g @ g))  # |g|² = tr(Σ)/M0: noise and signal comparable
    return rng, g, sigma


def _norms(rng, g, sigma, sizes, precond=None):
    """Per-trial (local_sqr_mean, inv_size_mean, total_sqr, B) from per-example gradients."""
    sizes = np.asarray(sizes)
    big_b = int(sizes.sum())
    chol = np.linalg.cholesky(sigma)
    examples = g + rng.standard_normal((TRIALS, big_b, g.size)) @ chol.T  # per-example gradients
    if precond is not None:
        examples = examples * precond
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    micro = np.stack([examples[:, bounds[i]:bounds[i + 1]].mean(axis=1)
                      for i in range(sizes.size)], axis=1)  # (TRIALS, n, d)
    local = np.mean(np.sum(micro**2, axis=2), axis=1)
    weighted = np.einsum("i,tid->td", sizes / big_b, micro)  # Σ b_i ĝ_i / B = mean of all examples
    total = np.sum(weighted**2, axis=1)
    return local, float(np.mean(1.0 / sizes)), total, big_b


@pytest.mark.parametrize(("sizes", "seed"), [((3, 13), 1), ((5, 7, 20), 2), ((1, 2, 4, 25), 3)])
def test_unequal_estimator_within_15_percent_of_truth(sizes, seed):
    rng, g, sigma = _problem(seed, 20)
    local, inv, total, big_b = _norms(rng, g, sigma, sizes)
    sqr, var = estimate_unequal(local, inv, total, big_b, M0)
    true_sqr, true_var = float(g @ g), float(np.trace(sigma)) / M0
    assert abs(float(np.mean(sqr)) / true_sqr - 1.0) < 0.15
    assert abs(float(np.mean(var)) / true_var - 1.0) < 0.15
    # The equal-size formula on the same norms is biased: var is overestimated by B·(h−1/B)/(n−1).
    n = len(sizes)
    naive_sqr, naive_var = estimate_from_norms(local, total, n, big_b / M0)
    assert abs(float(np.mean(naive_var)) / true_var - 1.0) > 0.5
    assert abs(float(np.mean(naive_sqr)) / true_sqr - 1.0) > 0.1


def test_unequal_estimator_preconditioned():
    rng, g, sigma = _problem(4, 16)
    p = 1.0 / (np.sqrt(rng.uniform(0.01, 1.0, g.size)) + 1e-8)
    local, inv, total, big_b = _norms(rng, g, sigma, (5, 7, 20), precond=p)
    sqr, var = estimate_unequal(local, inv, total, big_b, M0)
    pg = p * g
    true_var = float(np.trace(np.diag(p) @ sigma @ np.diag(p))) / M0
    assert float(np.mean(sqr)) == pytest.approx(float(pg @ pg), rel=0.15)
    assert float(np.mean(var)) == pytest.approx(true_var, rel=0.15)


@pytest.mark.parametrize(("n", "m", "seed"), [(2, 4, 0), (3, 7, 1), (8, 16, 2), (5, 1, 3)])
def test_equal_sizes_reduce_to_estimate_from_norms(n, m, seed):
    rng = np.random.default_rng(seed)
    local = rng.uniform(1.0, 10.0, 50)
    total = local * rng.uniform(0.05, 1.2, 50)
    big_b = n * m
    sqr, var = estimate_unequal(local, 1.0 / m, total, big_b, 4.0)
    ref_sqr, ref_var = estimate_from_norms(local, total, n, big_b / 4.0)
    np.testing.assert_allclose(sqr, ref_sqr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, ref_var, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((2.0, 1.0 / 16, 1.0, 16, 8), "inv_size_mean"),  # one micro-batch: h = 1/B
        ((2.0, 0.01, 1.0, 16, 8), "inv_size_mean"),  # h < 1/B is impossible
        ((2.0, 0.0, 1.0, 16, 8), "inv_size_mean"),
        ((2.0, float("nan"), 1.0, 16, 8), "inv_size_mean"),
        ((2.0, 0.3, 1.0, 0, 8), "batch_size"),
        ((2.0, 0.3, 1.0, float("inf"), 8), "batch_size"),
        ((2.0, 0.3, 1.0, 16, -1), "init_batch_size"),
        ((2.0, 0.3, 1.0, 16, float("nan")), "init_batch_size"),
    ],
)
def test_bad_input_names_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        estimate_unequal(*args)
