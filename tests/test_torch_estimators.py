"""Gradient-noise estimators against the truth when the gradient moves between steps (SPEC §2).

The loss ``L = −w·(x + d_t)`` with ``x ~ N(g, diag σ²)`` per example and a shift ``d_t = ±δ`` that
flips sign at every optimiser step (δ orthogonal to g) is a linear loss whose optimum moves: the
per-example gradient is ``−(x + d_t)``, so at every step the true squared gradient is
``|g|² + |δ|²`` and the true variance (at batch M0) ``Σσ²/M0`` — but two consecutive gradients differ
by ``2δ``. The differenced single-replica estimator reads that drift as noise (its variance is
biased by ``2|δ|²``); the probe steps of an adaptive single replica (one step split into two
micro-batches at the same weights) are unbiased. Decisions must wait for the unbiased ones.
"""

from __future__ import annotations

import pytest
import torch

import pollux.torch as ptorch
from pollux.torch.context import ENV_REFIT_INTERVAL, reset_context
from pollux.torch.decisions import MIN_UNBIASED
from pollux.torch.env import POLLUX_VARS, TORCHRUN_VARS

DIM, SPLIT, M0 = 64, 40, 48


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch):
    for name in (*POLLUX_VARS, *TORCHRUN_VARS, ENV_REFIT_INTERVAL):
        monkeypatch.delenv(name, raising=False)
    reset_context()
    yield monkeypatch
    reset_context()


def problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    g = torch.randn(DIM, generator=gen, dtype=torch.float64) * 0.5
    sigma = torch.exp(torch.randn(DIM, generator=gen, dtype=torch.float64) * 0.6) * 1.5
    delta = torch.randn(DIM, generator=gen, dtype=torch.float64)
    delta -= (delta @ g) / (g @ g) * g                       # orthogonal to g
    true_var = float((sigma * sigma).sum()) / M0
    delta *= (1.5 * true_var) ** 0.5 / float(delta.norm())    # 2|δ|² = 3 × the true variance
    return g, sigma, delta


class Examples(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g, sigma, _ = problem()
        z = torch.randn(n, DIM, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
        self.x = (g + sigma * z).float()

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


class Drifting(torch.nn.Module):
    """``−w·(x + sign·δ)``, weights in two parameter groups; ``sign`` is set before each step."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.zeros(SPLIT))
        self.w2 = torch.nn.Parameter(torch.zeros(DIM - SPLIT))
        self.register_buffer("delta", problem()[2].float())
        self.sign = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.sign * self.delta
        return -(x[:, :SPLIT] @ self.w1 + x[:, SPLIT:] @ self.w2)


def run(steps: int, adaptive: bool) -> tuple[ptorch.AdaptiveDataParallel, ptorch.AdaptiveDataLoader]:
    torch.manual_seed(0)
    ptorch.init_process_group("gloo")
    model = Drifting()
    optimizer = torch.optim.SGD([{"params": [model.w1]}, {"params": [model.w2]}], lr=1e-3)
    adp = ptorch.AdaptiveDataParallel(model, optimizer)
    loader = ptorch.AdaptiveDataLoader(Examples(steps * M0), batch_size=M0, shuffle=True, seed=5)
    if adaptive:
        loader.autoscale_batch_size(8 * M0, local_bsz_bounds=(1, 8 * M0), gradient_accumulation=True)
    for _ in ptorch.remaining_epochs_until(1):
        for x in loader:
            model.sign = 1.0 if adp.steps % 2 == 0 else -1.0     # the same for both halves of a probe
            optimizer.zero_grad()
            adp(x).mean().backward()
            optimizer.step()
    return adp, loader


def truth() -> tuple[float, float]:
    g, sigma, delta = problem()
    return float(g @ g + delta @ delta), float((sigma * sigma).sum()) / M0


def test_the_differenced_estimator_is_biased_by_the_drift_and_drives_no_decision(agent) -> None:
    adp, _ = run(600, adaptive=False)
    _, true_var = truth()
    stats = adp.grad_stats
    assert adp.biased_stats and not adp.decision_ready
    # E[var] = true var + 2|δ|² = 4 × the truth; the estimate is far above it.
    assert stats.var == pytest.approx(4.0 * true_var, rel=0.2)
    assert stats.var > 2.5 * true_var


def test_probe_steps_measure_the_truth_on_one_replica(agent) -> None:
    agent.setenv(ENV_REFIT_INTERVAL, "1e9")      # one refit, before any decision is allowed
    adp, loader = run(1200, adaptive=True)
    true_sqr, true_var = truth()
    stats = adp.grad_stats
    assert not adp.biased_stats and adp.decision_ready
    assert loader.current_batch_size == M0        # no decision was taken at that one refit
    assert stats.var == pytest.approx(true_var, rel=0.2)
    assert stats.sqr == pytest.approx(true_sqr, rel=0.2)
    ev = adp.evidence()
    assert ev.count >= 2 * MIN_UNBIASED
    # The standard errors are honest: the truth lies within a few of them.
    assert abs(ev.var - true_var) < 4 * ev.se_var
    assert abs(ev.sqr - true_sqr) < 4 * ev.se_sqr + 1e-9


@pytest.mark.parametrize("m0", [12, 11])
def test_a_probe_step_makes_the_same_update_as_the_unsplit_step(agent, m0: int) -> None:
    """Probing changes the measurement, not the training: weights equal a non-adaptive run's."""
    finals = []
    for adaptive in (False, True):
        reset_context()
        torch.manual_seed(0)
        ptorch.init_process_group("gloo")
        model = torch.nn.Linear(DIM, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        adp = ptorch.AdaptiveDataParallel(model, optimizer)
        loader = ptorch.AdaptiveDataLoader(Examples(5 * m0), batch_size=m0, shuffle=True, seed=2)
        if adaptive:
            loader.autoscale_batch_size(4 * m0)
        probes = 0
        for x in loader:
            probes += int(adp.accumulating)
            optimizer.zero_grad()
            adp(x).pow(2).mean().backward()
            optimizer.step()
        assert adp.steps == 5
        assert probes == (5 if adaptive else 0)
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(finals[1], finals[0], rtol=1e-5, atol=1e-6)


class FakeBucket:
    """A DDP ``GradBucket`` stand-in: parameters laid out in ``order`` in one flat buffer."""

    def __init__(self, buffer: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
        self._buffer, self._params = buffer, params
        offsets, pos = [], 0
        for p in params:
            offsets.append(pos)
            pos += p.numel()
        self._grads = [buffer[o:o + p.numel()].view_as(p) for o, p in zip(offsets, params, strict=True)]

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0

    def parameters(self) -> list[torch.nn.Parameter]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        return self._grads


def test_a_rebuilt_bucket_at_the_same_address_gets_a_new_layout() -> None:
    """DDP rebuilds its buckets after the first iteration (gradient-ready order); the new buffer may
    reuse the old address. The layout must follow the parameters, not the address: a stale one put
    the Adam pre-conditioner on the wrong entries on one replica only, the replicas' statistics and
    progress diverged, and their collectives mismatched (a gloo abort on resume)."""
    from pollux.torch.gradstats import GradTracker

    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(5))
    tracker = GradTracker(torch.optim.Adam([a, b]), torch.device("cpu"), None)
    buf = torch.zeros(8)
    first = tracker.layout(FakeBucket(buf, [a, b]))
    assert [(off, n) for p, off, n, _ in first.spans] == [(0, 3), (3, 5)]
    rebuilt = tracker.layout(FakeBucket(buf, [b, a]))         # same buffer, reversed order
    spans = {id(p): (off, n) for p, off, n, _ in rebuilt.spans}
    assert spans[id(b)] == (0, 5) and spans[id(a)] == (5, 3)
    assert rebuilt is not first
