"""Build a policy by name: ``pollux``, ``tiresias``, ``optimus`` or ``fifo``."""

from __future__ import annotations

from typing import Any

from pollux.policy.base import Policy

POLICY_NAMES = ("pollux", "tiresias", "optimus", "fifo")


def make_policy(name: str, **options: Any) -> Policy:
    """A fresh policy instance; ``options`` go to its constructor (e.g. ``p=-1`` for pollux)."""
    if name == "pollux":
        from pollux.policy.pollux import PolluxPolicy
        return PolluxPolicy(**options)
    if name == "tiresias":
        from pollux.policy.tiresias import TiresiasPolicy
        return TiresiasPolicy(**options)
    if name == "optimus":
        from pollux.policy.optimus import OptimusPolicy
        return OptimusPolicy(**options)
    if name == "fifo":
        from pollux.policy.fifo import FifoPolicy
        return FifoPolicy(**options)
    raise ValueError(f"policy: unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
