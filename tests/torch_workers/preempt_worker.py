"""A script written the way people write them, for the preemption tests (SIGTERM at any moment).

Noisy linear regression with SGD (momentum, weight decay, one parameter group per parameter), a
per-epoch ``StepLR``, adaptive batch size with accumulation, and the script's own all-reduce of
per-epoch metrics at each epoch end. SIGTERMs are injected by the agent's fault points
(``POLLUX_FAULT_SIGTERM``, set by the test).

Each rank appends one record per optimiser step to ``visits-<tag>-rank<r>.jsonl`` (epoch, the pass of
the global sample stream the step belongs to, dataset indices); rank 0 appends one record per epoch
end to ``epochs-<tag>.jsonl`` with the step counts of this run in that epoch, summed, maxed and
minned over the replicas by the script's own all-reduce.

It also keeps its totals the way the digits example (and docs/agent.md) tells users to: a
``pollux.torch.Accumulator`` counts the examples of each epoch, read with ``sum(reset=True)`` at the
epoch's end into a checkpointed history (``register_state``); rank 0 writes the history, with the
sampler's final position, to ``final-<tag>.json`` when the job ends. The test compares those counters
with the dataset indices the steps logged, so a count kept twice across a restart shows.

TEST_OUT_DIR, TEST_TAG, TEST_N, TEST_M0, TEST_EPOCHS, TEST_AUTOSCALE ("max,lo,hi"),
TEST_STEP_SLEEP (seconds slept in each forward pass: a fixed cost per pass, which makes larger
batches pay and so batch-size changes happen within a short test)
"""

from __future__ import annotations

import json
import logging
import os
import time

import torch
import torch.distributed as dist
from worker_env import Indexed, settings

import pollux.torch as ptorch


class History:
    """The examples of every finished epoch, over all replicas; checkpointed with the job."""

    def __init__(self) -> None:
        self.per_epoch: list[int] = []
        self.runs = 1

    def state_dict(self) -> dict:
        return {"per_epoch": list(self.per_epoch), "runs": self.runs}

    def load_state_dict(self, state: dict) -> None:
        self.per_epoch = [int(v) for v in state["per_epoch"]]
        self.runs = int(state["runs"]) + 1


def main() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.DEBUG if os.environ.get("TEST_DEBUG") else logging.INFO,
                        format="%(message)s")
    common = settings(n=240, m0=8)
    out, tag, n, m0, epochs = common.out, common.tag, common.n, common.m0, common.epochs
    mx, lo, hi = (int(v) for v in os.environ.get("TEST_AUTOSCALE", "64,2,16").split(","))
    sleep = float(os.environ.get("TEST_STEP_SLEEP", "0"))
    ptorch.init_process_group("gloo")
    rank, replicas = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD([{"params": [p]} for p in model.parameters()], lr=0.02, momentum=0.9,
                                weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
    adp = ptorch.AdaptiveDataParallel(model, optimizer, scheduler)
    dataset = Indexed(n, seed=11, noise=3.0)
    loader = ptorch.AdaptiveDataLoader(dataset, batch_size=m0, shuffle=True, seed=3)
    loader.autoscale_batch_size(mx, (lo, hi), gradient_accumulation=True)
    visits = open(out / f"visits-{tag}-rank{rank}.jsonl", "a")
    history = History()
    ptorch.register_state("test_history", history)
    examples = ptorch.Accumulator("test_examples")
    for epoch in ptorch.remaining_epochs_until(epochs):
        steps = samples = 0
        pending: list[int] = []
        start = None
        for idx, x, y in loader:
            if start is None:
                start = loader.sampler.position       # the global sample index of this step
            optimizer.zero_grad()
            if sleep:
                time.sleep(sleep)
            loss = torch.nn.functional.mse_loss(adp(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            pending.extend(idx.tolist())
            examples["seen"] += len(idx)
            if adp.accumulating:
                continue
            visits.write(json.dumps({"epoch": epoch, "pass": start // n, "idx": pending,
                                     "replicas": replicas, "batch": loader.current_batch_size}) + "\n")
            visits.flush()
            steps += 1
            samples += len(pending)
            pending, start = [], None
        scheduler.step()
        history.per_epoch.append(int(examples.sum(reset=True).get("seen", 0)))
        # The script's own end-of-epoch all-reduce: it must meet every peer here, none inside a step.
        counts = torch.tensor([steps, samples], dtype=torch.float64)
        total, high, low = counts.clone(), counts.clone(), counts.clone()
        dist.all_reduce(total)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if rank == 0:
            with open(out / f"epochs-{tag}.jsonl", "a") as f:
                f.write(json.dumps({"epoch": epoch, "replicas": replicas, "steps_max": high[0].item(),
                                    "steps_min": low[0].item(), "samples": total[1].item()}) + "\n")
    if rank == 0:
        final = {"per_epoch": history.per_epoch, "runs": history.runs, "replicas": replicas,
                 "position": loader.sampler.position}
        (out / f"final-{tag}.json").write_text(json.dumps(final))


if __name__ == "__main__":
    main()
