"""Weighted moments of the per-step gradient-statistics estimates (the standard errors behind
:class:`pollux.torch.decisions.Evidence`), kept by :class:`pollux.torch.grad_estimates.GradEstimates`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pollux.goodput.efficiency import EMA_DECAY


@dataclass(slots=True)
class Moments:
    """Weighted moments of the per-step (sqr, var) estimates, with the smoother's weights.

    Each estimate enters with weight ``1 − d`` (``d = 0.999 ** S``) and older ones decay by ``d``, as
    in ``GradNoiseState``; so ``s1 / w`` is the smoothed value and the standard error of that
    weighted mean is ``sqrt(variance / n_eff)`` with ``n_eff = w² / w2``.
    """

    w: float = 0.0
    w2: float = 0.0
    s1: tuple[float, float] = (0.0, 0.0)
    s2: tuple[float, float] = (0.0, 0.0)

    def update(self, x: tuple[float, float], scale: float) -> None:
        d = EMA_DECAY ** max(scale, 1e-12)
        a = 1.0 - d
        self.w = d * self.w + a
        self.w2 = d * d * self.w2 + a * a
        self.s1 = (d * self.s1[0] + a * x[0], d * self.s1[1] + a * x[1])
        self.s2 = (d * self.s2[0] + a * x[0] ** 2, d * self.s2[1] + a * x[1] ** 2)

    def standard_errors(self) -> tuple[float, float]:
        if self.w <= 0.0 or self.w2 <= 0.0:
            return math.inf, math.inf
        n_eff = self.w * self.w / self.w2
        if n_eff < 2.0:
            return math.inf, math.inf
        out = []
        for s1, s2 in zip(self.s1, self.s2, strict=True):
            mean = s1 / self.w
            variance = max(s2 / self.w - mean * mean, 0.0) * n_eff / (n_eff - 1.0)
            out.append(math.sqrt(variance / n_eff))
        return out[0], out[1]
