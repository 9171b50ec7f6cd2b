"""The smoothed gradient-noise statistics of one job, per parameter group (SPEC §2).

:class:`~pollux.torch.gradstats.GradTracker` measures the squared norms of each step; this module
turns one step's norms (a :class:`StepNorms`) into the unbiased (or, for one replica without
accumulation, differenced) estimates of (sqr, var), smooths them per parameter group, counts the
updates that decide when the statistics may drive a decision, and keeps the weighted moments behind
their standard errors (``Evidence``). It holds everything the tracker checkpoints: the per-step
measurements start afresh after a restart, the smoothed statistics must not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pollux.goodput import (
    GradNoiseState,
    GradStats,
    combine_groups,
    estimate_differenced,
    estimate_from_norms,
)
from pollux.goodput.efficiency import estimate_unequal
from pollux.torch.decisions import Evidence
from pollux.torch.moments import Moments

__all__ = ["GradEstimates", "StepNorms"]


@dataclass(slots=True)
class StepNorms:
    """A step's norms waiting for its local norms (reduced with the next step's first bucket).

    ``total`` holds the per-group squared norms of the reduced gradient; in the differenced mode
    ``prev`` and ``mean`` hold those of the previous step's gradient and of the two steps' mean.
    ``inv`` undoes the loss scaler (``1 / scale²``), ``scale`` is the step's nominal scale, and
    ``inv_size_mean``/``init_batch`` describe unequal shares (LB-BSP; None: equal micro-batches).
    """

    sid: int
    mode: str
    scale: float
    replicas: int
    micro_steps: int
    inv: float
    total: list[float]
    prev: list[float] | None
    mean: list[float] | None
    diff_valid: bool
    inv_size_mean: float | None = None
    init_batch: float = 1.0


class GradEstimates:
    """The smoothed (sqr, var) per parameter group, the update counts and the estimates' moments."""

    def __init__(self, num_groups: int) -> None:
        self.num_groups = num_groups
        self.states = [GradNoiseState() for _ in range(num_groups)]
        #: Groups with a gradient in some bucket: a group DDP never reduces has no statistics.
        self.measured = [False] * num_groups
        self.updates = 0
        self.unbiased_updates = 0
        self.moments = Moments()

    def mark_measured(self, groups: Iterable[int]) -> None:
        """Count these parameter groups in the statistics (a bucket holds their gradients)."""
        for gi in groups:
            self.measured[gi] = True

    def stats(self) -> GradStats:
        states = [s for s, seen in zip(self.states, self.measured, strict=True) if seen]
        return combine_groups(states)

    def add(self, rec: StepNorms, local: list[float] | None) -> None:
        """Turn one step's norms into (sqr, var) estimates and smooth them per parameter group."""
        inv, scale = rec.inv, rec.scale
        if rec.mode == "diff":
            if not rec.diff_valid:
                return
            assert rec.prev is not None and rec.mean is not None
            for gi in range(self.num_groups):
                if self.measured[gi]:
                    sqr, var = estimate_differenced(rec.prev[gi] * inv, rec.total[gi] * inv,
                                                    rec.mean[gi] * inv, scale)
                    self.states[gi] = self.states[gi].update(sqr, var, scale, biased=True)
            self.updates += 1
            return
        assert local is not None
        if not all(math.isfinite(v) for v in local):
            return
        n = rec.replicas * rec.micro_steps
        sum_sqr = sum_var = 0.0
        for gi in range(self.num_groups):
            if self.measured[gi]:
                if rec.inv_size_mean is None:
                    sqr, var = estimate_from_norms(local[gi] / n * inv, rec.total[gi] * inv, n, scale)
                else:       # unequal shares (LB-BSP): the size-weighted estimator
                    u_sqr, u_var = estimate_unequal(local[gi] / n * inv, rec.inv_size_mean,
                                                    rec.total[gi] * inv, rec.init_batch * scale,
                                                    rec.init_batch)
                    sqr, var = float(u_sqr), float(u_var)
                self.states[gi] = self.states[gi].update(sqr, var, scale)
                sum_sqr += sqr
                sum_var += var
        self.updates += 1
        if math.isfinite(sum_sqr) and math.isfinite(sum_var):
            self.unbiased_updates += 1
            self.moments.update((sum_sqr, sum_var), scale)

    def evidence(self) -> Evidence:
        """The smoothed statistics with standard errors from the spread of the recent estimates."""
        stats = self.stats()
        se_sqr, se_var = self.moments.standard_errors()
        return Evidence(sqr=stats.sqr, var=stats.var, se_sqr=se_sqr, se_var=se_var,
                        count=self.unbiased_updates, biased=self.unbiased_updates == 0)

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [s.to_dict() for s in self.states], "measured": list(self.measured),
                "updates": self.updates, "unbiased_updates": self.unbiased_updates,
                "moments": [self.moments.w, self.moments.w2, *self.moments.s1, *self.moments.s2]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = state["groups"]
        if len(groups) != self.num_groups:
            raise ValueError(f"gradient statistics saved for {len(groups)} parameter groups, the "
                             f"optimiser has {self.num_groups}")
        self.states = [GradNoiseState.from_dict(d) for d in groups]
        self.measured = [bool(x) for x in state.get("measured", [True] * self.num_groups)]
        self.updates = int(state.get("updates", 0))
        self.unbiased_updates = int(state.get("unbiased_updates", 0))
        mom = [float(v) for v in state.get("moments", [0.0] * 6)]
        self.moments = Moments(mom[0], mom[1], (mom[2], mom[3]), (mom[4], mom[5]))
