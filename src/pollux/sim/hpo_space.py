"""The search space of the HPO replay and its synthetic objective surface (issue 37, part 2).

The thesis (§3.5.5, Table 3.3) tunes ResNet-18 on CIFAR-10 over the learning rate and its annealing,
the momentum, the weight decay and the network width. Training 100 real trials is what the simulator
replaces, so the accuracy a trial reaches is a fixed, documented function of its hyper-parameters
(:meth:`Surface.final_accuracy`) instead of a measurement. It has one good region, around the usual
recipe for this model (SGD, learning rate 0.1, momentum 0.9, weight decay 5e-4, cosine annealing to
about 1 % of the initial rate, 64–128 base channels), and falls smoothly away from it:

``accuracy = FLOOR + (PEAK - FLOOR) * exp(-d² / 2)``, ``d² = Σ_k ((x_k - opt_k) / scale_k)²``

over coordinates ``x_k`` in which the effect is roughly symmetric (decades for the rates, octaves for
the width). The learning rate enters through the *effective* rate ``lr / (1 - momentum)``, the
quantity SGD with momentum actually steps by, so the two interact as they do in practice. ``PEAK`` is
a little above the thesis's best trials (95.5 %), ``FLOOR`` is chance for ten classes.

Intermediate values (what a pruner judges) follow a learning curve over the epochs
(:meth:`Surface.curve`): a saturating rise to the final accuracy whose pace depends on the effective
learning rate (a large rate climbs faster early, whatever it reaches at the end), plus per-epoch
evaluation noise. Early values are thus informative but not a perfect ranking: a median pruner can
be fooled, as a real one can. Every trial also has a run-to-run noise on its final accuracy (seed
noise of a real training run); both noises come from a generator seeded by the study's seed and the
trial's number, so a replay is exactly repeatable.

The width changes the accuracy only: there is one measured profile (the standard ResNet-18), so every
trial runs at its speed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

__all__ = ["CURVE_TAU", "EPOCH_NOISE", "FLOOR", "PEAK", "RUN_NOISE", "SPACE", "Dimension", "Surface",
           "TrialCurve"]

#: Accuracy at the optimum of the surface (before a run's noise).
PEAK = 0.960
#: Accuracy far from it: chance for ten classes.
FLOOR = 0.10
#: Standard deviation of a trial's final accuracy around the surface (seed noise of one training run).
RUN_NOISE = 0.002
#: Standard deviation of an intermediate (per-epoch) validation accuracy around the learning curve.
EPOCH_NOISE = 0.01
#: Time constant of the learning curve, as a fraction of the training, at the optimal learning rate.
CURVE_TAU = 0.15


@dataclass(frozen=True)
class Dimension:
    """One hyper-parameter: its range, whether it is searched on a log scale, and where the surface
    peaks along it and how wide that peak is, in the coordinate the surface uses (``log10`` for a
    log-scale parameter, ``log2`` for the width, the value itself otherwise)."""

    name: str
    low: float
    high: float
    log: bool
    optimum: float
    scale: float
    integer: bool = False
    step: int = 1

    def distribution(self) -> BaseDistribution:
        """The Optuna distribution a sampler draws this parameter from."""
        if self.integer:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=self.step)
        return FloatDistribution(self.low, self.high, log=self.log)

    def contains(self, value: float) -> bool:
        return bool(self.low <= value <= self.high)


#: The thesis's five hyper-parameters. Ranges are the ones a practitioner would search for
#: ResNet-18 on CIFAR-10 (``lr_final_ratio``: the learning rate left at the end of the annealing, as a
#: fraction of the initial one; ``width``: the base channels, 64 in the standard model).
#: ``optimum`` and ``scale`` are in the surface's coordinates (see the module docstring); one
#: ``scale`` away from the optimum the accuracy has lost about 40 % of its range (``exp(-1/2)``).
#: They are chosen, not fitted to measurements: the learning rate matters most (0.75 decades of the
#: effective rate ``lr / (1 - momentum)``, whose optimum 1.0 is lr 0.1 at momentum 0.9), the width
#: least (4 octaves: the narrowest net loses about a quarter).
SPACE: tuple[Dimension, ...] = (
    Dimension("lr", 1e-3, 1.0, log=True, optimum=0.0, scale=0.75),
    Dimension("lr_final_ratio", 1e-4, 1.0, log=True, optimum=-2.0, scale=1.5),
    Dimension("momentum", 0.5, 0.99, log=False, optimum=0.9, scale=0.2),
    Dimension("weight_decay", 1e-5, 1e-2, log=True, optimum=math.log10(5e-4), scale=1.0),
    Dimension("width", 16, 128, log=False, optimum=7.0, scale=4.0, integer=True, step=16),
)


def distributions() -> dict[str, BaseDistribution]:
    """``{name: distribution}`` of :data:`SPACE`, for ``study.ask``."""
    return {d.name: d.distribution() for d in SPACE}


@dataclass(frozen=True)
class TrialCurve:
    """One trial's validation accuracy after each epoch (``values[e]`` after epoch ``e + 1``).

    ``final`` is the accuracy at the end of training (the objective told to the study); it is the
    last entry of ``values``.
    """

    values: np.ndarray
    final: float
    surface_value: float


class Surface:
    """The fixed synthetic objective over :data:`SPACE` and the learning curve of a trial."""

    def __init__(self, space: tuple[Dimension, ...] = SPACE) -> None:
        self.space = space
        self._by_name = {d.name: d for d in space}

    def check(self, params: Mapping[str, float]) -> None:
        """Every parameter of the space, in range (``ValueError`` naming the first that is not)."""
        for d in self.space:
            if d.name not in params:
                raise ValueError(f"params: missing {d.name!r}")
            value = float(params[d.name])
            if not (math.isfinite(value) and d.contains(value)):
                raise ValueError(f"params: {d.name} = {params[d.name]!r} outside [{d.low}, {d.high}]")

    def coordinates(self, params: Mapping[str, float]) -> dict[str, float]:
        """Each parameter in the coordinate the surface is symmetric in (the learning rate as the
        decade of the effective rate)."""
        self.check(params)
        out: dict[str, float] = {}
        for d in self.space:
            value = float(params[d.name])
            if d.name == "lr":
                out[d.name] = math.log10(value / (1.0 - float(params["momentum"])))
            elif d.name == "width":
                out[d.name] = math.log2(value)
            elif d.log:
                out[d.name] = math.log10(value)
            else:
                out[d.name] = value
        return out

    def distance2(self, params: Mapping[str, float]) -> float:
        """Squared scaled distance from the optimum (0 at the best hyper-parameters)."""
        coords = self.coordinates(params)
        return float(sum(((coords[d.name] - d.optimum) / d.scale) ** 2 for d in self.space))

    def final_accuracy(self, params: Mapping[str, float]) -> float:
        """Accuracy at the end of training, before the run's noise: the surface itself."""
        return FLOOR + (PEAK - FLOOR) * math.exp(-0.5 * self.distance2(params))

    def pace(self, params: Mapping[str, float]) -> float:
        """How fast the learning curve rises: 1 at the optimal effective rate, faster (smaller time
        constant) for larger rates, slower for smaller ones, within a factor of about 2.7 either way."""
        coords = self.coordinates(params)
        lr = self._by_name["lr"]
        offset = max(-2.0, min(2.0, coords["lr"] - lr.optimum))
        return math.exp(0.5 * offset)

    def curve(self, params: Mapping[str, float], epochs: int, rng: np.random.Generator) -> TrialCurve:
        """The trial's accuracy after each of its ``epochs`` epochs.

        ``FLOOR + (final - FLOOR) * shape(x) ** (1 / pace)`` at the fraction ``x`` of training done,
        ``shape(x) = (1 - exp(-x / tau)) / (1 - exp(-1 / tau))`` (0 at the start, 1 at the end), plus
        the per-epoch noise; the last value is ``final`` exactly. ``rng`` draws the run's noise first,
        then the epochs' (so the final value does not depend on ``epochs``).
        """
        if epochs < 1:
            raise ValueError(f"epochs: must be at least 1, got {epochs}")
        base = self.final_accuracy(params)
        final = float(np.clip(base + rng.normal(0.0, RUN_NOISE), FLOOR, 1.0))
        noise = rng.normal(0.0, EPOCH_NOISE, size=epochs)
        x = np.arange(1, epochs + 1, dtype=np.float64) / epochs
        shape = (1.0 - np.exp(-x / CURVE_TAU)) / (1.0 - math.exp(-1.0 / CURVE_TAU))
        values = FLOOR + (final - FLOOR) * shape ** (1.0 / self.pace(params))
        values = np.clip(values + noise, 0.0, 1.0)
        values[-1] = final
        values.setflags(write=False)
        return TrialCurve(values=values, final=final, surface_value=base)

    def optimum_params(self) -> dict[str, float]:
        """Hyper-parameters at the surface's peak (inside the space), for checks and reports."""
        out: dict[str, float] = {}
        for d in self.space:
            if d.name == "lr":
                continue
            if d.name == "width":
                out[d.name] = float(2.0 ** d.optimum)
            elif d.log:
                out[d.name] = float(10.0 ** d.optimum)
            else:
                out[d.name] = d.optimum
        out["lr"] = float(10.0 ** self._by_name["lr"].optimum * (1.0 - out["momentum"]))
        return out
