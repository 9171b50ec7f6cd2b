"""The policies Pollux knows, by name, with what each needs and schedules (like Ray Tune's registry).

Every list of policies elsewhere — the CLI's choices, the service's ``--policy``, the demo, the
simulator's job kinds — is derived from :data:`REGISTRY`, so adding a policy is one entry here and
one module beside this one.

Capabilities:

* ``job_kind`` — how the jobs it schedules behave: ``"adaptive"`` (the policy sets replicas *and* the
  job adapts its batch size: Pollux), ``"elastic"`` (replicas change, batch size fixed: Optimus) or
  ``"rigid"`` (the user's replicas and batch size: Tiresias, FIFO).
* ``needs_oracle`` — it reads :class:`pollux.policy.base.Oracle`, knowledge only a simulator has, so
  the live service cannot run it.
* ``type_aware`` — it reads per-GPU-type models (``JobView.type_models``); the others see a
  heterogeneous cluster as one pool of GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pollux.policy.base import Policy

JobKind = Literal["adaptive", "elastic", "rigid"]
ADAPTIVE: JobKind = "adaptive"
ELASTIC: JobKind = "elastic"
RIGID: JobKind = "rigid"


def _pollux(**options: Any) -> Policy:
    from pollux.policy.pollux import PolluxPolicy
    return PolluxPolicy(**options)


def _tiresias(**options: Any) -> Policy:
    from pollux.policy.tiresias import TiresiasPolicy
    return TiresiasPolicy(**options)


def _optimus(**options: Any) -> Policy:
    from pollux.policy.optimus import OptimusPolicy
    return OptimusPolicy(**options)


def _fifo(**options: Any) -> Policy:
    from pollux.policy.fifo import FifoPolicy
    return FifoPolicy(**options)


def _gavel(**options: Any) -> Policy:
    from pollux.policy.gavel import GavelPolicy
    return GavelPolicy(**options)


def _sia(**options: Any) -> Policy:
    from pollux.policy.sia import SiaPolicy
    return SiaPolicy(**options)


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """One registered policy: its name, a one-line summary, its capabilities and its factory."""

    name: str
    summary: str
    job_kind: JobKind
    needs_oracle: bool
    factory: Callable[..., Policy]
    #: Compared in ``pollux simulate`` when no ``--policy`` is given (the published comparison).
    default_compare: bool = True
    #: It reads ``JobView.type_models``/``type_limits`` (per-GPU-type models); callers fill them only
    #: for such policies. A type-unaware policy sees the cluster as one pool.
    type_aware: bool = False

    @property
    def live(self) -> bool:
        """Whether the live service can run it (it needs nothing only a simulator knows)."""
        return not self.needs_oracle


REGISTRY: dict[str, PolicyInfo] = {
    info.name: info for info in (
        PolicyInfo("pollux", "co-adaptive goodput optimisation (replicas, placement, batch size)",
                   ADAPTIVE, False, _pollux),
        PolicyInfo("tiresias", "two-dimensional least-attained-service queues, user's replicas",
                   RIGID, False, _tiresias),
        PolicyInfo("optimus", "Optimus+Oracle: greedy marginal-gain replicas from true step times",
                   ELASTIC, True, _optimus),
        PolicyInfo("fifo", "first come, first served with the user's replicas",
                   RIGID, False, _fifo, default_compare=False),
        PolicyInfo("gavel", "Gavel: max-sum-throughput GPU-type fractions by LP, rounds, user's replicas",
                   RIGID, False, _gavel, default_compare=False, type_aware=True),
        PolicyInfo("sia", "Sia: one (GPU type, count) per job by a goodput MILP, then placement",
                   ADAPTIVE, False, _sia, default_compare=False, type_aware=True),
    )
}

#: Every registered name, in registration order.
POLICY_NAMES: tuple[str, ...] = tuple(REGISTRY)


def policy_names(*, live: bool | None = None, compare: bool | None = None) -> tuple[str, ...]:
    """Registered names, optionally only those the live service can run / compared by default."""
    return tuple(n for n, info in REGISTRY.items()
                 if (live is None or info.live == live)
                 and (compare is None or info.default_compare == compare))


def policy_info(name: str) -> PolicyInfo:
    """The registry entry of ``name``; ``ValueError`` naming the choices if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"policy: unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}") \
            from None


def make_policy(name: str, **options: Any) -> Policy:
    """A fresh policy instance; ``options`` go to its constructor (e.g. ``p=-1`` for pollux)."""
    return policy_info(name).factory(**options)
