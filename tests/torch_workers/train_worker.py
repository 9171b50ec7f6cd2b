"""A small training script driven by environment variables, for the multi-process agent tests.

Linear regression (no batch-dependent layers) with plain SGD on an indexed synthetic dataset. Each
rank appends one record per optimiser step (dataset indices, micro-batch sizes, whether the update
was applied) to ``visits-<tag>-rank<r>.jsonl``; rank 0 writes its step count to ``steps-<tag>.txt``
after every step and the final weights to ``final-<tag>.pt``.

TEST_OUT_DIR, TEST_TAG            where and under which name to write
TEST_N, TEST_M0, TEST_EPOCHS      dataset size, initial batch size, epochs
TEST_SIGTERM_AT_STEP/RANK         that rank sends itself SIGTERM after that many optimiser steps
TEST_STEP_SLEEP                   seconds to sleep in every step (to give a test time to act)
TEST_AUTOSCALE                    "max,lo,hi,accum" to call autoscale_batch_size
TEST_OPTIMIZER                    "sgd" (default) or "adam"
TEST_BALANCE                      call loader.balance_batches(mode) (LB-BSP); each record then holds
                                  the scalars "balance_share<r>" in "shares"
TEST_SLOW                         "r:s,r:s": rank r sleeps s seconds per example of its micro-batch
                                  between forward and backward (an injected, share-proportional delay)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import torch
from worker_env import Indexed, settings

import pollux.torch as ptorch


def main() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    common = settings(n=360, m0=12)
    out, tag, n, m0, epochs = common.out, common.tag, common.n, common.m0, common.epochs
    sigterm_step = int(os.environ.get("TEST_SIGTERM_AT_STEP", "-1"))
    sigterm_rank = int(os.environ.get("TEST_SIGTERM_RANK", "0"))
    sleep = float(os.environ.get("TEST_STEP_SLEEP", "0"))
    env = ptorch.init_process_group("gloo")
    rank = env.rank
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    if os.environ.get("TEST_OPTIMIZER", "sgd") == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    adp = ptorch.AdaptiveDataParallel(model, optimizer, scheduler)
    loader = ptorch.AdaptiveDataLoader(Indexed(n), batch_size=m0, shuffle=True, seed=3)
    if os.environ.get("TEST_BALANCE"):
        loader.balance_batches(os.environ["TEST_BALANCE"])
    slow = dict(item.split(":") for item in os.environ.get("TEST_SLOW", "").split(",") if item)
    per_example = float(slow.get(str(rank), 0.0))
    auto = os.environ.get("TEST_AUTOSCALE")
    if auto:
        mx, lo, hi, acc = auto.split(",")
        loader.autoscale_batch_size(int(mx), (int(lo) if lo else None, int(hi) if hi else None), acc == "1")
    visits = open(out / f"visits-{tag}-rank{rank}.jsonl", "a")
    pending: list[int] = []
    micro_sizes: list[int] = []
    for epoch in ptorch.remaining_epochs_until(epochs):
        for idx, x, y in loader:
            before = adp.steps
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(adp(x).squeeze(1), y)
            if per_example:
                time.sleep(per_example * len(idx))
            loss.backward()
            optimizer.step()
            pending.extend(idx.tolist())
            micro_sizes.append(len(idx))
            if adp.accumulating:
                continue
            # One record per optimiser step; "applied" is False for a step skipped after an OOM.
            visits.write(json.dumps({"epoch": epoch, "step": adp.steps, "idx": pending,
                                     "micro": micro_sizes, "applied": adp.steps > before,
                                     "replicas": env.num_replicas,
                                     "shares": [v for k, v in sorted(adp.to_scalars().items())
                                                if k.startswith("balance_share")]}) + "\n")
            visits.flush()
            pending, micro_sizes = [], []
            if rank == 0:
                (out / f"steps-{tag}.txt").write_text(str(adp.steps))
            if sleep:
                time.sleep(sleep)
            if adp.steps == sigterm_step and rank == sigterm_rank:
                os.kill(os.getpid(), signal.SIGTERM)
        scheduler.step()
    if rank == 0:
        torch.save({"state": model.state_dict(), "progress": adp.progress, "steps": adp.steps,
                    "epoch": ptorch.current_epoch(), "lr": optimizer.param_groups[0]["lr"]},
                   out / f"final-{tag}.pt")


if __name__ == "__main__":
    main()
