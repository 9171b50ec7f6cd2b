"""A small training job that sums per-step metrics over its replicas with ``pollux.torch.Accumulator``.

Linear regression with plain SGD on an indexed synthetic dataset (as in ``train_worker.py``). Every
replica adds, per step, the number of examples it trained on, the sums of their dataset indices and
of the indices' square roots (a float with a known total), its loss, and one step under its own key
``steps_rank<r>`` to a per-epoch accumulator, and the example count to a second accumulator that is
never reset. At every epoch end each replica reads the totals (``sum(reset=True)``) and appends them
to ``totals-<tag>-rank<r>.jsonl``; right after creating the accumulators each replica writes its
restored local values to ``restored-<tag>-rank<r>.json``, and at the end the whole-run totals to
``final-<tag>-rank<r>.json``. Rank 0 writes its step count to ``steps-<tag>.txt`` after every step.

TEST_OUT_DIR, TEST_TAG            where and under which name to write
TEST_N, TEST_M0, TEST_EPOCHS      dataset size, initial batch size, epochs
TEST_SIGTERM_AT_STEP              rank 0 sends itself SIGTERM after that many optimiser steps
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import torch
from worker_env import Indexed, settings

import pollux.torch as ptorch


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


def main() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    common = settings(n=360, m0=12)
    out, tag, n, m0, epochs = common.out, common.tag, common.n, common.m0, common.epochs
    sigterm_step = int(os.environ.get("TEST_SIGTERM_AT_STEP", "-1"))
    env = ptorch.init_process_group("gloo")
    rank = env.rank
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    adp = ptorch.AdaptiveDataParallel(model, optimizer)
    loader = ptorch.AdaptiveDataLoader(Indexed(n), batch_size=m0, shuffle=True, seed=3)
    per_epoch = ptorch.Accumulator()                   # auto name: pollux_accumulator0
    whole_run = ptorch.Accumulator("whole_run")
    write_json(out / f"restored-{tag}-rank{rank}.json",
               {"per_epoch": per_epoch.local(), "whole_run": whole_run.local(),
                "restored": [per_epoch.restored, whole_run.restored], "name": per_epoch.name})
    totals_log = open(out / f"totals-{tag}-rank{rank}.jsonl", "a")
    for epoch in ptorch.remaining_epochs_until(epochs):
        for idx, x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(adp(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            per_epoch["examples"] += len(idx)
            per_epoch["index_sum"] += idx.sum()            # an int64 tensor: stays an int
            per_epoch[f"steps_rank{rank}"] += 1
            per_epoch.update(loss_sum=loss.detach() * len(idx), sqrt_index_sum=idx.double().sqrt().sum())
            whole_run["examples"] += len(idx)
            if rank == 0:
                (out / f"steps-{tag}.txt").write_text(str(adp.steps))
            if adp.steps == sigterm_step and rank == 0:
                os.kill(os.getpid(), signal.SIGTERM)
        totals = per_epoch.sum(reset=True)                 # every replica, at the end of the body
        types = {key: type(value).__name__ for key, value in totals.items()}
        totals_log.write(json.dumps({"epoch": epoch, "replicas": env.num_replicas, "totals": totals,
                                     "types": types}) + "\n")
        totals_log.flush()
    write_json(out / f"final-{tag}-rank{rank}.json",
               {"whole_run": whole_run.sum(), "steps": adp.steps, "epoch": ptorch.current_epoch()})


if __name__ == "__main__":
    main()
