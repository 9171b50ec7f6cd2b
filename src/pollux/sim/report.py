"""Reports on simulation results (SPEC §7): summaries, finish-time fairness, JSON, a table, plots.

* :func:`isolated_jct` — a job's JCT run alone on an exclusive share of GPUs (the denominator of ρ).
* :func:`finish_time_fairness` — fills ``JobResult.rho = JCT / JCT_iso`` for every finished job.
* :func:`summarize` — the statistics of one run as a flat dict.
* :func:`to_json` — the machine-readable form of several runs (``{"runs": [...]}``).
* :func:`format_table` — a terminal table: per run, mean over workloads, per-application JCT.
* :func:`write_plots` — PNGs: JCT and ρ CDFs per policy, GPU allocation and efficiency over time.

All times are seconds unless a name or a header says otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from pollux.goodput import gain
from pollux.goodput.model import accumulation_plan, batch_candidates
from pollux.policy.placement import packed_shape
from pollux.sim.engine import JobResult, SimResult
from pollux.sim.profiles import AppProfile

#: Geometric total-batch candidates tried per epoch by :func:`isolated_jct` (as the optimiser does).
NUM_CANDIDATES = 50
#: GPUs per node assumed when packing an isolated share onto as few nodes as possible.
GPUS_PER_NODE = 4
#: Most timeline points kept per run in :func:`to_json`.
TIMELINE_POINTS = 600
#: Timeline figures are written for every workload up to this many workloads, else the first only.
MAX_TIMELINE_WORKLOADS = 4

# ----------------------------------------------------------------------------------------------
# Isolated JCT and finish-time fairness
# ----------------------------------------------------------------------------------------------

_ISO_CACHE: dict[tuple[Hashable, ...], float] = {}


def _profile_key(profile: AppProfile) -> tuple[Hashable, ...]:
    """Cache key of a profile: its name, plus its metadata and epoch ends as a cheap fingerprint."""
    name = getattr(profile, "name", None) or getattr(profile.meta, "name", None)
    meta = profile.meta
    try:
        hash(meta)
        meta_key: Hashable = meta
    except TypeError:
        meta_key = repr(meta)
    ends = tuple(float(x) for x in profile.epoch_ends)
    return (name, getattr(profile, "gpu_type", None), meta_key, ends)


def packed_placement(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> list[int]:
    """GPUs per node for ``gpus`` GPUs on as few nodes as possible: ``[4, 4, ..., rem]``
    (:func:`pollux.policy.placement.packed_shape`)."""
    return packed_shape(gpus, gpus_per_node)


def _candidates(profile: AppProfile, gpus: int, gpus_per_node: int = GPUS_PER_NODE
                ) -> list[tuple[int, float]]:
    """Feasible (total batch M, iteration time) pairs on ``gpus`` packed GPUs (deduplicated by M)."""
    limits = profile.meta.limits(accumulation=True)
    cands, exists = batch_candidates(gpus, limits)
    if not exists[0]:
        return []
    placement = packed_placement(gpus, gpus_per_node)
    _, ms, ss, within = accumulation_plan(cands[0], gpus, limits)
    step_cache: dict[int, tuple[float, float]] = {}
    out: dict[int, float] = {}
    for m, s, ok in zip(ms.astype(int).tolist(), ss.astype(int).tolist(), within.tolist(), strict=True):
        if not ok:
            continue
        if m not in step_cache:
            step, sync = profile.step_time(placement, m)
            step_cache[m] = (float(step), float(sync))
        step, sync = step_cache[m]
        if not (math.isfinite(step) and math.isfinite(sync)) or step <= 0:
            continue
        t_iter = step + s * (step - sync)
        batch = gpus * m * (s + 1)
        if t_iter > 0 and (batch not in out or t_iter < out[batch]):
            out[batch] = t_iter
    return sorted(out.items())


def _isolated_jct(profile: AppProfile, gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> float:
    cands = _candidates(profile, gpus, gpus_per_node)
    if not cands:
        return math.nan
    m0 = float(profile.meta.init_batch_size)
    total = 0.0
    prev = 0.0
    for e, end in enumerate(profile.epoch_ends):
        end = float(end)
        best = 0.0
        for batch, t_iter in cands:
            stats = profile.grad_stats(e, batch)
            rate = float(gain(batch / m0, stats.sqr, stats.var)) / t_iter
            if rate > best:
                best = rate
        if not best > 0:
            return math.nan
        total += (end - prev) / best
        prev = end
    return total


def isolated_jct(profile: AppProfile, gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> float:
    """JCT of the job run alone on ``gpus`` GPUs packed on as few nodes as possible (4 GPUs per
    node unless ``gpus_per_node`` says otherwise: the nodes of a GPU type).

    At every epoch the job runs its best configuration for that share by *true* goodput: over 50
    geometric total batches ``M`` from ``max(M0, min_local·g)`` to ``max_batch_size``, the smallest
    accumulation ``s`` with ``m = ceil(M/(g(s+1))) ≤ max_local_bsz`` (``s ≥ 1`` on one GPU above M0),
    ``T_iter = step + s·(step − sync)`` from the profile, and progress rate
    ``gain(M/M0, sqr, var)/T_iter`` with the profile's statistics for that epoch and batch. No
    restarts, no restart delay. If no configuration is feasible on exactly ``gpus`` GPUs (the
    profile cannot interpolate that placement, or ``min_local·g`` exceeds the max batch), the job
    uses the largest smaller share that works — an exclusive share does not force a job to use all of
    it. Cached per (profile, gpus).
    """
    gpus = int(gpus)
    if gpus < 1:
        raise ValueError(f"gpus: must be >= 1, got {gpus}")
    key = (*_profile_key(profile), gpus) if gpus_per_node == GPUS_PER_NODE else \
        (*_profile_key(profile), gpus, gpus_per_node)
    cached = _ISO_CACHE.get(key)
    if cached is not None:
        return cached
    value = math.nan
    for g in range(gpus, 0, -1):
        value = _isolated_jct(profile, g, gpus_per_node)
        if math.isfinite(value):
            break
    if not math.isfinite(value):
        name = key[0] if key[0] is not None else "profile"
        raise ValueError(f"{name}: no feasible configuration on {gpus} GPU(s) or fewer")
    _ISO_CACHE[key] = value
    return value


def isolated_share(job: JobResult, total_gpus: int) -> int:
    """GPUs of the job's isolated share: ``max(1, ⌊G / N̄⌋)``, 1 for ncf (its batch fits one replica)."""
    if job.application == "ncf":
        return 1
    mean_active = job.active_jobs_mean if job.active_jobs_mean and job.active_jobs_mean > 0 else 1.0
    return max(1, min(int(total_gpus), math.floor(total_gpus / mean_active + 1e-9)))


def finish_time_fairness(result: SimResult, profiles: dict[str, AppProfile], total_gpus: int) -> SimResult:
    """Fill ``rho = JCT / JCT_iso`` of every finished job of ``result`` (in place; returns it).

    ``JCT_iso`` is :func:`isolated_jct` on :func:`isolated_share` GPUs plus one start delay
    (``result.config.restart_delay``): a job run alone still pays its first start, which is not a
    restart. Without it, jobs shorter than a minute (ncf: ~46 s alone) would show ρ > 2 under every
    policy from the start delay alone. Unfinished jobs keep ``rho = None``.
    """
    start_delay = float(getattr(result.config, "restart_delay", 0.0))
    if total_gpus < 1:
        raise ValueError(f"total_gpus: must be >= 1, got {total_gpus}")
    for job in result.jobs:
        if job.jct is None:
            job.rho = None
            continue
        profile = profiles.get(job.application)
        if profile is None:
            raise ValueError(f"job {job.name}: no profile for application {job.application!r}")
        iso = isolated_jct(profile, isolated_share(job, total_gpus)) + start_delay
        job.rho = float(job.jct) / iso
    return result


# ----------------------------------------------------------------------------------------------
# Summaries and JSON
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Terminal table
# ----------------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 0, scale: float = 1.0) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x * scale:.{digits}f}"


def _fmt_jct(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.0f} ({x / 3600:.2f} h)"


def _render(header: list[str], rows: list[list[str]], left: int = 2) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return out


def _ordered(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


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

    order = {w: i for i, w in enumerate(_ordered([s["workload"] for s in summaries]))}
    rows = []
    for s in sorted(summaries, key=lambda s: order[s["workload"]]):
        jobs = f"{s['completed']}/{s['num_jobs']}" if s["completed"] != s["num_jobs"] else str(s["num_jobs"])
        rows.append([s["workload"], s["policy"], jobs, *cells(s)])
    lines = ["Per run (JCT statistics over finished jobs; times in seconds)", *_render(header, rows)]

    policies = _ordered([s["policy"] for s in summaries])
    workloads = _ordered([s["workload"] for s in summaries])
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
        lines += ["", "Mean over workloads", *_render(mheader, mrows, left=1)]

    apps = sorted({j.application for r in results for j in r.jobs})
    arows = []
    for p in policies:
        pooled = [j for r in results if r.policy == p for j in r.jobs]
        means = app_mean_jct(pooled)
        arows.append([p, *(_fmt(means.get(a)) for a in apps)])
    lines += ["", "Mean JCT per application (s)", *_render(["policy", *apps], arows, left=1)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def _safe(name: str) -> str:
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
    policies = _ordered([r.policy for r in results])
    workloads = _ordered([r.workload for r in results])
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
        path = out / f"timeline-{_safe(w)}.png"
        fig.savefig(path)
        written.append(path)
    return written
