"""The terminal table of simulation results (``pollux simulate``): per run, the mean over workloads,
and the mean JCT per application."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pollux.sim.engine import SimResult
from pollux.sim.report import app_mean_jct, ordered, summarize


def _fmt(x: float | None, digits: int = 0, scale: float = 1.0) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x * scale:.{digits}f}"


def _fmt_jct(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.0f} ({x / 3600:.2f} h)"


def render_rows(header: list[str], rows: list[list[str]], left: int = 2) -> list[str]:
    """Aligned text lines of a table: the header, a rule, the rows (the first ``left`` columns
    left-aligned, the others right-aligned)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return out


def format_table(results: Sequence[SimResult]) -> str:
    """A human table of several runs: JCTs in seconds (hours in brackets), one row per run.

    When the runs cover several workloads, a second block gives each policy's mean over workloads
    (of each run's statistics); the last block gives each policy's mean JCT per application, pooled
    over all its runs' finished jobs.
    """
    if not results:
        return "(no results)"
    summaries = [summarize(r) for r in results]
    header = ["workload", "policy", "jobs", "avg JCT s (h)", "median JCT s", "p99 JCT s", "makespan s",
              "restarts/job", "GPU-h/job", "rho>2", "wall s"]

    def cells(s: dict[str, Any]) -> list[str]:
        share2 = s["rho"]["share_gt_2"]
        return [_fmt_jct(s["avg_jct"]), _fmt(s["median_jct"]), _fmt(s["p99_jct"]), _fmt(s["makespan"]),
                _fmt(s["restarts_per_job"], 2), _fmt(s["gpu_hours_per_job"], 2),
                "-" if share2 is None else f"{share2:.1%}", _fmt(s["wall_time_s"], 1)]

    order = {w: i for i, w in enumerate(ordered([s["workload"] for s in summaries]))}
    rows = []
    for s in sorted(summaries, key=lambda s: order[s["workload"]]):
        jobs = f"{s['completed']}/{s['num_jobs']}" if s["completed"] != s["num_jobs"] else str(s["num_jobs"])
        rows.append([s["workload"], s["policy"], jobs, *cells(s)])
    lines = ["Per run (JCT statistics over finished jobs; times in seconds)", *render_rows(header, rows)]

    policies = ordered([s["policy"] for s in summaries])
    workloads = ordered([s["workload"] for s in summaries])
    if len(workloads) > 1:
        keys = ["avg_jct", "median_jct", "p99_jct", "makespan", "restarts_per_job", "gpu_hours_per_job",
                "wall_time_s"]
        mrows = []
        for p in policies:
            group = [s for s in summaries if s["policy"] == p]
            mean: dict[str, Any] = {}
            for k in keys:
                vals = [s[k] for s in group if s[k] is not None]
                mean[k] = float(np.mean(vals)) if vals else None
            shares = [s["rho"]["share_gt_2"] for s in group if s["rho"]["share_gt_2"] is not None]
            mean["rho"] = {"share_gt_2": float(np.mean(shares)) if shares else None}
            mrows.append([p, str(len(group)), *cells(mean)])
        mheader = ["policy", "runs", *header[3:]]
        lines += ["", "Mean over workloads", *render_rows(mheader, mrows, left=1)]

    apps = sorted({j.application for r in results for j in r.jobs})
    arows = []
    for p in policies:
        pooled = [j for r in results if r.policy == p for j in r.jobs]
        means = app_mean_jct(pooled)
        arows.append([p, *(_fmt(means.get(a)) for a in apps)])
    lines += ["", "Mean JCT per application (s)", *render_rows(["policy", *apps], arows, left=1)]
    return "\n".join(lines)
