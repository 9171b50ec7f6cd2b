"""Checkpointed state of an :class:`pollux.torch.data.AdaptiveDataLoader` (its sampler and the batch
configuration chosen so far)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pollux.torch.decisions import DecisionRecord

if TYPE_CHECKING:
    from pollux.torch.data import AdaptiveDataLoader


class _LoaderState:
    def __init__(self, loader: AdaptiveDataLoader) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        ld = self.loader
        return {"sampler": ld.sampler.state_dict(),
                "config": None if ld._config is None else list(ld._config),
                "limits_key": None if ld._config_key is None else list(ld._config_key),
                "oom_max_local": ld._oom_max_local,
                "last_decision": None if ld._last_decision is None else ld._last_decision.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ld = self.loader
        ld.sampler.load_state_dict(state["sampler"])
        ld._config = None if state["config"] is None else tuple(int(v) for v in state["config"])
        key = state.get("limits_key")
        ld._config_key = None if key is None else tuple(key)
        ld._oom_max_local = state.get("oom_max_local")
        last = state.get("last_decision")
        ld._last_decision = None if last is None else DecisionRecord.from_dict(last)

