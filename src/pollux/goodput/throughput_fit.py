"""The fit of the throughput model (:mod:`pollux.goodput.throughput`, SPEC §3) to observed step
times, and the exploration priors that pin what the records cannot identify.

The fit minimises the SPEC loss (RMSLE of the optimiser-step times + RMSLE of the accumulation-step
times + the two regularisers) with L-BFGS-B over log α, log β and γ. A young job has only a few
records, and there a single descent from the SPEC start meets two traps:

* The kink. Each RMSLE is ``sqrt(MSE)``: ``|e|`` for one record, and not differentiable wherever a
  series can be fitted exactly, which with seven parameters and a handful of records is common.
  L-BFGS-B's line search and curvature model fail at such a point and it stops, sometimes far from
  the optimum. So every start first descends a smooth surrogate in which each series costs
  ``sqrt(MSE + δ²)`` (δ = 1e-3), the best end is polished on a sharper one (δ = 1e-5) and then on the
  true loss; every candidate is judged on the true loss, which is the one reported.
* The floor. In log space a parameter's gradient is its linear gradient times its value, so an α or
  β that sinks towards the 1e-8 floor cannot come back, and what it stood for (a pass that grows with
  m, a sync cost) vanishes from the model. So the main start is read off the records (a line through
  the pass times, sync = step − pass, γ = 1): every free parameter starts clearly above the floor and
  the records are nearly fitted already. The SPEC start is tried too when there are few records
  (where the loss has flat valleys and several minima), and ``previous`` when given (its parameters
  at the floor replaced by the data's values). If the best result still has a free α or β 1000x
  below the data's value while the loss falls as it rises, it is lifted back and the fit descends
  again.

Starting near the answer makes most descents short: on up to eight records (two or three starts)
the fit costs about 1.5–2.5x one plain descent from the SPEC start; on more (one or two starts),
about as much or less.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from pollux.goodput.lbfgsb import LbfgsbResult, minimise
from pollux.goodput.records import ThroughputParams
from pollux.goodput.threads import one_blas_thread
from pollux.goodput.throughput import PARAM_NAMES

__all__ = ["FIT_FTOL", "GAMMA_BOUNDS", "INITIAL_PARAMS", "PARAM_CEIL", "PARAM_FLOOR", "ThroughputFit",
           "exploration_priors", "fit_objective", "fit_throughput"]

#: Lower bound of every α and β; "pinning" a parameter fixes it here.
PARAM_FLOOR = 1e-8
#: Upper bound of every α and β (seconds, or seconds per sample): generous, keeps exp() finite.
PARAM_CEIL = 1e4
GAMMA_BOUNDS = (1.0, 10.0)
#: L-BFGS-B stopping tolerance on the loss reduction per iteration (scipy's default). Losses here are
#: below 1, so this is effectively absolute; 1e-5 is ~5x faster at a ~1 % worse in-sample error.
FIT_FTOL = 2.2e-9
#: Smoothing of the surrogate each start is first minimised on: every series costs sqrt(MSE + δ²)
#: (δ in log units) instead of sqrt(MSE), which has a kink wherever a series can be fitted exactly.
SMOOTH = 1e-3
#: The sharper surrogate of the polish: it takes the residuals the first surrogate leaves (about
#: sqrt(2·δ·ftol)) further down, towards the kink, before the true loss has the last word.
SMOOTH_FINE = 1e-5
#: A fit of at most this many distinct configurations also starts from the SPEC point: with about
#: as many records as parameters the loss has flat valleys and several minima; with more, the start
#: read off the records is already close to the optimum.
FEW_RECORDS = 8
#: Default starting point of a fresh fit (SPEC §3).
INITIAL_PARAMS = ThroughputParams(0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.001)

_AG, _BG, _AL, _BL, _AN, _BN, _GAMMA = range(7)




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
        smooth: float = 0.0,
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
        #: δ² of the smooth surrogate: each series costs sqrt(MSE + δ²) instead of sqrt(MSE).
        self.smooth2 = float(smooth) ** 2

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
        rmse = float(np.sqrt((e @ e) * self.inv_n1 + self.smooth2))
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
            rmse2 = float(np.sqrt((e2 @ e2) / idx.size + self.smooth2))
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


def _positive_line(x: np.ndarray, y: np.ndarray, a_min: float, small: float) -> tuple[float, float]:
    """A least-squares line ``y ≈ a + b·x`` (x ≥ 0) with both coefficients kept above zero.

    Where the data put the intercept below ``a_min`` of the mean, or the slope below ``small`` of
    the mean over the mean x (or cannot tell the slope), those values are used instead: a start at
    the floor is where the log-space gradient vanishes, and the fit could not raise it from there.
    """
    y_mean = float(np.mean(y))
    x_mean = float(np.mean(x))
    b_small = small * y_mean / max(x_mean, 1.0)
    if np.unique(x).size < 2:
        b = b_small
    else:
        dx = x - x_mean
        b = max(float(dx @ (y - y_mean) / (dx @ dx)), b_small)
    a = y_mean - b * x_mean
    if a < a_min * y_mean:
        a = a_min * y_mean
        b = max(float(np.mean((y - a) / np.maximum(x, 1.0))), b_small)
    return a, b


def _data_start(
    kn: np.ndarray, kr: np.ndarray, km: np.ndarray, kopt: np.ndarray, kacc: np.ndarray,
    spec_start: np.ndarray, pinned: list[str],
) -> np.ndarray:
    """A starting point read off the records (pinned parameters stay at their pins).

    The pass time is a line in ``m`` through the accumulation step times (or the optimiser step
    times of single replicas, which have no sync); the sync time of a multi-replica record is what
    its optimiser step takes beyond its pass (``γ`` = 1: no overlap), a line in ``K − 2`` for each
    node class. Every free parameter starts clearly above the floor.
    """
    p = spec_start.copy()
    has_acc = np.isfinite(kacc)
    single = kr <= 1
    use = has_acc | single
    if np.any(use):
        mg, tg = km[use], np.where(has_acc, kacc, kopt)[use]
    else:
        mg, tg = km, 0.5 * kopt          # only synchronised steps: call half of each step the pass
    if "alpha_grad" in pinned or np.unique(mg).size < 2:
        a = p[_AG] if "alpha_grad" in pinned else 0.5 * float(np.mean(tg))
        b = float(np.mean((tg - a) / mg))
        p[_AG], p[_BG] = a, max(b, 0.01 * float(np.mean(tg / mg)))
    else:
        p[_AG], p[_BG] = _positive_line(mg, tg, 0.01, 0.01)
    pass_time = np.where(has_acc, kacc, p[_AG] + p[_BG] * km)
    sync = np.maximum(kopt - pass_time, 1e-3 * kopt)
    for sel, ia, ib in (((kn <= 1) & (kr > 1), _AL, _BL), (kn > 1, _AN, _BN)):
        if PARAM_NAMES[ia] in pinned or not np.any(sel):
            continue
        if PARAM_NAMES[ib] in pinned:
            p[ia] = float(np.mean(sync[sel]))
        else:
            p[ia], p[ib] = _positive_line(kr[sel] - 2.0, sync[sel], 0.1, 1e-3)
    for name in pinned:                  # the pins stay where the priors put them
        p[PARAM_NAMES.index(name)] = spec_start[PARAM_NAMES.index(name)]
    p = np.clip(p, PARAM_FLOOR, PARAM_CEIL)
    p[_GAMMA] = GAMMA_BOUNDS[0]          # no overlap: the sync above is exactly step − pass
    return p


def _to_z(values: np.ndarray) -> np.ndarray:
    z = np.log(np.clip(values, PARAM_FLOOR, PARAM_CEIL))
    z[_GAMMA] = float(np.clip(values[_GAMMA], *GAMMA_BOUNDS))
    return z


def _stuck_at_floor(objective: _Objective, x: np.ndarray, z_data: np.ndarray,
                    free: np.ndarray) -> np.ndarray:
    """Which free α/β sit far (1000x) below the data's value while the loss falls as they rise.

    In log space the gradient of such a parameter is its linear gradient times its (tiny) value,
    so L-BFGS-B stops there although raising it would pay.
    """
    _, grad = objective(x)
    return (free != _GAMMA) & (x < z_data - np.log(1e3)) & (grad < 0.0)


def _bounds(free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of the free parameters: log α and log β within the floor and ceiling,
    γ within its own."""
    lower = np.where(free == _GAMMA, GAMMA_BOUNDS[0], np.log(PARAM_FLOOR))
    upper = np.where(free == _GAMMA, GAMMA_BOUNDS[1], np.log(PARAM_CEIL))
    return lower, upper


def _minimise(objective: _Objective, x0: np.ndarray, bounds: tuple[np.ndarray, np.ndarray],
              ftol: float) -> LbfgsbResult:
    with np.errstate(all="ignore"):
        return minimise(objective, x0, *bounds, ftol=ftol, maxiter=500)


@one_blas_thread
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
    parameters are kept (``ok=False`` and ``message`` say why). ``initial`` is the SPEC starting
    point; the fit also starts from a point read off the records and from ``previous`` (see the
    module docstring); ``ftol`` is the optimiser's stopping tolerance.
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
    pinned = exploration_priors(kn, kr, km)
    spec = _pinned_start(np.array(initial.as_array(), dtype=np.float64), pinned, kopt, kacc)
    z_spec = _to_z(spec)
    free = np.array([i for i, nm in enumerate(PARAM_NAMES) if nm not in pinned], dtype=np.intp)
    objective = _Objective(kn, kr, km, kopt, kacc, free, z_spec)
    surrogate = _Objective(kn, kr, km, kopt, kacc, free, z_spec, smooth=SMOOTH)
    fine = _Objective(kn, kr, km, kopt, kacc, free, z_spec, smooth=SMOOTH_FINE)
    bounds = _bounds(free)
    data = _data_start(kn, kr, km, kopt, kacc, spec, pinned)
    z_data = _to_z(data)
    starts = [z_data[free]]
    if previous is not None:
        prev = _pinned_start(np.array(previous.as_array(), dtype=np.float64), pinned, kopt, kacc)
        low = prev <= 10.0 * PARAM_FLOOR     # where log-space gradients vanish: use the data's value
        prev[low] = data[low]
        starts.append(_to_z(prev)[free])
    spec_run = kn.size <= FEW_RECORDS
    if spec_run:
        starts.append(z_spec[free])
    best_x, best_loss, message, failures = None, np.inf, "", []

    def consider(x: np.ndarray, loss: float, why: str) -> None:
        nonlocal best_x, best_loss, message
        if not np.all(np.isfinite(x)) or not np.isfinite(loss):
            failures.append(f"non-finite result ({why})")
        elif loss < best_loss:
            best_x, best_loss, message = x, float(loss), why

    def descend(x0: np.ndarray) -> None:
        # The smooth surrogate first (no kink to stall on), then judged on the true objective.
        consider(x0, objective(x0)[0], "starting point kept")
        res = _minimise(surrogate, x0, bounds, ftol)
        consider(res.x, objective(res.x)[0], str(res.message))

    def polish() -> None:
        # The first surrogate leaves residuals near sqrt(2·δ·ftol); a sharper one takes them down.
        assert best_x is not None   # set by the first consider()
        res = _minimise(fine, best_x, bounds, ftol)
        consider(res.x, objective(res.x)[0], str(res.message))
        assert best_x is not None
        res = _minimise(objective, best_x, bounds, ftol)
        consider(res.x, float(res.fun), str(res.message))

    try:
        with np.errstate(all="ignore"):
            for x0 in starts:
                descend(x0)
            if best_x is None:
                raise FloatingPointError("; ".join(failures))
            polish()
            stuck = _stuck_at_floor(objective, best_x, z_data[free], free)
            if np.any(stuck):
                # Lift what sank to the floor back to the data's value and descend again; a fit that
                # has not yet tried the SPEC start tries it too.
                escape = best_x.copy()
                escape[stuck] = z_data[free][stuck]
                descend(escape)
                if not spec_run:
                    descend(z_spec[free])
                polish()
    except (FloatingPointError, ValueError, ArithmeticError) as exc:
        return ThroughputFit(fallback, False, f"fit failed, keeping previous parameters: {exc}",
                             float("nan"), tuple(pinned), int(kn.size))
    z = objective.full(best_x)
    values = np.clip(np.exp(z), PARAM_FLOOR, PARAM_CEIL)
    values[_GAMMA] = float(np.clip(z[_GAMMA], *GAMMA_BOUNDS))
    if not np.any(kn > 1):
        # Prior 5: multi-node is assumed no cheaper than what single-node showed.
        values[_AN] = min(max(values[_AN], 1.1 * values[_AL]), PARAM_CEIL)
        values[_BN] = min(max(values[_BN], 1.1 * values[_BL]), PARAM_CEIL)
    params = ThroughputParams(*(float(v) for v in values))
    return ThroughputFit(params, True, message, float(best_loss), tuple(pinned), int(kn.size))


def fit_objective(
    params: ThroughputParams,
    nodes: ArrayLike,
    replicas: ArrayLike,
    local_bsz: ArrayLike,
    optim_step_time: ArrayLike,
    accum_step_time: ArrayLike | None = None,
) -> float:
    """The loss :func:`fit_throughput` minimises (SPEC §3), at ``params`` on these records.

    RMSLE of the optimiser-step times plus RMSLE of the observed accumulation-step times plus the two
    regularisers, on the records averaged by (nodes, replicas, m) as the fit averages them. Note
    that the fit reports its loss before prior 5 lifts the node parameters.
    """
    optim_a = np.atleast_1d(np.asarray(optim_step_time, dtype=np.float64))
    if accum_step_time is None:
        accum_a = np.full_like(optim_a, np.nan)
    else:
        accum_a = np.atleast_1d(np.asarray(accum_step_time, dtype=np.float64))
    n_a, r_a, m_a = (np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (nodes, replicas, local_bsz))
    n_r, r_r, m_r, o_r, a_r = _aggregate(n_a, r_a, m_a, optim_a, accum_a)
    z = _to_z(np.array(params.as_array(), dtype=np.float64))
    with np.errstate(all="ignore"):
        loss, _ = _Objective(n_r, r_r, m_r, o_r, a_r, np.arange(7), z)(z)
    return float(loss)


def _pinned_start(values: np.ndarray, pinned: list[str], kopt: np.ndarray,
                  kacc: np.ndarray) -> np.ndarray:
    """``values`` with the pinned parameters set where the priors put them (SPEC §3, 1–4)."""
    out = np.clip(values, PARAM_FLOOR, PARAM_CEIL)
    out[_GAMMA] = float(np.clip(values[_GAMMA], *GAMMA_BOUNDS))
    for name in pinned:
        out[PARAM_NAMES.index(name)] = PARAM_FLOOR
    if "alpha_grad" in pinned:
        times = np.where(np.isfinite(kacc), kacc, kopt)
        out[_AG] = float(np.clip(np.mean(times) / 2.0, PARAM_FLOOR, PARAM_CEIL))
    return out


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
