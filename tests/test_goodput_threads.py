"""BLAS limited to one thread in the core's numerics (issue 11, item 8): pollux.goodput.threads."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from pollux.goodput import BatchLimits, GoodputModel, GradStats, ThroughputParams, fair_share
from pollux.goodput import model as model_module
from pollux.goodput.threads import limit_blas_threads, one_blas_thread
from pollux.policy import base as policy_base
from pollux.policy.base import Cluster, JobView
from pollux.policy.pollux import PolluxPolicy
from pollux.policy.pollux import problem as pollux_module

# The throughput fit, as a module (its helpers are patched below).
fit_module = importlib.import_module("pollux.goodput.throughput_fit")


def blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


@pytest.fixture
def two_blas_threads() -> Iterator[None]:
    """BLAS at two threads, as a fresh process on a multi-core machine has it (set from this, the main
    thread, which OpenBLAS always obeys)."""
    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("no BLAS library that takes two threads")
        yield


def fit_rows() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    nodes = rng.integers(1, 4, 40)
    replicas = nodes * rng.integers(1, 4, 40)
    bsz = rng.integers(8, 64, 40).astype(float)
    step = 0.01 + 0.001 * bsz + 0.02 * np.log1p(replicas)
    return nodes, replicas, bsz, step, 0.8 * step


def test_the_decorator_limits_blas_to_one_thread_and_keeps_it(two_blas_threads):
    @one_blas_thread
    def inside() -> set[int]:
        return blas_threads()

    assert inside() == {1}
    assert blas_threads() == {1}         # kept: see the module docstring for why it is not restored


def test_fit_throughput_runs_with_one_blas_thread(two_blas_threads, monkeypatch):
    seen: list[set[int]] = []
    real = fit_module._minimise
    monkeypatch.setattr(fit_module, "_minimise",
                        lambda *a, **k: seen.append(blas_threads()) or real(*a, **k))
    fit = fit_module.fit_throughput(*fit_rows())
    assert fit.ok and seen and all(s == {1} for s in seen)


def test_optimize_and_speedup_table_run_with_one_blas_thread(two_blas_threads):
    params = ThroughputParams(alpha_grad=0.01, beta_grad=1e-3, alpha_local=0.01, beta_local=1e-3,
                              alpha_node=0.1, beta_node=1e-3, gamma=1.5)
    model = GoodputModel(params, GradStats(sqr=1.0, var=1.0), 32.0)
    limits = BatchLimits(32.0, max_batch_size=1024.0, min_local_bsz=8.0, max_local_bsz=64.0)
    model_module.optimize(model, 1, 2, limits)
    assert blas_threads() == {1}
    with threadpool_limits(limits=2, user_api="blas"):
        model_module.speedup_table(model, limits, 4, 8, fair_share(4, 4, 2))
        assert blas_threads() == {1}


def test_a_pollux_round_runs_with_one_blas_thread(two_blas_threads, monkeypatch):
    seen: list[set[int]] = []
    real = policy_base.from_matrix
    monkeypatch.setattr(pollux_module, "from_matrix",
                        lambda *a, **k: seen.append(blas_threads()) or real(*a, **k))
    params = ThroughputParams(alpha_grad=0.01, beta_grad=1e-3, alpha_local=0.01, beta_local=1e-3,
                              alpha_node=0.1, beta_node=1e-3, gamma=1.5)
    limits = BatchLimits(32.0, max_batch_size=1024.0, min_local_bsz=8.0, max_local_bsz=64.0)
    jobs = [JobView(id=f"j{i}", submit_time=float(i), model=GoodputModel(params, GradStats(1.0, 1.0), 32.0),
                    limits=limits) for i in range(2)]
    PolluxPolicy().decide(jobs, Cluster.uniform(2, 4), None, 0.0, np.random.default_rng(0))
    assert seen and all(s == {1} for s in seen)


def test_a_refit_thread_after_the_main_thread_is_limited(two_blas_threads):
    """The agent's case: the main thread (batch-size optimisation) limits first, then the refit thread
    fits. OpenBLAS ignores the refit thread's own calls then; the limit the main thread set holds."""
    limit_blas_threads()
    seen: list[set[int]] = []

    def refit() -> None:
        fit_module.fit_throughput(*fit_rows())
        seen.append(blas_threads())

    t = threading.Thread(target=refit)
    t.start()
    t.join(30)
    assert seen == [{1}]


def test_the_limit_is_cheap_once_set():
    """Cheap enough to wrap every public entry point (threadpool_limits() itself takes ~1 ms)."""
    limit_blas_threads()
    start = time.perf_counter()
    for _ in range(1000):
        limit_blas_threads()
    assert (time.perf_counter() - start) / 1000 < 1e-4
