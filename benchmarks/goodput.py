#!/usr/bin/env python3
"""Benchmark of the goodput core: fit quality and speed per application, speedup-table speed.

Usage: benchmarks/goodput.py --data ../shared/data/pollux-osdi21/traces [--json]

For every application folder in DATA, fits the throughput model to all rows of placements.csv and
scalability.csv (step_time is the optimiser-step time with s = 0; step_time − sync_time is the
accumulation-step time) and reports the in-sample mean relative error of the predicted optimiser-step
time over rows, the median time of several fresh fits, and the row count. Then times building one
job's full speedup table (nodes ≤ 16, replicas ≤ 64), each repetition for a new random job model.

``benchmarks/goodput_busy.py`` runs this benchmark while busy loops occupy every core (started and
stopped by PID): the fits must stay fast then (BLAS runs with one thread, pollux.goodput.threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pollux.goodput import (
    BatchLimits,
    GoodputModel,
    GradStats,
    ThroughputParams,
    fair_share,
    fit_throughput,
    speedup_table,
    t_iter,
)
from trace_rows import read_throughput_rows

FIT_REPEATS = 7
TABLE_REPEATS = 50


def bench_fit(app_dir: Path) -> dict[str, float | int]:
    rows = read_throughput_rows(app_dir)
    times = []
    fit = None
    for _ in range(FIT_REPEATS):
        start = time.perf_counter()
        fit = fit_throughput(rows.nodes, rows.replicas, rows.local_bsz, rows.step_time,
                             rows.accum_time)
        times.append(time.perf_counter() - start)
    assert fit is not None
    if not fit.ok:
        raise RuntimeError(f"{app_dir.name}: {fit.message}")
    pred = t_iter(fit.params, rows.nodes, rows.replicas, rows.local_bsz, 0)
    err = np.abs(pred - rows.step_time) / rows.step_time
    return {
        "mean_rel_error": float(np.mean(err)),
        "fit_ms": float(np.median(times) * 1e3),
        "rows": int(rows.step_time.size),
    }


def random_model(rng: np.random.Generator) -> tuple[GoodputModel, BatchLimits]:
    """A plausible random job: parameters log-uniform around the ranges the shared profiles show."""
    def lu(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    params = ThroughputParams(
        alpha_grad=lu(1e-3, 0.3), beta_grad=lu(1e-6, 5e-2), alpha_local=lu(1e-3, 0.3),
        beta_local=lu(1e-5, 2e-2), alpha_node=lu(1e-2, 1.5), beta_node=lu(1e-4, 2e-2),
        gamma=rng.uniform(1.0, 3.0),
    )
    m0 = float(rng.choice([8, 12, 20, 128, 200, 256]))
    grad = GradStats(sqr=lu(1e-4, 10.0), var=lu(1e-2, 50.0))
    limits = BatchLimits(m0, max_batch_size=32 * m0, min_local_bsz=max(1.0, m0 / 4),
                         max_local_bsz=2 * m0, accumulation=True)
    return GoodputModel(params, grad, m0), limits


def bench_table(seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    fair = fair_share(16, 4, 20)
    times = []
    for _ in range(TABLE_REPEATS):
        model, limits = random_model(rng)
        start = time.perf_counter()
        speedup_table(model, limits, 16, 64, fair)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of application profiles")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"--data {args.data}: no such folder")
    apps = sorted(p for p in args.data.iterdir() if (p / "placements.csv").is_file())
    if not apps:
        parser.error(f"--data {args.data}: no application folder with placements.csv")
    try:
        fits = {}
        for app in apps:
            fits[app.name] = bench_fit(app)
            if not args.json:
                f = fits[app.name]
                print(f"{app.name:12s} rows={f['rows']:5d} mean_rel_error={f['mean_rel_error']:.4f}"
                      f" fit_ms={f['fit_ms']:.1f}", file=sys.stderr)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {
        "fit": fits,
        "optimize_table_ms": bench_table(),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.machine()},
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"optimize_table_ms={result['optimize_table_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
