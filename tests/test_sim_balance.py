"""The simulator's slow nodes and LB-BSP balancing model (issue 12): hand-checked times, the share
solver's bounds, what a Pollux job observes, and that nothing changes when every node is fast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pollux.balance.balancers import equal_finish_split
from pollux.policy.registry import make_policy
from pollux.sim.balance import balanced_compute_time, slow_node_speeds
from pollux.sim.engine import ADAPTIVE, SimConfig, SimJob, simulate
from pollux.sim.profile_meta import AppMeta
from pollux.sim.profiles import load_profile
from pollux.sim.workload import WorkloadJob


def linear_profile(root: Path, meta: AppMeta | None = None):
    """Compute time 0.1 s per example (no constant part), 0.2 s of sync on two nodes; no gradient
    noise (gain = S). A 2-replica step at local batch 8 takes 0.8 + 0.2 = 1 s."""
    d = root / "toy"
    d.mkdir(parents=True)
    (d / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n1,4,0.4,0.0\n1,16,1.6,0.0\n"
        "11,4,0.6,0.2\n11,16,1.8,0.2\n")
    (d / "scalability.csv").write_text(
        "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,8,3.0,2.0\n")
    (d / "validation-8.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n60,60,0.5,0.0,1.0\n120,120,0.9,0.0,1.0\n")
    return load_profile(d, meta)


def test_slow_node_hand_checked_with_and_without_balancing(tmp_path):
    """A rigid 2-replica job (batch 16, local 8: 1 s steps, progress 2/s) on nodes of speed 1 and 0.5.

    Fast: 30 s start + 120/2 s of steps = 90 s. Unbalanced: compute 0.8/0.5 = 1.6 s, step 1.8 s →
    30 + 60·1.8 = 138 s. Balanced: compute 0.8/mean(1, 0.5) = 1.0667 s (shares 10.67 and 5.33, within
    the bounds 4..16), step 1.2667 s → 30 + 60·1.2667 = 106 s.
    """
    prof = {"toy": linear_profile(tmp_path)}
    jobs = [WorkloadJob("a", 0.0, "toy", 2, 16)]
    jct = {}
    for speeds, balance in [((), False), ((), True), ((1.0, 0.5), False), ((1.0, 0.5), True)]:
        cfg = SimConfig(num_nodes=2, gpus_per_node=1, node_speed=speeds, balance=balance)
        res = simulate(jobs, prof, make_policy("fifo"), cfg)
        jct[(speeds, balance)] = (res.policy, res.jobs[0].jct)
    assert jct[((), False)] == ("fifo", pytest.approx(90.0))
    assert jct[((), True)] == ("fifo+lbbsp", pytest.approx(90.0))       # no slow node: no change
    assert jct[((1.0, 0.5), False)] == ("fifo", pytest.approx(138.0))
    assert jct[((1.0, 0.5), True)] == ("fifo+lbbsp", pytest.approx(106.0))


def test_shares_equalise_time_and_respect_bounds():
    f = np.array([1.0, 1.0, 0.5, 0.25])
    x, tau = equal_finish_split(f, 0.0, 0.1, 4 * 8, 1, 100)
    assert x.sum() == pytest.approx(32) and np.allclose(0.1 * x / f, tau)
    assert tau == pytest.approx(0.8 / f.mean())                 # affine, unbounded: t(m) / mean speed
    # A fast replica capped at hi: the others carry the rest, all still finishing together.
    x, tau = equal_finish_split(f, 0.0, 0.1, 32, 1, 10)
    assert x.max() <= 10 + 1e-9 and x.sum() == pytest.approx(32)
    # A straggler held at lo sets the step time itself.
    x, tau = equal_finish_split(np.array([1.0, 0.01]), 0.0, 0.1, 16, 4, 16)
    assert x[1] == pytest.approx(4) and tau == pytest.approx(0.1 * 4 / 0.01)
    # With a constant part the common time follows t(m) / mean f too (no bound binding).
    x, tau = equal_finish_split(np.array([1.0, 0.5]), 0.3, 0.1, 16, 1, 100)
    assert tau == pytest.approx((0.3 + 0.8) / 0.75) and x.sum() == pytest.approx(16)
    with pytest.raises(ValueError, match="total"):
        equal_finish_split(f, 0.0, 0.1, 1000, 1, 10)


def test_balanced_time_lies_between_the_ideal_and_the_slowest():
    rng = np.random.default_rng(0)
    for _ in range(200):
        f = rng.uniform(0.1, 1.0, size=int(rng.integers(2, 9)))
        m = float(rng.integers(4, 64))
        a, b = rng.uniform(0, 0.5), rng.uniform(0.001, 0.05)
        t_m, t_half = a + b * m, a + b * m / 2
        got = balanced_compute_time(f, t_m, t_half, m, 1.0, 4 * m)
        assert t_m / f.mean() - 1e-9 <= got <= t_m / f.min() + 1e-9
        x, tau = equal_finish_split(f, a, b, f.size * m, 1.0, 4 * m)
        assert got == pytest.approx(tau) and x.sum() == pytest.approx(f.size * m)
        if np.all((x > 1.0 + 1e-9) & (x < 4 * m - 1e-9)):      # no bound binds: t(m) / mean speed
            assert got == pytest.approx(t_m / f.mean())
        else:                                                    # a straggler held at the minimum
            assert got == pytest.approx(float(np.max((a + b * x) / f)))
    # Equal shares forced (lo = hi = m): no gain; no slope in the profile: none either.
    f = np.array([1.0, 0.5])
    assert balanced_compute_time(f, 1.0, 0.5, 8, 8, 8) == pytest.approx(2.0)
    assert balanced_compute_time(f, 1.0, float("inf"), 8, 1, 64) == pytest.approx(1.0 / 0.75)
    assert balanced_compute_time(np.array([1.0, 1.0]), 1.0, 0.5, 8, 1, 64) == 1.0


def test_node_speed_settings_are_checked_naming_the_field():
    assert slow_node_speeds(4, 1, 0.5) == (0.5, 1.0, 1.0, 1.0)
    assert SimConfig(node_speed=slow_node_speeds(16, 4, 0.5)).speeds()[:5].tolist() == [0.5] * 4 + [1.0]
    assert SimConfig(num_nodes=3, node_speed=(0.5,)).speeds().tolist() == [0.5, 1.0, 1.0]
    for speeds, field in [((1.0, 0.0), "node_speed.1"), ((1.5,), "node_speed.0"),
                          ((float("nan"),), "node_speed.0"), ((1.0,) * 17, "node_speed")]:
        with pytest.raises(ValueError, match=rf"^{field}:"):
            SimConfig(node_speed=speeds)
    with pytest.raises(ValueError, match=r"^slow_nodes:"):
        slow_node_speeds(4, 5, 0.5)
    with pytest.raises(ValueError, match=r"^slow_factor:"):
        slow_node_speeds(4, 1, 0.0)


def test_pollux_job_observes_the_throughput_it_really_achieves(tmp_path):
    meta = AppMeta(name="toy", init_batch_size=8, max_batch_size=32, min_local_bsz=1, max_local_bsz=16,
                   epochs=2, optimizer="sgd", metric_higher_is_better=True)
    prof = linear_profile(tmp_path, meta)
    steps = {}
    for balance in (False, True):
        cfg = SimConfig(num_nodes=3, gpus_per_node=1, node_speed=(1.0, 0.5), balance=balance)
        job = SimJob(WorkloadJob("a", 0.0, "toy", 1, 8), prof, ADAPTIVE, cfg, 3)
        job.apply(np.array([1, 1, 0]), 30.0)
        job.advance(0.0, 60.0, 0.0)
        key = (2, 2, job.local_bsz)
        step, sync = prof.step_time([1, 1], job.local_bsz)
        compute = step - sync
        expected = compute / (0.75 if balance else 0.5) + sync
        assert job.records[key] == (pytest.approx(expected), pytest.approx(expected - sync))
        steps[balance] = job.records[key][0]
        # The job moves to two fast nodes with the same configuration: it re-measures and refits,
        # so the policy stops seeing the slow node's speed.
        fits = job.fits
        job.row = np.array([0, 1, 1])
        job.observe(step, sync, slowed=False)
        assert job.records[key] == (step, compute) and job.fits == fits + 1
        job.observe(step * 1.005, sync, slowed=False)              # within 1 %, not slowed: kept
        assert job.records[key] == (step, compute) and job.fits == fits + 1
    assert steps[True] < steps[False]


def test_without_slow_nodes_a_seen_configuration_is_never_refit(tmp_path):
    prof = linear_profile(tmp_path)
    job = SimJob(WorkloadJob("a", 0.0, "toy", 1, 8), prof, ADAPTIVE, SimConfig(num_nodes=2), 2)
    job.apply(np.array([1, 1]), 30.0)
    job.advance(0.0, 60.0, 0.0)
    key, fits = (2, 2, job.local_bsz), job.fits
    before = job.records[key]
    job.observe(before[0] * 2, 0.0)
    assert job.records[key] == before and job.fits == fits
