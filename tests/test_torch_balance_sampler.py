"""Unequal shares (LB-BSP) in the elastic sampler: exactly once per pass while the shares change
every few steps, across a restart on another replica count mid-pass, and bad shares named."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pollux.torch.api import BatchConfig
from pollux.torch.microbatch import PlanBatchSampler
from pollux.torch.sampler import ElasticSampler


def random_shares(rng: np.random.Generator, k: int, m: int, lo: int = 1) -> tuple[int, ...]:
    """``k`` shares of ``k·m`` examples, each at least ``lo``."""
    total = k * m
    cuts = np.sort(rng.choice(np.arange(1, total - k * (lo - 1)), size=k - 1, replace=False))
    parts = np.diff(np.concatenate([[0], cuts, [total - k * (lo - 1)]])) + (lo - 1)
    assert parts.sum() == total and parts.min() >= lo
    return tuple(int(x) for x in parts)


def step(sampler: ElasticSampler, position: int, k: int, m: int, s: int,
         shares: tuple[int, ...] | None, visits: Counter) -> tuple[int, int]:
    plans = [sampler.plan(position, k, r, m, s, shares) for r in range(k)]
    assert len({(p.advance, p.samples, p.full) for p in plans}) == 1
    for r, p in enumerate(plans):
        if p.full and shares is not None:
            assert p.local_sizes == (shares[r],) * (s + 1)
        for micro in p.micro_batches:
            visits.update(micro)
    return plans[0].advance, plans[0].advance - plans[0].samples


@pytest.mark.parametrize(("n", "k", "m", "s"), [(203, 2, 8, 0), (500, 3, 10, 1), (97, 4, 3, 0)])
def test_exactly_once_with_shares_changing_every_few_steps(n: int, k: int, m: int, s: int) -> None:
    sampler = ElasticSampler(n, seed=3)
    rng = np.random.default_rng(0)
    position = 0
    for pass_index in range(3):
        visits: Counter = Counter()
        skipped = 0
        i = 0
        shares = random_shares(rng, k, m)
        while position // n == pass_index:
            if i % 3 == 0:
                shares = random_shares(rng, k, m)
            adv, skip = step(sampler, position, k, m, s, shares, visits)
            position += adv
            skipped += skip
            i += 1
        assert max(visits.values()) == 1 and len(visits) + skipped == n and skipped < k


def test_restart_two_to_three_replicas_mid_pass() -> None:
    n = 300
    sampler = ElasticSampler(n, seed=9)
    rng = np.random.default_rng(1)
    visits: Counter = Counter()
    position, skipped = 0, 0
    shares = random_shares(rng, 2, 8)
    for i in range(7):                         # 2 replicas, shares changing every 2 steps
        if i % 2 == 0:
            shares = random_shares(rng, 2, 8)
        adv, skip = step(sampler, position, 2, 8, 1, shares, visits)
        position, skipped = position + adv, skipped + skip
    assert 0 < position < n
    sampler.position = position                 # what the loader does after each step
    state = sampler.state_dict()
    resumed = ElasticSampler(n, seed=9)         # a new process on 3 replicas: shares reset to equal
    resumed.load_state_dict(state)
    position = resumed.position
    i = 0
    while position < n:
        shares = None if i < 2 else random_shares(rng, 3, 5)
        adv, skip = step(resumed, position, 3, 5, 0, shares, visits)
        position, skipped = position + adv, skipped + skip
        i += 1
    assert max(visits.values()) == 1 and len(visits) + skipped == n and skipped < 3


def test_contiguous_ranges_and_equal_shares_keep_the_strided_rule() -> None:
    sampler = ElasticSampler(64, shuffle=False)
    p0 = sampler.plan(0, 2, 0, 8, 1, (3, 13))
    p1 = sampler.plan(0, 2, 1, 8, 1, (3, 13))
    assert p0.micro_batches == ((0, 1, 2), (16, 17, 18))
    assert p1.micro_batches == (tuple(range(3, 16)), tuple(range(19, 32)))
    assert p0.shares == (3, 13)
    equal = sampler.plan(0, 2, 1, 8, 1, (8, 8))
    assert equal == sampler.plan(0, 2, 1, 8, 1) and equal.shares is None


def test_tail_step_ignores_shares() -> None:
    sampler = ElasticSampler(20, shuffle=False)
    tail = [sampler.plan(16, 2, r, 4, 0, (1, 7)) for r in range(2)]
    assert not tail[0].full and tail[0].local_sizes == tail[1].local_sizes == (2,)


@pytest.mark.parametrize("shares", [(3, 12), (0, 16), (16,), (2.5, 13.5), (True, 15)])
def test_bad_shares_are_named(shares: tuple) -> None:
    with pytest.raises(ValueError, match="shares"):
        ElasticSampler(64).plan(0, 2, 0, 8, 0, shares)


def test_plan_batch_sampler_passes_shares() -> None:
    sampler = ElasticSampler(40, shuffle=False)
    feeder = PlanBatchSampler(sampler)
    feeder.start_at(0, 1, BatchConfig(2, 5, 0), (2, 8))
    it = iter(feeder)
    assert next(it) == list(range(2, 10)) and next(it) == list(range(12, 20))
