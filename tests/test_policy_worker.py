"""The policy's worker process: the same decisions as in the service's own process, its failures
reported or covered, and no process left behind."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from pollux.cluster.control.policy_worker import OffloadedPolicy, PolicyWorker, PolicyWorkerError
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.store import JobStore
from pollux.goodput.records import GradStats, ThroughputParams
from pollux.hints import build_hints
from pollux.policy.base import Cluster
from pollux.policy.registry import make_policy
from test_policy_conformance import random_case

PARAMS = ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23)


@pytest.fixture(scope="module")
def worker():
    w = PolicyWorker("pollux")
    yield w
    w.close()


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` has ended within ``within_s`` (reaped, or a zombie not reaped yet)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_worker_decides_as_the_policy_does_here(worker, seed):
    views, cluster = random_case("pollux", seed)
    here_rng, there_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    here = make_policy("pollux").decide(views, cluster, None, 100.0, here_rng)
    there = worker.decide(views, cluster, None, 100.0, there_rng)
    assert there == here                          # the allocation and the carried state
    # The generator advanced in the child as it did here: the next draws agree.
    assert there_rng.bit_generator.state == here_rng.bit_generator.state
    # A second round from the carried state, in the same child (its memos warm): still the same.
    again_here = make_policy("pollux").decide(views, cluster, here[1], 160.0, here_rng)
    again_there = worker.decide(views, cluster, there[1], 160.0, there_rng)
    assert again_there == again_here


def test_a_policy_error_in_the_worker_is_raised_with_its_message(worker):
    _, cluster = random_case("pollux", 0)
    with pytest.raises(RuntimeError, match="AttributeError") as info:
        worker.decide([None], cluster, None, 0.0, np.random.default_rng(0))   # type: ignore[list-item]
    assert not isinstance(info.value, PolicyWorkerError)
    assert worker.pid is not None                 # the child lives on


def test_a_dead_worker_is_covered_by_this_process_and_replaced():
    views, cluster = random_case("pollux", 3)
    worker = PolicyWorker("pollux")
    try:
        offloaded = OffloadedPolicy(make_policy("pollux"), worker, min_jobs=1)
        first = offloaded.decide(views, cluster, None, 0.0, np.random.default_rng(5))
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert gone(pid)
        with pytest.raises(PolicyWorkerError):
            worker.decide(views, cluster, None, 0.0, np.random.default_rng(5))
        # Through the offloading policy the round is decided here instead, the same way.
        assert offloaded.decide(views, cluster, None, 0.0, np.random.default_rng(5)) == first
        # The next call starts a new child.
        assert worker.decide(views, cluster, None, 0.0, np.random.default_rng(5)) == first
        assert worker.pid not in (None, pid)
    finally:
        worker.close()
    assert worker.pid is None


def test_small_rounds_stay_in_this_process():
    views, cluster = random_case("pollux", 4)
    worker = PolicyWorker("pollux")
    offloaded = OffloadedPolicy(make_policy("pollux"), worker, min_jobs=len(views) + 1)
    offloaded.decide(views, cluster, None, 0.0, np.random.default_rng(0))
    assert worker.pid is None                     # never started
    assert offloaded.name == "pollux"


def test_a_scheduler_decides_large_rounds_in_its_worker_and_stops_it(tmp_path):
    """The same round result with the worker as without, and the child gone once closed."""
    cluster = Cluster.uniform(4, 2)
    results = []
    for min_jobs in (1, None):
        store = JobStore(tmp_path / f"jobs-{min_jobs}.db")
        for i in range(6):
            job = store.submit({"entrypoint": "train.py", "init_batch_size": 128, "max_batch_size": 4096},
                               job_id=f"j{i}", now=float(i))
            if i % 2:
                hints = build_hints(PARAMS, GradStats(sqr=8.95, var=5.07), init_batch_size=128,
                                    max_batch_size=4096, local_bsz_bounds=(32, 1024), accumulation=True,
                                    max_replicas_seen=2, progress=100.0, epoch=1)
                store.put_hints(job.id, hints, now=float(i))
        scheduler = Scheduler(store, process_min_jobs=min_jobs)
        result = scheduler.decide(10.0, cluster)
        pid = None if scheduler.worker is None else scheduler.worker.pid
        assert (pid is not None) == (min_jobs is not None)
        scheduler.close()
        if pid is not None:
            assert gone(pid)
        results.append((result.allocation, result.policy_state, scheduler.rng.bit_generator.state))
        store.close()
    assert results[0] == results[1]
    with pytest.raises(ValueError, match="process_min_jobs"):
        Scheduler(JobStore(tmp_path / "x.db"), process_min_jobs=0)
