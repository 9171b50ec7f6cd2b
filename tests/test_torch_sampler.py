"""The elastic sampler: exact-once passes, strided shares, resumption with another replica count."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pollux.torch.sampler import ElasticSampler


def run_pass(sampler: ElasticSampler, position: int, configs: list[tuple[int, int, int]],
             steps_per_config: int | None = None) -> tuple[Counter, int, int]:
    """Train through one pass switching configurations every few steps; (visits, skipped, end)."""
    n = sampler.dataset_len
    pass_index = position // n
    visits: Counter = Counter()
    skipped = 0
    i = 0
    while position // n == pass_index:
        k, m, s = configs[(i // (steps_per_config or 10**9)) % len(configs)]
        plans = [sampler.plan(position, k, r, m, s) for r in range(k)]
        assert len({(p.advance, p.samples, p.local_sizes) for p in plans}) == 1
        for p in plans:
            for micro in p.micro_batches:
                visits.update(micro)
        skipped += plans[0].advance - plans[0].samples
        position += plans[0].advance
        i += 1
    return visits, skipped, position


@pytest.mark.parametrize("n", [96, 100, 101, 7])
@pytest.mark.parametrize(("k", "m", "s"), [(1, 8, 0), (2, 3, 1), (3, 4, 0), (4, 1, 2), (5, 2, 0)])
def test_every_example_once_per_pass(n: int, k: int, m: int, s: int) -> None:
    sampler = ElasticSampler(n, shuffle=True, seed=11)
    position = 0
    for _ in range(3):
        visits, skipped, position = run_pass(sampler, position, [(k, m, s)])
        assert all(c == 1 for c in visits.values())
        assert len(visits) + skipped == n
        assert skipped < k                      # only a remainder that cannot be shared equally
        assert position % n == 0


def test_replica_count_changing_mid_pass_keeps_exact_once() -> None:
    sampler = ElasticSampler(120, seed=2)
    visits, skipped, position = run_pass(sampler, 0, [(1, 12, 0), (3, 4, 0), (2, 3, 1), (4, 5, 0)],
                                         steps_per_config=2)
    assert skipped < 4 and len(visits) + skipped == 120 and max(visits.values()) == 1
    assert position == 120


def test_strided_shares_and_full_batch_mean() -> None:
    n, k, m, s = 60, 3, 4, 1
    sampler = ElasticSampler(n, seed=5)
    perm = sampler.permutation(0)
    plans = [sampler.plan(12, k, r, m, s) for r in range(k)]
    for j in range(s + 1):
        chunk = perm[12 + j * k * m: 12 + (j + 1) * k * m]
        for r, p in enumerate(plans):
            assert list(p.micro_batches[j]) == list(chunk[r::k])
    # The mean of the replicas' per-micro-batch means is the mean over the whole global batch.
    values = np.random.default_rng(0).normal(size=n)
    replica_means = [np.mean([values[list(mb)].mean() for mb in p.micro_batches]) for p in plans]
    everything = np.concatenate([values[list(mb)] for p in plans for mb in p.micro_batches])
    assert np.mean(replica_means) == pytest.approx(everything.mean(), rel=1e-12)
    assert plans[0].full and plans[0].fraction == 1.0 and plans[0].samples == k * m * (s + 1)


def test_tail_step_has_equal_local_batches() -> None:
    sampler = ElasticSampler(50, shuffle=False)
    plans = [sampler.plan(40, 4, r, 3, 0) for r in range(4)]   # 10 left: 2 per replica, 2 skipped
    assert not plans[0].full
    assert all(p.local_sizes == (2,) for p in plans)
    assert plans[0].advance == 10 and plans[0].samples == 8 and plans[0].fraction == pytest.approx(10 / 12)
    # A full step that would leave fewer than K positions behind absorbs them.
    p = sampler.plan(0, 4, 0, 3, 3)              # 48 of 50: 2 left < 4 replicas
    assert p.full and p.advance == 50 and p.samples == 48
    # With accumulation a tail keeps m as the largest micro-batch.
    tail = sampler.plan(30, 2, 0, 4, 3)          # 20 left, 10 per replica over micro-batches <= 4
    assert tail.local_sizes == (4, 3, 3) and tail.advance == 20


def test_rescale_with_too_few_positions_left_skips_to_next_pass() -> None:
    sampler = ElasticSampler(10, shuffle=False)
    p = sampler.plan(8, 3, 0, 1, 0)              # 2 left for 3 replicas
    assert p.start == 8 and p.advance == 2 + 3 and p.micro_batches == ((0,),)


def test_permutations_are_seeded_per_pass() -> None:
    a, b = ElasticSampler(100, seed=1), ElasticSampler(100, seed=1)
    assert np.array_equal(a.permutation(3), b.permutation(3))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert not np.array_equal(a.permutation(0), ElasticSampler(100, seed=2).permutation(0))
    assert np.array_equal(ElasticSampler(5, shuffle=False).permutation(9), np.arange(5))


def test_resume_from_state() -> None:
    a = ElasticSampler(64, seed=4)
    it = a.iter_plans(0, 2, 1, 4, 0)
    for _ in range(5):
        plan = next(it)
    a.position = plan.start + plan.advance
    b = ElasticSampler(64, seed=4)
    b.load_state_dict(a.state_dict())
    assert b.position == 40
    assert b.plan(b.position, 2, 1, 4, 0) == next(it)


def test_state_validation() -> None:
    state = ElasticSampler(64, seed=4).state_dict()
    with pytest.raises(ValueError, match="64 examples"):
        ElasticSampler(65, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        ElasticSampler(64, seed=5).load_state_dict(state)
    with pytest.raises(ValueError):
        ElasticSampler(0)
    with pytest.raises(ValueError, match="fewer than"):
        ElasticSampler(3).plan(0, 4, 0, 1, 0)
    with pytest.raises(ValueError):
        ElasticSampler(30).plan(0, 2, 2, 1, 0)
