"""Reports of runs on typed (heterogeneous) clusters (issue 13): per GPU type GPU-hours and
utilisation, finish-time fairness against the job's best type, and GPUs allocated by type over time.

Kept apart from :mod:`pollux.sim.report` so that untyped runs report exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pollux.policy.base import Cluster
from pollux.sim.engine import TYPE_SERIES, SimResult
from pollux.sim.fairness import isolated_jct, isolated_share
from pollux.sim.plots import file_safe
from pollux.sim.profiles import AppProfile
from pollux.sim.table import render_rows

__all__ = ["format_type_table", "type_summary", "typed_finish_time_fairness", "write_type_plots"]


def _cluster(result: SimResult) -> Cluster:
    return result.config.make_cluster()


def type_summary(result: SimResult) -> dict[str, dict[str, float]]:
    """Per GPU type of the run's cluster: ``gpus`` (capacity), ``gpu_hours`` (held by jobs, bootstrap
    included), ``gpu_hours_per_job`` and ``utilisation`` (mean over scheduling rounds of allocated /
    capacity). Empty for an untyped cluster."""
    cluster = _cluster(result)
    if not cluster.types:
        return {}
    n = max(len(result.jobs), 1)
    out: dict[str, dict[str, float]] = {}
    for t, cap in cluster.type_capacity().items():
        hours = float(sum(j.type_gpu_hours.get(t, 0.0) for j in result.jobs))
        series = np.asarray(result.timeline.get(TYPE_SERIES + t, []), dtype=np.float64)
        util = float(series.mean() / cap) if series.size and cap else 0.0
        out[t] = {"gpus": float(cap), "gpu_hours": hours, "gpu_hours_per_job": hours / n,
                  "utilisation": util}
    return out


def best_type_isolated_jct(per_type: dict[str, AppProfile], cluster: Cluster, gpus: int,
                           factor: float = 1.0) -> float:
    """The shortest isolated JCT over the cluster's types the application has a profile for: ``gpus``
    GPUs (at most the type's capacity) packed on that type's nodes, step times times ``factor``."""
    cap = cluster.type_capacity()
    per_node = {t: max(g for g, tt in zip(cluster.gpus, cluster.node_types, strict=True) if tt == t)
                for t in cap}
    best = math.inf
    for t, prof in per_type.items():
        if t not in cap:
            continue
        try:
            value = isolated_jct(prof, max(1, min(gpus, cap[t])), per_node[t]) * factor
        except ValueError:
            continue
        best = min(best, value)
    return best


def typed_finish_time_fairness(result: SimResult, typed_profiles: dict[str, dict[str, AppProfile]]
                               ) -> SimResult:
    """Fill ``rho = JCT / JCT_iso`` with the isolated JCT on the job's best type (in place).

    The share is :func:`pollux.sim.fairness.isolated_share` of the whole cluster, capped by the type's
    GPUs; the speed factor of the run's ``slowdown`` applies; one start delay is added as in
    :func:`pollux.sim.fairness.finish_time_fairness`. Jobs with no feasible type keep ``rho = None``.
    """
    cluster = _cluster(result)
    start_delay = float(result.config.restart_delay)
    for job in result.jobs:
        job.rho = None
        if job.jct is None:
            continue
        share = isolated_share(job, cluster.total_gpus)
        iso = best_type_isolated_jct(typed_profiles.get(job.application, {}), cluster, share,
                                     result.config.slowdown_of(job.application))
        if math.isfinite(iso):
            job.rho = float(job.jct) / (iso + start_delay)
    return result


def format_type_table(results: Sequence[SimResult], terminal: bool = False) -> str:
    """One row per (run, GPU type): capacity, GPU-hours, GPU-hours per job and utilisation (drawn for
    a terminal if ``terminal``: :func:`pollux.sim.table.render_rows`)."""
    rows = []
    for r in results:
        for t, s in type_summary(r).items():
            rows.append([r.workload, r.policy, t, f"{s['gpus']:.0f}", f"{s['gpu_hours']:.1f}",
                         f"{s['gpu_hours_per_job']:.2f}", f"{s['utilisation']:.1%}"])
    if not rows:
        return ""
    header = ["workload", "policy", "type", "GPUs", "GPU-h", "GPU-h/job", "utilisation"]
    return "\n".join(["Per GPU type", *render_rows(header, rows, left=3, terminal=terminal)])


def add_type_json(data: dict[str, Any], results: Sequence[SimResult]) -> dict[str, Any]:
    """Add ``types`` (:func:`type_summary`) to every run of :func:`pollux.sim.report.to_json`'s dict,
    and each job's ``type_gpu_hours`` (in place; runs in the same order)."""
    for run, r in zip(data["runs"], results, strict=True):
        run["types"] = type_summary(r)
        for job, jr in zip(run["jobs"], r.jobs, strict=True):
            job["type_gpu_hours"] = dict(jr.type_gpu_hours)
            job["bootstrap_gpu_hours"] = jr.bootstrap_gpu_hours
    return data


def write_type_plots(results: Sequence[SimResult], out_dir: Path | str) -> list[Path]:
    """``gpus-by-type-<workload>-<policy>.png``: GPUs allocated on each type over time (stacked),
    for every typed run."""
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        cluster = _cluster(r)
        if not cluster.types or not r.timeline.get("time"):
            continue
        t = np.asarray(r.timeline["time"], dtype=np.float64) / 3600.0
        names = list(cluster.type_names)
        stack = [np.asarray(r.timeline[TYPE_SERIES + n], dtype=np.float64) for n in names]
        fig = Figure(figsize=(9, 4.5), dpi=110)
        ax = fig.add_subplot()
        ax.stackplot(t, *stack, labels=[f"{n} ({cluster.type_capacity()[n]} GPUs)" for n in names],
                     step="post", alpha=0.8)
        ax.axhline(cluster.total_gpus, color="grey", linestyle=":", linewidth=1, label="cluster GPUs")
        ax.set_xlabel("time since trace start (h)")
        ax.set_ylabel("GPUs allocated")
        ax.set_title(f"{r.workload} under {r.policy}: GPUs allocated by type")
        ax.legend(loc="upper right")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out / f"gpus-by-type-{file_safe(r.workload)}-{file_safe(r.policy)}.png"
        fig.savefig(path)
        written.append(path)
    return written
