#!/usr/bin/env python3
"""Train a small CNN on scikit-learn's digits with the Pollux agent (adaptive batch size).

Runs alone, under torchrun, or under the Pollux scheduler (which sets the POLLUX_* variables)::

    .venv/bin/python examples/digits/train.py
    .venv/bin/torchrun --nproc_per_node=2 examples/digits/train.py
    POLLUX_CHECKPOINT_DIR=/tmp/digits-ckpt .venv/bin/python examples/digits/train.py
    .venv/bin/python examples/digits/train.py --tensorboard-dir runs/digits    # tensorboard --logdir runs

The data are the 1797 8×8 images bundled with scikit-learn (no download), split once into a fixed
training set (75 %) and test set (25 %). The batch size starts at ``--batch-size`` (M0) and Pollux
grows it up to ``--max-batch-size`` as the gradient noise grows; every change is logged on the
``pollux.torch`` logger (stderr) with its predicted goodput gain. The training loss and accuracy of
each epoch are summed over all replicas with ``pollux.torch.Accumulator`` (so they cover the whole
global batch, not rank 0's share) and survive a restart mid-epoch. Rank 0 ends by printing one JSON
line on stdout: test accuracy, the distinct global batch sizes used in order, epochs, progress,
replicas, the last epoch's training loss and accuracy, the examples trained on, and more.

As a trial of a hyper-parameter study (``pollux hpo run``, docs/hpo.md, with ``examples/digits/space.yaml``)
the study passes ``--lr``, ``--momentum``, ``--weight-decay`` and ``--width`` as flags, and each epoch's test
accuracy is reported with ``pollux.hpo.report`` (the last one is the trial's objective).

Unequal batches (LB-BSP, docs/agent.md): ``--balance auto`` sizes each replica's share of the batch so
that all finish their compute together; the shares are logged (``batch shares ... -> ...`` and
``balance {JSON}`` lines) and printed at the end. To see it work, slow one replica down:
``--slow-rank 1 --slow-factor 2`` makes rank 1 sleep, between forward and backward, (F−1)× its own
compute time for the batch it holds, estimated as 3× its forward pass of that batch (a backward pass
costs about twice a forward one; the backward's own time would include the wait for the all-reduce),
so that it runs at about 1/F speed. The delay busy-waits, as a slower device would be busy: a sleep of
a millisecond can oversleep by several on a loaded machine. ``--width 4`` (4× the convolution
channels) makes the compute, which the delay doubles, dominate the step; with the default network the
per-step work of DDP and the agent does, and balancing has little to win::

    .venv/bin/torchrun --nproc_per_node=2 examples/digits/train.py --width 4 --slow-rank 1 --slow-factor 2 \
        --balance off
    .venv/bin/torchrun --nproc_per_node=2 examples/digits/train.py --width 4 --slow-rank 1 --slow-factor 2 \
        --balance auto
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

import pollux.hpo
import pollux.torch as ptorch
from pollux.contract import LOG_FORMAT

#: The train/test split is fixed (independent of --seed) so that every run is scored on the same images.
SPLIT_SEED = 0
TEST_FRACTION = 0.25
#: The agent's refit interval (seconds), read by init_process_group.
REFIT_ENV = "POLLUX_REFIT_INTERVAL_S"

log = logging.getLogger("digits")


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions, one 2×2 max-pool, two linear layers (≈ 38 k parameters at ``width`` 1).

    ``width`` multiplies the convolution channels (``--width``): with one thread the default network
    computes a local batch of 64 in about 2 ms, less than the per-step work of DDP and the agent, so
    a slowed replica (``--slow-rank``) barely slows the step and balancing has little to win; at
    width 4 the compute dominates the step, as on real models.
    """

    def __init__(self, width: int = 1) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"width: must be >= 1, got {width}")
        self.conv1 = nn.Conv2d(1, 16 * width, 3, padding=1)
        self.conv2 = nn.Conv2d(16 * width, 32 * width, 3, padding=1)
        self.fc1 = nn.Linear(32 * width * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def load_data() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]    # N×1×8×8 in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=digits.target)
    mean, std = float(x_train.mean()), float(x_train.std())
    def norm(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy((a - mean) / std)

    train = TensorDataset(norm(x_train), torch.from_numpy(y_train).long())
    return train, norm(x_test), torch.from_numpy(y_test).long()


class History:
    """What this script reports about the whole run; checkpointed with the job, so it survives restarts."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []      # distinct global batch sizes, in the order used
        self.seconds = 0.0                    # training time of earlier runs of this job
        self.runs = 1
        self.train_loss = math.nan            # the last finished epoch's, over all replicas
        self.train_accuracy = math.nan
        self.train_examples = 0               # examples trained on in finished epochs, by all replicas

    def note_batch_size(self, size: int) -> None:
        if not self.batch_sizes or self.batch_sizes[-1] != size:
            self.batch_sizes.append(int(size))

    def state_dict(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "seconds": self.seconds, "runs": self.runs,
                "train_loss": self.train_loss, "train_accuracy": self.train_accuracy,
                "train_examples": self.train_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch_sizes = [int(b) for b in state["batch_sizes"]]
        self.seconds = float(state["seconds"])
        self.runs = int(state["runs"]) + 1
        self.train_loss = float(state.get("train_loss", math.nan))
        self.train_accuracy = float(state.get("train_accuracy", math.nan))
        self.train_examples = int(state.get("train_examples", 0))

    def note_epoch(self, totals: dict[str, float]) -> None:
        """Keep an epoch's training metrics from the totals of the epoch's ``Accumulator``."""
        seen = totals.get("seen", 0)
        self.train_examples += seen
        if seen:
            self.train_loss = totals["loss_sum"] / seen
            self.train_accuracy = totals["correct"] / seen


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@torch.no_grad()
def accuracy(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    module.eval()
    pred = module(x).argmax(dim=1)
    module.train()
    return float((pred == y).float().mean())


def type_slowdown(spec: str, gpu_type: str | None, rank: int) -> float:
    """How much slower than the fastest listed type this replica should run (>= 1), from --type-speed.

    The emulation is said out loud: a CPU has no GPU types, so the speed differences a type-aware
    scheduler reacts to are injected here (an untyped node, or a type not listed, runs at full speed).
    """
    speeds: dict[str, float] = {}
    for item in spec.split(","):
        name, sep, value = item.partition("=")
        try:
            speed = float(value)
        except ValueError:
            speed = float("nan")
        if not sep or not name.strip() or not math.isfinite(speed) or speed <= 0:
            raise SystemExit(f"--type-speed: expected TYPE=SPEED with SPEED > 0, got {item!r}")
        speeds[name.strip()] = speed
    factor = max(speeds.values()) / speeds[gpu_type] if gpu_type in speeds else 1.0
    log.info("emulated GPU type on CPU (--type-speed): replica %d on %s runs at 1/%.2f of the fastest type",
             rank, gpu_type or "an untyped node", factor)
    return factor


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=30, help="epochs of training progress (default 30)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    p.add_argument("--batch-size", type=int, default=16, help="initial global batch size M0 (default 16)")
    p.add_argument("--max-batch-size", type=int, default=512, help="largest global batch (default 512)")
    p.add_argument("--local-bsz-bounds", type=int, nargs=2, default=(8, 256), metavar=("LO", "HI"),
                   help="bounds of the per-replica batch (default 8 256)")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at M0 (default 0.02)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="SGD weight decay (default 0)")
    p.add_argument("--refit-interval", type=float, default=None,
                   help="seconds between throughput refits and batch-size decisions (default: "
                        "$POLLUX_REFIT_INTERVAL_S if set, else 5; the agent's own default, 30 s, suits jobs "
                        "of hours, not this example of seconds)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--fixed", action="store_true",
                   help="keep the batch at --batch-size (a fixed-batch baseline: no autoscale_batch_size)")
    p.add_argument("--balance", choices=("auto", "gpu", "cpu", "off"), default=None,
                   help="LB-BSP batch balancing across replicas (default: $POLLUX_BALANCE, else off)")
    p.add_argument("--slow-rank", type=int, default=None, metavar="R",
                   help="slow replica R down by --slow-factor (an injected delay, to demonstrate --balance)")
    p.add_argument("--slow-factor", type=float, default=2.0, metavar="F",
                   help="replica --slow-rank runs at 1/F speed (default 2)")
    p.add_argument("--type-speed", default=None, metavar="T=S,...",
                   help="emulate GPU types on CPU: a replica on a node of type T (POLLUX_GPU_TYPE) runs at "
                        "S / max(S) speed, e.g. 'a100=3,t4=1' (injected delay as --slow-factor; logged)")
    p.add_argument("--width", type=int, default=1, metavar="W",
                   help="multiply the network's convolution channels by W (default 1; 4 makes compute "
                        "dominate the step, for the --slow-rank demonstration of --balance)")
    p.add_argument("--tensorboard-dir", default=None, metavar="DIR",
                   help="write the agent's scalars (progress, gain, PGNS, batch size, step times, ...) as "
                        "TensorBoard event files in DIR (default: $POLLUX_TENSORBOARD_DIR if set, else none)")
    p.add_argument("--json-epochs", action="store_true",
                   help='also print one JSON line per epoch on stdout ({"event": "epoch", ...}, rank 0)')
    args = p.parse_args(argv)
    if args.width < 1:
        p.error(f"--width: must be >= 1, got {args.width}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    if args.refit_interval is not None:
        os.environ[REFIT_ENV] = str(args.refit_interval)
    else:
        os.environ.setdefault(REFIT_ENV, "5")
    # Alone, under torchrun, or as the scheduler's replicas (which set POLLUX_TENSORBOARD_DIR themselves).
    ptorch.init_process_group("gloo", tensorboard_dir=args.tensorboard_dir)
    rank, replicas = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)          # the same initial weights on every replica
    train_set, x_test, y_test = load_data()

    net = DigitsCNN(args.width)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    model = ptorch.AdaptiveDataParallel(net, optimizer)     # restores model and optimiser if resuming
    loader = ptorch.AdaptiveDataLoader(train_set, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    if not args.fixed:
        loader.autoscale_batch_size(args.max_batch_size, local_bsz_bounds=tuple(args.local_bsz_bounds))
    if args.balance is not None:
        loader.balance_batches(args.balance)
    slow_factor = args.slow_factor if args.slow_rank == rank else 1.0
    if args.type_speed:
        slow_factor *= type_slowdown(args.type_speed, os.environ.get("POLLUX_GPU_TYPE"), rank)
    slow = slow_factor > 1.0
    history = History()
    if ptorch.register_state("digits_history", history) and rank == 0:
        log.info("resumed at epoch %d (run %d of this job), batch sizes so far %s",
                 ptorch.current_epoch(), history.runs, history.batch_sizes)
    earlier = history.seconds
    # This epoch's training sums, added by each replica for its share of every batch and summed over
    # the replicas when read; checkpointed, so an epoch interrupted by a restart keeps its first part.
    metrics = ptorch.Accumulator("digits_train")

    acc = float("nan")
    for epoch in ptorch.remaining_epochs_until(args.epochs):
        for x, y in loader:
            history.note_batch_size(loader.current_batch_size)
            optimizer.zero_grad()
            t0 = time.perf_counter()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            if slow:                      # (F − 1)× this replica's compute time (≈ 3× its forward)
                now = time.perf_counter()
                end = now + (slow_factor - 1.0) * 3.0 * (now - t0)
                while time.perf_counter() < end:
                    pass
            loss.backward()
            optimizer.step()
            metrics["loss_sum"] += loss.detach() * len(y)     # local adds: no communication
            metrics["correct"] += (logits.argmax(dim=1) == y).sum()
            metrics["seen"] += len(y)
        # Every replica reads the totals (a collective) and starts the next epoch's sums here, at the
        # end of the body: a reset at its start would drop the part of an epoch restored after a restart.
        history.note_epoch(metrics.sum(reset=True))
        history.seconds = earlier + time.perf_counter() - start
        acc = accuracy(model.module, x_test, y_test)
        if rank == 0:
            log.info("epoch %d: train loss %.4f, train accuracy %.4f, test accuracy %.4f, batch size %d, "
                     "progress %.1f, gain %.2f, %.1f s", epoch, history.train_loss,
                     history.train_accuracy, acc, loader.current_batch_size, model.progress,
                     model.gain, history.seconds)
            # As a trial of `pollux hpo run`, the study's pruner sees every epoch's accuracy and the last
            # one is the trial's objective; alone, this warns once and does nothing.
            pollux.hpo.report(acc, epoch)
            if args.json_epochs:
                print(json.dumps({"event": "epoch", "epoch": epoch, "val_acc": acc, "time": time.time(),
                                  "batch_size": loader.current_batch_size, "replicas": replicas,
                                  "run": history.runs, "progress": model.progress}), flush=True)
    if math.isnan(acc):                   # nothing left to train (resumed after the last epoch)
        acc = accuracy(model.module, x_test, y_test)

    if rank == 0:
        print(json.dumps({
            "test_accuracy": acc,
            "batch_sizes": history.batch_sizes,
            "epochs": ptorch.current_epoch(),
            "progress": model.progress,
            "replicas": replicas,
            "steps": model.steps,
            "final_batch_size": loader.current_batch_size,
            "pgns": finite_or_none(model.pgns),
            "runs": history.runs,
            "train_loss": finite_or_none(history.train_loss),
            "train_accuracy": finite_or_none(history.train_accuracy),
            "train_examples": history.train_examples,
            # The global sample index: positions of the data stream drawn over the whole job. Each is
            # trained once except the fewer than K skipped at a rescale or a pass end (none on one
            # replica); above epochs x N when the batch grew (an epoch is measured in progress).
            "stream_position": loader.sampler.position,
            "seconds": time.perf_counter() - start + earlier,
            "shares": [int(v) for k, v in sorted(model.to_scalars().items())
                       if k.startswith("balance_share")],
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
