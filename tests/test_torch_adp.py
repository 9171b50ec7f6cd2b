"""AdaptiveDataParallel and AdaptiveDataLoader in one process (a world of one over gloo).

LR scaling, progress and epochs, gradient accumulation, statistics modes, the Adam pre-conditioner,
AMP, out-of-memory recovery through fault injection, checkpoint-restart, hints.
"""

from __future__ import annotations

import http.server
import json
import logging
import math
import sys
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

import pollux.torch as ptorch
from pollux.goodput import AdaScale, SquareRoot, gain
from pollux.torch.api import BatchConfig
from pollux.torch.context import ENV_FAULT_OOM_ABOVE, ENV_REFIT_INTERVAL, get_context, reset_context
from pollux.torch.tuner import current_hints


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int, dim: int = 3, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=gen)
        self.y = self.x @ torch.arange(1.0, dim + 1.0) + 0.3 * torch.randn(n, generator=gen)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def make_job(n: int = 48, m0: int = 8, optimizer: str = "sgd", lr: float = 0.05, **adp_kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    ptorch.init_process_group("gloo")
    adp = ptorch.AdaptiveDataParallel(model, opt, **adp_kwargs)
    loader = ptorch.AdaptiveDataLoader(Indexed(n), batch_size=m0, shuffle=True, seed=1)
    return model, opt, adp, loader


def train_step(adp, opt, batch, scale_loss: float = 1.0) -> None:
    _, x, y = batch
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(adp(x).squeeze(1), y) * scale_loss
    loss.backward()
    opt.step()


# --------------------------------------------------------------------------------------------
# API edges
# --------------------------------------------------------------------------------------------


def test_iterable_dataset_is_rejected_with_a_clear_message(agent) -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from range(3)

    with pytest.raises(TypeError, match="map-style"):
        ptorch.AdaptiveDataLoader(Stream(), batch_size=2)
    with pytest.raises(TypeError, match="sampler"):
        ptorch.AdaptiveDataLoader(Indexed(4), batch_size=2, sampler=[0, 1])


def test_loader_needs_the_model_and_valid_limits(agent) -> None:
    loader = ptorch.AdaptiveDataLoader(Indexed(8), batch_size=4)
    with pytest.raises(RuntimeError, match="AdaptiveDataParallel"):
        next(iter(loader))
    with pytest.raises(ValueError, match="below the initial batch size"):
        loader.autoscale_batch_size(2)
    with pytest.raises(ValueError, match="exceeds"):
        loader.autoscale_batch_size(8, (4, 2))


def test_default_scaling_rules(agent) -> None:
    _, _, adp, _ = make_job()
    assert isinstance(adp.scaling_rule, AdaScale)
    reset_context()
    _, _, adp, _ = make_job(optimizer="adam")
    assert isinstance(adp.scaling_rule, SquareRoot)


# --------------------------------------------------------------------------------------------
# Epochs, progress, learning-rate scaling
# --------------------------------------------------------------------------------------------


def test_epochs_are_passes_at_scale_one(agent) -> None:
    _, opt, adp, loader = make_job(n=48, m0=8)
    seen = []
    for epoch in ptorch.remaining_epochs_until(3):
        assert ptorch.current_epoch() == epoch
        visits: Counter = Counter()
        for batch in loader:
            visits.update(batch[0].tolist())
            train_step(adp, opt, batch)
        assert sorted(visits) == list(range(48)) and set(visits.values()) == {1}
        seen.append(epoch)
    assert seen == [0, 1, 2] and ptorch.current_epoch() == 3
    assert adp.steps == 18 and adp.progress == 18.0 and adp.lr_factor == 1.0
    assert list(ptorch.remaining_epochs_until(3)) == []
    scalars = adp.to_scalars()
    for key in ("progress", "gain", "pgns", "grad_sqr", "grad_var", "batch_size", "local_bsz",
                "accum_steps", "lr_factor", "efficiency"):
        assert key in scalars
        assert math.isfinite(scalars[key]) or key == "pgns"


def test_scaling_rule_multiplies_the_learning_rate_during_the_step(agent) -> None:
    calls = []

    def rule(scale, stats, epoch=0.0):
        calls.append((scale, stats, epoch))
        return 2.5

    model, opt, adp, loader = make_job(lr=0.1, scaling_rule=rule)
    batch = next(iter(loader))
    _, x, y = batch
    opt.zero_grad()
    torch.nn.functional.mse_loss(adp(x).squeeze(1), y).backward()
    before = model.weight.detach().clone()
    grad = model.weight.grad.detach().clone()
    opt.step()
    assert torch.allclose(model.weight.detach(), before - 0.1 * 2.5 * grad, atol=1e-7)
    assert opt.param_groups[0]["lr"] == 0.1            # restored after the update
    assert adp.lr_factor == 2.5 and calls[0][0] == 1.0


def test_progress_grows_by_gain_at_larger_batches(agent) -> None:
    _, opt, adp, loader = make_job(n=64, m0=4)
    loader.autoscale_batch_size(64, (1, 8), gradient_accumulation=True)
    loader.tuner.config = BatchConfig(1, 8, 1)          # M = 16: S = 4 (as if chosen by the optimiser)
    loader.tuner.config_key = loader.tuner.limits_key()
    expected = 0.0
    micro = 0
    for batch in loader:
        micro += 1
        train_step(adp, opt, batch)
        if not adp.accumulating:
            stats = adp.grad_stats
            expected += float(gain(4.0, stats.sqr, stats.var))
            assert adp.lr_factor == pytest.approx(float(gain(4.0, stats.sqr, stats.var)))
            assert adp.progress == pytest.approx(expected)
        if adp.steps == 3:
            break
    assert micro == 6 and loader.current_batch_size == 16 and adp.scale == 4.0
    assert expected > 3.0                               # noise makes a bigger batch worth more


# --------------------------------------------------------------------------------------------
# Accumulation
# --------------------------------------------------------------------------------------------


def test_accumulation_is_one_full_batch_step(agent) -> None:
    model, opt, adp, loader = make_job(n=32, m0=8, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)   # created after the wrapper
    loader.autoscale_batch_size(8, (1, 2), gradient_accumulation=True)
    w0 = model.weight.detach().clone()
    b0 = model.bias.detach().clone()
    idx_seen = []
    it = iter(loader)
    for _ in range(4):                 # the user steps after every micro-batch, zeroing afterwards
        batch = next(it)
        idx_seen.extend(batch[0].tolist())
        _, x, y = batch
        torch.nn.functional.mse_loss(adp(x).squeeze(1), y).backward()
        opt.step()
        opt.zero_grad()
    it.close()
    assert loader.local_bsz == 2 and loader.accumulation_steps == 3 and adp.steps == 1
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    # Reference: one SGD step on the mean over micro-batches of their mean losses.
    ds = loader.dataset
    x, y = ds.x[idx_seen], ds.y[idx_seen]
    w = w0.clone().requires_grad_(True)
    b = b0.clone().requires_grad_(True)
    losses = [torch.nn.functional.mse_loss((x[i:i + 2] @ w.T).squeeze(1) + b, y[i:i + 2])
              for i in range(0, 8, 2)]
    torch.stack(losses).mean().backward()
    assert torch.allclose(model.weight.detach(), w0 - 0.1 * w.grad, atol=1e-6)
    assert torch.allclose(model.bias.detach(), b0 - 0.1 * b.grad, atol=1e-6)


def test_accumulation_and_a_per_iteration_schedule(agent) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    adp = ptorch.AdaptiveDataParallel(model, opt, sched)
    loader = ptorch.AdaptiveDataLoader(Indexed(16), batch_size=8)
    loader.autoscale_batch_size(8, (1, 4), gradient_accumulation=True)
    for batch in loader:
        train_step(adp, opt, batch)
        if not adp.accumulating:
            sched.step()                              # a per-iteration schedule
    assert adp.steps == 2 and sched.last_epoch == 2    # 4 micro-batches, 2 optimiser steps
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.25)
    assert "step" not in sched.state_dict()           # nothing of the agent leaks into its state


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


class NoiseLinear(torch.nn.Module):
    """L = −w·x with x ~ N(g, diag σ²): the per-example gradient distribution does not depend on w."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -(x @ self.w)


def noise_problem(n: int, dim: int = 32):
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(dim, generator=gen, dtype=torch.float64)
    sigma = torch.exp(0.5 * torch.randn(dim, generator=gen, dtype=torch.float64)) * 2.0
    x = (g + sigma * torch.randn(n, dim, generator=gen, dtype=torch.float64)).float()
    return g, sigma, torch.utils.data.TensorDataset(x)


def run_noise(m0: int, steps: int, accum_bound: int | None, optimizer: str = "sgd"):
    g, sigma, ds = noise_problem(m0 * steps)
    model = NoiseLinear(len(g))
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(), lr=1e-3)
    adp = ptorch.AdaptiveDataParallel(model, opt)
    loader = ptorch.AdaptiveDataLoader(ds, batch_size=m0, seed=4)
    if accum_bound is not None:
        loader.autoscale_batch_size(m0, (1, accum_bound), gradient_accumulation=True)
    for _ in ptorch.remaining_epochs_until(1):
        for (x,) in loader:
            opt.zero_grad()
            adp(x).mean().backward()
            opt.step()
    return g, sigma, model, opt, adp, loader


def test_one_replica_with_accumulation_measures_the_noise_scale(agent) -> None:
    g, sigma, _, _, adp, loader = run_noise(m0=32, steps=300, accum_bound=8)
    assert loader.accumulation_steps == 3 and not adp.biased_stats
    truth = float((sigma ** 2).sum() / (g ** 2).sum())
    assert adp.pgns == pytest.approx(truth, rel=0.15)
    assert adp.grad_stats.var == pytest.approx(float((sigma ** 2).sum()) / 32, rel=0.15)


def test_one_replica_without_accumulation_is_marked_biased(agent) -> None:
    _, _, _, _, adp, loader = run_noise(m0=16, steps=40, accum_bound=None)
    assert loader.accumulation_steps == 0 and adp.biased_stats
    assert math.isfinite(adp.grad_stats.var) and adp.grad_stats.var > 1e-6


def test_adam_preconditioner_follows_the_optimizer_state(agent) -> None:
    _, _, model, opt, adp, _ = run_noise(m0=16, steps=12, accum_bound=4, optimizer="adam")
    tracker = adp._tracker
    assert tracker.preconditioner.active
    state = opt.state[model.w]
    vhat = state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))
    expected = 1.0 / (vhat.sqrt() + 1e-8) ** 2
    assert torch.allclose(tracker.bucket_layouts.param_pc2[id(model.w)], expected, rtol=1e-5)
    assert not adp.biased_stats and math.isfinite(adp.pgns)


def test_amp_scaler_skips_nonfinite_steps(agent) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    adp = ptorch.AdaptiveDataParallel(model, opt, scaler=scaler)
    loader = ptorch.AdaptiveDataLoader(Indexed(48), batch_size=8, seed=1)
    loader.autoscale_batch_size(8, (1, 4), gradient_accumulation=True)
    trace = []
    for i, (_, x, y) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(adp(x).squeeze(1), y)
        if i == 5:                                    # overflow in the final micro-step of step 3
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)                              # no-ops on the non-final micro-steps
        scaler.update()
        trace.append((adp.steps, adp.progress, adp._tracker.updates, scaler.get_scale()))
    # Statistics of a step are finalised one step later (its local norms travel with the next step).
    assert trace[3][:3] == (2, 2.0, 1) and trace[5][:2] == (2, 2.0)      # skipped: no progress
    # The skipped step is closed by the loader at the next micro-batch: it delivers the previous
    # step's local norms (update 2) but yields no estimate of its own (still 2 after the next step).
    assert trace[5][2] == 1 and trace[6][2] == 2 and trace[7][2] == 2
    assert trace[4][3] == 1024.0 and trace[5][3] == 512.0                # the scaler backed off once
    assert len(trace) == 14 and trace[-1][:3] == (6, 6.0, 5)             # one more step for the epoch


def test_amp_statistics_are_unscaled(agent) -> None:
    results = []
    for use_scaler in (False, True):
        reset_context()
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0) if use_scaler else None
        adp = ptorch.AdaptiveDataParallel(model, opt, scaler=scaler)
        loader = ptorch.AdaptiveDataLoader(Indexed(48), batch_size=8, seed=1)
        loader.autoscale_batch_size(8, (1, 4), gradient_accumulation=True)
        for _, x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(adp(x).squeeze(1), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
        results.append(adp.grad_stats)
    assert results[1].sqr == pytest.approx(results[0].sqr, rel=1e-4)
    assert results[1].var == pytest.approx(results[0].var, rel=1e-4)


# --------------------------------------------------------------------------------------------
# Out-of-memory recovery (fault injection)
# --------------------------------------------------------------------------------------------


def test_injected_oom_lowers_the_bound_and_training_continues(agent, caplog) -> None:
    _, opt, adp, loader = make_job(n=64, m0=16)
    loader.autoscale_batch_size(64)                    # no upper local bound: OOM recovery is on
    adp.inject_oom(1)
    visits: Counter = Counter()
    with caplog.at_level(logging.INFO, logger="pollux.torch"):
        for batch in loader:
            train_step(adp, opt, batch)
            visits.update(batch[0].tolist())
    assert loader.max_local_bsz == 12                  # floor(16 × 0.75)
    assert loader.local_bsz <= 12 and loader.accumulation_steps >= 1
    assert adp.steps == 4 and adp.progress == 4.0      # the failed step was redone, not lost
    # Every example once, except the failed step's 16: seen by the failed step, then by its redo.
    assert sorted(visits) == list(range(64))
    assert sorted(Counter(visits.values()).items()) == [(1, 48), (2, 16)]
    assert "out of memory" in caplog.text and "lowered to 12" in caplog.text


def test_oom_above_a_limit_converges_below_it(agent) -> None:
    agent.setenv(ENV_FAULT_OOM_ABOVE, "5")
    _, opt, adp, loader = make_job(n=64, m0=16)
    loader.autoscale_batch_size(64, (None, None))
    for batch in loader:
        train_step(adp, opt, batch)
    assert loader.max_local_bsz == 4 and loader.local_bsz <= 5    # 16 → 12 → 9 → 6 → 4
    assert adp.progress == 4.0


def test_oom_with_a_user_bound_is_not_swallowed(agent) -> None:
    _, opt, adp, loader = make_job(n=64, m0=16)
    loader.autoscale_batch_size(64, (1, 16))
    adp.inject_oom(1)   # injection only acts where recovery applies: nothing happens here
    for batch in loader:
        train_step(adp, opt, batch)
    assert adp.steps == 4 and loader.max_local_bsz == 16


# --------------------------------------------------------------------------------------------
# Checkpoint-restart in one process
# --------------------------------------------------------------------------------------------


def run_training(epochs: int, stop_at_step: int | None = None):
    model, opt, adp, loader = make_job(n=40, m0=8)
    counter = Counter()

    class Counts:
        def state_dict(self):
            return dict(counter)

        def load_state_dict(self, state):
            counter.update(state)

    restored = ptorch.register_state("visits", Counts())
    for _ in ptorch.remaining_epochs_until(epochs):
        for batch in loader:
            train_step(adp, opt, batch)
            counter.update(batch[0].tolist())
            if adp.steps == stop_at_step:
                get_context().sigterm_requested = True     # what the SIGTERM handler does
    return model, adp, counter, restored


def test_sigterm_checkpoint_and_resume(agent, tmp_path: Path) -> None:
    ref_model, ref_adp, _, _ = run_training(3)
    ref = {k: v.clone() for k, v in ref_model.state_dict().items()}
    reset_context()
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        run_training(3, stop_at_step=7)                # mid-epoch 1 (5 steps per epoch)
    assert exc.value.code == 143
    reset_context()
    model, adp, counter, restored = run_training(3)
    assert restored
    assert adp.steps == 15 and adp.progress == ref_adp.progress == 15.0
    assert all(c == 3 for c in counter.values()) and len(counter) == 40
    for k, v in model.state_dict().items():
        assert torch.allclose(v, ref[k], atol=1e-6)
    # A finished job restarts with nothing left to do.
    reset_context()
    _, adp, _, _ = run_training(3)
    assert adp.steps == 15


def test_without_checkpoint_dir_a_second_run_starts_fresh(agent) -> None:
    run_training(1)
    reset_context()
    _, adp, _, restored = run_training(1)
    assert not restored and adp.steps == 5 and get_context().registry.restored_from is None


# --------------------------------------------------------------------------------------------
# Refit and hints
# --------------------------------------------------------------------------------------------


class _HintsHandler(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def test_the_agent_reporter_is_built_from_the_pollux_variables(agent) -> None:
    """The replica's hint reporter comes from POLLUX_SCHEDULER_URL, POLLUX_JOB_ID, POLLUX_JOB_TOKEN."""
    agent.setenv("POLLUX_SCHEDULER_URL", "http://127.0.0.1:8080")
    agent.setenv("POLLUX_JOB_ID", "a/b")
    agent.setenv("POLLUX_JOB_TOKEN", "tok")
    reporter = get_context().reporter
    assert reporter.enabled and reporter.token == "tok"
    assert reporter.endpoint == "http://127.0.0.1:8080/v1/jobs/a%2Fb/hints"
    reset_context()
    agent.delenv("POLLUX_SCHEDULER_URL")
    assert not get_context().reporter.enabled          # no scheduler: reporting is off
    reset_context()
    agent.setenv("POLLUX_SCHEDULER_URL", "http://h:1")
    agent.delenv("POLLUX_JOB_TOKEN")
    reporter = get_context().reporter
    assert reporter.enabled and reporter.token is None


def test_periodic_refit_chooses_batches_and_reports_hints(agent, caplog) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _HintsHandler)
    _HintsHandler.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        agent.setenv("POLLUX_SCHEDULER_URL", f"http://127.0.0.1:{server.server_address[1]}")
        agent.setenv("POLLUX_JOB_ID", "job-1")
        agent.setenv("POLLUX_JOB_TOKEN", "tok")
        agent.setenv("POLLUX_GPU_TYPE", "aws")          # a node of a typed cluster (issue 13)
        agent.setenv(ENV_REFIT_INTERVAL, "0")
        _, opt, adp, loader = make_job(n=512, m0=8)
        loader.autoscale_batch_size(128, (1, 32), gradient_accumulation=True)
        with caplog.at_level(logging.INFO, logger="pollux.torch"):
            for batch in loader:
                train_step(adp, opt, batch)
        ctx = get_context()
        assert ctx.fit_params is not None and len(ctx.profiler) >= 1
        hints = loader.hints()
        assert hints["init_batch_size"] == 8 and hints["max_batch_size"] == 128
        assert hints["local_bsz_bounds"] == [1, 32] and hints["accumulation"] is True
        # What the job runs now, and the profiler's own mean step time of it on these nodes (issue 35).
        config = loader.tuner.config
        measured = ctx.profiler.step_time(ctx.nodes, config.replicas, config.local_bsz, config.accum_steps)
        assert measured is not None and measured[0] > 0
        assert hints["current"] == {"replicas": config.replicas, "local_bsz": config.local_bsz,
                                    "accum_steps": config.accum_steps, "batch_size": config.batch_size,
                                    "step_time": measured[0], "steps": measured[1]}
        assert ctx.reporter.flush(10)
    finally:
        server.shutdown()
        server.server_close()
    assert _HintsHandler.received
    path, auth, body = _HintsHandler.received[-1]
    assert path == "/v1/jobs/job-1/hints" and auth == "Bearer tok"
    assert body["version"] == 3 and set(body["throughput"]) >= {"alpha_grad", "gamma"}
    assert body["gpu_type"] == "aws"
    # Every report names the configuration it ran; the profiler times steps only after a warm-up, so
    # the early ones have no step time yet, and the last one has.
    assert all(sent["current"]["replicas"] == 1 for _, _, sent in _HintsHandler.received)
    assert body["current"]["step_time"] > 0 and body["current"]["steps"] >= 1
    assert "batch size 8 (local 8 x 1" in caplog.text


def test_current_hints_describe_only_the_configuration_running_here() -> None:
    """``current`` is the configuration on the current replicas, timed where the profiler timed it on
    the current nodes; a zero mean (a clock too coarse) is no measurement."""
    asked = []
    times = {(2, 2, 16, 1): (0.25, 7), (2, 2, 8, 0): (0.0, 3)}

    def step_time(nodes, replicas, local_bsz, accum_steps=0):
        asked.append((nodes, replicas, local_bsz, accum_steps))
        return times.get((nodes, replicas, local_bsz, accum_steps))

    ctx = SimpleNamespace(replicas=2, nodes=2, profiler=SimpleNamespace(step_time=step_time))
    assert current_hints(ctx, BatchConfig(2, 16, 1)) == {"replicas": 2, "local_bsz": 16, "accum_steps": 1,
                                                         "batch_size": 64, "step_time": 0.25, "steps": 7}
    assert asked == [(2, 2, 16, 1)]
    assert current_hints(ctx, BatchConfig(2, 8, 0)) == {"replicas": 2, "local_bsz": 8, "accum_steps": 0,
                                                        "batch_size": 16}
    untimed = current_hints(ctx, BatchConfig(2, 4, 0))          # never timed here
    assert untimed == {"replicas": 2, "local_bsz": 4, "accum_steps": 0, "batch_size": 8}
    assert current_hints(ctx, None) is None                   # before the first iteration
    assert current_hints(ctx, BatchConfig(3, 16, 1)) is None   # resized: that configuration ran elsewhere


def test_fatal_oom_is_remembered_for_the_restart(agent, tmp_path: Path) -> None:
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    _, _, _, loader = make_job(n=64, m0=16)
    loader.autoscale_batch_size(64)
    it = iter(loader)
    next(it)
    exc = torch.OutOfMemoryError("CUDA out of memory (in the backward pass)")
    sys.excepthook(type(exc), exc, None)        # what an uncaught error does on its way out
    it.close()
    assert json.loads((tmp_path / "pollux-oom.json").read_text())["max_local_bsz"] == 12
    reset_context()
    _, _, _, loader = make_job(n=64, m0=16)
    loader.autoscale_batch_size(64)
    assert loader.max_local_bsz == 12 and loader.local_bsz <= 12
