"""Speed predictors for the CPU balancer (LB-BSP Alg. 1; see ``docs/goodput.md``).

A replica's next sample-processing speed (samples/s) is predicted from its history and, for NARX,
from exogenous load features observed with each speed. ``pollux.balance.balancers`` re-exports these.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from pollux.goodput.threads import limit_blas_threads


class SpeedPredictor(Protocol):
    """Predicts a replica's next sample-processing speed (samples/s) from its history."""

    def observe(self, speed: float, load: ArrayLike | None = None) -> None:
        """Record the speed of the iteration just finished and the load features seen with it."""

    def predict(self) -> float:
        """The predicted speed of the next iteration (NaN before any observation)."""


def _check_speed(speed: float) -> float:
    s = float(speed)
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"speed: must be finite and positive, got {speed!r}")
    return s


class LastValue:
    """The paper's "memoryless" predictor: the next speed is the last one."""

    def __init__(self) -> None:
        self._last = math.nan

    def observe(self, speed: float, load: ArrayLike | None = None) -> None:
        self._last = _check_speed(speed)

    def predict(self) -> float:
        return self._last


class MovingAverage:
    """Exponential moving average of the speed (the paper's EMA, ``alpha`` = weight of the newest).

    Plain EMA reacts slowly to a lasting change of speed. With ``shift_tolerance`` set, the average
    restarts at the mean of the last ``shift_after`` observations when all of them lie more than
    that relative distance from it on the same side (a level shift, not a transient spike). The n-th
    observation weighs at least 1/n, so the first few make a plain mean rather than leaving the
    first (often a warm-up outlier) in charge for ~1/alpha observations.
    """

    def __init__(self, alpha: float = 0.2, shift_tolerance: float | None = None,
                 shift_after: int = 2) -> None:
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"alpha: must be in (0, 1], got {alpha!r}")
        if shift_tolerance is not None and not float(shift_tolerance) > 0.0:
            raise ValueError(f"shift_tolerance: must be positive, got {shift_tolerance!r}")
        if int(shift_after) < 1:
            raise ValueError(f"shift_after: must be at least 1, got {shift_after!r}")
        self.alpha = float(alpha)
        self.shift_tolerance = shift_tolerance
        self.shift_after = int(shift_after)
        self._value = math.nan
        self._count = 0
        self._recent: deque[float] = deque(maxlen=self.shift_after)

    def observe(self, speed: float, load: ArrayLike | None = None) -> None:
        s = _check_speed(speed)
        self._recent.append(s)
        self._count += 1
        if math.isnan(self._value):
            self._value = s
            return
        a = max(self.alpha, 1.0 / self._count)
        self._value = a * s + (1.0 - a) * self._value
        if self.shift_tolerance is not None and len(self._recent) == self.shift_after:
            rel = np.asarray(self._recent) / self._value - 1.0
            if np.all(rel > self.shift_tolerance) or np.all(rel < -self.shift_tolerance):
                self._value = float(np.mean(self._recent))

    def predict(self) -> float:
        return self._value


class NarxPredictor:
    """The paper's NARX predictor: a one-hidden-layer network on lagged speeds and load features.

    ``log v(k+1) = F(log v(k), …, log v(k−lags+1), c(k), …, c(k−lags))`` with ``c`` the load vector
    observed with each speed (``load=None``: speeds only). F is an sklearn ``MLPRegressor`` (tanh,
    ``hidden`` units, fixed ``random_state``: deterministic for a seed), refitted on the last
    ``max_history`` observations; the forward pass runs in numpy. Refits come ``refit_every``
    observations apart at first; the interval doubles after each refit, up to ``max_refit_every``,
    and starts again at ``refit_every`` after a level shift: a steady regime needs no fresh fit every
    few iterations, and each fit costs milliseconds on the training thread.

    Robustness, because a bad prediction moves real work between replicas:

    * transient spikes are outliers, not signal: training targets more than 4 MADs from the median of
      their neighbours are left out (Hampel filter), so the network learns the speed the load
      explains and is not pulled by bursts;
    * it does not extrapolate: the prediction is clipped to the speeds seen, and for an input outside
      the range seen in training, or after a level shift (its last two predictions both off by more
      than ``shift_tolerance`` on the same side), it answers with the last speed until a refit has
      learned the new regime;
    * before ``min_history`` observations an EMA that follows level shifts answers
      (:class:`MovingAverage` with ``shift_tolerance``; the paper used EMA for its first 500
      iterations).
    """

    def __init__(self, lags: int = 2, hidden: int = 8, seed: int = 0, min_history: int = 50,
                 refit_every: int = 25, max_history: int = 500, alpha: float = 0.2,
                 shift_tolerance: float = 0.25, l2: float = 1.0, cooldown: int = 10,
                 max_refit_every: int | None = None) -> None:
        if max_refit_every is None:
            max_refit_every = 8 * int(refit_every)
        for name, value, least in (("lags", lags, 1), ("hidden", hidden, 1),
                                   ("refit_every", refit_every, 1), ("cooldown", cooldown, 1),
                                   ("max_refit_every", max_refit_every, int(refit_every))):
            if isinstance(value, bool) or int(value) != value or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")
        if int(min_history) < lags + 8:
            raise ValueError(f"min_history: must be at least lags + 8 = {lags + 8}, got {min_history!r}")
        if int(max_history) < int(min_history):
            raise ValueError(f"max_history: must be at least min_history, got {max_history!r}")
        self.lags = int(lags)
        self.hidden = int(hidden)
        self.seed = int(seed)
        self.min_history = int(min_history)
        self.refit_every = int(refit_every)
        self.max_refit_every = int(max_refit_every)
        self._interval = self.refit_every  # observations until the next scheduled refit
        self.cooldown = int(cooldown)
        self.max_history = int(max_history)
        self.shift_tolerance = float(shift_tolerance)
        if not float(l2) >= 0.0:
            raise ValueError(f"l2: must be non-negative, got {l2!r}")
        self.l2 = float(l2)
        self._fallback = MovingAverage(alpha, shift_tolerance=shift_tolerance)
        self._logv: deque[float] = deque(maxlen=self.max_history + self.lags + 2)
        self._load: deque[np.ndarray] = deque(maxlen=self.max_history + self.lags + 2)
        self._load_dim: int | None = None
        self._since_fit = 0
        self._net: dict[str, Any] | None = None
        self._last_pred = math.nan
        self._misses: deque[float] = deque(maxlen=2)
        self._model: Any = None  # the sklearn estimator, kept for warm-started refits
        self._net_pred = math.nan  # the network's own last prediction, used or not
        self._cooldown = 0  # observations left during which the network is not trusted

    @property
    def fitted(self) -> bool:
        """Whether a network has been fitted (it may still defer to the EMA, see the class doc)."""
        return self._net is not None

    def _load_vec(self, load: ArrayLike | None) -> np.ndarray:
        vec = np.zeros(0) if load is None else np.atleast_1d(np.asarray(load, dtype=np.float64))
        if vec.ndim != 1 or not np.all(np.isfinite(vec)):
            raise ValueError(f"load: expected finite numbers, got {load!r}")
        if self._load_dim is None:
            self._load_dim = vec.size
        elif vec.size != self._load_dim:
            raise ValueError(f"load: expected {self._load_dim} features as before, got {vec.size}")
        return vec

    def _rows(self, logv: np.ndarray, load: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Input rows for predicting the steps after the indices ``ends`` (each >= lags)."""
        cols = [logv[ends - j] for j in range(self.lags)]
        cols += [load[ends - j] for j in range(self.lags + 1)]
        return np.column_stack([c.reshape(ends.size, -1) for c in cols])

    def observe(self, speed: float, load: ArrayLike | None = None) -> None:
        s = _check_speed(speed)
        vec = self._load_vec(load)
        if not math.isnan(self._net_pred):
            self._misses.append(s / self._net_pred - 1.0)
        refit_now = self._cooldown == 1  # the new regime has been seen long enough: learn it
        self._cooldown = max(self._cooldown - 1, 0)
        self._fallback.observe(s)
        self._logv.append(math.log(s))
        self._load.append(vec)
        self._since_fit += 1
        scheduled = self._since_fit >= self._interval
        if len(self._logv) >= self.min_history and (self._net is None or refit_now or scheduled):
            if scheduled and self._net is not None:
                self._interval = min(2 * self._interval, self.max_refit_every)
            self._fit()
        self._last_pred = self._predict()

    def _fit(self) -> None:
        from sklearn.neural_network import MLPRegressor  # lazy: only the NARX path needs sklearn

        logv = np.asarray(self._logv)
        load = np.asarray(self._load).reshape(logv.size, -1)
        ends = np.arange(self.lags, logv.size - 1)
        y = logv[ends + 1]
        # Hampel filter on the targets: drop transient spikes (median of the target and its
        # neighbours, scale from the median absolute deviation of the whole series).
        med = np.median(np.stack([logv[ends], logv[ends + 1],
                                  np.append(logv[ends[:-1] + 2], logv[-1])]), axis=0)
        dev = np.abs(y - med)
        mad = max(float(np.median(np.abs(np.diff(logv)))), 1e-3)
        keep = dev <= 4.0 * mad
        if int(keep.sum()) < self.lags + 8:
            keep[:] = True
        x = self._rows(logv, load, ends)[keep]
        y = y[keep]
        mu, sd = x.mean(axis=0), x.std(axis=0)
        # A feature that barely varied so far (one load level seen) must not be blown up to many
        # standard deviations by the next value: floor its scale at 10 % of its typical magnitude.
        sd = np.maximum(sd, np.maximum(0.1 * np.abs(x).mean(axis=0), 1e-6))
        y_mu, y_sd = float(y.mean()), max(float(y.std()), 1e-6)
        if self._model is None:
            self._model = MLPRegressor(hidden_layer_sizes=(self.hidden,), activation="tanh",
                                       solver="lbfgs", alpha=self.l2, max_iter=80,
                                       random_state=self.seed, warm_start=True)
        else:
            # Refits start from the previous weights (a warm start: the scaling moves a little
            # between fits, the optimum not much), so they need far fewer iterations.
            self._model.set_params(max_iter=50)
        net = self._model
        import warnings

        # One BLAS thread: the problem is tiny, and threads spinning on a busy machine (other
        # replicas on the same cores) made each fit ~50x slower in measurements. The kept limit of
        # goodput.threads, not a threadpool_limits context: that lists the loaded libraries on
        # every call (~2.4 ms, more than the refit itself).
        limit_blas_threads()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lbfgs hitting max_iter is fine for a predictor
            net.fit((x - mu) / sd, (y - y_mu) / y_sd)
        span = x.max(axis=0) - x.min(axis=0)
        self._net = {"w": [np.asarray(w) for w in net.coefs_],
                     "b": [np.asarray(b) for b in net.intercepts_],
                     "mu": mu, "sd": sd, "y_mu": y_mu, "y_sd": y_sd,
                     "lo": float(logv.min()), "hi": float(logv.max()),
                     "xmin": x.min(axis=0) - 0.1 * span - 0.1 * sd,
                     "xmax": x.max(axis=0) + 0.1 * span + 0.1 * sd}
        self._since_fit = 0

    def predict(self) -> float:
        return self._last_pred  # computed once per observation, in observe()

    def _predict(self) -> float:
        if not self._logv:
            return math.nan
        fallback = self._fallback.predict()
        net = self._net
        if net is None or len(self._logv) <= self.lags:
            return fallback
        n = self.lags + 1
        logv = np.fromiter((self._logv[i] for i in range(-n, 0)), dtype=np.float64, count=n)
        load = np.stack([self._load[i] for i in range(-n, 0)]).reshape(n, -1)
        raw = self._rows(logv, load, np.array([self.lags]))[0]
        outside = bool(np.any(raw < net["xmin"]) or np.any(raw > net["xmax"]))
        h = np.tanh(((raw - net["mu"]) / net["sd"]) @ net["w"][0] + net["b"][0])
        level = float((h @ net["w"][1] + net["b"][1])[0]) * net["y_sd"] + net["y_mu"]
        self._net_pred = math.exp(min(max(level, net["lo"]), net["hi"]))
        tol = self.shift_tolerance
        shifted = len(self._misses) == 2 and (all(m > tol for m in self._misses)
                                              or all(m < -tol for m in self._misses))
        if outside or shifted:
            # A regime the network has not learned (inputs outside its training range, or its
            # last two predictions both off the same way): answer with the last speed for
            # ``cooldown`` observations, then refit on them.
            self._cooldown = self.cooldown
            self._misses.clear()
            self._interval = self.refit_every
        if self._cooldown > 0:
            return math.exp(logv[-1])
        return self._net_pred
