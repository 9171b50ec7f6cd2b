"""The clairvoyant node schedule of one job (pollux.sim.scaling_bound): the dynamic programme is exact,
the bound holds for every schedule, and the rates are the profile's."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from pollux.goodput.efficiency import gain_of
from pollux.goodput.model import accumulation_plan, batch_candidates
from pollux.sim.profiles import load_profile
from pollux.sim.scaling_bound import bound_at, cheapest_schedule, epoch_rates, epoch_work, gpu_rates

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "pollux-osdi21" / "traces"

RESTART = 30.0
PROVISION = 120.0


Path_ = tuple[int, ...]


def brute_costs(rates: np.ndarray, work: np.ndarray, start: int) -> list[tuple[Path_, float, float]]:
    """(path, seconds, node-seconds) of every path, accounted here independently of the module."""
    out = []
    sizes = range(1, rates.shape[1])
    for path in itertools.product(sizes, repeat=rates.shape[0]):
        seconds = node_seconds = 0.0
        held = start
        for e, n in enumerate(path):
            if e == 0 or n != held:          # a start or a change: a restart; new nodes are billed early
                seconds += RESTART
                node_seconds += n * RESTART + PROVISION * max(0, n - held)
            seconds += work[e] / rates[e, n]
            node_seconds += n * work[e] / rates[e, n]
            held = n
        out.append((path, seconds, node_seconds))
    return out


def random_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    epochs, sizes = 5, 3
    rates = np.zeros((epochs, sizes + 1))
    # Rates grow with the size but less than linearly, as a job's do; costs of the order of the delays.
    rates[:, 1:] = np.sort(rng.uniform(0.5, 3.0, (epochs, sizes)), axis=1)
    work = rng.uniform(50.0, 400.0, epochs)
    return rates, work


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_dynamic_programme_is_exact(seed):
    rates, work = random_case(seed)
    every = brute_costs(rates, work, start=2)
    for weight in (0.1, 1.0, 3.0, 30.0):
        value, schedule = cheapest_schedule(rates, work, weight, start_nodes=2, restart_s=RESTART,
                                            provision_s=PROVISION)
        best = min(ns + weight * s for _, s, ns in every)
        assert value == pytest.approx(best, rel=1e-12)
        assert schedule.node_seconds + weight * schedule.completion_s == pytest.approx(value, rel=1e-12)
        path = {p: (s, ns) for p, s, ns in every}[schedule.nodes]
        assert path == pytest.approx((schedule.completion_s, schedule.node_seconds), rel=1e-12)
        # each epoch starts once the one before it has run (and the change's restart is paid within it)
        starts = schedule.starts
        assert starts[0] == 0.0 and len(starts) == len(schedule.nodes)
        assert all(a < b for a, b in itertools.pairwise(starts)) and starts[-1] < schedule.completion_s
        assert [n for _, n in schedule.change_times()] == [n for _, n in schedule.change_points()]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_schedule_within_the_limit_beats_the_bound(seed):
    rates, work = random_case(seed)
    every = brute_costs(rates, work, start=1)
    fastest = min(s for _, s, _ in every)
    slowest = max(s for _, s, _ in every)
    for limit in np.linspace(fastest, slowest, 7):
        within = [ns for _, s, ns in every if s <= limit]
        bound = bound_at(rates, work, limit, restart_s=RESTART, provision_s=PROVISION)
        assert bound.node_seconds_bound <= min(within) * (1 + 1e-12)
        assert bound.cheapest is not None
        assert bound.cheapest.completion_s <= limit
        assert bound.cheapest.node_seconds >= min(within) * (1 - 1e-12)
        # The grid of weights leaves the bound close to the true optimum on these small cases.
        assert bound.node_seconds_bound >= 0.8 * min(within)


def test_a_size_the_profile_cannot_run_is_never_chosen():
    rates, work = random_case(5)
    rates[:, 3] = 0.0
    _, schedule = cheapest_schedule(rates, work, 0.01, restart_s=RESTART, provision_s=PROVISION)
    assert 3 not in schedule.nodes
    assert math.isfinite(schedule.completion_s)


def rows_on(nodes: int, gpus_per_node: int) -> list[list[int]]:
    """Every placement (GPUs per node, each node used) on at most ``nodes`` nodes."""
    out = []
    for n in range(1, nodes + 1):
        out += [list(r) for r in itertools.combinations_with_replacement(range(1, gpus_per_node + 1), n)]
    return out


def direct_rates(profile, row: list[int]) -> np.ndarray:
    """The best progress rate of one placement in each epoch, one candidate at a time: the simulator's
    lookup of the row, or the (nodes, GPUs) interpolation where that is faster (the bound takes the
    faster)."""
    meta = profile.meta
    limits = meta.limits(accumulation=True)
    k = sum(row)
    best = np.zeros(meta.epochs)
    for batch in [*batch_candidates(k, limits)[0][0], min(meta.init_batch_size * k, meta.max_batch_size)]:
        total, local, accum, fits = (float(x) for x in accumulation_plan(batch, k, limits))
        if not fits:
            continue
        times = [step + accum * (step - sync)
                 for step, sync in (profile.step_time(row, local), profile.step_time_nk(len(row), k, local))
                 if math.isfinite(step)]
        if not times:
            continue
        for epoch in range(meta.epochs):
            stats = profile.grad_stats(epoch, total)
            rate = gain_of(total / meta.init_batch_size, stats.sqr, stats.var) / min(times)
            best[epoch] = max(best[epoch], rate)
    return best


@pytest.mark.skipif(not (TRACES / "deepspeech2").is_dir(), reason=f"shared data not found at {TRACES}")
def test_rates_are_the_best_placement_on_so_many_nodes():
    profile = load_profile(TRACES / "deepspeech2")
    meta = profile.meta
    rates = epoch_rates(profile, 2, 4)
    assert rates.shape == (meta.epochs, 3)
    assert np.all(rates[:, 0] == 0.0)
    for nodes in (1, 2):
        best = np.max([direct_rates(profile, row) for row in rows_on(nodes, 4)], axis=0)
        np.testing.assert_allclose(rates[:, nodes], best, rtol=1e-9)
    assert np.all(rates[:, 2] >= rates[:, 1])
    work = epoch_work(profile)
    assert work.sum() == pytest.approx(profile.completion_progress)


@pytest.mark.skipif(not (TRACES / "deepspeech2").is_dir(), reason=f"shared data not found at {TRACES}")
def test_gpu_rates_are_the_best_placement_of_so_many_gpus():
    profile = load_profile(TRACES / "deepspeech2")
    rates = gpu_rates(profile, 6, 4)                      # a cluster of 2 nodes, 6 GPUs used at most
    assert rates.shape == (profile.meta.epochs, 7)
    per_row = {tuple(row): direct_rates(profile, row) for row in rows_on(2, 4)}
    for k in range(1, 7):
        best = np.max([r for row, r in per_row.items() if sum(row) <= k], axis=0)
        np.testing.assert_allclose(rates[:, k], best, rtol=1e-9)
