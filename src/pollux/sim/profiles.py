"""Measured job profiles in the Pollux OSDI'21 artifact format (SPEC §7).

An application directory holds

* ``placements.csv`` — ``placement,local_bsz,step_time,sync_time``: step and exposed-sync time (seconds
  per optimiser step, no accumulation) for a placement string (GPUs per node, e.g. ``22``) and a local
  batch size;
* ``scalability.csv`` — ``num_nodes,num_replicas,local_bsz,step_time,sync_time``: larger configurations;
* ``validation-<B>.csv`` — ``progress,iteration,metric,grad_sqr,grad_var``, one row per epoch at global
  batch size B: cumulative progress in M0-iterations, iterations, validation metric, gradient statistics.

The application constants (M0, batch limits, epochs, optimiser) are not in the CSVs; they live in
``applications.json`` beside this module (:func:`default_metadata`), which an override file may replace.

Throughput lookup (:meth:`AppProfile.step_time`): drop empty nodes and normalise the placement to its
smallest rotation (:func:`placement_key`); for a measured placement and a local batch within that
placement's measured range, interpolate linearly over the local batch; otherwise interpolate linearly
over (nodes, replicas, local_bsz) on a Delaunay triangulation of the unscaled points of both files
(rows averaged per key); outside its hull the configuration is infeasible and the lookup is
``(nan, nan)``. Lookups are memoised per profile, so a repeated lookup costs about a microsecond.

Decisions beyond the format:

* Epochs: a validation file with fewer rows than the metadata's ``epochs`` is an error; one with more
  rows is truncated to ``epochs`` (the metadata decides when a job completes, so an override file can
  shorten jobs). All validation files of an application must have the same number of rows.
* An application with no metadata entry gets metadata inferred from its files
  (:func:`infer_metadata`): M0 / max batch = smallest / largest validated B, local bounds = min / max
  local batch over ``placements.csv``, epochs = validation rows, SGD, higher-is-better metric.
* ``step_time`` is a pure data lookup: it does not apply the metadata's local batch bounds.
* Placement strings in files may be any rotation and may contain zero digits; they are normalised,
  and rows that then share (placement, local_bsz) are averaged.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy.interpolate import LinearNDInterpolator
from scipy.spatial import QhullError

from pollux.goodput import GradStats
from pollux.sim.profile_files import (  # noqa: F401 (constants re-exported from here)
    _PLACEMENT_STRING,
    PLACEMENT_COLUMNS,
    PLACEMENTS_FILE,
    SCALABILITY_COLUMNS,
    SCALABILITY_FILE,
    VALIDATION_COLUMNS,
    _infer,
    _read_app,
    infer_metadata,
)
from pollux.sim.profile_meta import METADATA_FILE, OPTIMIZERS, AppMeta, default_metadata  # noqa: F401

__all__ = [
    "AppMeta",
    "AppProfile",
    "default_metadata",
    "infer_metadata",
    "load_profile",
    "load_profiles",
    "placement_key",
    "placement_parts",
    "placement_shape",
]

CACHE_SIZE = 1 << 16

_NAN_PAIR = (math.nan, math.nan)


# --------------------------------------------------------------------------------------------------
# Placements


def placement_key(row: Sequence[int] | np.ndarray | str) -> str:
    """Canonical string of an allocation row (GPUs per node, in node order; zeros allowed).

    Drops zero entries and takes the lexicographically smallest rotation: ``(0, 2, 1, 0, 3)`` →
    ``(2, 1, 3)`` → ``"132"``. An empty allocation gives ``""``. A digit string is accepted as a row.
    Rows with a node of more than 9 GPUs (never measured) give comma-separated keys (``"1,12"``), so
    they cannot collide with a measured digit string. Negative or fractional entries raise ``ValueError``.
    """
    if isinstance(row, str):
        if not _PLACEMENT_STRING.fullmatch(row):
            raise ValueError(f"placement {row!r}: expected a string of digits (GPUs per node)")
        values = [int(c) for c in row if c != "0"]
    else:
        items = row.tolist() if isinstance(row, np.ndarray) else row
        values = []
        for x in items:
            if isinstance(x, bool) or x != x or x < 0 or x != int(x):
                raise ValueError(f"placement {tuple(items)!r}: entries must be non-negative integers")
            if x:
                values.append(int(x))
    if not values:
        return ""
    if len(values) > 1:
        values = min(values[i:] + values[:i] for i in range(len(values)))
    if max(values) <= 9:
        return "".join(map(str, values))
    return ",".join(map(str, values))


def placement_parts(key: str) -> list[int]:
    """GPUs on each node of a placement key."""
    return [int(p) for p in (key.split(",") if "," in key else key)]


def placement_shape(key: str) -> tuple[int, int]:
    """(nodes, replicas) of a placement key."""
    parts = placement_parts(key)
    return len(parts), sum(parts)


# --------------------------------------------------------------------------------------------------
# The profile


class AppProfile:
    """One application's measured throughput and gradient statistics, with fast memoised lookups.

    Public attributes: ``name``, ``meta``, ``gpu_type`` (None for the un-suffixed files),
    ``epoch_ends`` (shape ``(epochs,)``: progress at which epoch
    e ends, the minimum over measured B), ``batch_sizes`` (measured global batch sizes, sorted) and the
    per-B validation arrays ``progress``, ``iterations``, ``metric``, ``grad_sqr``, ``grad_var`` (shape
    ``(len(batch_sizes), epochs)``). All arrays are read-only.
    """

    def __init__(
        self,
        name: str,
        meta: AppMeta,
        *,
        placement_rows: tuple[Sequence[str], Any, Any, Any],
        scalability_rows: tuple[Any, Any, Any, Any, Any],
        batch_sizes: Any,
        progress: Any,
        iterations: Any,
        metric: Any,
        grad_sqr: Any,
        grad_var: Any,
        gpu_type: str | None = None,
    ) -> None:
        self._args = (name, meta)
        self._kwargs = dict(
            placement_rows=placement_rows,
            scalability_rows=scalability_rows,
            batch_sizes=batch_sizes,
            progress=progress,
            iterations=iterations,
            metric=metric,
            grad_sqr=grad_sqr,
            grad_var=grad_var,
            gpu_type=gpu_type,
        )
        self.name = name
        self.meta = meta
        #: The GPU type these throughput rows were measured on (None: the un-suffixed files).
        self.gpu_type = gpu_type

        # Placement rows, normalised and grouped by key.
        raw_keys = [placement_key(k) for k in placement_rows[0]]
        p_lbs, p_step, p_sync = (_ro(np.asarray(a, dtype=np.float64)) for a in placement_rows[1:])
        if not (len(raw_keys) == len(p_lbs) == len(p_step) == len(p_sync)):
            raise ValueError(f"{name}: placement row arrays differ in length")
        self._placement_keys = tuple(raw_keys)
        self._p_lbs, self._p_step, self._p_sync = p_lbs, p_step, p_sync
        groups: dict[str, dict[float, list[tuple[float, float]]]] = {}
        for key, m, st, sy in zip(raw_keys, p_lbs.tolist(), p_step.tolist(), p_sync.tolist(), strict=True):
            if not key:
                raise ValueError(f"{name}: a placement row has no GPUs")
            groups.setdefault(key, {}).setdefault(m, []).append((st, sy))
        self._placements: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, float, float]] = {}
        for key, by_m in groups.items():
            ms = sorted(by_m)
            st = [float(np.mean([v[0] for v in by_m[m]])) for m in ms]
            sy = [float(np.mean([v[1] for v in by_m[m]])) for m in ms]
            self._placements[key] = (np.array(ms), np.array(st), np.array(sy), ms[0], ms[-1])

        s_nodes, s_reps = (np.asarray(a, dtype=np.int64) for a in scalability_rows[:2])
        s_lbs, s_step, s_sync = (np.asarray(a, dtype=np.float64) for a in scalability_rows[2:])
        if not (len(s_nodes) == len(s_reps) == len(s_lbs) == len(s_step) == len(s_sync)):
            raise ValueError(f"{name}: scalability row arrays differ in length")
        shapes = [placement_shape(k) for k in raw_keys]
        self._rows = tuple(
            _ro(a)
            for a in (
                np.concatenate([np.array([s[0] for s in shapes], dtype=np.int64), s_nodes]),
                np.concatenate([np.array([s[1] for s in shapes], dtype=np.int64), s_reps]),
                np.concatenate([p_lbs, s_lbs]),
                np.concatenate([p_step, s_step]),
                np.concatenate([p_sync, s_sync]),
            )
        )
        self._interp = _build_interpolator(*self._rows)

        # Validation data.
        order = np.argsort(np.asarray(batch_sizes, dtype=np.float64), kind="stable")
        self.batch_sizes = _ro(np.asarray(batch_sizes, dtype=np.float64)[order])
        if self.batch_sizes.size == 0:
            raise ValueError(f"{name}: no validated batch sizes")
        if np.any(np.diff(self.batch_sizes) <= 0):
            raise ValueError(f"{name}: duplicate validated batch size")
        arrays = {}
        for label, value in (
            ("progress", progress),
            ("iterations", iterations),
            ("metric", metric),
            ("grad_sqr", grad_sqr),
            ("grad_var", grad_var),
        ):
            arr = np.asarray(value, dtype=np.float64)
            if arr.ndim != 2 or arr.shape[0] != self.batch_sizes.size or arr.shape[1] < 1:
                raise ValueError(f"{name}: {label} must have shape (len(batch_sizes), epochs)")
            arrays[label] = _ro(arr[order])
        self.progress = arrays["progress"]
        self.iterations = arrays["iterations"]
        self.metric = arrays["metric"]
        self.grad_sqr = arrays["grad_sqr"]
        self.grad_var = arrays["grad_var"]
        self.epoch_ends = _ro(self.progress.min(axis=0))
        if self.epoch_ends.size != meta.epochs:
            raise ValueError(
                f"{name}: {self.epoch_ends.size} validation epochs but metadata says {meta.epochs}"
            )
        self._ends = self.epoch_ends.tolist()
        self._bs = self.batch_sizes.tolist()

        self._step_cached: Callable[[tuple, float], tuple[float, float]] = lru_cache(CACHE_SIZE)(
            self._step_lookup
        )
        self._nk_cached: Callable[[int, int, float], tuple[float, float]] = lru_cache(CACHE_SIZE)(
            self._nk_lookup
        )
        self._grad_cached: Callable[[int, float], GradStats] = lru_cache(CACHE_SIZE)(self._grad_lookup)

    # -- pickling (for worker processes): rebuild caches and the interpolator on the other side
    def __reduce__(self):
        return (_rebuild_profile, (self._args, self._kwargs))

    def __repr__(self) -> str:
        return (
            f"AppProfile({self.name!r}, placements={len(self._placements)}, rows={self._rows[0].size}, "
            f"batch_sizes={self._bs}, epochs={self.meta.epochs})"
        )

    # -- throughput -------------------------------------------------------------------------------
    @property
    def measured_placements(self) -> tuple[str, ...]:
        """The measured placement keys, sorted."""
        return tuple(sorted(self._placements))

    def placement_range(self, placement: Sequence[int] | np.ndarray | str) -> tuple[float, float] | None:
        """(min, max) measured local batch of a placement, or None when it was not measured."""
        entry = self._placements.get(placement_key(placement))
        return None if entry is None else (entry[3], entry[4])

    def step_time(self, placement: Sequence[int] | np.ndarray | str, local_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time) in seconds per optimiser step; ``(nan, nan)`` when infeasible.

        ``placement`` is GPUs per node in node order (zeros allowed) or a placement string.
        """
        if isinstance(placement, np.ndarray):
            row = tuple(placement.tolist())
        elif isinstance(placement, str):
            row = (placement,)
        else:
            row = tuple(placement)
        return self._step_cached(row, float(local_bsz))

    def _step_lookup(self, row: tuple, m: float) -> tuple[float, float]:
        key = placement_key(row[0]) if len(row) == 1 and isinstance(row[0], str) else placement_key(row)
        if not key or not m > 0 or not math.isfinite(m):
            return _NAN_PAIR
        entry = self._placements.get(key)
        if entry is not None:
            xs, st, sy, lo, hi = entry
            if lo <= m <= hi:
                return float(np.interp(m, xs, st)), float(np.interp(m, xs, sy))
        nodes, replicas = placement_shape(key)
        return self._nk_cached(nodes, replicas, m)

    def step_time_nk(self, nodes: int, replicas: int, local_bsz: float) -> tuple[float, float]:
        """The (nodes, replicas, local_bsz) interpolation only; ``(nan, nan)`` outside its hull."""
        return self._nk_cached(int(nodes), int(replicas), float(local_bsz))

    def _nk_lookup(self, nodes: int, replicas: int, m: float) -> tuple[float, float]:
        if self._interp is None or nodes < 1 or replicas < nodes or not m > 0 or not math.isfinite(m):
            return _NAN_PAIR
        value = self._interp(np.array([[nodes, replicas, m]], dtype=np.float64))[0]
        st, sy = float(value[0]), float(value[1])
        if not (math.isfinite(st) and math.isfinite(sy)):
            return _NAN_PAIR
        return st, sy

    def step_times_nk(self, nodes: Any, replicas: Any, local_bsz: Any) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`step_time_nk` over broadcast arrays (not memoised)."""
        n, r, m = np.broadcast_arrays(
            np.asarray(nodes, dtype=np.float64),
            np.asarray(replicas, dtype=np.float64),
            np.asarray(local_bsz, dtype=np.float64),
        )
        shape = n.shape
        step = np.full(shape, np.nan)
        sync = np.full(shape, np.nan)
        ok = (n >= 1) & (r >= n) & (m > 0) & np.isfinite(m) & np.isfinite(n) & np.isfinite(r)
        if self._interp is not None and ok.any():
            pts = np.stack([np.floor(n[ok]), np.floor(r[ok]), m[ok]], axis=-1)
            vals = self._interp(pts)
            good = np.isfinite(vals).all(axis=-1)
            vals[~good] = np.nan
            step[ok], sync[ok] = vals[:, 0], vals[:, 1]
        return step, sync

    def throughput_rows(self) -> tuple[np.ndarray, ...]:
        """(nodes, replicas, local_bsz, step_time, sync_time) of every row of both files, for fitting.

        Placement rows first (nodes = non-empty nodes, replicas = GPUs), then scalability rows.
        """
        return self._rows

    # -- statistical efficiency ------------------------------------------------------------------
    def grad_stats(self, epoch: int, batch_size: float) -> GradStats:
        """Gradient statistics (sqr, var at M0) of the 0-based ``epoch`` (clamped to [0, epochs − 1]),
        interpolated linearly between the nearest measured batch sizes (clamped outside their range)."""
        return self._grad_cached(self._epoch_index(epoch), float(batch_size))

    def _epoch_index(self, epoch: int) -> int:
        """``epoch`` clamped to the measured epochs [0, epochs − 1]."""
        return min(max(int(epoch), 0), self.meta.epochs - 1)

    def grad_stats_many(self, epoch: int, batch_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`grad_stats` of many batch sizes at once, as arrays (sqr, var): the same
        interpolation, value for value (not memoised)."""
        e = self._epoch_index(epoch)
        batch_sizes = np.asarray(batch_sizes, dtype=np.float64)
        if not np.all(np.isfinite(batch_sizes)):
            raise ValueError(f"{self.name}: batch sizes must be finite")
        return (np.interp(batch_sizes, self.batch_sizes, self.grad_sqr[:, e]),
                np.interp(batch_sizes, self.batch_sizes, self.grad_var[:, e]))

    def _grad_lookup(self, epoch: int, batch_size: float) -> GradStats:
        if not math.isfinite(batch_size):
            raise ValueError(f"{self.name}: batch_size must be finite, got {batch_size!r}")
        sqr = float(np.interp(batch_size, self.batch_sizes, self.grad_sqr[:, epoch]))
        var = float(np.interp(batch_size, self.batch_sizes, self.grad_var[:, epoch]))
        return GradStats(sqr=sqr, var=var)

    def epoch_at(self, progress: float) -> int:
        """Index of the epoch ``progress`` is in; ``epochs`` once the last epoch has ended."""
        if progress != progress:
            raise ValueError(f"{self.name}: progress is NaN")
        return bisect.bisect_right(self._ends, progress)

    def iterations_to_finish(self, batch_size: float) -> float:
        """Optimiser steps to the completion epoch at a fixed global batch (the Optimus oracle).

        The iteration count at the last epoch of each measured batch size, interpolated linearly
        between the nearest measured batch sizes (clamped outside their range).
        """
        last = self.iterations[:, self.meta.epochs - 1]
        return float(np.interp(float(batch_size), self.batch_sizes, last))

    @property
    def completion_progress(self) -> float:
        """Progress at which the job completes (end of its last epoch)."""
        return self._ends[-1]


def _rebuild_profile(args: tuple, kwargs: dict) -> AppProfile:
    return AppProfile(*args, **kwargs)


def _ro(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, copy=True)
    arr.setflags(write=False)
    return arr


def _build_interpolator(nodes, replicas, lbs, step, sync) -> LinearNDInterpolator | None:
    """Linear interpolator over unscaled (nodes, replicas, local_bsz), rows averaged per key."""
    if nodes.size == 0:
        return None
    keys = np.stack([nodes.astype(np.float64), replicas.astype(np.float64), lbs], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    counts = np.bincount(inverse, minlength=len(uniq)).astype(np.float64)
    values = np.stack(
        [
            np.bincount(inverse, weights=step, minlength=len(uniq)) / counts,
            np.bincount(inverse, weights=sync, minlength=len(uniq)) / counts,
        ],
        axis=1,
    )
    if len(uniq) < 4:
        return None
    try:
        return LinearNDInterpolator(uniq, values, fill_value=np.nan)
    except (QhullError, ValueError):
        # Degenerate point set (e.g. all points in one plane): no volume to interpolate over.
        return None


def _build(name: str, raw: dict[str, Any], meta: AppMeta, gpu_type: str | None = None) -> AppProfile:
    epochs = meta.epochs
    vals = raw["validation"]
    rows = len(vals[0][2]["progress"])
    if rows < epochs:
        raise ValueError(
            f"{vals[0][1]}: {rows} epoch row(s) but the metadata for {meta.name!r} says epochs = {epochs}"
        )

    def stack(column: str) -> np.ndarray:
        return np.array([v[column][:epochs] for _, _, v in vals], dtype=np.float64)

    pl, sc = raw["placements"], raw["scalability"]
    return AppProfile(
        name,
        meta,
        placement_rows=(pl["placement"], pl["local_bsz"], pl["step_time"], pl["sync_time"]),
        scalability_rows=(
            sc["num_nodes"],
            sc["num_replicas"],
            sc["local_bsz"],
            sc["step_time"],
            sc["sync_time"],
        ),
        batch_sizes=[b for b, _, _ in vals],
        progress=stack("progress"),
        iterations=stack("iteration"),
        metric=stack("metric"),
        grad_sqr=stack("grad_sqr"),
        grad_var=stack("grad_var"),
        gpu_type=gpu_type,
    )


def load_profile(app_dir: Path, meta: AppMeta | None = None) -> AppProfile:
    """Load one application directory. Without ``meta``: the default metadata entry of the directory's
    name, else metadata inferred from the files (:func:`infer_metadata`)."""
    app_dir = Path(app_dir)
    name = app_dir.name
    raw = _read_app(app_dir)
    if meta is None:
        meta = default_metadata().get(name) or _infer(name, raw)
    return _build(name, raw, meta)


def load_profiles(
    root: Path, apps: Sequence[str] | None = None, metadata: dict[str, AppMeta] | None = None
) -> dict[str, AppProfile]:
    """Load the applications under ``root`` (all sub-directories holding a placements.csv when ``apps``
    is None). ``metadata`` defaults to :func:`default_metadata`; apps missing from it are inferred."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: profile root directory not found")
    if apps is None:
        apps = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / PLACEMENTS_FILE).is_file())
        if not apps:
            raise FileNotFoundError(f"{root}: no application directories (with {PLACEMENTS_FILE})")
    if metadata is None:
        metadata = default_metadata()
    out = {}
    for app in apps:
        raw = _read_app(root / app)
        meta = metadata.get(app) or _infer(app, raw)
        out[app] = _build(app, raw, meta)
    return out
