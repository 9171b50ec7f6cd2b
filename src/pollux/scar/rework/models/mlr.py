"""Multinomial logistic regression with L2, trained by gradient descent (thesis §5.5.1, MLR).

The parameters are one ``(features + 1) × classes`` weight matrix (the last row is the bias); a
parameter server partitions its *rows* randomly over its shards, so the blocks here are rows
randomly grouped into `blocks` groups (seeded), and a failure loses whole rows.

Data: scikit-learn's bundled handwritten digits (``dataset="digits"``, the default; a seeded subset of
`samples` images) or a generated Gaussian mixture (``dataset="gaussian"``), both through
`pollux.datasets`, so nothing is downloaded. Training is full-batch by default; with
``batch`` set, iteration ``t`` uses the ``t mod (samples / batch)``-th slice of a fixed seeded
shuffle — a minibatch schedule fixed by the iteration number, so every trial sees the same
minibatch at the same step. The loss convergence is judged on is always the full-data objective.

Feature scales: by default the features are standardised and nothing more (``feature_spread=0``),
the plainest setting and the headline of the benchmark. ``feature_spread`` > 0 then scales feature
j by a seeded log-normal factor (largest 1), a sensitivity setting: real inputs are often like that
(MNIST's border pixels are almost always 0, tf-idf weights are heavy-tailed), most of the weights'
movement is then in a few rows, and prioritised checkpoints that save the top 1/8 often keep the
lost rows close to their current values. With equal scales every row drifts alike, the top 1/8
carry little more of the movement than any other 1/8, and priority saves far less;
``benchmarks/scar.py`` reports both (docs/scar.md explains the gap to the thesis's 78–95 % from
Theorems 5.3.1 and 5.4.2).

Protocol: the thesis's MLR reaches its threshold in about 60 iterations; here the threshold is the
loss after 80 steps (the objective is still falling there, so rework is well defined), full
checkpoints every 20 and failures after about 30 iterations on average, so a failure usually
strikes within the first two checkpoint intervals, where a lost row has moved far from its
saved copy. The full sweep (13 points × 100 trials) takes 20–30 s on one core.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pollux.datasets import Dataset, digits, gaussian_mixture
from pollux.scar.api import BlockLayout, Protocol, ReworkModel, ScarError, State

DATASETS = ("digits", "gaussian")


def _data(dataset: str, samples: int, features: int, classes: int, seed: int) -> Dataset:
    if dataset == "digits":
        return digits()
    if dataset == "gaussian":
        return gaussian_mixture(samples, features, classes, seed)
    raise ScarError(f"mlr dataset: expected one of {', '.join(DATASETS)}, got {dataset!r}")


class MultinomialLogisticRegression(ReworkModel):
    """Softmax regression; state ``{"W": (trials, features + 1, classes)}``, blocks = row groups."""

    name = "mlr"
    protocol = Protocol(converge_iterations=80, checkpoint_interval=20, failure_mean=30.0)

    def __init__(
        self,
        dataset: str = "digits",
        samples: int = 600,
        features: int = 64,
        classes: int = 10,
        blocks: int = 64,
        lr: float = 2.0,
        l2: float = 1e-3,
        batch: int | None = None,
        init_scale: float = 0.0,
        standardize: bool = True,
        feature_spread: float = 0.0,
        seed: int = 0,
    ) -> None:
        rng = np.random.default_rng([seed, 0x4D4C52])
        data = _data(dataset, samples, features, classes, seed)
        if not 1 <= samples <= data.X.shape[0]:
            raise ScarError(f"mlr samples: must be in [1, {data.X.shape[0]}], got {samples}")
        pick = np.sort(rng.permutation(data.X.shape[0])[:samples])
        X = data.X[pick]
        # standardise the features so one step size suits every row; constant pixels stay zero
        if standardize:
            sd = X.std(axis=0)
            X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        if feature_spread < 0:
            raise ScarError(f"mlr feature_spread: must be >= 0, got {feature_spread}")
        if feature_spread > 0:
            # log-normal feature scales (largest 1): a few features dominate, most move little
            scale = np.exp(feature_spread * rng.normal(size=X.shape[1]))
            X = X * (scale / scale.max())
        self.X = np.hstack([X, np.ones((samples, 1))])
        self.labels = data.y[pick]
        self.classes = data.classes
        self.Y = np.eye(self.classes)[self.labels]
        rows = self.X.shape[1]
        if not 1 <= blocks <= rows:
            raise ScarError(f"mlr blocks: must be in [1, rows={rows}], got {blocks}")
        if lr <= 0 or l2 < 0:
            raise ScarError(f"mlr lr/l2: need lr > 0 and l2 >= 0, got {lr}, {l2}")
        if batch is not None and not 1 <= batch <= samples:
            raise ScarError(f"mlr batch: must be in [1, samples={samples}], got {batch}")
        self.lr, self.l2, self.batch = float(lr), float(l2), batch
        self._order = rng.permutation(samples)
        self._W0 = init_scale * rng.normal(size=(rows, self.classes))
        self.layouts = {"rows": BlockLayout({"W": rng.permutation(np.arange(rows) % blocks)}, blocks)}

    def init_state(self, trials: int) -> State:
        return {"W": np.tile(self._W0, (trials, 1, 1))}

    def _batch(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        if self.batch is None:
            return self.X, self.Y
        per_epoch = max(1, self.X.shape[0] // self.batch)
        start = (iteration % per_epoch) * self.batch
        idx = self._order[start : start + self.batch]
        return self.X[idx], self.Y[idx]

    @staticmethod
    def _logits(X: np.ndarray, W: np.ndarray) -> np.ndarray:
        """(trials, n, classes): one stacked matmul, the same product for every trial.

        Deliberately not one 2-D matmul over all trials' columns: BLAS may round a column
        differently by its position, and then a trial's loss would depend on how many trials run
        beside it — the threshold comes from a one-trial run, so it must match to the last bit.
        """
        return np.matmul(X, W)

    def step(self, state: State, iteration: int) -> State:
        X, Y = self._batch(iteration)
        W = state["W"]
        logits = self._logits(X, W)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        grad = np.matmul(X.T, p - Y)
        return {"W": W - self.lr * (grad / X.shape[0] + self.l2 * W)}

    def loss(self, state: State) -> np.ndarray:
        W = state["W"]
        logits = self._logits(self.X, W)
        top = logits.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
        picked = (logits * self.Y).sum(axis=-1)
        ce = (log_z - picked).mean(axis=-1)
        # a sum per contiguous trial row: the same rounding whatever the population size
        return ce + 0.5 * self.l2 * (W * W).reshape(W.shape[0], -1).sum(axis=1)


def make(**kw: Any) -> MultinomialLogisticRegression:
    """The registry's factory: digits (600 images), 65 weight rows in 64 random blocks by default."""
    return MultinomialLogisticRegression(**kw)
