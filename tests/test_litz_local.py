"""The local Litz runtime: the API's semantics in one process (pollux.litz.local), no Ray.

These pin down the rules the Ray runtime must also keep: versions, updates applied before the driver
hears of a completion, §4.3 (a task dispatched after the driver saw A complete observes A's updates),
dispatch-time snapshots shared by tasks of one version, picklability, migration of state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from pollux.litz.api import (
    Application,
    ApplicationError,
    Driver,
    DriverContext,
    Executor,
    LitzError,
    TableSpec,
    TaskContext,
    TaskResult,
)
from pollux.litz.local import run_local


class CounterExecutor(Executor):
    """Reads the counter table, adds its executor id + 1 to row 0, returns what it read."""

    def __init__(self, executor_id: int, num_executors: int, config: Mapping[str, Any]) -> None:
        super().__init__(executor_id, num_executors, config)
        self.runs = 0

    def load_input(self) -> Any:
        return np.full(3, self.executor_id)

    def get_state(self) -> Any:
        return {"runs": self.runs}

    def set_state(self, state: Any) -> None:
        self.runs = int(state["runs"])

    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        seen = await ctx.ps.get("counter")
        ctx.ps.update("counter", np.array([float(self.executor_id + 1)]), rows=np.array([0]))
        again = await ctx.ps.get("counter", np.array([0]))  # own update is buffered until completion
        self.runs += 1
        return {"seen": float(seen[0]), "again": float(again[0]), "version": ctx.version,
                "runs": self.runs, "input": int(self.input[0]), "tag": args["tag"]}


class ChainDriver(Driver):
    """Dispatches `rounds` waves of one task per executor; wave k+1 after wave k completed."""

    def __init__(self, num_executors: int, config: Mapping[str, Any]) -> None:
        super().__init__(num_executors, config)
        self.results: list[dict[str, Any]] = []
        self.done_in_wave = 0
        self.wave = 0

    def tables(self) -> Sequence[TableSpec]:
        return [TableSpec("counter", (2,), init=np.array([10.0, 0.0]))]

    def _wave(self, ctx: DriverContext) -> None:
        for e in range(self.num_executors):
            ctx.dispatch(e, {"tag": self.wave})

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        self._wave(ctx)

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        assert result.args["tag"] == result.value["tag"]
        self.results.append({**result.value, "executor": result.executor_id, "task_version": result.version,
                             "ps_after": float(ctx.ps_get("counter")[0]), "ctx_version": ctx.version})
        ctx.report(value=float(ctx.ps_get("counter")[0]))
        self.done_in_wave += 1
        if self.done_in_wave == self.num_executors:
            self.done_in_wave = 0
            self.wave += 1
            if self.wave < int(self.config["rounds"]):
                self._wave(ctx)
            else:
                ctx.finish({"results": self.results})


def chain_app(rounds: int = 3) -> Application:
    return Application("chain", ChainDriver, CounterExecutor, {"rounds": rounds})


def test_versions_and_updates_applied_before_completion() -> None:
    summary = run_local(chain_app(2), num_executors=3)
    assert summary.tasks_completed == 6
    results = summary.final["results"]
    # FIFO, latest reads: each task sees every earlier completion; updates land before the driver runs.
    total = 10.0
    for k, r in enumerate(results):
        assert r["seen"] == total
        assert r["again"] == total  # a task does not see its own buffered update
        total += r["executor"] + 1
        assert r["ps_after"] == total
        assert r["ctx_version"] == k + 1  # completions handled, this one included
    assert [r["task_version"] for r in results] == [0, 0, 0, 3, 3, 3]
    assert [m["version"] for m in summary.metrics] == list(range(1, 7))


def test_dependency_rule_with_dispatch_time_snapshots() -> None:
    """§4.3: tasks of wave 2 were dispatched after the driver saw all of wave 1, so they see all of it;
    tasks of one wave were dispatched together, so with snapshot reads they see none of each other."""
    summary = run_local(chain_app(3), num_executors=3, reads="dispatch")
    results = summary.final["results"]
    assert summary.cache_misses == 3 and summary.cache_hits == 6  # one snapshot per dispatch version
    per_wave = 1 + 2 + 3
    for r in results:
        assert r["seen"] == 10.0 + per_wave * r["tag"]


def test_random_order_keeps_rule_and_executor_order() -> None:
    summary = run_local(chain_app(4), num_executors=4, seed=3, staleness_order="random")
    results = summary.final["results"]
    order = [r["executor"] for r in results[:4]]
    assert sorted(order) == [0, 1, 2, 3] and order != [0, 1, 2, 3]  # seed 3 interleaves
    for r in results:
        assert r["seen"] >= 10.0 + 10 * r["tag"]  # a wave sees all earlier waves
        assert r["runs"] == r["tag"] + 1  # each executor's tasks ran in order


def test_migration_keeps_state_and_reloads_input() -> None:
    base = run_local(chain_app(3), num_executors=3)
    moved = run_local(chain_app(3), num_executors=3, migrate_every=1)
    assert moved.migrations == 9
    strip = [{k: v for k, v in r.items()} for r in base.final["results"]]
    assert moved.final["results"] == strip
    assert all(r["input"] == r["executor"] for r in moved.final["results"])


class BadExecutor(CounterExecutor):
    async def run_task(self, ctx: TaskContext, args: Any) -> Any:
        if args.get("mode") == "raise":
            raise ValueError("boom")
        if args.get("mode") == "shape":
            ctx.ps.update("counter", np.zeros(5))
        if args.get("mode") == "table":
            await ctx.ps.get("nope")
        return lambda: None  # not picklable


class OneShotDriver(ChainDriver):
    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        ctx.dispatch(0, {"mode": self.config["mode"], "tag": 0})


@pytest.mark.parametrize(
    ("mode", "error", "text"),
    [
        ("raise", ApplicationError, "executor 0 raised"),
        ("shape", LitzError, "delta shape"),
        ("table", LitzError, "unknown PS table 'nope'"),
        ("pickle", LitzError, "not picklable"),
    ],
)
def test_errors_name_the_culprit(mode: str, error: type[Exception], text: str) -> None:
    app = Application("bad", OneShotDriver, BadExecutor, {"mode": mode, "rounds": 1})
    with pytest.raises(error, match=text):
        run_local(app, num_executors=1)


def test_run_without_finish_and_bad_dispatch() -> None:
    class Silent(ChainDriver):
        def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
            return None

    with pytest.raises(LitzError, match="never called finish"):
        run_local(Application("silent", Silent, CounterExecutor, {"rounds": 1}), num_executors=2)

    class Stray(ChainDriver):
        def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
            ctx.dispatch(5, {"tag": 0})

    with pytest.raises(LitzError, match="executor_id 5"):
        run_local(Application("stray", Stray, CounterExecutor, {"rounds": 1}), num_executors=2)


class CausalDriver(ChainDriver):
    """A and B go out together; C is dispatched when A's completion is seen, before B's."""

    def dispatch_initial_tasks(self, ctx: DriverContext) -> None:
        ctx.dispatch(0, {"tag": "A"})
        ctx.dispatch(1, {"tag": "B"})

    def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
        self.results.append({**result.value, "task_version": result.version})
        if result.value["tag"] == "A":
            ctx.dispatch(2, {"tag": "C"})
        if len(self.results) == 3:
            ctx.finish({"results": self.results})


@pytest.mark.parametrize("reads", ["latest", "dispatch"])
def test_task_dispatched_after_completion_sees_its_updates(reads: str) -> None:
    app = Application("causal", CausalDriver, CounterExecutor, {})
    summary = run_local(app, num_executors=3, reads=reads)  # type: ignore[arg-type]
    by_tag = {r["tag"]: r for r in summary.final["results"]}
    assert by_tag["C"]["task_version"] == 1 and by_tag["B"]["task_version"] == 0
    if reads == "dispatch":
        assert by_tag["B"]["seen"] == 10.0  # dispatched with A: none of A's updates
        assert by_tag["C"]["seen"] == 11.0  # all of A's (+1), none of B's (completed after C's dispatch)
    else:
        assert by_tag["B"]["seen"] == 11.0  # ran after A completed: "some, all or none" — here all
        assert by_tag["C"]["seen"] == 13.0  # A's and B's (+2)


def test_finish_drains_queued_tasks_without_the_driver() -> None:
    class Early(ChainDriver):
        def handle_task_completion(self, ctx: DriverContext, result: TaskResult) -> None:
            self.results.append(result.value)
            ctx.finish({"handled": len(self.results), "ps": float(ctx.ps_get("counter")[0])})

    summary = run_local(Application("early", Early, CounterExecutor, {"rounds": 1}), num_executors=3)
    assert summary.tasks_completed == 3  # the two queued tasks still ran
    assert summary.final == {"handled": 1, "ps": 11.0}
    assert summary.metrics == []


def test_the_public_face_exports_the_api_and_imports_ray_only_for_the_ray_runner() -> None:
    """``pollux.litz`` names what an application and a program need; an application module that
    imports it does not pay for Ray, and the Ray runner is the same object as the runtime's."""
    import subprocess
    import sys

    code = ("import sys, pollux.litz as litz\n"
            "assert 'ray' not in sys.modules, 'importing pollux.litz imported Ray'\n"
            "from pollux.litz.api import Application\n"
            "assert litz.Application is Application and litz.run_local.__module__ == 'pollux.litz.local'\n"
            "assert 'ray' not in sys.modules\n"
            "from pollux.litz.runtime import LitzRuntime\n"
            "assert litz.LitzRuntime is LitzRuntime\n"
            "missing = [n for n in litz.__all__ if not hasattr(litz, n)]\n"
            "assert not missing, missing\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
