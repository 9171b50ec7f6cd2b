"""The ``predictor_rmse`` section of ``benchmarks/lbbsp.py``: the CPU balancer's speed predictors on
replayed, seeded speed traces (see that file's docstring for what is reported and the criterion)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pollux.balance.balancers import (
    LastValue,
    MovingAverage,
    NarxPredictor,
    SpeedPredictor,
)

# --------------------------------------------------------------------------------------------
# predictor_rmse
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedTrace:
    """One replica's replayed history: ``speed[k]`` of iteration k and the load read at its end."""

    speed: np.ndarray
    load: np.ndarray
    spikes: np.ndarray  # bool: iteration k had a transient burst or dip
    explained: np.ndarray  # the speed the true share at the end of iteration k implies for k + 1


def speed_trace(seed: int, length: int = 1500, base: float = 100.0) -> SpeedTrace:
    """A seeded speed trace driven by an available-CPU-share load, plus bursts the load misses.

    The CPU share is piecewise constant (segments of 30–120 iterations, levels 0.25–1.0) and changes
    at a random point inside an iteration, so that iteration runs partly at the old and partly at the
    new share; the share read at the end of the iteration (with 1 % noise) is already the new one.
    Speed is ``base·share^0.8`` (sub-linear: memory bandwidth is shared less than cores), times 5 %
    noise; with probability 0.04 an iteration starts a transient dip (×0.55–0.85) or burst (×1.15–1.35)
    lasting one or two iterations, which the load does not show.
    """
    rng = np.random.default_rng(seed)
    levels = np.array([1.0, 0.85, 0.7, 0.55, 0.4, 0.25])
    share = np.empty(length + 1)  # share[k]: the share at the END of iteration k
    frac = np.ones(length)  # fraction of iteration k run at share[k] (the rest at share[k-1])
    k, level = 0, 1.0
    while k < length:
        seg = int(rng.integers(30, 121))
        share[k:k + seg] = level
        if k > 0:
            frac[k] = rng.uniform(0.05, 0.95)
        k += seg
        level = float(rng.choice(levels[levels != level]))
    share[length] = share[length - 1]
    prev = np.concatenate([[share[0]], share[:length - 1]])
    rate_now, rate_prev = share[:length] ** 0.8, prev ** 0.8
    # Time-weighted: the iteration's time is the sum of the times of its two parts.
    speed = base / (frac / rate_now + (1.0 - frac) / rate_prev)
    speed *= 1.0 + 0.05 * rng.standard_normal(length)
    spikes = np.zeros(length, dtype=bool)
    k = 0
    while k < length:
        if rng.random() < 0.04:
            dur = int(rng.integers(1, 3))
            factor = rng.uniform(0.55, 0.85) if rng.random() < 0.7 else rng.uniform(1.15, 1.35)
            speed[k:k + dur] *= factor
            spikes[k:k + dur] = True
            k += dur
        k += 1
    load = share[:length] + 0.01 * rng.standard_normal(length)
    return SpeedTrace(speed=speed, load=load, spikes=spikes, explained=base * share[:length] ** 0.8)


def replay(trace: SpeedTrace, predictor: SpeedPredictor) -> np.ndarray:
    """Predictions of speed[k] made after observing iterations 0..k−1 (NaN for k = 0)."""
    out = np.full(trace.speed.size, math.nan)
    for k in range(trace.speed.size):
        out[k] = predictor.predict() if k > 0 else math.nan
        predictor.observe(float(trace.speed[k]), float(trace.load[k]))
    return out


PREDICTORS: dict[str, Callable[[], SpeedPredictor]] = {
    "narx": lambda: NarxPredictor(lags=2, hidden=8, seed=0),
    "moving_average": lambda: MovingAverage(alpha=0.2),
    "last_value": LastValue,
}


def section_predictor_rmse(args: argparse.Namespace) -> dict[str, Any]:
    per_trace: list[dict[str, float]] = []
    timing: dict[str, float] = {name: 0.0 for name in PREDICTORS}
    for t in range(args.traces):
        trace = speed_trace(args.seed + t, length=args.length)
        row: dict[str, float] = {}
        for name, factory in PREDICTORS.items():
            start = time.perf_counter()
            pred = replay(trace, factory())
            timing[name] += time.perf_counter() - start
            err = pred[1:] - trace.speed[1:]
            row[name] = float(np.sqrt(np.mean(err**2)))
        # Reference floor, not a predictor: the speed the noiseless load explains (knows the model).
        row["oracle"] = float(np.sqrt(np.mean((trace.explained[:-1] - trace.speed[1:]) ** 2)))
        per_trace.append(row)
    rmse = {name: float(np.mean([r[name] for r in per_trace])) for name in PREDICTORS}
    steps = args.traces * args.length
    return {
        "rmse": rmse,
        "per_trace": per_trace,
        "oracle_floor_rmse": float(np.mean([r["oracle"] for r in per_trace])),
        "us_per_step": {name: 1e6 * timing[name] / steps for name in PREDICTORS},
        "ok": rmse["narx"] < rmse["moving_average"] and rmse["narx"] < rmse["last_value"],
        "criterion": "narx lowest (paper: 4.78 < 7.85 < 11.85)",
        "trace": {"seeds": [args.seed + t for t in range(args.traces)], "length": args.length,
                  "base_speed": 100.0},
    }
