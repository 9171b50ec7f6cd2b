"""The GPU time a simulated job is charged (its GPU-hours), split from :class:`pollux.sim.job.SimJob`.

Three counts, kept apart because the results report them apart (:class:`pollux.sim.engine.JobResult`):
the GPU-seconds the job held (its attained service, which the policies also see), the same split by
GPU type on a typed cluster, and the GPU-seconds of its 1-GPU bootstrap profiles under a type-aware
policy (charged to its GPU-hours although it held no allocation then).
"""

from __future__ import annotations

import numpy as np

from pollux.sim.type_context import TypeContext

__all__ = ["GpuTime"]


class GpuTime:
    """One job's GPU-seconds: held in all (``attained``), held per type index (``type_gpu_s``) and
    spent on bootstrap profiles per type index (``bootstrap_gpu_s``)."""

    def __init__(self, ntypes: int) -> None:
        """``ntypes``: the cluster's GPU types (0 on an untyped cluster)."""
        self.attained = 0.0
        self.type_gpu_s = np.zeros(ntypes, dtype=np.float64)
        self.bootstrap_gpu_s = np.zeros(ntypes, dtype=np.float64)

    def hold(self, row: np.ndarray, dt: float, typed: TypeContext | None) -> None:
        """Charge ``dt`` seconds of the placement ``row`` (GPUs per node), per type on a typed cluster."""
        self.attained += int(row.sum()) * dt
        if typed is not None:
            self.type_gpu_s += np.bincount(typed.node_type, weights=row,
                                           minlength=self.type_gpu_s.size) * dt

    def charge_bootstrap_typed(self, typed: TypeContext) -> None:
        """Charge ``typed.bootstrap_s`` for every type the job has a profile for (it profiles each)."""
        for i, t in enumerate(typed.type_names):
            if typed.profiles.get(t) is not None:
                self.bootstrap_gpu_s[i] += typed.bootstrap_s

    def charge_bootstrap_untyped(self, gpu_s: float) -> None:
        """Charge ``gpu_s`` for the one bootstrap profile on an untyped cluster (one count, no types)."""
        self.bootstrap_gpu_s = np.array([gpu_s], dtype=np.float64)
