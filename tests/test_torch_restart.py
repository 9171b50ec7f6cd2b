"""Checkpoint-restart across replica counts with real gloo processes (SPEC §8).

A job runs on 1 replica, is stopped by SIGTERM mid-epoch (exit 143), resumes on 3 replicas, is
stopped again mid-epoch by a SIGTERM that only one replica receives, and finishes on 2 replicas. The
global batch is fixed at M0 (S = 1, M0 divisible by 6), the model has no batch-dependent layers and
the optimiser is plain SGD: every epoch visits every example exactly once and the final weights equal
those of an uninterrupted run.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from torch_workers.forkserver import ForkServer
from torch_workers.launch import WORKERS

WORKER = WORKERS / "train_worker.py"
N, M0, EPOCHS = 360, 12, 3          # 30 steps per epoch


def visits_by_epoch(out: Path) -> dict[int, Counter]:
    by_epoch: dict[int, Counter] = defaultdict(Counter)
    for path in out.glob("visits-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            assert rec["applied"]
            by_epoch[rec["epoch"]].update(rec["idx"])
    return by_epoch


def replica_counts(out: Path, tag: str) -> set[int]:
    return {json.loads(line)["replicas"] for p in out.glob(f"visits-{tag}-rank*.jsonl")
            for line in p.read_text().splitlines()}


def test_restart_1_3_2_replicas_matches_an_uninterrupted_run(tmp_path: Path, forks: ForkServer) -> None:
    ref_out, out, ckpt = tmp_path / "ref", tmp_path / "job", tmp_path / "ckpt"
    ref_out.mkdir()
    out.mkdir()
    common = {"TEST_N": str(N), "TEST_M0": str(M0), "TEST_EPOCHS": str(EPOCHS)}

    # Uninterrupted reference (no checkpoint directory) next to phase 1 of the job.
    ref = forks.launch(WORKER, 1, ref_out, env={**common, "TEST_OUT_DIR": str(ref_out), "TEST_TAG": "ref"},
                       tag="ref")
    phase1 = forks.launch(WORKER, 1, out, checkpoint_dir=ckpt, tag="p1",
                          env={**common, "TEST_OUT_DIR": str(out), "TEST_TAG": "p1",
                               "TEST_SIGTERM_AT_STEP": "20"})
    try:
        assert ref.wait(120) == [0], ref.output()
        assert phase1.wait(120) == [143], phase1.output()
    finally:
        ref.kill()
        phase1.kill()
    # The flag travels with the next step's all-reduce: the replicas stop one step later.
    assert (out / "steps-p1.txt").read_text() == "21"

    # Phase 2: 3 replicas; only rank 2 receives SIGTERM, all must checkpoint and exit 143.
    phase2 = forks.launch(WORKER, 3, out, checkpoint_dir=ckpt, tag="p2",
                          env={**common, "TEST_OUT_DIR": str(out), "TEST_TAG": "p2",
                               "TEST_STEP_SLEEP": "0.03"})
    try:
        deadline = time.monotonic() + 120
        steps_file = out / "steps-p2.txt"
        while time.monotonic() < deadline:
            text = steps_file.read_text() if steps_file.exists() else ""
            if text and int(text) >= 40:
                break
            assert all(p.poll() is None for p in phase2.procs), phase2.output()
            time.sleep(0.01)
        phase2.signal(signal.SIGTERM, ranks=[2])
        assert phase2.wait(120) == [143, 143, 143], phase2.output()
    finally:
        phase2.kill()
    stopped_at = int((out / "steps-p2.txt").read_text())
    assert 40 <= stopped_at < 60, "the second stop should fall inside epoch 1"

    phase3 = forks.launch(WORKER, 2, out, checkpoint_dir=ckpt, tag="p3",
                          env={**common, "TEST_OUT_DIR": str(out), "TEST_TAG": "p3"})
    try:
        assert phase3.wait(120) == [0, 0], phase3.output()
    finally:
        phase3.kill()
    assert replica_counts(out, "p1") == {1} and replica_counts(out, "p2") == {3}
    assert replica_counts(out, "p3") == {2}

    # Every epoch visited every example exactly once, across the three runs and all replicas.
    by_epoch = visits_by_epoch(out)
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, counts in by_epoch.items():
        assert sorted(counts) == list(range(N)), f"epoch {epoch} missed examples"
        assert set(counts.values()) == {1}, f"epoch {epoch} repeated examples"

    final = torch.load(out / "final-p3.pt")
    reference = torch.load(ref_out / "final-ref.pt")
    assert final["steps"] == reference["steps"] == EPOCHS * N // M0
    assert final["progress"] == reference["progress"] and final["epoch"] == EPOCHS
    assert final["lr"] == reference["lr"]                    # the LR scheduler was restored too
    for name, value in reference["state"].items():
        assert torch.allclose(final["state"][name], value, rtol=1e-5, atol=1e-6), name
