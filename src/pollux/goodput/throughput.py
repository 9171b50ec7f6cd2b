"""The throughput model of SPEC §3 and its fit from observed step times.

The model predicts the time of one optimiser step for ``K`` replicas on ``N`` nodes with local batch
``m`` and ``s`` gradient-accumulation steps::

    T_grad(m)       = α_grad + β_grad·m
    T_sync(K, N)    = 0 (K = 1) | α_local + β_local·(K−2) (N = 1) | α_node + β_node·(K−2)
    T_iter          = s·T_grad + (T_grad^γ + T_sync^γ)^(1/γ)

Seven parameters are enough to extrapolate from the few configurations a job has run to every
allocation the scheduler may consider; the exploration priors make an unexplored dimension look
cheap (perfect scaling), which draws the scheduler to try it and so measure it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize

from pollux.goodput.records import ThroughputParams

#: Lower bound of every α and β; "pinning" a parameter fixes it here.
PARAM_FLOOR = 1e-8
#: Upper bound of every α and β (seconds, or seconds per sample): generous, keeps exp() finite.
PARAM_CEIL = 1e4
GAMMA_BOUNDS = (1.0, 10.0)
#: L-BFGS-B stopping tolerance on the loss reduction per iteration (scipy's default). Losses here are
#: below 1, so this is effectively absolute; 1e-5 is ~5x faster at a ~1 % worse in-sample error.
FIT_FTOL = 2.2e-9
#: Default starting point of a fresh fit (SPEC §3).
INITIAL_PARAMS = ThroughputParams(0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.001)

_NAMES = ("alpha_grad", "beta_grad", "alpha_local", "beta_local", "alpha_node", "beta_node", "gamma")
_AG, _BG, _AL, _BL, _AN, _BN, _GAMMA = range(7)


def _params_array(params: ThroughputParams | ArrayLike) -> np.ndarray:
    if isinstance(params, ThroughputParams):
        return np.array(params.as_array(), dtype=np.float64)
    return np.asarray(params, dtype=np.float64)


def t_grad(params: ThroughputParams | ArrayLike, local_bsz: ArrayLike) -> np.ndarray:
    """Time of one forward/backward pass over a local batch of ``local_bsz`` examples."""
    p = _params_array(params)
    return p[_AG] + p[_BG] * np.asarray(local_bsz, dtype=np.float64)


def t_sync(params: ThroughputParams | ArrayLike, nodes: ArrayLike, replicas: ArrayLike) -> np.ndarray:
    """Time of the gradient all-reduce of one optimiser step (zero for a single replica)."""
    p = _params_array(params)
    nodes = np.asarray(nodes)
    replicas = np.asarray(replicas, dtype=np.float64)
    local = p[_AL] + p[_BL] * (replicas - 2.0)
    remote = p[_AN] + p[_BN] * (replicas - 2.0)
    out = np.where(nodes <= 1, local, remote)
    return np.where(replicas <= 1, 0.0, out)


def _overlap(tg: np.ndarray, ts: np.ndarray, gamma: float) -> np.ndarray:
    """``(tg^γ + ts^γ)^(1/γ)`` computed without overflow or underflow."""
    top = np.maximum(tg, ts)
    safe = np.where(top > 0.0, top, 1.0)
    return top * ((tg / safe) ** gamma + (ts / safe) ** gamma) ** (1.0 / gamma)


def t_iter(
    params: ThroughputParams | ArrayLike,
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> np.ndarray:
    """Seconds per optimiser step: ``s`` accumulation passes plus one overlapped pass-and-sync."""
    p = _params_array(params)
    tg = t_grad(p, local_bsz)
    ts = t_sync(p, nodes, replicas)
    return np.asarray(accum_steps, dtype=np.float64) * tg + _overlap(tg, ts, p[_GAMMA])


def throughput(
    params: ThroughputParams | ArrayLike,
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> np.ndarray:
    """Examples per second: ``M / T_iter`` with ``M = K·m·(s+1)``."""
    replicas_f = np.asarray(replicas, dtype=np.float64)
    m = np.asarray(local_bsz, dtype=np.float64)
    s = np.asarray(accum_steps, dtype=np.float64)
    return replicas_f * m * (s + 1.0) / t_iter(params, nodes, replicas, local_bsz, accum_steps)


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputFit:
    """Outcome of :func:`fit_throughput`.

    ``ok`` is False when the optimiser failed; ``params`` are then the previous parameters (or the
    defaults) and ``message`` says why. ``pinned`` names the parameters fixed by the priors.
    """

    params: ThroughputParams
    ok: bool
    message: str
    loss: float
    pinned: tuple[str, ...]
    records: int


def _aggregate(
    nodes: np.ndarray, replicas: np.ndarray, local_bsz: np.ndarray,
    optim: np.ndarray, accum: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Average records that share a (nodes, replicas, m) key; accumulation times may be missing."""
    keys = np.stack([nodes, replicas, local_bsz], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    k = uniq.shape[0]
    count = np.bincount(inverse, minlength=k).astype(np.float64)
    optim_mean = np.bincount(inverse, weights=optim, minlength=k) / count
    has_accum = np.isfinite(accum)
    accum_count = np.bincount(inverse, weights=has_accum.astype(np.float64), minlength=k)
    accum_sum = np.bincount(inverse, weights=np.where(has_accum, accum, 0.0), minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        accum_mean = np.where(accum_count > 0, accum_sum / np.maximum(accum_count, 1.0), np.nan)
    return uniq[:, 0], uniq[:, 1], uniq[:, 2], optim_mean, accum_mean


def _validate_records(name: str, values: np.ndarray, *, positive: bool, allow_nan: bool = False) -> None:
    bad = ~np.isfinite(values)
    if allow_nan:
        bad &= ~np.isnan(values)
    if np.any(bad):
        raise ValueError(f"{name}: record {int(np.argmax(bad))} is not finite")
    check = values[np.isfinite(values)]
    if positive and np.any(check <= 0):
        idx = int(np.flatnonzero(np.where(np.isfinite(values), values <= 0, False))[0])
        raise ValueError(f"{name}: record {idx} must be > 0, got {values[idx]!r}")


class _Objective:
    """RMSLE of both series plus regularisers, with its analytic gradient, in log-parameter space.

    Working with ``x = log(param)`` for α and β puts parameters that differ by six orders of
    magnitude on the same footing for L-BFGS-B; γ is optimised directly.
    """

    def __init__(
        self, nodes: np.ndarray, replicas: np.ndarray, m: np.ndarray,
        optim: np.ndarray, accum: np.ndarray, free: np.ndarray, fixed: np.ndarray,
    ) -> None:
        multi = replicas > 1
        local = (multi & (nodes <= 1)).astype(np.float64)
        remote = (multi & (nodes > 1)).astype(np.float64)
        k2 = replicas - 2.0
        self.m = m
        self.multi = multi
        # Design columns: T_grad = [1, m]·(α_grad, β_grad); T_sync = [loc, loc·k2, rem, rem·k2]·(...).
        self.grad_cols = np.stack([np.ones_like(m), m], axis=1)
        self.sync_cols = np.stack([local, local * k2, remote, remote * k2], axis=1)
        self.log_optim = np.log(optim)
        self.inv_n1 = 1.0 / optim.size
        has_accum = np.isfinite(accum)
        self.accum_idx = np.flatnonzero(has_accum)
        self.log_accum = np.log(accum[has_accum])
        self.accum_cols = self.grad_cols[self.accum_idx]
        self.free = free
        self.fixed = fixed

    def full(self, x: np.ndarray) -> np.ndarray:
        p = self.fixed.copy()
        p[self.free] = x
        return p

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        # Few, whole-array operations: fits run on a handful of records, where numpy's per-call
        # overhead, not arithmetic, is the cost.
        z = self.full(x)                      # α, β in log space; γ plain
        p = np.exp(z)
        gamma = z[_GAMMA]
        tg = self.grad_cols @ p[0:2]
        ts = self.sync_cols @ p[2:6]
        has_ts = self.multi
        top = np.maximum(tg, ts)
        a = (tg / top) ** gamma
        b = (ts / top) ** gamma               # exactly 0 where ts = 0 (γ ≥ 1)
        ab = a + b
        to = top * ab ** (1.0 / gamma)
        log_tg = np.log(tg)
        log_to = np.log(to)
        wg = a / ab
        ws = b / ab
        grad = np.zeros(7)
        # Series 1: optimiser-step time against the overlapped pass-and-sync.
        e = log_to - self.log_optim
        rmse = float(np.sqrt((e @ e) * self.inv_n1))
        loss = rmse
        if rmse > 0:
            c = e * (self.inv_n1 / rmse)
            safe_ts = np.where(has_ts, ts, 1.0)
            grad[0:2] = (c * wg / tg) @ self.grad_cols
            grad[2:6] = (c * ws / safe_ts) @ self.sync_cols
            log_ts = np.log(safe_ts)          # 0 where there is no sync
            grad[_GAMMA] = float(c @ (wg * log_tg + ws * log_ts - log_to)) / gamma
        # Series 2: accumulation-step time against T_grad alone.
        idx = self.accum_idx
        if idx.size:
            e2 = log_tg[idx] - self.log_accum
            rmse2 = float(np.sqrt((e2 @ e2) / idx.size))
            loss += rmse2
            if rmse2 > 0:
                grad[0:2] += (e2 / (idx.size * rmse2 * tg[idx])) @ self.accum_cols
        # Chain rule into log space for every α and β.
        grad[:_GAMMA] *= p[:_GAMMA]
        # Regularisers: γ near 1, and sync cost dominated by its constant part.
        loss += 1e-3 * (gamma - 1.0) ** 2
        grad[_GAMMA] += 2e-3 * (gamma - 1.0)
        r_node = (p[_BN] / p[_AN]) ** 2
        r_local = (p[_BL] / p[_AL]) ** 2
        loss += 1e-2 * (r_node + r_local)
        grad[_BN] += 2e-2 * r_node
        grad[_AN] -= 2e-2 * r_node
        grad[_BL] += 2e-2 * r_local
        grad[_AL] -= 2e-2 * r_local
        return float(loss), grad[self.free]


def fit_throughput(
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    optim_step_time: ArrayLike,
    accum_step_time: ArrayLike | None = None,
    *,
    previous: ThroughputParams | None = None,
    initial: ThroughputParams = INITIAL_PARAMS,
    ftol: float = FIT_FTOL,
) -> ThroughputFit:
    """Fit the seven parameters to observed step times (L-BFGS-B on RMSLE, SPEC §3).

    Each record is one configuration a job ran: ``nodes``, ``replicas``, local batch ``local_bsz``,
    the mean optimiser-step time (a pass overlapped with the all-reduce) and, where the job used
    gradient accumulation, the mean accumulation-step time (NaN where not observed). Records that
    share a (nodes, replicas, m) key are averaged. The exploration priors pin what the records
    cannot identify (see :func:`exploration_priors`). If the optimiser fails, the previous
    parameters are kept (``ok=False`` and ``message`` say why). ``initial`` is the starting point
    (warm-start from the previous fit to converge faster); ``ftol`` the optimiser's stopping tolerance.
    """
    nodes_a = np.atleast_1d(np.asarray(nodes, dtype=np.float64))
    replicas_a = np.atleast_1d(np.asarray(replicas, dtype=np.float64))
    m_a = np.atleast_1d(np.asarray(local_bsz, dtype=np.float64))
    optim_a = np.atleast_1d(np.asarray(optim_step_time, dtype=np.float64))
    if accum_step_time is None:
        accum_a = np.full_like(optim_a, np.nan)
    else:
        accum_a = np.atleast_1d(np.asarray(accum_step_time, dtype=np.float64))
    n = nodes_a.size
    for name, arr in (("replicas", replicas_a), ("local_bsz", m_a), ("optim_step_time", optim_a),
                      ("accum_step_time", accum_a)):
        if arr.size != n:
            raise ValueError(f"{name}: expected {n} records (as many as nodes), got {arr.size}")
    fallback = previous if previous is not None else initial
    if n == 0:
        return ThroughputFit(fallback, False, "no records to fit", float("nan"), (), 0)
    _validate_records("nodes", nodes_a, positive=True)
    _validate_records("replicas", replicas_a, positive=True)
    _validate_records("local_bsz", m_a, positive=True)
    _validate_records("optim_step_time", optim_a, positive=True)
    _validate_records("accum_step_time", accum_a, positive=True, allow_nan=True)
    if np.any(nodes_a > replicas_a):
        idx = int(np.argmax(nodes_a > replicas_a))
        raise ValueError(f"nodes: record {idx} has more nodes than replicas")

    kn, kr, km, kopt, kacc = _aggregate(nodes_a, replicas_a, m_a, optim_a, accum_a)
    start = np.array(initial.as_array(), dtype=np.float64)
    pinned = exploration_priors(kn, kr, km)
    if "alpha_grad" in pinned:
        times = np.where(np.isfinite(kacc), kacc, kopt)
        start[_AG] = float(np.clip(np.mean(times) / 2.0, PARAM_FLOOR, PARAM_CEIL))
    for name in pinned:
        if name != "alpha_grad":
            start[_NAMES.index(name)] = PARAM_FLOOR
    z0 = np.log(np.clip(start, PARAM_FLOOR, PARAM_CEIL))
    z0[_GAMMA] = start[_GAMMA]
    free = np.array([i for i, nm in enumerate(_NAMES) if nm not in pinned], dtype=np.intp)
    objective = _Objective(kn, kr, km, kopt, kacc, free, z0)
    bounds = [GAMMA_BOUNDS if i == _GAMMA else (np.log(PARAM_FLOOR), np.log(PARAM_CEIL))
              for i in free]
    try:
        with np.errstate(all="ignore"):
            start_loss, _ = objective(z0[free])
            res = minimize(objective, z0[free], jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": 500, "ftol": ftol})
        loss = float(res.fun)
        if not np.all(np.isfinite(res.x)) or not np.isfinite(loss):
            raise FloatingPointError(f"non-finite result ({res.message})")
        if np.isfinite(start_loss) and loss > start_loss:
            raise FloatingPointError(f"loss rose from {start_loss:.4g} to {loss:.4g}")
    except (FloatingPointError, ValueError, ArithmeticError) as exc:
        return ThroughputFit(fallback, False, f"fit failed, keeping previous parameters: {exc}",
                             float("nan"), tuple(pinned), int(kn.size))
    z = objective.full(res.x)
    values = np.clip(np.exp(z), PARAM_FLOOR, PARAM_CEIL)
    values[_GAMMA] = float(np.clip(z[_GAMMA], *GAMMA_BOUNDS))
    if not np.any(kn > 1):
        # Prior 5: multi-node is assumed no cheaper than what single-node showed.
        values[_AN] = min(max(values[_AN], 1.1 * values[_AL]), PARAM_CEIL)
        values[_BN] = min(max(values[_BN], 1.1 * values[_BL]), PARAM_CEIL)
    params = ThroughputParams(*(float(v) for v in values))
    return ThroughputFit(params, True, str(res.message), loss, tuple(pinned), int(kn.size))


def exploration_priors(nodes: ArrayLike, replicas: ArrayLike, local_bsz: ArrayLike) -> list[str]:
    """Names of the parameters the records cannot identify, pinned before the fit (SPEC §3, 1–4).

    1. no record on more than one node → ``alpha_node``, ``beta_node``;
    2. no single-node record with more than one replica → ``alpha_local``, ``beta_local``;
    3. no record with more than two replicas → ``beta_node``, ``beta_local``;
    4. a single distinct local batch → ``alpha_grad`` (set to half the mean pass time, not the floor).
    """
    nodes = np.asarray(nodes)
    replicas = np.asarray(replicas)
    pinned: list[str] = []

    def pin(*names: str) -> None:
        for nm in names:
            if nm not in pinned:
                pinned.append(nm)

    if not np.any(nodes > 1):
        pin("alpha_node", "beta_node")
    if not np.any((nodes == 1) & (replicas > 1)):
        pin("alpha_local", "beta_local")
    if not np.any(replicas > 2):
        pin("beta_node", "beta_local")
    if np.unique(np.asarray(local_bsz)).size == 1:
        pin("alpha_grad")
    return pinned
