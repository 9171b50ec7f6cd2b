"""The agent's parts meet through small protocols and typed records (``pollux.torch.api``).

The context drives the model wrapper and the loaders through their public methods only, so a fake
of either is enough to test it; the real ``AdaptiveDataParallel`` and ``AdaptiveDataLoader`` provide
every member of their protocol; the loader's checkpoint keeps its format, and one written when the
batch configuration was a bare ``(K, m, s)`` still loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import pollux.torch as ptorch
from pollux.torch.api import BatchConfig, BatchLoader, ModelWrapper, StepInfo, SyncOutcome
from pollux.torch.checkpoint import CheckpointStore
from pollux.torch.context import (
    OOM_NOTE,
    AgentContext,
    get_context,
)
from pollux.torch.data import AdaptiveDataLoader
from pollux.torch.env import AgentEnv
from pollux.torch.parallel import AdaptiveDataParallel


class FakeWrapper:
    """Records the context's calls; answers ``finish_sync`` with a given outcome."""

    def __init__(self, outcome: SyncOutcome) -> None:
        self.outcome = outcome
        self.calls: list[str] = []
        self.stats_ready = False

    def begin_step(self, info: StepInfo) -> None:
        self.calls.append(f"begin {info.sid}")

    def finish_sync(self, info: StepInfo) -> SyncOutcome:
        self.calls.append(f"finish {info.sid}")
        return self.outcome

    def discard_gradients(self) -> None:
        self.calls.append("discard")

    def release_process_group(self) -> None:
        self.calls.append("release")


class FakeLoader:
    def __init__(self, user_max_local_bsz: int | None) -> None:
        self.user_max_local_bsz = user_max_local_bsz


def _members(protocol: type) -> list[str]:
    return sorted(n for n in vars(protocol) if not n.startswith("_"))


def test_the_real_parts_provide_their_protocols() -> None:
    wrapper, loader = _members(ModelWrapper), _members(BatchLoader)
    assert {"begin_step", "finish_sync", "discard_gradients", "release_process_group"} <= set(wrapper)
    assert "user_max_local_bsz" in loader
    for name in wrapper:
        assert hasattr(AdaptiveDataParallel, name), name
    for name in loader:
        if name != "init_batch_size":            # an instance attribute of the loader
            assert hasattr(AdaptiveDataLoader, name), name


@pytest.mark.parametrize("oom", [False, True])
def test_the_context_drives_a_wrapper_through_its_protocol(agent, oom: bool) -> None:
    ctx = AgentContext(AgentEnv())
    fake = FakeWrapper(SyncOutcome(reduced=True, oom=oom))
    ctx.adp = fake  # type: ignore[assignment]   # a fake with only what the context calls
    info = StepInfo(sid=ctx.new_sid(), replicas=1, micro_steps=1, local_bsz=8)
    ctx.begin_step(info)
    outcome = ctx.finish_step()
    assert outcome.oom is oom and info.finished and info.skipped is oom
    assert fake.calls == ["begin 0", "finish 0", *(["discard"] if oom else [])]
    ctx.close()


def test_the_oom_note_asks_the_loader_for_the_users_bound(agent, tmp_path: Path) -> None:
    ctx = AgentContext(AgentEnv(checkpoint_dir=str(tmp_path)))
    try:
        ctx.step = StepInfo(sid=0, replicas=1, micro_steps=1, local_bsz=8)
        ctx.active_loader = FakeLoader(user_max_local_bsz=8)  # type: ignore[assignment]
        assert ctx.note_oom_for_restart() is None            # the user's bound is not lowered
        assert not (tmp_path / OOM_NOTE).exists()
        ctx.active_loader = FakeLoader(user_max_local_bsz=None)  # type: ignore[assignment]
        assert ctx.note_oom_for_restart() == 6
        assert json.loads((tmp_path / OOM_NOTE).read_text())["max_local_bsz"] == 6
        assert ctx.oom_note() == 6
    finally:
        ctx.close()


class Indexed(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.tensor([float(i)]), torch.tensor(float(i))


def _job() -> tuple[AdaptiveDataParallel, AdaptiveDataLoader]:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    ptorch.init_process_group("gloo")
    adp = ptorch.AdaptiveDataParallel(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loader = ptorch.AdaptiveDataLoader(Indexed(), batch_size=8, shuffle=True, seed=1)
    loader.autoscale_batch_size(64, (1, 8), gradient_accumulation=True)
    return adp, loader


def test_the_loader_checkpoint_keeps_its_format(agent) -> None:
    _adp, loader = _job()
    assert loader.config == BatchConfig(1, 8, 0)
    for _ in loader:
        break
    state = loader.state_dict()
    assert state["config"] == [1, 8, 0] and isinstance(state["limits_key"], list)
    assert set(state) == {"sampler", "config", "limits_key", "oom_max_local", "last_decision"}
    loader.load_state_dict(json.loads(json.dumps(state)))   # what a checkpoint gives back
    assert loader.config == BatchConfig(1, 8, 0) and loader.state_dict() == state


def test_a_checkpoint_with_a_bare_config_tuple_still_loads(agent, tmp_path: Path) -> None:
    """A loader state written before the configuration was a ``BatchConfig``: a tuple, and only the
    keys of the oldest format (no limits, bound or last decision)."""
    CheckpointStore(tmp_path).save({
        "pollux_loader0": {"sampler": {"position": 16, "dataset_len": 64, "shuffle": True, "seed": 1},
                           "config": (1, 4, 1)},
        "pollux_epoch": {"epoch": 0},
    })
    agent.setenv("POLLUX_CHECKPOINT_DIR", str(tmp_path))
    _adp, loader = _job()
    assert get_context().registry.restored_from is not None
    assert loader.config == BatchConfig(1, 4, 1) and loader.sampler.position == 16
    assert loader.current_batch_size == 8 and loader.state_dict()["config"] == [1, 4, 1]
