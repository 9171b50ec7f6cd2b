"""Reports on simulation results (SPEC §7): summaries and the machine-readable form.

* :func:`summarize` — the statistics of one run as a flat dict.
* :func:`to_json` — the machine-readable form of several runs (``{"runs": [...]}``).

Beside it: :mod:`pollux.sim.fairness` (isolated JCT and ρ), :mod:`pollux.sim.table` (the terminal
table) and :mod:`pollux.sim.plots` (PNGs). All times are seconds unless a name or a header says
otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from pollux.sim.engine import JobResult, SimResult

#: Most timeline points kept per run in :func:`to_json`.
TIMELINE_POINTS = 600

def _num(x: Any) -> float | None:
    """A JSON-safe float: None for None, NaN and infinities."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _stats(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    if len(values) == 0:
        return None, None, None
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(np.median(arr)), float(np.percentile(arr, 99))


def rho_summary(jobs: Sequence[JobResult]) -> dict[str, float | int | None]:
    """ρ distribution over the jobs that have one: mean, median, p99, max, shares above 1 and 2."""
    rhos = np.asarray([j.rho for j in jobs if j.rho is not None and math.isfinite(j.rho)],
                      dtype=np.float64)
    if rhos.size == 0:
        return {"count": 0, "mean": None, "median": None, "p99": None, "max": None,
                "share_gt_1": None, "share_gt_2": None}
    return {
        "count": int(rhos.size),
        "mean": float(rhos.mean()),
        "median": float(np.median(rhos)),
        "p99": float(np.percentile(rhos, 99)),
        "max": float(rhos.max()),
        "share_gt_1": float(np.mean(rhos > 1.0)),
        "share_gt_2": float(np.mean(rhos > 2.0)),
    }


def app_mean_jct(jobs: Sequence[JobResult]) -> dict[str, float]:
    """Mean JCT per application over the finished jobs, applications sorted by name."""
    by_app: dict[str, list[float]] = {}
    for j in jobs:
        if j.jct is not None:
            by_app.setdefault(j.application, []).append(float(j.jct))
    return {app: float(np.mean(v)) for app, v in sorted(by_app.items())}


def summarize(result: SimResult) -> dict[str, Any]:
    """Statistics of one run.

    JCT statistics are over finished jobs (``completed`` says how many); p99 is numpy's linearly
    interpolated 99th percentile; ``makespan`` is the last completion minus the first submission;
    per-job means (restarts, GPU-hours, fits) are over all jobs. ``decide_time_s`` is the policy's
    total decision time and ``decide_time_per_round_s`` its mean per scheduling round.
    """
    jobs = result.jobs
    jcts = [float(j.jct) for j in jobs if j.jct is not None]
    avg, med, p99 = _stats(jcts)
    done = [float(j.completion) for j in jobs if j.completion is not None]
    makespan = max(done) - min(j.submit for j in jobs) if done else None
    n = len(jobs)

    def per_job(values: list[float]) -> float | None:
        return float(np.mean(values)) if n else None

    return {
        "policy": result.policy,
        "workload": result.workload,
        "seed": result.seed,
        "num_jobs": n,
        "completed": len(jcts),
        "avg_jct": avg,
        "median_jct": med,
        "p99_jct": p99,
        "makespan": makespan,
        "restarts_per_job": per_job([j.restarts for j in jobs]),
        "gpu_hours_per_job": per_job([j.gpu_hours for j in jobs]),
        "fits_per_job": per_job([j.fits for j in jobs]),
        "rho": rho_summary(jobs),
        "app_jct": app_mean_jct(jobs),
        "rounds": int(result.rounds),
        "wall_time_s": float(result.wall_time_s),
        "decide_time_s": float(result.decide_time_s),
        "decide_time_per_round_s": float(result.decide_time_s) / result.rounds if result.rounds else None,
    }


def downsample_timeline(timeline: dict[str, list[float]], max_points: int = TIMELINE_POINTS
                        ) -> dict[str, list[float | None]]:
    """Every k-th point of each series (k chosen so at most ``max_points`` remain), always the last."""
    n = len(timeline.get("time", []))
    if n == 0:
        return {k: [] for k in timeline}
    step = max(1, math.ceil(n / max(max_points - 1, 1)))
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return {k: [_num(v[i]) for i in idx] for k, v in timeline.items() if len(v) == n}


def _job_json(j: JobResult) -> dict[str, Any]:
    return {
        "name": j.name,
        "application": j.application,
        "submit": _num(j.submit),
        "jct": _num(j.jct),
        "restarts": int(j.restarts),
        "gpu_hours": _num(j.gpu_hours),
        "rho": _num(j.rho),
        "fits": int(j.fits),
        "completion": _num(j.completion),
        "epochs": int(j.epochs),
        "active_jobs_mean": _num(j.active_jobs_mean),
        "batch_sizes": [int(b) for b in j.batch_sizes],
    }


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, float | np.floating):
        return _num(x)
    if isinstance(x, np.integer):
        return int(x)
    return str(x)


def to_json(results: Sequence[SimResult]) -> dict[str, Any]:
    """``{"runs": [{policy, workload, avg_jct, median_jct, p99_jct, makespan, restarts_per_job,
    wall_time_s, jobs: [{name, application, submit, jct, restarts, gpu_hours, rho, fits, ...}], ...}]}``.

    Besides the required keys each run carries the rest of :func:`summarize`, its simulator config and
    its timeline downsampled to at most :data:`TIMELINE_POINTS` points. Missing or non-finite numbers
    (unfinished jobs, ρ not computed) are ``null``; the dict is ``json.dumps``-able as is.
    """
    runs = []
    for r in results:
        summary = summarize(r)
        run: dict[str, Any] = {
            "policy": r.policy,
            "workload": r.workload,
            "avg_jct": summary["avg_jct"],
            "median_jct": summary["median_jct"],
            "p99_jct": summary["p99_jct"],
            "makespan": summary["makespan"],
            "restarts_per_job": summary["restarts_per_job"],
            "wall_time_s": summary["wall_time_s"],
            "jobs": [_job_json(j) for j in r.jobs],
        }
        for k, v in summary.items():
            run.setdefault(k, v)
        try:
            run["config"] = asdict(r.config)
        except TypeError:
            run["config"] = None
        run["timeline"] = downsample_timeline(r.timeline)
        runs.append(_clean(run))
    return {"runs": runs}


def ordered(values: Sequence[str]) -> list[str]:
    """``values`` without repeats, in first-seen order."""
    return list(dict.fromkeys(values))
