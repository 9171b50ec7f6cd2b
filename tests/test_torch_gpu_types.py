"""The agent on a heterogeneous cluster (issue 13): a profile per GPU type across restarts.

A job checkpointed on one GPU type and restarted on another (the service moved it) starts a fresh
throughput profile there — step times measured on a T4 say nothing exact about an A100 — keeps the
old type's records and fit aside, reports both in its hints (schema v2 ``gpu_type`` and ``types``),
and gets the old profile back when it returns. Its training progress carries over unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pollux.torch as ptorch
from pollux.hints import hints_to_type_models, validate_hints
from pollux.torch.context import ENV_REFIT_INTERVAL, get_context, reset_context


def _job():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ptorch.init_process_group("gloo")
    adp = ptorch.AdaptiveDataParallel(model, opt)
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(96, 3, generator=gen), torch.randn(96, generator=gen))
    loader = ptorch.AdaptiveDataLoader(data, batch_size=8, shuffle=True, seed=1)
    loader.autoscale_batch_size(64, (1, 16))
    return opt, adp, loader


def _epoch(opt, adp, loader) -> None:
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(adp(x).squeeze(1), y).backward()
        opt.step()


def test_a_profile_per_gpu_type_across_restarts(agent: pytest.MonkeyPatch, tmp_path: Path) -> None:
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    agent.setenv(ENV_REFIT_INTERVAL, "0")
    agent.setenv("POLLUX_GPU_TYPE", "t4")
    opt, adp, loader = _job()
    _epoch(opt, adp, loader)
    ctx = get_context()
    t4_fit, t4_records, progress = ctx.fit_params, len(ctx.profiler), adp.progress
    assert t4_fit is not None and t4_records > 0
    body = loader.hints()
    assert body is not None and body["gpu_type"] == "t4" and "types" not in body   # nothing else yet
    ctx.save_checkpoint("test")

    # Moved to an A100 node: a fresh profile there, the T4 one kept aside, progress unchanged.
    reset_context()
    agent.setenv("POLLUX_GPU_TYPE", "a100")
    opt, adp, loader = _job()
    ctx = get_context()
    assert ctx.env.gpu_type == "a100" and ctx.fit_params is None and len(ctx.profiler) == 0
    assert set(ctx.other_types) == {"t4"} and ctx.other_types["t4"]["fit"] == t4_fit.to_dict()
    assert adp.progress == pytest.approx(progress)
    _epoch(opt, adp, loader)
    body = loader.hints()
    assert body is not None and body["gpu_type"] == "a100" and set(body["types"]) == {"t4"}
    models, _ = hints_to_type_models(validate_hints(body))
    assert set(models) == {"t4", "a100"}
    assert models["t4"].throughput_params == t4_fit
    a100_fit = get_context().fit_params
    assert a100_fit is not None
    get_context().save_checkpoint("test")

    # Back on a T4: its own profile returns, the A100 one goes aside.
    reset_context()
    agent.setenv("POLLUX_GPU_TYPE", "t4")
    opt, adp, loader = _job()
    ctx = get_context()
    assert ctx.fit_params == t4_fit and len(ctx.profiler) == t4_records
    assert set(ctx.other_types) == {"a100"} and ctx.other_types["a100"]["fit"] == a100_fit.to_dict()


def test_untyped_jobs_keep_one_profile(agent: pytest.MonkeyPatch, tmp_path: Path) -> None:
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    agent.setenv(ENV_REFIT_INTERVAL, "0")
    opt, adp, loader = _job()
    _epoch(opt, adp, loader)
    fit = get_context().fit_params
    body = loader.hints()
    assert body is not None and "gpu_type" not in body and "types" not in body
    get_context().save_checkpoint("test")
    reset_context()
    _job()
    ctx = get_context()
    assert ctx.fit_params == fit and ctx.other_types == {}
