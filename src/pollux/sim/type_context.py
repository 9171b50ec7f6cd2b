"""What a simulated job on a typed cluster (issue 13) knows about the cluster's GPU types.

A record of its own because three parts of a job read it: its true step times
(:mod:`pollux.sim.step_times`, the profile per type), its measurements (the bootstrap on every type,
:mod:`pollux.sim.measurements`) and the job itself (:mod:`pollux.sim.job`, the type it runs on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pollux.sim.profiles import AppProfile

__all__ = ["TypeContext"]


@dataclass(frozen=True)
class TypeContext:
    """What a job on a typed cluster needs: its application's profile per GPU type (a type missing
    here cannot run the job), the type index of every node, whether the policy is type-aware, and
    the bootstrap cost in GPU-seconds per type."""

    profiles: dict[str, AppProfile]
    type_names: tuple[str, ...]
    node_type: np.ndarray = field(repr=False)
    aware: bool = False
    bootstrap_s: float = 0.0
