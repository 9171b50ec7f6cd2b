"""Tiny Litz applications for the runtime tests, with exact numpy references.

`lsq_app`: least-squares regression by full-partition gradient steps with staleness s (SSP by
dispatch order). Each executor holds a seeded partition and counts its tasks in its state, so a lost
or duplicated state after a move or a recovery shows up as an error. `chain_app`: the §4.3
dependency check — each task adds 1 to a PS value and returns what it read; a task dispatched after
the previous one's completion must read the full count.

Ray workers cannot import this tests folder, so the tests register this module for pickling by
value (`ray.cloudpickle.register_pickle_by_value`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pollux.litz.api import Application, Driver, DriverContext, Executor, TableSpec, TaskContext, TaskResult


def lsq_partition(seed: int, executor_id: int, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, executor_id])
    x = rng.standard_normal((rows, dim))
    w_true = np.random.default_rng(seed).standard_normal(dim)
    y = x @ w_true + 0.1 * rng.standard_normal(rows)
    return x, y


def lsq_objective(w: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray]]) -> float:
    return float(sum(0.5 * np.sum((x @ w - y) ** 2) for x, y in parts) / sum(len(y) for _, y in parts))


def lsq_reference(num_executors: int, config: dict[str, Any]) -> list[float]:
    """Objectives after each iteration of the s = 0 computation, in plain numpy."""
    parts = [lsq_partition(config["seed"], e, config["rows"], config["dim"]) for e in range(num_executors)]
    w = np.zeros(config["dim"])
    out = []
    for _ in range(config["iterations"]):
        grad = sum(x.T @ (x @ w - y) / len(y) for x, y in parts)
        w = w - config["lr"] * grad / num_executors
        out.append(lsq_objective(w, parts))
    return out


class LsqExecutor(Executor):
    def load_input(self) -> Any:
        c = self.config
        return lsq_partition(c["seed"], self.executor_id, c["rows"], c["dim"])

    def get_state(self) -> Any:
        return {"count": getattr(self, "count", 0)}

    def set_state(self, state: Any) -> None:
        self.count = int(state["count"])

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        x, y = self.input
        w = await ctx.ps.get("w")
        grad = x.T @ (x @ w - y) / len(y)
        ctx.ps.update("w", -self.config["lr"] * grad / self.num_executors)
        self.count = getattr(self, "count", 0) + 1
        return {"iteration": args, "count": self.count}


#: Open holds on lsq runs (name -> callable), in the test process, where the driver runs: while the
#: hold named by ``config["hold"]`` returns True, the driver adds iterations instead of finishing, so a
#: test that must see a resize finish before the run ends waits on that event, not on the run's length.
HOLDS: dict[str, Callable[[], bool]] = {}


def _held(config: Any) -> bool:
    hold = HOLDS.get(config.get("hold", ""))
    return bool(hold is not None and hold())


class LsqDriver(Driver):
    def tables(self) -> list[TableSpec]:
        return [TableSpec("w", (self.config["dim"],))]

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        self.done = [0] * self.config["iterations"]
        self.frontier = 0  # iterations < frontier are complete
        self.dispatched = 0
        self._dispatch_upto(ctx, min(self.config["staleness"] + 1, self.config["iterations"]))

    def _dispatch_upto(self, ctx: DriverContext, upto: int) -> None:
        while self.dispatched < upto:
            for e in range(ctx.num_executors):
                ctx.dispatch(e, self.dispatched)
            self.dispatched += 1

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        it = int(result.args)
        if result.value["count"] != it + 1:
            raise AssertionError(
                f"executor {result.executor_id}: count {result.value['count']} at iteration {it}"
            )
        self.done[it] += 1
        while self.frontier < len(self.done) and self.done[self.frontier] == ctx.num_executors:
            self.frontier += 1
            w = ctx.ps_get("w")
            parts = self._parts(ctx.num_executors)
            ctx.report(iteration=self.frontier, objective=lsq_objective(w, parts))
        window = self.frontier + self.config["staleness"] + 1
        while len(self.done) < window and _held(self.config):
            self.done.append(0)         # one more iteration while the test holds the run open
        total = len(self.done)
        if self.frontier == total:
            ctx.finish({"objective": self.last_objective(ctx), "iterations": total})
            return
        self._dispatch_upto(ctx, min(window, total))

    def _parts(self, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
        if getattr(self, "_cached_parts", None) is None:
            c = self.config
            self._cached_parts = [lsq_partition(c["seed"], e, c["rows"], c["dim"]) for e in range(n)]
        return self._cached_parts

    def last_objective(self, ctx: DriverContext) -> float:
        return lsq_objective(ctx.ps_get("w"), self._parts(ctx.num_executors))

    def state_dict(self) -> Any:
        return {"done": list(self.done), "frontier": self.frontier, "dispatched": self.dispatched}


def iterations_run(summary: Any) -> int:
    """Iterations an lsq run completed (its configured number, or more where a hold kept it open)."""
    return int(summary.final["iterations"])


def lsq_app(**overrides: Any) -> Application:
    config = {"seed": 0, "rows": 40, "dim": 6, "lr": 0.1, "iterations": 10, "staleness": 0}
    config.update(overrides)
    return Application("lsq", LsqDriver, LsqExecutor, config)


class ChainExecutor(Executor):
    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        seen = float((await ctx.ps.get("x"))[0])
        ctx.ps.update("x", np.ones(1))
        return seen


class ChainDriver(Driver):
    def tables(self) -> list[TableSpec]:
        return [TableSpec("x", (1,))]

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        self.step = 0
        self.seen: list[float] = []
        ctx.dispatch(0, 0)

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        self.seen.append(float(result.value))
        self.step += 1
        if self.step == self.config["steps"]:
            ctx.finish({"seen": self.seen})
            return
        ctx.dispatch(self.step % ctx.num_executors, self.step)


def chain_app(steps: int = 12) -> Application:
    return Application("chain", ChainDriver, ChainExecutor, {"steps": steps})


def after(delay_s: float, action: Callable[[], None]) -> threading.Thread:
    """Run `action` in a daemon thread after `delay_s` (resizes and kills while a run runs)."""

    def body() -> None:
        time.sleep(delay_s)
        action()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def config(**fields: Any) -> Any:
    """A `RuntimeConfig` for tests: a hang fails after 30 s instead of the default 600 s."""
    from pollux.litz.records import RuntimeConfig

    return RuntimeConfig(**{"stall_timeout_s": 30.0, **fields})


@contextlib.contextmanager
def local_ray(**init: Any) -> Iterator[None]:
    """A local Ray cluster on loopback (2 CPUs, plus ``init``) for one test module; on exit it is
    shut down and no process it started may be left (processes that were already this process's
    children — earlier tests' long-lived helpers — are not its own)."""
    import ray

    from pollux import raylink
    from pollux.cluster.backends.processes import descendants

    os.environ.update(raylink.LOOPBACK_ENV)
    before = set(descendants(os.getpid()))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, _node_ip_address="127.0.0.1", **init)
    try:
        yield
    finally:
        ray.shutdown()
    deadline = time.monotonic() + 20
    while set(descendants(os.getpid())) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(descendants(os.getpid())) - before, "Ray processes left behind"
