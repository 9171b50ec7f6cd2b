"""The measured PGNS against the truth, with real gloo replicas (SPEC §2).

The loss ``L = −w·x`` with ``x ~ N(g, diag σ²)`` per example has a per-example gradient distribution
that does not depend on the weights, so the true noise scale is known: ``tr(Σ)/|g|²`` for SGD, and
``tr(PΣP)/|Pg|²`` under Adam's current pre-conditioner P (computed from the optimiser state at the end).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torch_workers.forkserver import ForkServer
from torch_workers.launch import WORKERS

WORKER = WORKERS / "pgns_worker.py"
M0 = 48


def measure(forks: ForkServer, tmp_path: Path, optimizer: str, replicas: int, steps: int,
            accum_bound: int | None = None):
    out = tmp_path / f"{optimizer}-{replicas}.json"
    args = [str(out), optimizer, str(steps), str(M0)] + ([str(accum_bound)] if accum_bound else [])
    group = forks.launch(WORKER, replicas, tmp_path, args=args, tag=f"{optimizer}{replicas}")
    try:
        assert group.wait(180) == [0] * replicas, group.output()
    finally:
        group.kill()
    return json.loads(out.read_text())


def test_sgd_two_replicas(tmp_path: Path, forks: ForkServer) -> None:
    res = measure(forks, tmp_path, "sgd", 2, 800)
    assert res["replicas"] == 2 and res["accum_steps"] == 0 and not res["biased"]
    assert res["pgns"] == pytest.approx(res["true_pgns"], rel=0.15)
    assert res["var"] == pytest.approx(res["true_var"], rel=0.15)
    assert res["sqr"] == pytest.approx(res["true_sqr"], rel=0.15)


def test_adam_three_replicas_under_the_current_preconditioner(tmp_path: Path, forks: ForkServer) -> None:
    res = measure(forks, tmp_path, "adam", 3, 200)
    assert res["replicas"] == 3 and not res["biased"]
    assert res["pgns"] == pytest.approx(res["true_pgns"], rel=0.25)
    # The pre-conditioned truth differs from the plain one: the test does exercise P.
    sigma_over_g = 42.8169523
    assert abs(res["true_pgns"] / sigma_over_g - 1) > 0.02


def test_sgd_two_replicas_with_accumulation(tmp_path: Path, forks: ForkServer) -> None:
    res = measure(forks, tmp_path, "sgd", 2, 300, accum_bound=8)
    assert res["local_bsz"] == 8 and res["accum_steps"] == 2          # n = 2 × 3 micro-batches
    assert res["pgns"] == pytest.approx(res["true_pgns"], rel=0.15)
