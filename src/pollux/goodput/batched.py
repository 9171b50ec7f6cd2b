"""The best goodput of many models at once: :func:`pollux.goodput.model.optimize` for a batch of
(model, limits) pairs in one set of array operations, the same to the last bit (issue 38).

Why: a cold scheduling round calls :func:`optimize` once per job and GPU type — 1,896 calls in Sia's
first round at 4,096 GPUs × 1,000 jobs, about 0.3 ms each for arrays of ten counts × 50 candidate
batches, most of it numpy's cost per operation rather than arithmetic. Here each (model, limits)
pair is a row of parameters (:class:`ModelRows`), each entry names its row, and all entries are
optimised together.

Bit for bit: each step is the operation :func:`optimize` performs (through :func:`batch_candidates`,
:func:`accumulation_plan` and :func:`pollux.goodput.throughput.t_iter`), in the same order, with the
model's scalars taken per entry instead of broadcast from one model; elementwise IEEE operations do
not depend on how their operands were broadcast. One exception needs care: numpy evaluates
``array ** scalar`` for the exponents 2, 0.5 and −1 as a square, a square root and a reciprocal,
which differ from ``pow`` in the last bit for about one value in a thousand, so :func:`scalar_power`
does the same entry by entry (a fitted γ of exactly 2 would otherwise give another speedup).
``tests/test_goodput_batched.py`` compares both on random models, limits and allocations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pollux.goodput.efficiency import efficiency
from pollux.goodput.model import NUM_CANDIDATES, BatchLimits, GoodputModel, local_bounds

#: Entries optimised together at most (8,192 × 50 candidates: 3.3 MB per array).
CHUNK = 8192
#: numpy's shortcuts for ``array ** scalar`` (``fast_scalar_power``): exponent → the function used.
_SHORTCUTS = ((2.0, np.square), (0.5, np.sqrt), (-1.0, np.reciprocal))


@dataclass(frozen=True, slots=True)
class ModelRows:
    """(model, limits) pairs as rows of parameters: the seven throughput parameters, the gradient
    statistics, M0, the whole-example local batch bounds, the largest batch and the two flags."""

    params: np.ndarray
    sqr: np.ndarray
    var: np.ndarray
    init_batch_size: np.ndarray
    min_local: np.ndarray
    max_local: np.ndarray
    max_batch: np.ndarray
    accumulation: np.ndarray
    adaptive: np.ndarray

    @property
    def size(self) -> int:
        return int(self.sqr.size)


def model_rows(pairs: Sequence[tuple[GoodputModel, BatchLimits]]) -> ModelRows:
    """The rows of ``pairs``; the same ``ValueError`` as :func:`optimize` when a pair's M0 differ."""
    for model, limits in pairs:
        if model.init_batch_size != limits.init_batch_size:
            raise ValueError(f"limits.init_batch_size: {limits.init_batch_size:g} differs from the model's "
                             f"init_batch_size {model.init_batch_size:g}")
    bounds = np.array([local_bounds(limits) for _, limits in pairs], dtype=np.float64).reshape(-1, 2)
    return ModelRows(
        params=np.array([model.throughput_params.as_array() for model, _ in pairs],
                        dtype=np.float64).reshape(-1, 7),
        sqr=np.array([model.grad_stats.sqr for model, _ in pairs], dtype=np.float64),
        var=np.array([model.grad_stats.var for model, _ in pairs], dtype=np.float64),
        init_batch_size=np.array([limits.init_batch_size for _, limits in pairs], dtype=np.float64),
        min_local=bounds[:, 0],
        max_local=bounds[:, 1],
        max_batch=np.array([limits.max_batch for _, limits in pairs], dtype=np.float64),
        accumulation=np.array([limits.accumulation for _, limits in pairs], dtype=bool),
        adaptive=np.array([limits.adaptive for _, limits in pairs], dtype=bool),
    )


def scalar_power(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """``base[i] ** exponent[i]`` (``exponent`` of shape (E, 1)) as numpy computes a row raised to a
    scalar exponent, shortcuts included."""
    out = np.power(base, exponent)
    for value, shortcut in _SHORTCUTS:
        rows = exponent[:, 0] == value
        if rows.any():
            out[rows] = shortcut(base[rows])
    return out


def optimize_many(rows: ModelRows, row: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, *,
                  force_single_accumulation: bool = True) -> np.ndarray:
    """The best goodput of entry e — model and limits ``row[e]`` of ``rows`` on ``nodes[e]`` nodes and
    ``replicas[e]`` GPUs — equal to ``optimize(model, nodes[e], replicas[e], limits).goodput``.

    Entries go through in slices of :data:`CHUNK` (each entry is computed on its own, so the slices
    change nothing but the memory held: about 30 arrays of ``CHUNK × 50`` floats at a time)."""
    row = np.asarray(row, dtype=np.int64).reshape(-1)
    n = np.asarray(nodes).reshape(-1).astype(np.float64)
    k = np.asarray(replicas).reshape(-1).astype(np.float64)
    if not row.size == n.size == k.size:
        raise ValueError(f"row, nodes, replicas: {row.size}, {n.size} and {k.size} entries, expected equal")
    parts = [_optimize_slice(rows, row[i:i + CHUNK], n[i:i + CHUNK], k[i:i + CHUNK],
                             force_single_accumulation)
             for i in range(0, row.size, CHUNK)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


def _optimize_slice(rows: ModelRows, row: np.ndarray, n: np.ndarray, k: np.ndarray,
                    force_single_accumulation: bool) -> np.ndarray:
    """:func:`optimize_many` on one slice of entries (float node and replica counts)."""
    valid = (k >= 1) & (n >= 1) & (n <= k)
    k_safe = np.where(valid, k, 1.0)
    n_safe = np.where(valid, n, 1.0)
    # The candidates (batch_candidates).
    low = np.maximum(rows.init_batch_size[row], rows.min_local[row] * k_safe)
    top_batch = rows.max_batch[row]
    valid &= low <= top_batch
    ratio = np.where(valid, top_batch / low, 1.0)
    frac = np.linspace(0.0, 1.0, NUM_CANDIDATES)
    cand = low[:, None] * ratio[:, None] ** frac[None, :]
    # How each runs (accumulation_plan).
    kk = k_safe[:, None]
    hi = rows.max_local[row][:, None]
    lo = rows.min_local[row][:, None]
    m0 = rows.init_batch_size[row][:, None]
    steps = np.maximum(np.ceil(cand / (kk * hi) - 1e-9) - 1.0, 0.0)
    force = (kk == 1.0) & (cand > m0 * (1.0 + 1e-9)) & force_single_accumulation
    steps = np.where(force, np.maximum(steps, 1.0), steps)
    steps = np.where(rows.accumulation[row][:, None], steps, 0.0)
    local = np.ceil(cand / (kk * (steps + 1.0)) - 1e-9)
    batch = kk * local * (steps + 1.0)
    ok = (local >= lo) & (local <= hi) & valid[:, None]
    # Step time (t_iter) and goodput.
    p = rows.params[row]
    grad = p[:, 0:1] + p[:, 1:2] * local
    same_node = p[:, 2:3] + p[:, 3:4] * (kk - 2.0)
    across = p[:, 4:5] + p[:, 5:6] * (kk - 2.0)
    sync = np.where(kk <= 1, 0.0, np.where(n_safe[:, None] <= 1, same_node, across))
    gamma = p[:, 6:7]
    top = np.maximum(grad, sync)
    safe = np.where(top > 0.0, top, 1.0)
    overlapped = top * scalar_power(scalar_power(grad / safe, gamma) + scalar_power(sync / safe, gamma),
                                    1.0 / gamma)
    throughput = batch / (steps * grad + overlapped)
    eff = efficiency(batch, m0, rows.sqr[row][:, None], rows.var[row][:, None])
    eff = np.where(rows.adaptive[row][:, None], eff, 1.0)
    good = np.where(ok, throughput * eff, 0.0)
    return np.asarray(good[np.arange(good.shape[0]), np.argmax(good, axis=1)], dtype=np.float64)
