"""The balancing API in one process: modes and their errors, the share state (resets, rescaling, the
balancer fed from gathered times, stragglers, checkpoint), the report in scalars and hints."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pollux.contract import ENV_BALANCE
from pollux.hints import validate_hints
from pollux.torch.api import BatchConfig
from pollux.torch.context import reset_context
from pollux.torch.data import AdaptiveDataLoader
from pollux.torch.parallel import AdaptiveDataParallel
from pollux.torch.shares import BalanceReport, LoaderBalance, parse_mode


def dataset(n: int = 64) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 3, generator=gen), torch.randn(n, generator=gen))


@pytest.mark.parametrize(("mode", "expected"), [("auto", "auto"), ("GPU", "gpu"), (" cpu ", "cpu"),
                                                ("off", None), (None, None)])
def test_parse_mode(mode: str | None, expected: str | None) -> None:
    assert parse_mode(mode) == expected


@pytest.mark.parametrize("mode", ["fast", "", 1, True])
def test_bad_mode_names_balance_and_the_choices(mode: object) -> None:
    with pytest.raises(ValueError, match=r"balance: expected one of 'auto', 'gpu', 'cpu', 'off'"):
        parse_mode(mode)


def test_loader_modes_and_env_default(agent: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(3, 1)
    AdaptiveDataParallel(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = AdaptiveDataLoader(dataset(), batch_size=8)
    assert not loader._balance.enabled                       # off by default
    with pytest.raises(ValueError, match="balance"):
        loader.balance_batches("sometimes")
    loader.balance_batches("cpu")
    assert loader._balance.enabled and loader._balance.algorithm == "cpu"
    loader.balance_batches(None)
    assert not loader._balance.enabled
    agent.setenv(ENV_BALANCE, "auto")
    assert AdaptiveDataLoader(dataset(), batch_size=8)._balance.enabled
    agent.setenv(ENV_BALANCE, "bogus")
    with pytest.raises(ValueError, match=ENV_BALANCE):
        AdaptiveDataLoader(dataset(), batch_size=8)


def test_one_replica_trains_unchanged_with_balancing_on(agent: pytest.MonkeyPatch) -> None:
    results = []
    for mode in (None, "auto"):
        reset_context()
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        adp = AdaptiveDataParallel(model, opt)
        loader = AdaptiveDataLoader(dataset(), batch_size=8, seed=1)
        loader.balance_batches(mode)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(adp(x).squeeze(1), y).backward()
            opt.step()
        assert not any(k.startswith("balance") for k in adp.to_scalars())
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert torch.equal(results[0], results[1])


def test_share_state_resets_rescales_and_balances(caplog: pytest.LogCaptureFixture) -> None:
    bal = LoaderBalance()
    bal.set_mode("cpu")
    cfg = BatchConfig(2, 12)
    assert bal.shares_for(cfg, 1, None) is None and bal.outgoing_time(2) == 0.0
    assert bal.outgoing_time(1) is None                       # one replica: nothing sent
    # step 1 is a warm-up; step 2's times arrive with step 3's packet; the first update of a
    # configuration pools FIRST_WINDOW_STEPS (2) steps
    bal.after_step(cfg, (12, 12), 0.5, None, 1, None, 0, 1.0)
    assert bal.prev_used is None
    bal.after_step(cfg, (12, 12), 0.012, None, 1, None, 0, 2.0)
    assert bal.outgoing_time(2) == 0.012
    bal.after_step(cfg, (12, 12), 0.012, (0.01, 0.02, 0.0, 0.0), 1, None, 0, 3.0)
    assert bal.shares is None and bal.window is not None and bal.window[2] == 1   # pooled, not judged
    with caplog.at_level(logging.INFO, logger="pollux.torch"):
        bal.after_step(cfg, (12, 12), 0.012, (0.01, 0.02, 0.0, 0.0), 1, None, 0, 4.0)
    assert bal.shares == (16, 8)
    assert "batch shares [12, 12] -> [16, 8]" in caplog.text
    assert 'balance {"config": [2, 12, 0]' in caplog.text
    rep = bal.report
    assert rep is not None and rep.mode == "cpu" and rep.shares == (16, 8) and rep.step_times == (0.01, 0.02)
    # the same replicas with a larger local batch keep the proportions; other replicas restart equal
    assert bal.shares_for(BatchConfig(2, 24), 1, None) == (32, 16)
    assert bal.shares_for(BatchConfig(3, 8), 1, None) is None
    # checkpoint
    bal.shares_for(BatchConfig(2, 24), 1, None)
    state = bal.state_dict()
    other = LoaderBalance()
    other.set_mode("cpu")
    other.load_state_dict(state)
    assert other.shares_for(BatchConfig(2, 24), 1, None) == bal.shares


def test_straggler_warning_names_the_replica(caplog: pytest.LogCaptureFixture) -> None:
    bal = LoaderBalance()
    bal.set_mode("cpu")
    cfg = BatchConfig(3, 8)
    bal.shares_for(cfg, 2, None)
    bal.warmup = 0
    bal.after_step(cfg, (8, 8, 8), 0.01, None, 2, None, 0, 1.0)
    bal.after_step(cfg, (8, 8, 8), 0.01, (0.01, 0.01, 1.0, 0, 0, 0), 2, None, 0, 2.0)   # pooled
    with caplog.at_level(logging.WARNING, logger="pollux.torch"):
        bal.after_step(cfg, (8, 8, 8), 0.01, (0.01, 0.01, 1.0, 0, 0, 0), 2, None, 0, 3.0)
    assert bal.report is not None and bal.report.stragglers == (2,)
    assert "replica 2 is a straggler" in caplog.text


def test_gpu_balancer_skips_times_of_shares_no_longer_in_force() -> None:
    bal = LoaderBalance()
    bal.set_mode("gpu")
    cfg = BatchConfig(2, 10)
    bal.shares_for(cfg, 1, None)
    bal.warmup = 0
    bal.after_step(cfg, (10, 10), 0.01, None, 1, None, 0, 1.0)
    for _ in range(4):                                        # D = 5 consistent observations
        bal.after_step(cfg, (10, 10), 0.01, (0.01, 0.02, 0, 0), 1, None, 0, 1.0)
    assert bal.shares is None
    bal.after_step(cfg, (10, 10), 0.01, (0.01, 0.02, 0, 0), 1, None, 0, 1.0)
    assert bal.shares == (15, 5)
    # the next packet measured (10, 10), which are no longer in force: ignored
    bal.after_step(cfg, (15, 5), 0.01, (0.01, 0.02, 0, 0), 1, None, 0, 1.0)
    assert bal.shares == (15, 5)


def test_cpu_window_pools_more_steps_while_the_shares_hold_and_skips_stale_times() -> None:
    """The CPU balancer's pooling window doubles after every update that kept the shares (up to
    BALANCE_WINDOW_MAX_S), falls back after a change, and the packet that still carries times of
    the old shares is not judged."""
    from pollux.torch.shares import BALANCE_WINDOW_MAX_S, BALANCE_WINDOW_S, FIRST_WINDOW_STEPS

    bal = LoaderBalance()
    bal.set_mode("cpu")
    cfg = BatchConfig(2, 10)
    bal.shares_for(cfg, 1, None)
    bal.warmup = 0
    assert bal.window_steps == FIRST_WINDOW_STEPS
    bal.after_step(cfg, (10, 10), 0.05, None, 1, None, 0, 1.0)
    windows = []
    for _ in range(20):                     # equal speeds: nothing moves, the window grows
        bal.after_step(cfg, (10, 10), 0.05, (0.05, 0.05, 0, 0), 1, None, 0, 1.0)
        windows.append(bal.window_s)
    assert bal.shares is None
    assert windows[0] == BALANCE_WINDOW_S and max(windows) == BALANCE_WINDOW_MAX_S
    assert windows == sorted(windows)
    for _ in range(4):                      # rank 1 becomes 3x slower: a move, the window falls back
        bal.after_step(cfg, (10, 10), 0.05, (0.05, 0.15, 0, 0), 1, None, 0, 1.0)
        if bal.shares is not None:
            break
    moved = bal.shares
    assert moved is not None and moved[0] > moved[1] and bal.window_s == BALANCE_WINDOW_S
    # the next packet still carries times measured at (10, 10): skipped, the shares stand
    bal.after_step(cfg, moved, 0.05, (0.05, 0.15, 0, 0), 1, None, 0, 1.0)
    assert bal.shares == moved and bal.window is None


def test_report_scalars_and_hints() -> None:
    rep = BalanceReport("gpu", (20, 12), (0.01, 0.011), 0.0105, (1,))
    assert rep.scalars() == {"balance_share0": 20.0, "balance_share1": 12.0, "balance_step_time0": 0.01,
                             "balance_step_time1": 0.011, "balance_predicted_step_time": 0.0105,
                             "balance_stragglers": 1.0}
    body = {"version": 1, "throughput": {"alpha_grad": 0.1, "beta_grad": 0.01, "alpha_local": 0.0,
                                         "beta_local": 0.0, "alpha_node": 0.0, "beta_node": 0.0,
                                         "gamma": 1.0},
            "grad": {"sqr": 1.0, "var": 1.0}, "init_batch_size": 32, "max_batch_size": 32,
            "local_bsz_bounds": [1, 32], "accumulation": False, "max_replicas_seen": 2, "progress": 0.0,
            "epoch": 0, "balance": rep.as_hints()}
    assert validate_hints(body)["balance"]["shares"] == [20, 12]


def test_shares_above_a_lowered_bound_are_split_again() -> None:
    bal = LoaderBalance()
    bal.set_mode("cpu")
    cfg = BatchConfig(2, 12)
    bal.shares_for(cfg, 1, None)
    bal.shares = (18, 6)
    assert bal.shares_for(cfg, 1, 13) == (13, 11)        # an out-of-memory error lowered hi to 13
    assert bal.shares_for(cfg, 1, 12) is None             # nothing but equal shares fits


def test_short_steps_are_pooled_before_an_update() -> None:
    """Steps of 5 ms are pooled until the slowest replica's time adds up to BALANCE_WINDOW_S (20 ms);
    the balancer then sees their mean."""
    bal = LoaderBalance()
    bal.set_mode("cpu")
    cfg = BatchConfig(2, 12)
    bal.shares_for(cfg, 1, None)
    bal.warmup = 0
    bal.after_step(cfg, (12, 12), 0.01, None, 1, None, 0, 1.0)
    times = [(0.0025, 0.005), (0.0025, 0.005), (0.0025, 0.004), (0.0025, 0.006)]
    for i, (a, b) in enumerate(times):
        assert bal.shares is None, i
        bal.after_step(cfg, (12, 12), 0.01, (a, b, 0.0, 0.0), 1, None, 0, 1.0)
    assert bal.shares == (16, 8) and bal.report is not None
    assert bal.report.step_times == pytest.approx((0.0025, 0.005))


def _run_cpu_balancer(per_sample: list[tuple[float, float]], steps_each: int, seed: int = 0,
                      level_shift: float | None = None) -> list[tuple[int, ...]]:
    """Drive a CPU LoaderBalance as the agent does (each step's times reach it one step late) on 2
    replicas of local batch 64 whose compute time is share × per-sample seconds (× 3 % noise); the
    per-sample seconds change every ``steps_each`` steps. Returns the shares of every step."""
    rng = np.random.default_rng(seed)
    bal = LoaderBalance()
    bal.set_mode("cpu")
    if level_shift is not None:
        bal.balancer.level_shift = level_shift  # type: ignore[union-attr]
    cfg = BatchConfig(2, 64)
    packet = None
    out = []
    for k in range(len(per_sample) * steps_each):
        a = per_sample[k // steps_each]
        shares = bal.shares_for(cfg, 1, None) or (64, 64)
        times = [x * s * float(np.exp(0.03 * rng.standard_normal())) for x, s in zip(shares, a, strict=True)]
        bal.after_step(cfg, shares, times[0], packet, 1, None, 0, float(k))
        packet = (*times, 0.0, 0.0)
        out.append(shares)
    return out


def _first_move_after(seq: list[tuple[int, ...]], at: int) -> tuple[int, tuple[int, ...]]:
    """(steps after ``at``, shares) of the first change of shares after step ``at``."""
    before = seq[at - 1]
    assert abs(before[0] / before[1] - 2.0) < 0.2, before      # settled at 2 : 1 first
    k = next(i for i in range(at, len(seq)) if seq[i] != before)
    return k - at, seq[k]


def test_cpu_balancer_takes_a_level_shift_from_the_measurement() -> None:
    """Steps long enough for one-step windows: when the slowdown moves from replica 1 to replica 0,
    the first move goes straight to the new balance point (1 : 2); with the predictions alone
    (level_shift infinite) it is a partial move, and the real one comes later."""
    speeds = [(0.0005, 0.001), (0.001, 0.0005)]        # rank 1 at half speed, then rank 0
    _, moved = _first_move_after(_run_cpu_balancer(speeds, 60), 60)
    assert abs(moved[1] / moved[0] - 2.0) < 0.2, moved
    _, partial = _first_move_after(_run_cpu_balancer(speeds, 60, level_shift=float("inf")), 60)
    assert partial[1] / partial[0] < 1.8, partial


def test_cpu_window_restarts_when_the_slowdown_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short steps, pooled in windows of several: the window does not mix steps of before and after
    the slowdown moved, so the move comes sooner than when it is pooled across the change
    (SHIFT_FACTOR infinite), and straight to the new balance point."""
    import pollux.torch.shares as shares_mod

    speeds = [(0.0001, 0.0002), (0.0002, 0.0001)]
    after, moved = _first_move_after(_run_cpu_balancer(speeds, 100), 100)
    assert abs(moved[1] / moved[0] - 2.0) < 0.2, moved
    monkeypatch.setattr(shares_mod, "SHIFT_FACTOR", float("inf"))
    pooled_after, _ = _first_move_after(_run_cpu_balancer(speeds, 100), 100)
    assert after <= 4 and pooled_after >= after + 3, (after, pooled_after)


def test_cpu_window_noise_does_not_restart_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal speeds with 3 % noise, long and short steps: no step counts as a shift of the replicas'
    relative speeds, and the shares stay (nearly) equal."""
    import pollux.torch.shares as shares_mod

    shifts: list[bool] = []
    real = shares_mod.speeds_shifted

    def spy(mean: np.ndarray, new: np.ndarray, factor: float) -> bool:
        shifts.append(real(mean, new, factor))
        return shifts[-1]

    monkeypatch.setattr(shares_mod, "speeds_shifted", spy)
    for a in (0.0005, 0.0001):
        seq = _run_cpu_balancer([(a, a)], 200, seed=3)
        assert all(abs(s[0] - s[1]) <= 4 for s in seq), sorted(set(seq))
    assert shifts and not any(shifts), (len(shifts), sum(shifts))
