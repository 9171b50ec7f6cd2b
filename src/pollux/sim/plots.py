"""Plots of simulation results (PNGs): JCT and ρ CDFs per policy, GPU allocation and efficiency
over time. matplotlib is imported only here, and only when plots are written."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pollux.sim.engine import SimResult
from pollux.sim.report import ordered

#: Timeline figures are written for every workload up to this many workloads, else the first only.
MAX_TIMELINE_WORKLOADS = 4

def file_safe(name: str) -> str:
    """``name`` as a file-name part: anything but letters, digits, ``_.-`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "run"


def _cdf_figure(series: dict[str, np.ndarray], title: str, xlabel: str, log: bool,
                marks: Sequence[float] = (), mean_fmt: str = "{:.3g}"):
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(7, 4.5), dpi=110)
    ax = fig.add_subplot()
    for label, values in series.items():
        v = np.sort(values[np.isfinite(values)])
        if v.size == 0:
            continue
        x = np.concatenate([v[:1], v])
        y = np.arange(0, v.size + 1) / v.size
        ax.step(x, y, where="post", label=f"{label} (n={v.size}, mean {mean_fmt.format(v.mean())})")
    for mark in marks:
        ax.axvline(mark, color="grey", linestyle=":", linewidth=1)
    if log:
        ax.set_xscale("log")
        finite = [v[np.isfinite(v) & (v > 0)] for v in series.values()]
        finite = [v for v in finite if v.size]
        decades = (math.log10(max(v.max() for v in finite) / min(v.min() for v in finite))
                   if finite else 0.0)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def write_plots(results: Sequence[SimResult], out_dir: Path | str) -> list[Path]:
    """Write PNG figures to ``out_dir`` (created if missing) and return their paths.

    * ``jct_cdf.png`` — CDF of JCT per policy, all workloads pooled (log time axis).
    * ``rho_cdf.png`` — CDF of finish-time fairness ρ per policy (only when some ρ is known).
    * ``timeline-<workload>.png`` — GPUs allocated and GPU-weighted statistical efficiency over time,
      one curve per policy; for every workload when there are at most
      :data:`MAX_TIMELINE_WORKLOADS`, else for the first workload only.
    """
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if not results:
        return written
    policies = ordered([r.policy for r in results])
    workloads = ordered([r.workload for r in results])
    scope = workloads[0] if len(workloads) == 1 else f"{len(workloads)} workloads pooled"

    jct = {p: np.asarray([j.jct for r in results if r.policy == p for j in r.jobs if j.jct is not None],
                         dtype=np.float64) for p in policies}
    if any(v.size for v in jct.values()):
        fig = _cdf_figure(jct, f"Job completion time per policy ({scope})", "JCT (s, log scale)",
                          log=True, mean_fmt="{:.0f} s")
        path = out / "jct_cdf.png"
        fig.savefig(path)
        written.append(path)

    rho = {p: np.asarray([j.rho for r in results if r.policy == p for j in r.jobs if j.rho is not None],
                         dtype=np.float64) for p in policies}
    if any(v.size for v in rho.values()):
        fig = _cdf_figure(rho, f"Finish-time fairness ρ = JCT / JCT_iso ({scope})",
                          "ρ (log scale; dotted lines at 1 and 2)", log=True, marks=(1.0, 2.0),
                          mean_fmt="{:.2f}")
        path = out / "rho_cdf.png"
        fig.savefig(path)
        written.append(path)

    shown = workloads if len(workloads) <= MAX_TIMELINE_WORKLOADS else workloads[:1]
    for w in shown:
        runs = [r for r in results if r.workload == w and r.timeline.get("time")]
        if not runs:
            continue
        fig = Figure(figsize=(9, 6), dpi=110)
        ax_gpu, ax_eff = fig.subplots(2, 1, sharex=True)
        for r in runs:
            t = np.asarray(r.timeline["time"], dtype=np.float64) / 3600.0
            ax_gpu.step(t, r.timeline["allocated_gpus"], where="post", label=r.policy)
            ax_eff.step(t, r.timeline["efficiency"], where="post", label=r.policy)
        gpus = [r.config.make_cluster().total_gpus if hasattr(r.config, "make_cluster")
                else r.config.num_nodes * r.config.gpus_per_node
                for r in runs if hasattr(r.config, "num_nodes")]
        if gpus:
            ax_gpu.axhline(max(gpus), color="grey", linestyle=":", linewidth=1, label="cluster GPUs")
        ax_gpu.set_ylabel("GPUs allocated")
        ax_gpu.set_title(f"{w}: cluster allocation and statistical efficiency over time")
        ax_gpu.legend(loc="upper right")
        ax_gpu.grid(True, alpha=0.3)
        ax_eff.set_ylabel("GPU-weighted mean\nstatistical efficiency")
        ax_eff.set_xlabel("time since trace start (h)")
        ax_eff.set_ylim(0, 1.05)
        ax_eff.legend(loc="best")
        ax_eff.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out / f"timeline-{file_safe(w)}.png"
        fig.savefig(path)
        written.append(path)
    return written
