"""benchmarks/litz_ddp.py, the `vs_ddp` baseline: a tiny DDP run over gloo trains (loss falls), it is
the same computation as the Litz MLR reference (2 executors at s = 0), and its processes all exit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # spawned children inherit it

import litz_ddp
from pollux.litz.apps.mlr import numpy_sgd_reference


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_tiny_ddp_run_trains_matches_reference_and_exits():
    cfg = litz_ddp.DdpConfig(n=600, d=6, classes=3, batch_per_process=16, steps=25, warmup_steps=3, lr=0.5)
    res = litz_ddp.run_ddp(cfg)
    losses = res["losses_rank0"]
    assert len(losses) == 28 and abs(losses[0] - np.log(3)) < 1e-12
    assert np.mean(losses[-5:]) < losses[0] - 0.1
    assert res["objective_end"] < res["objective_start"] - 0.1
    assert res["examples_per_s"] > 0 and res["examples_per_s_median_of_5_chunks"] > 0
    # DDP averages the two processes' gradients: exactly Litz MLR with 2 executors at staleness 0
    ref = numpy_sgd_reference(
        2, n=600, d=6, classes=3, batch_size=16, lr=0.5, iterations=28, report_every=1000, seed=0
    )
    assert abs(ref[-1][1] - res["objective_end"]) < 1e-9
    assert res["exitcodes"] == [0, 0] and len(res["pids"]) == 2
    assert not [pid for pid in res["pids"] if _alive(pid)]
