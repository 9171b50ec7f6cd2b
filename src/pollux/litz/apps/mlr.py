"""Multinomial logistic regression by mini-batch SGD with bounded staleness (SSP) on Litz.

The data are split over the executors (strided rows, `data.partition`); the weights `W` ((d + 1) × K,
last row the bias) live in the parameter server. Iteration i is one micro-task per executor: read W,
compute the gradient of the mean cross-entropy on the executor's next mini-batch, add
`-lr * grad / num_executors`. With staleness s the driver dispatches iteration i once iteration
i - s - 1 has completed (the SSP rule of §4.4, which the Litz cache turns into shared stale reads).
One executor at s = 0 is exactly plain mini-batch SGD; E executors at s = 0 are synchronous
data-parallel SGD on E mini-batches per step (`numpy_sgd_reference` computes both directly).

**Double buffering (why `W0`/`W1` instead of one `W`).** Litz lets the tasks of one iteration see
some, all or none of each other's updates, so on a distributed runtime a plain single-table MLR is
not reproducible even at s = 0 (a task may read W after a sibling's update was flushed). With
double buffering (the default at s = 0) there are two copies: iteration i reads `W{i % 2}` and writes to
`W{(i + 1) % 2}`, which nobody of iteration i reads. Each copy must receive every update exactly once,
so each executor keeps, per copy, the updates it has not yet sent there (`pending`, its only state)
and sends them with its next write to that copy. At s = 0 the copy an iteration reads therefore holds
exactly the weights after the previous iteration, whatever the timing and placement — which is what
makes a resized run equal a static one. With s > 0 reads are stale by design (the SSP contract) and
the second copy would only add staleness (a copy receives iteration j's update only with the
executor's next write to it, at j + 1), so by default (`double_buffer=None`) there is one table `W`
when s > 0 and two when s = 0.

Config keys (defaults): dataset ("gaussian" | "digits"), n (4000), d (20), classes (5),
separation (1.5) — the generated data only; seed (0); batch_size (32, per task); lr (0.5);
l2 (0.0, not on the bias); staleness (0); iterations (100) or epochs (passes over all data, overrides
iterations when given); target_loss (None: stop when the objective reaches it); report_every (10
iterations); double_buffer (None: on at s = 0, off at s > 0).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pollux.datasets import Dataset, load_classification, partition
from pollux.litz.api import Application, Driver, DriverContext, Executor, TableSpec, TaskContext, TaskResult


@dataclass(frozen=True)
class MLRConfig:
    """The MLR settings, validated once; every key of the module docstring."""

    batch_size: int
    lr: float
    l2: float
    staleness: int
    iterations: int
    target_loss: float | None
    report_every: int
    double_buffer: bool
    seed: int

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any], num_executors: int, n: int) -> MLRConfig:
        batch = int(config.get("batch_size", 32))
        if batch < 1:
            raise ValueError(f"MLR config 'batch_size' must be >= 1, got {batch}")
        lr = float(config.get("lr", 0.5))
        if not lr > 0:
            raise ValueError(f"MLR config 'lr' must be > 0, got {lr}")
        s = int(config.get("staleness", 0))
        if s < 0:
            raise ValueError(f"MLR config 'staleness' must be >= 0, got {s}")
        if config.get("epochs") is not None:
            epochs = float(config["epochs"])
            iterations = max(1, math.ceil(epochs * n / (num_executors * batch)))
        else:
            iterations = int(config.get("iterations", 100))
        if iterations < 1:
            raise ValueError(f"MLR config 'iterations' must be >= 1, got {iterations}")
        report_every = int(config.get("report_every", 10))
        if report_every < 1:
            raise ValueError(f"MLR config 'report_every' must be >= 1, got {report_every}")
        target = config.get("target_loss")
        return cls(
            batch_size=batch,
            lr=lr,
            l2=float(config.get("l2", 0.0)),
            staleness=s,
            iterations=iterations,
            target_loss=None if target is None else float(target),
            report_every=report_every,
            double_buffer=s == 0 if config.get("double_buffer") is None else bool(config["double_buffer"]),
            seed=int(config.get("seed", 0)),
        )


def with_bias(X: np.ndarray) -> np.ndarray:
    """Features with a trailing column of ones, so the bias is the last row of W."""
    return np.hstack([X, np.ones((X.shape[0], 1))])


def loss_and_grad(W: np.ndarray, Xb: np.ndarray, y: np.ndarray, l2: float = 0.0) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(Xb @ W) against labels `y`, and its gradient with respect to W
    (plus `l2/2 * ||W[:-1]||²`; the bias row is not regularised). The softmax reuses the
    exponentials of the loss, in place."""
    n = Xb.shape[0]
    logits = Xb @ W
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    norm = probs.sum(axis=1)
    picked = np.arange(n), y
    nll = np.log(norm) - logits[picked]
    loss = float(nll.sum() / n)  # = the loss of `_mean_cross_entropy`, bit for bit
    probs /= norm[:, None]
    probs[picked] -= 1.0
    grad = Xb.T @ probs
    grad /= n
    if l2:
        loss += _l2_term(W, l2)
        grad[:-1] += l2 * W[:-1]
    return loss, grad


def task_step(W: np.ndarray, Xb: np.ndarray, Yb: np.ndarray, scale: float, l2: float = 0.0) -> np.ndarray:
    """`scale` × the gradient of `loss_and_grad` (equal to rounding), from one-hot labels `Yb`: a
    micro-task's update with `scale` = -lr / E. Fewer numpy calls than `loss_and_grad` and a
    scaling (no loss, no label index, the scale folded into the softmax): on a task of a hundred
    rows numpy's cost per call is most of the time. `MLRExecutor` keeps features and one-hot labels
    in one matrix, so that a batch is one gather."""
    logits = Xb @ W
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    probs -= Yb
    probs *= scale / Xb.shape[0]
    step = Xb.T @ probs
    if l2:
        step[:-1] += (scale * l2) * W[:-1]
    return step


def _l2_term(W: np.ndarray, l2: float) -> float:
    """`l2/2 * ||W[:-1]||²` (the bias row is not regularised)."""
    return 0.5 * l2 * float(np.sum(W[:-1] ** 2))


def _mean_cross_entropy(W: np.ndarray, Xb: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(mean cross-entropy, logits shifted by their row maximum, log of their softmax normaliser)."""
    logits = Xb @ W
    logits -= logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits).sum(axis=1))
    nll = log_norm - logits[np.arange(Xb.shape[0]), y]
    return float(nll.sum() / nll.size), logits, log_norm  # = np.mean, bit for bit, without its overhead


def objective(W: np.ndarray, data: Dataset, l2: float = 0.0, Xb: np.ndarray | None = None) -> float:
    """The driver's objective: mean cross-entropy over the whole data set (plus the L2 term) — the
    loss of `loss_and_grad`, without the gradient. `Xb`: ``with_bias(data.X)``, if the caller keeps it."""
    loss = _mean_cross_entropy(W, with_bias(data.X) if Xb is None else Xb, data.y)[0]
    return loss + _l2_term(W, l2) if l2 else loss


def batch_rows(num_rows: int, batch_size: int, iteration: int, seed: int, executor_id: int) -> np.ndarray:
    """Rows (of an executor's partition) of its mini-batch at `iteration`: a seeded permutation per
    epoch, cut into floor(num_rows / batch_size) batches (the tail of each epoch is dropped)."""
    epoch, part = epoch_and_slice(num_rows, batch_size, iteration)
    return epoch_permutation(num_rows, seed, executor_id, epoch)[part]


def epoch_and_slice(num_rows: int, batch_size: int, iteration: int) -> tuple[int, slice]:
    """The epoch of `iteration` and the slice of that epoch's permutation that is its batch."""
    epoch, j = divmod(iteration, max(1, num_rows // batch_size))
    return epoch, slice(j * batch_size, (j + 1) * batch_size)


def epoch_permutation(num_rows: int, seed: int, executor_id: int, epoch: int) -> np.ndarray:
    """The order in which an executor visits its partition's rows in `epoch` (`batch_rows`)."""
    return np.random.default_rng([seed, 1, executor_id, epoch]).permutation(num_rows)


def table_name(copy: int, double_buffer: bool) -> str:
    return f"W{copy % 2}" if double_buffer else "W"


class MLRExecutor(Executor):
    """One data partition; stateless apart from the double-buffer's unsent updates."""

    def __init__(self, executor_id: int, num_executors: int, config: Mapping[str, Any]) -> None:
        super().__init__(executor_id, num_executors, config)
        self.cfg = MLRConfig.from_mapping(config, num_executors, 1)
        self.pending: dict[int, np.ndarray] = {}
        self._perm: tuple[int, np.ndarray] | None = None  # (epoch, its permutation): not state

    def batch(self, iteration: int) -> np.ndarray:
        """Rows of the input (features, then one-hot labels) of the mini-batch at `iteration`:
        `batch_rows`, with the epoch's permutation drawn once per epoch, not once per task.
        (Gathering the whole partition in the epoch's order once, so that a batch is a slice, is
        slower for large partitions: the small gathers stay in cache for the matmuls that follow.)"""
        Z = self.input
        epoch, part = epoch_and_slice(Z.shape[0], self.cfg.batch_size, iteration)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(Z.shape[0], self.cfg.seed, self.executor_id, epoch))
        return Z[self._perm[1][part]]

    def load_input(self) -> np.ndarray:
        """The partition as one matrix: features with the bias column, then the labels one-hot."""
        data = load_classification(self.config)
        rows = partition(data.X.shape[0], self.num_executors, self.executor_id)
        return np.hstack([with_bias(data.X[rows]), np.eye(data.classes)[data.y[rows]]])

    def get_state(self) -> Any:
        return {k: v.copy() for k, v in self.pending.items()}

    def set_state(self, state: Any) -> None:
        self.pending = {int(k): np.array(v) for k, v in (state or {}).items()}

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        cfg = self.cfg
        i = int(args["iteration"])
        W = await ctx.ps.get(table_name(i, cfg.double_buffer))
        Zb = self.batch(i)
        d = W.shape[0]  # features (with the bias); the rest of a row is its one-hot label
        delta = task_step(W, Zb[:, :d], Zb[:, d:], -cfg.lr / self.num_executors, cfg.l2)
        if not cfg.double_buffer:
            ctx.ps.update("W", delta)
        else:
            for copy in (0, 1):
                self.pending[copy] = self.pending[copy] + delta if copy in self.pending else delta
            target = (i + 1) % 2
            ctx.ps.update(table_name(target, True), self.pending.pop(target))
        return {"iteration": i, "examples": int(Zb.shape[0])}


class MLRDriver(Driver):
    """SSP dispatch: iteration i goes out once iterations < i - s are all complete."""

    def __init__(self, num_executors: int, config: Mapping[str, Any]) -> None:
        super().__init__(num_executors, config)
        self.cfg = MLRConfig.from_mapping(config, num_executors, self._data().X.shape[0])
        self.next_iteration = 0  # the next iteration to dispatch
        self.completed = 0  # iterations 0 .. completed-1 have all their tasks done
        self.counts: dict[int, int] = {}  # iteration -> tasks completed, for iterations >= completed
        self.stopped = False
        self.last_objective = math.nan
        self._xb: np.ndarray | None = None  # with_bias(data.X) for the objective: not state

    def _data(self) -> Dataset:
        return load_classification(self.config)

    def _objective(self, W: np.ndarray) -> float:
        data = self._data()
        if self._xb is None:
            self._xb = with_bias(data.X)
        return objective(W, data, self.cfg.l2, self._xb)

    def state_dict(self) -> Any:
        return {k: v for k, v in vars(self).items() if k not in ("config", "cfg", "_xb")}

    def tables(self) -> Sequence[TableSpec]:
        data = self._data()
        shape = (data.X.shape[1] + 1, data.classes)
        if not self.cfg.double_buffer:
            return [TableSpec("W", shape)]
        return [TableSpec("W0", shape), TableSpec("W1", shape)]

    def _dispatch_ready(self, ctx: DriverContext) -> None:
        limit = min(self.cfg.iterations, self.completed + self.cfg.staleness + 1)
        while not self.stopped and self.next_iteration < limit:
            for e in range(self.num_executors):
                ctx.dispatch(e, {"iteration": self.next_iteration})
            self.next_iteration += 1

    def current_weights(self, ctx: DriverContext) -> np.ndarray:
        """The weights after the completed iterations (exact at s = 0; an SSP mixture otherwise)."""
        return ctx.ps_get(table_name(self.completed, self.cfg.double_buffer))

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        self._dispatch_ready(ctx)

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        i = int(result.value["iteration"])
        self.counts[i] = self.counts.get(i, 0) + 1
        advanced = False
        while self.counts.get(self.completed) == self.num_executors:
            del self.counts[self.completed]
            self.completed += 1
            advanced = True
            if self.stopped:
                continue
            last = self.completed >= self.cfg.iterations
            if self.completed % self.cfg.report_every == 0 or last:
                start = time.perf_counter()
                self.last_objective = self._objective(self.current_weights(ctx))
                # eval_s: seconds of this evaluation (the PS read and the full-data loss), so that a
                # throughput measured between reports can leave evaluation out, as DDP's does
                ctx.report(iteration=self.completed, objective=self.last_objective,
                           eval_s=time.perf_counter() - start)  # fmt: skip
                reached = self.cfg.target_loss is not None and self.last_objective <= self.cfg.target_loss
                if last or reached:
                    self.stopped = True
                    ctx.finish({"objective": self.last_objective, "iterations": self.completed,
                                "target_reached": bool(reached)})
        if advanced:
            self._dispatch_ready(ctx)


def mlr_app(**config: Any) -> Application:
    """The MLR application with `config` (keys in the module docstring)."""
    MLRConfig.from_mapping(config, 1, 1)  # fail early on a bad key value
    return Application("mlr", MLRDriver, MLRExecutor, dict(config))


def numpy_sgd_reference(num_executors: int = 1, **config: Any) -> list[tuple[int, float]]:
    """Plain numpy SGD with the same data, batches and reports as `mlr_app(**config)` at staleness 0:
    W ← W − lr/E · Σ_e ∇loss_e(W) per iteration (E = 1: ordinary mini-batch SGD). Returns the
    (iteration, objective) pairs the driver would report; the target loss is honoured likewise."""
    data = load_classification(config)
    cfg = MLRConfig.from_mapping(config, num_executors, data.X.shape[0])
    parts = [partition(data.X.shape[0], num_executors, e) for e in range(num_executors)]
    Xs = [with_bias(data.X[p]) for p in parts]
    ys = [data.y[p] for p in parts]
    W = np.zeros((data.X.shape[1] + 1, data.classes))
    out: list[tuple[int, float]] = []
    for it in range(cfg.iterations):
        step = np.zeros_like(W)
        for e in range(num_executors):
            rows = batch_rows(Xs[e].shape[0], cfg.batch_size, it, cfg.seed, e)
            step += loss_and_grad(W, Xs[e][rows], ys[e][rows], cfg.l2)[1]
        W = W - (cfg.lr / num_executors) * step
        done = it + 1
        if done % cfg.report_every == 0 or done == cfg.iterations:
            obj = objective(W, data, cfg.l2)
            out.append((done, obj))
            if cfg.target_loss is not None and obj <= cfg.target_loss:
                break
    return out
