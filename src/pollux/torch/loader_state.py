"""The checkpointed state of an :class:`pollux.torch.data.AdaptiveDataLoader` as a typed record.

The loader saves and restores itself (``state_dict``/``load_state_dict``); this record is the format,
kept as it always was on disk: the sampler's state, the batch configuration as ``[K, m, s]``, the
batch limits it was chosen under, the upper local batch bound lowered by out-of-memory errors, and
the last decision. Checkpoints written before the configuration was a :class:`BatchConfig` (a list
or tuple there) load unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pollux.torch.api import BatchConfig
from pollux.torch.decisions import DecisionRecord


@dataclass(frozen=True, slots=True)
class LoaderCheckpoint:
    """What an ``AdaptiveDataLoader`` saves (see the module docstring)."""

    sampler: dict[str, Any]
    config: BatchConfig | None = None
    limits_key: tuple[Any, ...] | None = None
    oom_max_local: int | None = None
    last_decision: DecisionRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler,
                "config": None if self.config is None else self.config.to_list(),
                "limits_key": None if self.limits_key is None else list(self.limits_key),
                "oom_max_local": self.oom_max_local,
                "last_decision": None if self.last_decision is None else self.last_decision.to_dict()}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderCheckpoint:
        config, key, last = state["config"], state.get("limits_key"), state.get("last_decision")
        return cls(sampler=state["sampler"],
                   config=None if config is None else BatchConfig.from_seq(config),
                   limits_key=None if key is None else tuple(key),
                   oom_max_local=state.get("oom_max_local"),
                   last_decision=None if last is None else DecisionRecord.from_dict(last))
