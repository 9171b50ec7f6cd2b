"""Mini-batch K-means on Litz: executors whose partitions are large, for out-of-core runs (§4.8).

The thesis shows out-of-core execution with mini-batch K-means [Sculley 2010] on ImageNet features:
each executor holds a large partition of points, each task clusters a small mini-batch of them, so
the memory a worker needs is all its executors' points while one task touches few of them.

Every executor owns `points_per_executor` points of dimension `dim` (its *input*, generated from
the seed: our storage) and, as *state*, each point's last assigned centre (-1: never sampled). The
centres live in the PS as two additive tables: `sums` (k × dim) and `weights` (k), the centres being
``sums / weights``. Sculley's update moves a centre c with v points so far towards the mean of its m
new points with step m / (v + m): ``c' = (v c + s) / (v + m)``, i.e. ``v c`` grows by s and v by m
— additive, so the executors of one iteration simply add their sums and counts, and every centre is
the mean of its initial point (weight 1) and every point it was ever assigned.

Iteration i is one task per executor (a mini-batch of `batch` points, seeded by executor and
iteration) at SSP staleness `staleness` (default 0: synchronous, so a run computes the same centres
whatever the workers, timing, moves or evictions). Objective: the mean squared distance of a fixed
held-out sample to its nearest centre.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pollux.litz.api import Application, Driver, DriverContext, Executor, TableSpec, TaskContext, TaskResult

__all__ = ["kmeans_app", "nearest_centre", "partition", "true_centres"]

#: Points of the held-out sample the objective is measured on (and the first centres come from).
HOLDOUT = 2000


def true_centres(config: Mapping[str, Any]) -> np.ndarray:
    """The centres the data is drawn around (k × dim, seeded)."""
    rng = np.random.default_rng([int(config["seed"]), 0])
    return rng.uniform(-10.0, 10.0, size=(int(config["k"]), int(config["dim"])))


def _draw(config: Mapping[str, Any], stream: int, count: int) -> np.ndarray:
    centres = true_centres(config)
    rng = np.random.default_rng([int(config["seed"]), 1, stream])
    labels = rng.integers(len(centres), size=count)
    points = rng.standard_normal((count, centres.shape[1]), dtype=np.float32)
    points *= np.float32(config["spread"])
    points += centres.astype(np.float32)[labels]  # in place: one partition-sized array at a time
    return points


def partition(config: Mapping[str, Any], executor_id: int) -> np.ndarray:
    """Executor `executor_id`'s points (float32, points_per_executor × dim)."""
    return _draw(config, executor_id + 1, int(config["points_per_executor"]))


def holdout(config: Mapping[str, Any]) -> np.ndarray:
    """The held-out sample (stream 0, apart from every executor's)."""
    return _draw(config, 0, max(HOLDOUT, int(config["k"])))


def nearest_centre(points: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the nearest centre, squared distance to it) of every point; one matrix product."""
    x = points.astype(np.float64)
    d2 = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ centres.T) + (centres * centres).sum(axis=1)[None, :]
    idx = d2.argmin(axis=1)
    return idx, np.maximum(d2[np.arange(len(idx)), idx], 0.0)


class KMeansExecutor(Executor):
    """One partition of points (input) and each point's last assignment (state)."""

    def load_input(self) -> np.ndarray:
        return partition(self.config, self.executor_id)

    def set_input(self, data: Any) -> None:
        super().set_input(data)
        if data is not None and getattr(self, "assign", None) is None:
            self.assign = np.full(len(data), -1, dtype=np.int32)

    def get_state(self) -> Any:
        return {"assign": getattr(self, "assign", None)}

    def set_state(self, state: Any) -> None:
        if state is not None and state.get("assign") is not None:
            # a copy: a state that came through Ray's object store (a move) is read-only
            self.assign = np.array(state["assign"], dtype=np.int32)

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        cfg = self.config
        it = int(args["iteration"])
        points = self.input
        rng = np.random.default_rng([int(cfg["seed"]), 2, self.executor_id, it])
        picked = rng.choice(len(points), size=min(int(cfg["batch"]), len(points)), replace=False)
        sums = await ctx.ps.get("sums")
        weights = await ctx.ps.get("weights")
        idx, _ = nearest_centre(points[picked], sums / weights[:, None])
        k = len(weights)
        onehot = np.zeros((len(idx), k))
        onehot[np.arange(len(idx)), idx] = 1.0
        ctx.ps.update("sums", onehot.T @ points[picked].astype(np.float64))
        ctx.ps.update("weights", onehot.sum(axis=0))
        changed = int((self.assign[picked] != idx).sum())
        self.assign[picked] = idx
        return {"iteration": it, "changed": changed}


class KMeansDriver(Driver):
    """SSP by dispatch: iteration i goes out once iteration i - staleness - 1 has completed."""

    def tables(self) -> list[TableSpec]:
        start = holdout(self.config)[: int(self.config["k"])].astype(np.float64)
        k, dim = start.shape
        return [
            TableSpec("sums", (k, dim), init=start),  # weight 1 each: the centres start there
            TableSpec("weights", (k,), init=np.ones(k)),
        ]

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        self.completed = 0
        self.next_iteration = 0
        self.done: dict[int, int] = {}
        self.changed = 0
        self._dispatch(ctx)

    def _dispatch(self, ctx: DriverContext) -> None:
        limit = min(int(self.config["iterations"]), self.completed + int(self.config["staleness"]) + 1)
        while self.next_iteration < limit:
            for e in range(ctx.num_executors):
                ctx.dispatch(e, {"iteration": self.next_iteration})
            self.next_iteration += 1

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        i = int(result.value["iteration"])
        self.done[i] = self.done.get(i, 0) + 1
        self.changed += int(result.value["changed"])
        total = int(self.config["iterations"])
        while self.done.get(self.completed) == ctx.num_executors:
            del self.done[self.completed]
            self.completed += 1
            every = int(self.config["report_every"])
            if self.completed % every == 0 or self.completed == total:
                centres = ctx.ps_get("sums") / ctx.ps_get("weights")[:, None]
                _, d2 = nearest_centre(holdout(self.config), centres)
                ctx.report(iteration=self.completed, objective=float(d2.mean()), changed=self.changed)
                if self.completed == total:
                    ctx.finish(
                        {"objective": float(d2.mean()), "iterations": total, "centres": centres.tolist()}
                    )
                    return
        self._dispatch(ctx)


def kmeans_app(
    k: int = 16,
    dim: int = 32,
    points_per_executor: int = 20000,
    batch: int = 1000,
    iterations: int = 20,
    staleness: int = 0,
    spread: float = 2.0,
    report_every: int = 5,
    seed: int = 0,
) -> Application:
    """The application; each executor's footprint is about points_per_executor × (4 dim + 4) bytes."""
    for name, value in (("k", k), ("dim", dim), ("points_per_executor", points_per_executor),
                        ("batch", batch), ("iterations", iterations), ("report_every", report_every)):
        if int(value) < 1:
            raise ValueError(f"kmeans: {name} must be >= 1, got {value}")
    if staleness < 0:
        raise ValueError(f"kmeans: staleness must be >= 0, got {staleness}")
    if spread < 0:
        raise ValueError(f"kmeans: spread must be >= 0, got {spread}")
    config = {
        "k": int(k),
        "dim": int(dim),
        "points_per_executor": int(points_per_executor),
        "batch": int(batch),
        "iterations": int(iterations),
        "staleness": int(staleness),
        "spread": float(spread),
        "report_every": int(report_every),
        "seed": int(seed),
    }
    return Application("kmeans", KMeansDriver, KMeansExecutor, config)
