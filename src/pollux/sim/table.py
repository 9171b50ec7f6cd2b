"""The terminal table of simulation results (``pollux simulate``): per run, the mean over workloads,
and the mean JCT per application.

The tables are drawn by rich. Plain (the default, for a pipe, a file or a test): aligned columns two
spaces apart under a rule of dashes, no colour, nothing wrapped. For a terminal: rich's table (box
lines, a bold header), never squeezed. The simulator does not know where its report goes: the
caller says.
"""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

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


#: Width the plain form is laid out to: wider than any row, so that no cell is ever wrapped.
PLAIN_WIDTH = 1_000_000


def render_rows(header: list[str], rows: list[list[str]], left: int = 2,
                terminal: bool = False) -> list[str]:
    """The text lines of a table (the first ``left`` columns left-aligned, the others right-aligned).

    Plain: the header, a rule of dashes, the rows, two spaces between columns and no trailing
    spaces. ``terminal``: rich's table with its box lines and a bold header, for stdout's terminal.
    Neither wraps a cell.
    """
    if terminal:
        grid = Table()
        rule: list[list[str]] = []
    else:
        grid = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="")
        rule = [["-" * max(cell_len(r[i]) for r in [header, *rows]) for i in range(len(header))]]
    for i, name in enumerate(header):
        grid.add_column(Text(name), justify="left" if i < left else "right", no_wrap=True)
    for row in [*rule, *rows]:
        grid.add_row(*(Text(c) for c in row))
    if terminal:     # never squeezed: a terminal narrower than the table wraps its lines
        console = Console(file=sys.stdout, force_terminal=True, markup=False, emoji=False, highlight=False)
        console.width = max(console.width, Measurement.get(console, console.options.update_width(PLAIN_WIDTH),
                                                           grid).maximum)
    else:
        console = Console(file=io.StringIO(), force_terminal=False, color_system=None, no_color=True,
                          markup=False, emoji=False, highlight=False, width=PLAIN_WIDTH)
    with console.capture() as captured:
        console.print(grid)
    return [line.rstrip() for line in captured.get().rstrip("\n").split("\n")]


def format_table(results: Sequence[SimResult], terminal: bool = False) -> str:
    """A human table of several runs: JCTs in seconds (hours in brackets), one row per run.

    When the runs cover several workloads, a second block gives each policy's mean over workloads
    (of each run's statistics); the last block gives each policy's mean JCT per application, pooled
    over all its runs' finished jobs. ``terminal``: drawn for a terminal (:func:`render_rows`).
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
    lines = ["Per run (JCT statistics over finished jobs; times in seconds)",
             *render_rows(header, rows, terminal=terminal)]

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
        lines += ["", "Mean over workloads", *render_rows(mheader, mrows, left=1, terminal=terminal)]

    apps = sorted({j.application for r in results for j in r.jobs})
    arows = []
    for p in policies:
        pooled = [j for r in results if r.policy == p for j in r.jobs]
        means = app_mean_jct(pooled)
        arows.append([p, *(_fmt(means.get(a)) for a in apps)])
    lines += ["", "Mean JCT per application (s)",
              *render_rows(["policy", *apps], arows, left=1, terminal=terminal)]
    return "\n".join(lines)
