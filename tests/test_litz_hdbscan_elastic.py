"""Approximate HDBSCAN on a real local Ray cluster: a run that gains and loses workers mid-way (its
executors, with their kNN lists and proposals in hand, move), and one that loses a worker and comes
back from a checkpoint, must end with the labels of an unresized run of the same seed.

The driver is held between NN-Descent iterations (no-op tasks, `HDBSCANDriver.hold_open`) while a
resize is still going, so that each resize finishes before the descent does, whatever the machine's
load (the first resize starts as an iteration starts, so executors move with proposals in hand);
holding changes nothing (the labels are compared with a run that was never held).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import litz_helpers as h  # noqa: E402
from pollux.litz.api import Application  # noqa: E402
from pollux.litz.apps import make_app  # noqa: E402
from pollux.litz.apps.hdbscan import HDBSCANDriver, HDBSCANExecutor  # noqa: E402
from pollux.litz.local import run_local  # noqa: E402
from pollux.litz.runtime import LitzRuntime  # noqa: E402

CONFIG = {"n": 1500, "dim": 3, "clusters": 15, "seed": 3}
#: Per run (by its config's "hold" name): called by the driver between iterations; True holds it.
HOLDS: dict[str, Callable[[int], bool]] = {}


class HeldDriver(HDBSCANDriver):
    """The app's driver, asking the test whether to hold between iterations."""

    def hold_open(self) -> bool:
        # The class travels to Ray's workers by value, with the globals it names; HOLDS (closures over
        # the runtime) cannot, so it is looked up in this module at run time, in the master.
        holds = getattr(sys.modules[type(self).__module__], "HOLDS", {})
        hold = holds.get(str(self.config.get("hold", "")))
        return bool(hold is not None and hold(self.t))


@pytest.fixture(scope="module")
def cluster():
    with h.local_ray():
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield


@pytest.fixture(scope="module")
def unresized() -> np.ndarray:
    return run_local(make_app("hdbscan", **CONFIG), num_executors=4).final["labels"]


def _held_app(name: str) -> Application:
    return Application("hdbscan", HeldDriver, HDBSCANExecutor, {**CONFIG, "hold": name})


def test_workers_2_3_1_mid_descent_give_the_unresized_labels(cluster, unresized):
    rt = LitzRuntime(_held_app("resize"), h.config(num_executors=4, num_workers=2, num_shards=2))
    steps: list[Callable[[], None]] = [lambda: rt.resize(num_workers=3), lambda: rt.resize(num_workers=1)]

    def hold(iteration: int) -> bool:
        if rt.status()["resizing"]:
            return True  # let the resize finish before the descent goes on
        if steps and iteration >= 1:
            steps.pop(0)()
            return not steps  # the first moves executors while an iteration runs; the last, held
        return False

    HOLDS["resize"] = hold
    try:
        summary = rt.run()
    finally:
        del HOLDS["resize"]
    assert not steps
    assert [(r["from"], r["to"]) for r in summary.resizes] == [(2, 3), (3, 1)]
    assert all(r.get("t_done") is not None and r["moved"] > 0 for r in summary.resizes)
    assert summary.num_workers == 1 and summary.recoveries == 0
    np.testing.assert_array_equal(summary.final["labels"], unresized)


def test_a_lost_worker_comes_back_from_a_checkpoint_with_the_same_labels(cluster, unresized, tmp_path):
    cfg = h.config(num_executors=4, num_workers=2, num_shards=1, task_floor_s=0.01,
                   checkpoint_dir=str(tmp_path), checkpoint_every_s=0.1)
    rt = LitzRuntime(_held_app("kill"), cfg)
    killed: list[int] = []

    def hold(iteration: int) -> bool:
        if iteration >= 2 and not killed:
            killed.append(iteration)
            h.sigkill(list(rt.worker_pids().values())[-1])
        return False

    HOLDS["kill"] = hold
    try:
        summary: Any = rt.run()
    finally:
        del HOLDS["kill"]
    assert killed and summary.recoveries == 1 and summary.checkpoints_loaded == 1
    np.testing.assert_array_equal(summary.final["labels"], unresized)
