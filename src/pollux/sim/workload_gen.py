"""Workload generation from a Microsoft Philly-format trace (SPEC §7, "Workload generation").

The trace (``philly.csv``) has the columns ``timestamp,duration,num_gpus,gpu_time[,cluster]``:
``timestamp`` is the submission time as ``YYYY-MM-DD HH:MM:SS``, ``duration`` the run time in seconds,
``num_gpus`` the GPUs the job used and ``gpu_time`` its GPU time in **GPU-seconds** (in the shared trace
``gpu_time = duration × num_gpus`` on every row); ``cluster`` is not used and may be absent.

:func:`generate_workload` does, in this order, with every random draw from one
``numpy.random.default_rng(seed)``:

1. **Filter.** Keep the jobs with ``duration ≥ 60 s`` and ``gpu_time < 1000 GPU-hours`` whose submission
   falls in ``[02:00, 10:00)`` of its own day, on every day of the trace.
2. **Sample** ``num_jobs`` of them uniformly without replacement, then order them by their offset within
   the window (ties: trace line order). The offset (seconds from 02:00 of the job's day) is the job's
   submission time, so every workload lies within ``[0, 8 h)`` whatever days its jobs come from.
3. **Map** each job to an application by its GPU time (GPU-hours): ``< 1`` → cifar10 or ncf (½ each);
   ``[1, 10)`` → deepspeech2, relabelled bert with probability ½; ``[10, 100)`` → yolov3;
   ``[100, 1000)`` → imagenet.
4. **TunedJobs configuration**: a (replicas, batch) pair drawn uniformly from :func:`tuned_configs` of the
   application's profile. Jobs are named ``<app>-<k>``, ``k`` the job's 0-based index in submission order.

TunedJobs configurations (:func:`tuned_configs`), computed from the application's profile:

* ``JCT(r, B)`` — :func:`fixed_batch_jct`: the job run alone from start to completion on ``r`` GPUs
  packed 4 per node (``[4, …, 4, r mod 4]``) with the fixed global batch ``B``, exactly as the simulator
  runs a baseline job (:func:`pollux.sim.batch_config.fixed_batch_config`: the smallest accumulation
  ``s`` with local batch ``m = ⌈B / (r(s+1))⌉ ≤ max_local_bsz``, ``s ≥ 1`` on one GPU above M0,
  effective batch ``M = r·m·(s+1)``); ``T_iter = step + s·(step − sync)`` from the profile, and epoch
  ``e`` advances at ``gain(M/M0, sqr_e, var_e) / T_iter`` with the profile's statistics for that epoch
  and batch — like :func:`pollux.sim.fairness.isolated_jct`, but with the batch fixed. No restarts or
  restart delay. A pair is infeasible (JCT = ∞) when ``m < min_local_bsz`` or the profile has no step
  time for it.
* The **best batch** for ``r`` replicas is the B among the application's validated batch sizes (its
  ``validation-<B>.csv`` files) with the smallest ``JCT(r, B)`` — equivalently the highest job-average
  goodput-based progress rate ``rate(r, B) = completion progress / JCT(r, B)``.
* ``scaling(r) = rate(r, B*_r) / (r · rate(1, B*_1)) = JCT(1, B*_1) / (r · JCT(r, B*_r))``: the share of
  ideal linear scaling over the best single-GPU configuration.
* The configurations are the pairs ``(r, B*_r)``, ``r ∈ {1, 2, 4, 6, 8, 12, 16, 24, 32, 48}``, with
  ``0.5 ≤ scaling(r) ≤ 0.8`` and ``JCT(r, B*_r) < 12 h``.
* Fallback when no pair qualifies: among the pairs with JCT < 12 h, those whose scaling is closest to
  the range [0.5, 0.8] (all pairs at that distance, within 1e-9); when no pair finishes within 12 h,
  the single pair with the smallest JCT.
* Single-replica applications (default: ncf): only ``(1, B*_1)``. ncf is the job the reference fixes
  to one replica and its largest batch under Pollux and Optimus (SPEC §7); its TunedJobs configuration
  in every reference workload is ``1, 32768``. (Under the general rule ncf would get 2 replicas on the
  measured profiles, scaling 0.56, and 4 by the fallback on the built-in ones, scaling 0.49: several
  GPUs for a job of seconds.) Pass ``single_replica_apps=()`` to apply the general rule to ncf too.

Errors in the trace are ``ValueError``s naming the file, the line and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from pollux.goodput import gain
from pollux.goodput.records import check_number
from pollux.sim.batch_config import fixed_batch_config
from pollux.sim.csvrows import read_rows
from pollux.sim.fairness import packed_placement
from pollux.sim.profiles import AppProfile
from pollux.sim.workload import WorkloadJob

__all__ = [
    "MAX_GPU_HOURS",
    "MAX_JCT",
    "MIN_DURATION",
    "REPLICA_CHOICES",
    "SCALING_RANGE",
    "SINGLE_REPLICA_APPS",
    "TRACE_COLUMNS",
    "WINDOW",
    "TraceJob",
    "TunedConfig",
    "application_for",
    "best_batch",
    "filter_trace",
    "fixed_batch_jct",
    "generate_workload",
    "read_trace",
    "scaling_table",
    "tuned_configs",
]

#: Columns a trace must have (``cluster`` may also be present; it is not used).
TRACE_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time")
#: Submission window within each day, seconds since midnight: [02:00, 10:00).
WINDOW = (2 * 3600, 10 * 3600)
MIN_DURATION = 60.0
MAX_GPU_HOURS = 1000.0
REPLICA_CHOICES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
SCALING_RANGE = (0.5, 0.8)
MAX_JCT = 12 * 3600.0
SINGLE_REPLICA_APPS = ("ncf",)

_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")


# --------------------------------------------------------------------------------------------------
# The trace


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One trace row. ``gpu_time`` is in GPU-seconds; ``line`` is its line in the file."""

    line: int
    timestamp: datetime
    duration: float
    num_gpus: int
    gpu_time: float

    @property
    def gpu_hours(self) -> float:
        return self.gpu_time / 3600.0

    @property
    def time_of_day(self) -> int:
        """Seconds since midnight of the submission day."""
        t = self.timestamp
        return t.hour * 3600 + t.minute * 60 + t.second


def _trace_number(path: Path, line: int, field: str, text: str, *, integer: bool = False,
                  minimum: float = 0.0) -> float:
    where = f"{path}:{line}: field {field!r}"
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: not a number: {text!r}") from None
    check_number(where, value, minimum=minimum)
    if integer and value != int(value):
        raise ValueError(f"{where}: must be an integer, got {text!r}")
    return value


def _timestamp(path: Path, line: int, text: str) -> datetime:
    match = _TIMESTAMP.fullmatch((text or "").strip())
    bad = f"{path}:{line}: field 'timestamp': expected YYYY-MM-DD HH:MM:SS, got {text!r}"
    if not match:
        raise ValueError(bad)
    try:
        year, month, day, hour, minute, second = (int(g) for g in match.groups())
        return datetime(year, month, day, hour, minute, second)
    except ValueError:
        raise ValueError(bad) from None


def read_trace(path: Path | str) -> list[TraceJob]:
    """Every row of a Philly-format trace, validated; errors name the file, line and field."""
    path = Path(path)
    idx, rows = read_rows(path, TRACE_COLUMNS, kind="trace", loc=lambda n: f"{path}:{n}",
                          empty_message="no jobs")
    return [TraceJob(line=line,
                     timestamp=_timestamp(path, line, row[idx["timestamp"]]),
                     duration=_trace_number(path, line, "duration", row[idx["duration"]]),
                     num_gpus=int(_trace_number(path, line, "num_gpus", row[idx["num_gpus"]],
                                                integer=True, minimum=1)),
                     gpu_time=_trace_number(path, line, "gpu_time", row[idx["gpu_time"]]))
            for line, row in rows]


def filter_trace(jobs: Iterable[TraceJob], *, window: tuple[int, int] = WINDOW,
                 min_duration: float = MIN_DURATION, max_gpu_hours: float = MAX_GPU_HOURS
                 ) -> list[TraceJob]:
    """Jobs with ``duration ≥ min_duration``, ``gpu_hours < max_gpu_hours`` and a submission time of
    day in ``[window[0], window[1])`` (seconds since midnight), in input order."""
    lo, hi = window
    return [j for j in jobs
            if j.duration >= min_duration and j.gpu_hours < max_gpu_hours and lo <= j.time_of_day < hi]


def application_for(gpu_hours: float, rng: np.random.Generator) -> str:
    """The application of a job of ``gpu_hours`` GPU-hours (draws from ``rng`` for the first two buckets)."""
    if gpu_hours < 1:
        return "cifar10" if rng.random() < 0.5 else "ncf"
    if gpu_hours < 10:
        return "bert" if rng.random() < 0.5 else "deepspeech2"
    if gpu_hours < 100:
        return "yolov3"
    return "imagenet"


# --------------------------------------------------------------------------------------------------
# TunedJobs configurations


@dataclass(frozen=True, slots=True)
class TunedConfig:
    """A (replicas, batch) pair with its scaling (share of ideal linear scaling) and JCT (seconds)."""

    replicas: int
    batch_size: int
    scaling: float
    jct: float


def fixed_batch_jct(profile: AppProfile, replicas: int, batch_size: int) -> float:
    """Seconds to completion alone on ``replicas`` packed GPUs at a fixed batch (∞ when infeasible)."""
    meta = profile.meta
    r = int(replicas)
    total, m, s = fixed_batch_config(int(batch_size), r, meta.init_batch_size, meta.max_local_bsz)
    if m < meta.min_local_bsz:
        return math.inf
    step, sync = profile.step_time(packed_placement(r), m)
    if not (math.isfinite(step) and math.isfinite(sync)) or step <= 0:
        return math.inf
    t_iter = step + s * (step - sync)
    if not t_iter > 0:
        return math.inf
    sqr, var = _epoch_stats(profile, total)
    rates = gain(total / meta.init_batch_size, sqr, var) / t_iter
    if not np.all(rates > 0):
        return math.inf
    ends = np.asarray(profile.epoch_ends, dtype=np.float64)
    jct = float(np.sum(np.diff(ends, prepend=0.0) / rates))
    return jct


def _epoch_stats(profile: AppProfile, batch_size: float) -> tuple[np.ndarray, np.ndarray]:
    """(sqr, var) of every epoch at a global batch: ``AppProfile.grad_stats`` for all epochs at once
    (linear between the nearest validated batch sizes, clamped outside their range)."""
    bs = np.asarray(profile.batch_sizes, dtype=np.float64)
    sqr, var = np.asarray(profile.grad_sqr), np.asarray(profile.grad_var)
    if batch_size <= bs[0] or len(bs) == 1:
        return sqr[0], var[0]
    if batch_size >= bs[-1]:
        return sqr[-1], var[-1]
    i = int(np.searchsorted(bs, batch_size, side="right")) - 1
    w = (batch_size - bs[i]) / (bs[i + 1] - bs[i])
    return (1 - w) * sqr[i] + w * sqr[i + 1], (1 - w) * var[i] + w * var[i + 1]


def best_batch(profile: AppProfile, replicas: int, batch_sizes: Sequence[int] | None = None
               ) -> tuple[int, float]:
    """(B, JCT) of the batch among ``batch_sizes`` (default: the validated ones) with the smallest JCT
    on ``replicas`` GPUs; ties go to the smaller batch. JCT is ∞ when none is feasible."""
    sizes = [int(b) for b in (profile.batch_sizes if batch_sizes is None else batch_sizes)]
    best = (sizes[0], math.inf)
    for b in sorted(sizes):
        jct = fixed_batch_jct(profile, replicas, b)
        if jct < best[1]:
            best = (b, jct)
    return best


def scaling_table(profile: AppProfile, replica_choices: Sequence[int] = REPLICA_CHOICES
                  ) -> list[TunedConfig]:
    """``(r, B*_r, scaling(r), JCT)`` for every feasible replica count (see the module docstring)."""
    _, base = best_batch(profile, 1)
    if not math.isfinite(base):
        raise ValueError(f"{profile.name}: no feasible configuration on one GPU")
    out = []
    for r in replica_choices:
        b, jct = best_batch(profile, r)
        if math.isfinite(jct):
            out.append(TunedConfig(int(r), int(b), base / (r * jct), jct))
    return out


def tuned_configs(profile: AppProfile, *, replica_choices: Sequence[int] = REPLICA_CHOICES,
                  scaling_range: tuple[float, float] = SCALING_RANGE, max_jct: float = MAX_JCT,
                  single_replica: bool = False) -> list[TunedConfig]:
    """The TunedJobs configurations of an application (see the module docstring), by replicas."""
    if single_replica:
        b, jct = best_batch(profile, 1)
        if not math.isfinite(jct):
            raise ValueError(f"{profile.name}: no feasible configuration on one GPU")
        return [TunedConfig(1, b, 1.0, jct)]
    table = scaling_table(profile, replica_choices)
    lo, hi = scaling_range
    ok = [c for c in table if lo <= c.scaling <= hi and c.jct < max_jct]
    if ok:
        return ok
    fast = [c for c in table if c.jct < max_jct]
    if not fast:
        return [min(table, key=lambda c: c.jct)]
    dist = [max(lo - c.scaling, c.scaling - hi, 0.0) for c in fast]
    best = min(dist)
    return [c for c, d in zip(fast, dist, strict=True) if d <= best + 1e-9]


# --------------------------------------------------------------------------------------------------
# The workload


def generate_workload(
    trace_csv: Path | str | Sequence[TraceJob],
    profiles: dict[str, AppProfile],
    num_jobs: int = 160,
    seed: int = 0,
    *,
    window: tuple[int, int] = WINDOW,
    min_duration: float = MIN_DURATION,
    max_gpu_hours: float = MAX_GPU_HOURS,
    replica_choices: Sequence[int] = REPLICA_CHOICES,
    scaling_range: tuple[float, float] = SCALING_RANGE,
    max_jct: float = MAX_JCT,
    single_replica_apps: Sequence[str] = SINGLE_REPLICA_APPS,
) -> list[WorkloadJob]:
    """Sample a workload of ``num_jobs`` jobs from a Philly-format trace (see the module docstring).

    ``trace_csv`` is the trace file, or its rows already read by :func:`read_trace`. Same trace,
    profiles, arguments and ``seed`` ⇒ the same workload. Raises ``ValueError`` when fewer than
    ``num_jobs`` jobs pass the filters or a drawn application has no profile.
    """
    if isinstance(num_jobs, bool) or int(num_jobs) != num_jobs or num_jobs < 1:
        raise ValueError(f"num_jobs: expected a positive integer, got {num_jobs!r}")
    num_jobs = int(num_jobs)
    if isinstance(trace_csv, str | Path):
        path, rows = Path(trace_csv), read_trace(trace_csv)
    else:
        path, rows = Path("<trace>"), list(trace_csv)
    kept = filter_trace(rows, window=window, min_duration=min_duration,
                        max_gpu_hours=max_gpu_hours)
    if len(kept) < num_jobs:
        raise ValueError(f"{path}: only {len(kept)} job(s) pass the filters (duration >= {min_duration:g} s, "
                         f"gpu_time < {max_gpu_hours:g} GPU-hours, submitted in the daily window); "
                         f"cannot sample {num_jobs}")
    rng = np.random.default_rng(seed)
    picked = [kept[i] for i in rng.choice(len(kept), size=num_jobs, replace=False)]
    picked.sort(key=lambda j: (j.time_of_day, j.line))
    configs: dict[str, list[TunedConfig]] = {}
    out = []
    for k, job in enumerate(picked):
        app = application_for(job.gpu_hours, rng)
        if app not in profiles:
            raise ValueError(f"{path}:{job.line}: a job of {job.gpu_hours:.3g} GPU-hours maps to "
                             f"{app!r}, which has no profile (profiles: {', '.join(sorted(profiles))})")
        if app not in configs:
            configs[app] = tuned_configs(profiles[app], replica_choices=replica_choices,
                                         scaling_range=scaling_range, max_jct=max_jct,
                                         single_replica=app in single_replica_apps)
        cfg = configs[app][int(rng.integers(len(configs[app])))]
        out.append(WorkloadJob(name=f"{app}-{k}", submit_time=float(job.time_of_day - window[0]),
                               application=app, num_replicas=cfg.replicas, batch_size=cfg.batch_size))
    return out
