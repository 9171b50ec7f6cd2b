"""pollux.goodput.batched against pollux.goodput.optimize, bit for bit, on random models."""

from __future__ import annotations

import numpy as np
import pytest

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams, optimize
from pollux.goodput.batched import model_rows, optimize_many, scalar_power


def _model(rng: np.random.Generator, gamma: float) -> tuple[GoodputModel, BatchLimits]:
    m0 = float(rng.choice([1, 16, 32, 128, 1000]))
    params = ThroughputParams(*(float(x) for x in rng.uniform(0.0, 0.2, size=6)), gamma)
    stats = GradStats(sqr=float(rng.choice([0.0, rng.uniform(1e-6, 1.0)])),
                      var=float(rng.choice([0.0, rng.uniform(1e-6, 10.0)])))
    model = GoodputModel(params, stats, m0)
    adaptive = rng.random() < 0.8
    max_batch = m0 * float(rng.choice([4, 64, 1000])) if adaptive else m0
    max_local = None if rng.random() < 0.3 else float(rng.choice([32.0, 250.5, 4096.0]))
    lowest = [x for x in (1.0, 2.5, 8.0) if x <= min(max_batch, max_local or max_batch)]
    limits = BatchLimits(m0, max_batch_size=max_batch if adaptive else None,
                         min_local_bsz=float(rng.choice(lowest)), max_local_bsz=max_local,
                         accumulation=bool(rng.random() < 0.5))
    return model, limits


def _gammas(rng: np.random.Generator, shortcut_only: bool) -> list[float]:
    # γ = 2 takes numpy's shortcuts for ``** 2`` and ``** 0.5`` (1/γ); γ = 1 the one for ``** 1``.
    if shortcut_only:
        return [2.0] * 12
    return [2.0, 1.0, 10.0, 2.0, *(float(g) for g in rng.uniform(1.0, 10.0, size=8))]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("force_single", [True, False])
@pytest.mark.parametrize("shortcut_only", [False, True])
def test_same_goodput_as_optimize_to_the_bit(seed: int, force_single: bool, shortcut_only: bool) -> None:
    rng = np.random.default_rng(seed)
    pairs = [_model(rng, g) for g in _gammas(rng, shortcut_only)]
    rows = model_rows(pairs)
    which, nodes, replicas, expected = [], [], [], []
    for r, (model, limits) in enumerate(pairs):
        count = int(rng.integers(300, 400)) if shortcut_only else int(rng.integers(20, 60))
        # Small counts often (one replica is where accumulation is forced), and invalid pairs
        # (no nodes or GPUs, more nodes than GPUs).
        k = np.where(rng.random(count) < 0.4, rng.integers(0, 3, size=count), rng.integers(0, 65, size=count))
        n = np.minimum(rng.integers(0, 9, size=count), k + rng.integers(0, 2, size=count))
        expected.append(optimize(model, n, k, limits, force_single_accumulation=force_single).goodput)
        which.append(np.full(count, r))
        nodes.append(n)
        replicas.append(k)
    got = optimize_many(rows, np.concatenate(which), np.concatenate(nodes), np.concatenate(replicas),
                        force_single_accumulation=force_single)
    want = np.concatenate(expected)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert (got > 0).any()


def test_slices_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import pollux.goodput.batched as batched
    rng = np.random.default_rng(11)
    pairs = [_model(rng, g) for g in _gammas(rng, False)]
    rows = model_rows(pairs)
    which = rng.integers(0, len(pairs), size=500)
    nodes = rng.integers(0, 5, size=500)
    replicas = rng.integers(0, 40, size=500)
    whole = optimize_many(rows, which, nodes, replicas)
    monkeypatch.setattr(batched, "CHUNK", 7)
    np.testing.assert_array_equal(optimize_many(rows, which, nodes, replicas), whole)
    assert optimize_many(rows, which[:0], nodes[:0], replicas[:0]).size == 0


def test_scalar_power_follows_numpy_shortcuts() -> None:
    rng = np.random.default_rng(5)
    base = rng.uniform(0.0, 3.0, size=(6, 4000))
    exponent = np.array([2.0, 0.5, -1.0, 1.0, 3.7, 0.1])[:, None]
    got = scalar_power(base, exponent)
    for i, e in enumerate(exponent[:, 0]):
        np.testing.assert_array_equal(got[i], base[i] ** np.float64(e))
    # Without the shortcuts some entries of the first three rows would differ (the reason it exists).
    assert (np.power(base[:3], exponent[:3]) != got[:3]).any()


def test_checks_m0_and_lengths() -> None:
    rng = np.random.default_rng(0)
    model, _ = _model(rng, 2.0)
    with pytest.raises(ValueError, match="init_batch_size"):
        model_rows([(model, BatchLimits(model.init_batch_size + 1.0))])
    rows = model_rows([(model, BatchLimits(model.init_batch_size))])
    with pytest.raises(ValueError, match="entries"):
        optimize_many(rows, np.zeros(2, dtype=np.int64), np.ones(3), np.ones(3))
