"""What an oracle policy (Optimus) is told about a simulated elastic job, split from
:class:`pollux.sim.job.SimJob`.

Optimus is given what it assumes it can predict: the optimiser steps an elastic job has left at its
fixed global batch, and the job's true step time at each replica count on packed placements of the
machines the profiles were measured on. No other policy sees this.
"""

from __future__ import annotations

import math

import numpy as np

from pollux.policy.base import Oracle
from pollux.policy.placement import packed_shape
from pollux.sim.batch_config import fixed_batch_config
from pollux.sim.profiles import AppProfile

__all__ = ["PROFILE_GPUS_PER_NODE", "ElasticOracle"]

#: GPUs per node of the machines the profiles were measured on (the oracle's packed placements).
PROFILE_GPUS_PER_NODE = 4


class ElasticOracle:
    """One elastic job's oracle: its total steps to completion and its step-time table by replica
    count (built once per replica cap: it depends only on the fixed batch and the cap)."""

    def __init__(self, profile: AppProfile, batch_size: int) -> None:
        self.profile = profile
        self.batch_size = batch_size
        self.total_iters = profile.iterations_to_finish(batch_size)
        self._steps: np.ndarray | None = None

    def tell(self, iterations: float, max_replicas: int) -> Oracle:
        """The oracle of a job that has run ``iterations`` steps and may use up to ``max_replicas``."""
        remaining = max(self.total_iters - iterations, 0.0)
        if self._steps is None or self._steps.size != max_replicas + 1:
            meta = self.profile.meta
            steps = np.full(max_replicas + 1, np.inf)
            for r in range(1, max_replicas + 1):
                placement = packed_shape(r, PROFILE_GPUS_PER_NODE)
                _, m, s = fixed_batch_config(self.batch_size, r, meta.init_batch_size, meta.max_local_bsz)
                step, sync = self.profile.step_time(placement, m)
                if math.isfinite(step):
                    steps[r] = step + s * (step - sync)
            self._steps = steps
        return Oracle(remaining_iterations=remaining, step_time=self._steps)
