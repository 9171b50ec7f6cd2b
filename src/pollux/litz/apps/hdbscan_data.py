"""The points the HDBSCAN application clusters: a file of vectors, or a generated data set.

A file is `.npy` (a 2-D numeric array) or `.csv` (comma-separated numbers, one point per line, an
optional header line). Every executor reads the whole file: a proposal's distance needs both points,
wherever they are owned (the points are read-only input, re-read after a move, never checkpointed);
a process keeps what it read (`load_points` is cached by path, size and modification time).

The generated set is thesis Table 4.2's: Gaussian clusters (unit variance) plus a fraction of
uniform noise. The cluster centres are uniform in a cube whose side grows with the number of
clusters as 10 · clusters^(1/dim), so that neighbouring centres are about ten standard deviations
apart in every dimension; the noise is uniform in the same cube, widened by three standard
deviations on each side.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class PointSet:
    """Points (n × dim, float64) and, for a generated set, the generating labels (-1 noise)."""

    points: np.ndarray
    truth: np.ndarray | None
    source: str


def gaussian_clusters(n: int, dim: int, clusters: int, noise: float, seed: int) -> PointSet:
    """`n` points: a fraction `noise` uniform, the rest spread at random over `clusters` unit
    Gaussians (module doc). Seeded: the same arguments give the same points in every process."""
    if n < 2 or dim < 1 or clusters < 1:
        raise ValueError(f"generated data: n ({n}) must be >= 2, dim ({dim}) and clusters ({clusters}) >= 1")
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"generated data: noise must be in [0, 1), got {noise}")
    rng = np.random.default_rng([seed, 4107])
    side = 10.0 * clusters ** (1.0 / dim)
    centres = rng.uniform(0.0, side, size=(clusters, dim))
    num_noise = round(noise * n)
    truth = np.r_[rng.integers(clusters, size=n - num_noise), np.full(num_noise, -1)]
    points = np.empty((n, dim))
    inside = truth >= 0
    points[inside] = centres[truth[inside]] + rng.standard_normal((int(inside.sum()), dim))
    points[~inside] = rng.uniform(-3.0, side + 3.0, size=(num_noise, dim))
    order = rng.permutation(n)  # noise is not a block at the end (blocks are contiguous ids)
    source = f"gaussian n={n} dim={dim} clusters={clusters} noise={noise}"
    return PointSet(points[order], truth[order], source)


def load_points(path: str) -> PointSet:
    """The vectors in `path` (.npy or .csv), checked: 2-D, numeric, finite, at least two rows."""
    file = Path(path)
    try:
        stat = file.stat()
    except OSError as exc:
        raise ValueError(f"data file {path}: cannot be read ({exc.strerror or exc})") from None
    if not file.is_file():
        raise ValueError(f"data file {path}: not a file")
    points = _cached(str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    return PointSet(points, None, str(path))


@functools.lru_cache(maxsize=4)
def _cached(path: str, size: int, mtime_ns: int) -> np.ndarray:
    del size, mtime_ns  # part of the cache key only: a changed file is read again
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".npy":
        data = _read_npy(path)
    elif suffix == ".csv":
        data = _read_csv(path)
    else:
        raise ValueError(f"data file {path}: expected a .npy or .csv file, got {suffix or 'no extension'!r}")
    if data.ndim != 2:
        raise ValueError(f"data file {path}: expected a 2-D array (points × dimensions), got {data.ndim}-D")
    if data.shape[0] < 2 or data.shape[1] < 1:
        raise ValueError(
            f"data file {path}: need at least 2 points of at least 1 dimension, got {data.shape}"
        )
    bad = ~np.isfinite(data).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"data file {path}: row {row} is not finite (NaN or infinity)")
    data.setflags(write=False)
    return data


def _read_npy(path: str) -> np.ndarray:
    try:
        raw = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"data file {path}: not a readable .npy array ({exc})") from None
    if not isinstance(raw, np.ndarray) or not (np.issubdtype(raw.dtype, np.number) or raw.dtype == bool):
        dtype = getattr(raw, "dtype", "?")
        raise ValueError(f"data file {path}: expected a numeric array, got dtype {dtype}")
    if np.iscomplexobj(raw):
        raise ValueError(f"data file {path}: complex numbers are not points")
    return np.asarray(raw, dtype=np.float64)


def _read_csv(path: str) -> np.ndarray:
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"data file {path}: cannot be read as text ({exc})") from None
    header = 0
    try:
        [float(cell) for cell in first.split(",")]
    except ValueError:
        header = 1  # a first line that is not numbers is a header
    try:
        return np.loadtxt(path, delimiter=",", skiprows=header, ndmin=2, dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"data file {path}: not a CSV of numbers ({exc})") from None
