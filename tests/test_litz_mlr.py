"""MLR on Litz (pollux.litz.apps.mlr) against a plain numpy SGD loop, on the local runtime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pollux.datasets import gaussian_mixture, load_classification, partition
from pollux.litz.apps.mlr import loss_and_grad, mlr_app, numpy_sgd_reference, task_step, with_bias
from pollux.litz.local import LocalSummary, run_local

SMALL = {"n": 1200, "d": 10, "classes": 4, "batch_size": 16, "lr": 0.5, "iterations": 60, "report_every": 5}


def _trajectory(summary: LocalSummary) -> list[tuple[int, float]]:
    return [(int(m["iteration"]), float(m["objective"])) for m in summary.metrics]


def _assert_same(got: list[tuple[int, float]], want: list[tuple[int, float]], rtol: float) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=rtol, atol=0)


@pytest.mark.parametrize("l2", [0.0, 0.01])
def test_task_step_is_the_scaled_gradient_and_the_gradient_matches_finite_differences(l2: float) -> None:
    """The micro-task's `task_step` (one-hot labels, scale folded in) must be scale × the
    reference's gradient to rounding, and that the true gradient of the loss (central differences)."""
    rng = np.random.default_rng(1)
    X, y, W = with_bias(rng.normal(size=(7, 3))), rng.integers(0, 4, 7), rng.normal(size=(4, 4))
    loss, grad = loss_and_grad(W, X, y, l2)
    np.testing.assert_allclose(task_step(W, X, np.eye(4)[y], -0.3, l2), -0.3 * grad, rtol=1e-13, atol=1e-16)
    h, numeric = 1e-6, np.zeros_like(W)
    for idx in np.ndindex(*W.shape):
        up, down = W.copy(), W.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (loss_and_grad(up, X, y, l2)[0] - loss_and_grad(down, X, y, l2)[0]) / (2 * h)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert isinstance(loss, float) and loss > 0


def test_one_executor_equals_plain_minibatch_sgd() -> None:
    """E = 1, s = 0 is exactly mini-batch SGD; the reference here is written out independently."""
    cfg = dict(SMALL)
    data = load_classification(cfg)
    X, y = with_bias(data.X), data.y
    W = np.zeros((X.shape[1], data.classes))
    want = []
    it = 0
    for epoch in range(100):
        perm = np.random.default_rng([0, 1, 0, epoch]).permutation(X.shape[0])
        for j in range(X.shape[0] // 16):
            rows = perm[j * 16 : (j + 1) * 16]
            W -= 0.5 * loss_and_grad(W, X[rows], y[rows])[1]
            it += 1
            if it % 5 == 0:
                want.append((it, loss_and_grad(W, X, y)[0]))
            if it == 60:
                break
        if it == 60:
            break
    summary = run_local(mlr_app(**cfg), num_executors=1)
    _assert_same(_trajectory(summary), want, rtol=1e-9)
    _assert_same(numpy_sgd_reference(1, **cfg), want, rtol=1e-12)
    # to rounding, not bit for bit: the BLAS kernels (and so the last bits) differ between CPUs
    assert summary.final == {"objective": pytest.approx(want[-1][1], rel=1e-12, abs=0), "iterations": 60,
                             "target_reached": False}
    # the single-table variant is the same algorithm
    single = run_local(mlr_app(**cfg, double_buffer=False), num_executors=1)
    _assert_same(_trajectory(single), want, rtol=1e-9)


def test_digits_one_executor_matches_reference() -> None:
    pytest.importorskip("sklearn")
    cfg = {"dataset": "digits", "batch_size": 32, "lr": 0.5, "iterations": 80, "report_every": 20}
    summary = run_local(mlr_app(**cfg), num_executors=1)
    ref = numpy_sgd_reference(1, **cfg)
    _assert_same(_trajectory(summary), ref, rtol=1e-6)
    assert summary.final is not None and summary.final["objective"] < 0.5  # from log(10) = 2.30


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"reads": "dispatch"},
        {"staleness_order": "random", "seed": 7},
        {"migrate_every": 3, "reads": "dispatch"},
    ],
)
def test_synchronous_data_parallel_is_schedule_independent(options: dict[str, object]) -> None:
    """E = 4, s = 0: whatever the order, the snapshot semantics or migrations, the trajectory is the
    synchronous data-parallel SGD of the reference (double buffering keeps sibling updates unseen)."""
    cfg = dict(SMALL)
    summary = run_local(mlr_app(**cfg), num_executors=4, **options)  # type: ignore[arg-type]
    assert summary.tasks_completed == 4 * 60
    _assert_same(_trajectory(summary), numpy_sgd_reference(4, **cfg), rtol=1e-9)


@pytest.mark.parametrize("staleness", [1, 2])
def test_stale_runs_converge(staleness: int) -> None:
    cfg = dict(SMALL, iterations=120)
    sync = run_local(mlr_app(**cfg), num_executors=4).final
    stale = run_local(mlr_app(**cfg, staleness=staleness), num_executors=4, reads="dispatch")
    assert sync is not None and stale.final is not None
    start = math.log(4)
    assert stale.final["objective"] < 0.8 * start
    assert stale.final["objective"] <= sync["objective"] + 0.02
    # with snapshot reads the staleness is real: the trajectory differs from the synchronous one
    assert stale.final["objective"] != pytest.approx(sync["objective"], rel=1e-9)


def test_more_executors_converge_and_target_loss_stops() -> None:
    cfg = dict(SMALL, iterations=200, report_every=1)
    one = run_local(mlr_app(**cfg), num_executors=1).final
    eight = run_local(mlr_app(**cfg), num_executors=8).final
    assert one is not None and eight is not None
    assert eight["objective"] <= one["objective"] + 1e-3  # 8 batches per step: no worse
    target = (math.log(4) + eight["objective"]) / 2
    stopped = run_local(mlr_app(**cfg, target_loss=target), num_executors=8)
    assert stopped.final is not None and stopped.final["target_reached"]
    assert stopped.final["objective"] <= target and stopped.final["iterations"] < 200
    assert stopped.metrics[-2]["objective"] > target


def test_epochs_config_and_partitions() -> None:
    app = mlr_app(**dict(SMALL, epochs=2))
    summary = run_local(app, num_executors=3)
    assert summary.final is not None and summary.final["iterations"] == math.ceil(2 * 1200 / (3 * 16))
    parts = [partition(10, 3, e) for e in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(10))
    a, b = gaussian_mixture(50, 3, 2, seed=1), gaussian_mixture(50, 3, 2, seed=1)
    np.testing.assert_array_equal(a.X, b.X)


@pytest.mark.parametrize(
    ("key", "value"),
    [("batch_size", 0), ("lr", 0.0), ("staleness", -1), ("iterations", 0), ("dataset", "mnist")],
)
def test_bad_config_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        if key == "dataset":
            load_classification({key: value})
        else:
            mlr_app(**{key: value})


def test_ssp_dispatch_rule() -> None:
    """Iteration i is dispatched exactly when iterations < i - s are all complete (any order)."""
    from pollux.litz.api import TaskResult
    from pollux.litz.apps.mlr import MLRDriver

    class Ctx:
        num_executors, version = 3, 0

        def __init__(self) -> None:
            self.sent: list[tuple[int, int]] = []

        def dispatch(self, e: int, args: dict[str, int]) -> None:
            self.sent.append((e, args["iteration"]))

        def ps_get(self, table: str, rows: object = None) -> np.ndarray:
            assert table == "W"  # one table when s > 0
            return np.zeros((11, 4))

        def report(self, **metrics: float) -> None: ...

        def finish(self, result: object = None) -> None: ...

    s = 2
    driver = MLRDriver(3, dict(SMALL, staleness=s, iterations=12))
    ctx = Ctx()
    driver.dispatch_initial_tasks(ctx)  # type: ignore[arg-type]
    assert sorted({i for _, i in ctx.sent}) == [0, 1, 2]
    rng = np.random.default_rng(0)
    pending, done = list(ctx.sent), set()
    while pending:
        e, i = pending.pop(int(rng.integers(len(pending))))
        done.add((e, i))
        ctx.sent = []
        driver.handle_task_completion(ctx, TaskResult(e, {"iteration": i}, {"iteration": i}, 0))  # type: ignore[arg-type]
        for _, j in ctx.sent:
            assert all((x, k) in done for x in range(3) for k in range(j - s))
        pending += ctx.sent
    assert len(done) == 36
