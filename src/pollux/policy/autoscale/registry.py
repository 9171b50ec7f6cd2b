"""The autoscaling rules by name, as :mod:`pollux.policy.registry` holds the scheduling policies.

Every rule here sizes a typed fleet too (``Fleet.pools``: a node count per GPU type, priced; see
:mod:`.typed_rule`): GPU types are a property of the fleet, not a separate rule, so ``goodput`` on
one pool and ``goodput`` on several are the same rule and agree where the two meet (one pool).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pollux.policy.autoscale.api import Autoscaler
from pollux.policy.autoscale.rules import FixedSize, ThresholdRule

__all__ = ["AUTOSCALERS", "autoscaler_names", "make_autoscaler"]


def _goodput(**options: Any) -> Autoscaler:
    return ThresholdRule(name="goodput", measure="goodput", **options)


def _throughput(**options: Any) -> Autoscaler:
    return ThresholdRule(name="throughput", measure="throughput", **options)


def _fixed(**options: Any) -> Autoscaler:
    return FixedSize(**options)


#: name → (summary, factory).
AUTOSCALERS: dict[str, tuple[str, Callable[..., Autoscaler]]] = {
    "goodput": ("grow while goodput per GPU is above 2/3 of ideal, to where it is 1/2 (thesis §3.5.4)",
                _goodput),
    "throughput": ("the same thresholds on a fixed batch per GPU's throughput (Or et al., MLSys'20)",
                   _throughput),
    "fixed": ("one size (nodes=N)", _fixed),
}


def autoscaler_names() -> list[str]:
    return list(AUTOSCALERS)


def make_autoscaler(name: str, **options: Any) -> Autoscaler:
    """The rule called ``name`` with ``options``; ValueError naming the choices for an unknown one."""
    if name not in AUTOSCALERS:
        raise ValueError(f"unknown autoscaler {name!r} (one of {', '.join(AUTOSCALERS)})")
    return AUTOSCALERS[name][1](**options)
