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


def test_tail_step_is_split_in_the_shares_proportions() -> None:
    """The pass's last, short step is split like the full steps (1 : 3 here), contiguously, every
    position once, so it does not wait for the straggler either."""
    sampler = ElasticSampler(28, shuffle=False)
    tail = [sampler.plan(16, 2, r, 8, 0, (4, 12)) for r in range(2)]
    assert not tail[0].full and tail[0].shares == tail[1].shares == (3, 9)
    assert tail[0].micro_batches == (tuple(range(16, 19)),)
    assert tail[1].micro_batches == (tuple(range(19, 28)),)
    assert tail[0].samples == 12 and tail[0].advance == 12


def test_tail_step_shares_edge_cases() -> None:
    sampler = ElasticSampler(20, shuffle=False)
    # every replica keeps at least one sample of the tail
    assert sampler.plan(16, 2, 0, 4, 0, (1, 7)).shares == (1, 3)
    # a tail too short to split unequally: equal local batches, no shares
    short = [ElasticSampler(18, shuffle=False).plan(16, 2, r, 4, 0, (1, 7)) for r in range(2)]
    assert not short[0].full and short[0].shares is None
    assert short[0].local_sizes == short[1].local_sizes == (1,)
    # proportions that round to equal
    assert sampler.plan(16, 2, 0, 8, 0, (7, 9)).shares is None
    # a tail of several micro-steps (accumulation) keeps equal local batches
    acc = [ElasticSampler(60, shuffle=False).plan(32, 2, r, 8, 1, (4, 12)) for r in range(2)]
    assert not acc[0].full and acc[0].shares is None and acc[0].local_sizes == acc[1].local_sizes


@pytest.mark.parametrize("replicas,shares", [(2, (3, 13)), (3, (5, 7, 12))])
def test_a_pass_with_unequal_tail_visits_every_position_once(replicas: int, shares: tuple) -> None:
    n = 101
    sampler = ElasticSampler(n, shuffle=True, seed=3)
    m = sum(shares) // replicas
    seen: list[int] = []
    position, tails = 0, 0
    while position < n:
        plans = [sampler.plan(position, replicas, r, m, 0, shares) for r in range(replicas)]
        tails += not plans[0].full
        assert len({p.shares for p in plans}) == 1
        for p in plans:
            seen += [i for mb in p.micro_batches for i in mb]
        position += plans[0].advance
    assert tails == 1 and position == n
    # every index once, except the fewer-than-K positions a pass cannot share
    assert len(seen) == len(set(seen)) and n - replicas < len(seen) <= n


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
