#!/usr/bin/env python3
"""LB-BSP (unequal per-replica batches, issue 12): benchmarks of the balancers and their predictors.

Usage:
    benchmarks/lbbsp.py [--json]                       # every section
    benchmarks/lbbsp.py --only predictor_rmse --json   # one section

Sections (each a function ``section_NAME(args) -> dict`` registered in ``SECTIONS``):

* ``predictor_rmse``: the speed predictors of the CPU algorithm on a replayed, seeded speed trace.
  A replica's available CPU share (the load feature) changes at seeded moments, mid-iteration, and
  drives its speed; on top come transient bursts and dips that the load does not show (a page-cache
  flush, a short-lived neighbour) and a little measurement noise. Each predictor sees the speed of
  every iteration and the load read at its end, and predicts the next iteration's speed. Reported:
  the RMSE (samples/s) of the NARX predictor, the moving average (EMA, α = 0.2) and the last value,
  averaged over ``--traces`` seeded traces, per trace too, and as a floor the RMSE of an oracle that
  knows the true share and the speed model (only noise and spikes left). Criterion: NARX lowest
  (paper, Table 3: NARX 4.78 < EMA 7.85 < last value 11.85).

Further sections (the training scenarios ``injected_half_speed``, ``real_contention`` and
``overhead_equal_speed``) plug in the same way: write ``section_x(args)`` and add it to ``SECTIONS``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pollux.goodput.balance import (
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


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "predictor_rmse": section_predictor_rmse,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append",
                        help="run only this section (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="first trace seed")
    parser.add_argument("--traces", type=int, default=5, help="predictor_rmse: seeded traces")
    parser.add_argument("--length", type=int, default=1500, help="predictor_rmse: iterations")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.only or list(SECTIONS)
    result: dict[str, Any] = {}
    for name in names:
        result[name] = SECTIONS[name](args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, section in result.items():
            print(f"== {name}")
            for key, value in section.items():
                if key != "per_trace":
                    print(f"  {key}: {value}")
    return 0 if all(section.get("ok", True) for section in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
