#!/usr/bin/env python3
"""One gloo replica of the LB-BSP training benchmarks (``benchmarks/lbbsp.py``; started by it, by PID).

Trains the digits CNN of ``examples/digits/train.py`` with a FIXED global batch (no
``autoscale_batch_size``, so M never changes) through ``AdaptiveDataParallel`` and
``AdaptiveDataLoader``, in blocks of epochs, each block with balancing on or off
(``loader.balance_batches``) and optionally one replica slowed down. Usage::

    lbbsp_worker.py CONFIG_JSON OUT_JSON     (OUT_JSON with "RANK" replaced by the rank)

CONFIG: ``{"batch_size": M, "width": w, "seed": s, "cores": [core per rank] | null, "warmup_epochs": n,
"blocks": [{"balance": "cpu" | "off", "epochs": n, "slow": rank | null,
"switch": [iteration, rank] | null}]}``. ``switch`` moves the slowdown to another rank at that
iteration of the block (counted from the block's first step).

The injected slowdown makes the slow replica a device at half speed: it computes each batch it holds
twice over (the batch concatenated with itself, so the loss, the mean over the doubled batch, has the
same gradient), and so takes as long for x samples as the other replica takes for 2x. The balance
point is then 2 : 1 for any shape of compute time against batch size (per-step costs that do not grow
with the batch, per-sample costs that grow with it) and follows the core's own speed live. (Until
2026-11-28 the slow replica busy-waited for a per-example time calibrated before training, as a slope
between batches of M/4 and 3M/4; with per-sample time growing with the batch that put the balance
point at 1.8-1.85 : 1 on this VM, not 2 : 1.) The calibration is kept as a reading of the core's
speed for the report (``compute_s_per_example``).

The model is the example's ``DigitsCNN`` with its convolution channels multiplied by ``width`` (its
``--width``; 1 is the example's default network): with one thread the example's network computes a local batch
of 64 in about 2 ms, less than the agent's and DDP's fixed per-step work, so a balancer could not
show the effect it has on real models, whose compute dominates the step.

Each replica writes per block: the wall time of every epoch and of every step, the size of its local
batch at every step (the parent pairs them up into shares) and, per step, the agent's latest balancer
report from ``to_scalars()`` (the shares it chose and the compute times per rank it measured, or null).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import pollux.torch as ptorch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits" / "train.py"


def load_example() -> Any:
    """The digits example as a module (its CNN and data split), without running it."""
    spec = importlib.util.spec_from_file_location("digits_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed_pass(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, reps: int = 30) -> float:
    """Median seconds of a forward + backward pass of ``net`` on the batch ``x`` (5 passes warm up)."""
    times = []
    for i in range(reps + 5):
        net.zero_grad()
        t0 = time.perf_counter()
        F.cross_entropy(net(x), y).backward()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def calibrate(net: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor, m: int) -> float:
    """Forward + backward seconds per example of a local copy of ``net``: the slope between batches of
    m/4 and 3m/4 (around the shares the balancer will choose), so that the per-step costs that do not
    grow with the batch (kernel launches, the optimiser, the agent) are left out. Reported only, as a
    reading of this core's speed (``compute_s_per_example``); the slowdown does not use it."""
    local = copy.deepcopy(net)
    small, large = max(m // 4, 1), max(3 * m // 4, 2)
    t_small = timed_pass(local, xs[:small], ys[:small])
    t_large = timed_pass(local, xs[:large], ys[:large])
    return max(t_large - t_small, 0.0) / (large - small)


def balance_report(scalars: dict[str, float]) -> list[list[float]] | None:
    """The agent's latest balancer report from ``to_scalars()``: [shares, compute times] per rank."""
    if "balance_share0" not in scalars:
        return None
    n = sum(1 for k in scalars if k.startswith("balance_share"))
    return [[scalars[f"balance_share{r}"] for r in range(n)],
            [scalars[f"balance_step_time{r}"] for r in range(n)]]


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    out = sys.argv[2]
    rank = int(os.environ["POLLUX_RANK"])
    cores = config.get("cores")
    if cores:
        os.sched_setaffinity(0, {int(cores[rank])})      # before any thread is started
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("POLLUX_REFIT_INTERVAL_S", "3600")   # no throughput refits mid-measurement
    ptorch.init_process_group("gloo")
    example = load_example()
    torch.manual_seed(config.get("seed", 0))
    train_set, _, _ = example.load_data()
    width = int(config.get("width", 1))
    net = example.DigitsCNN(width)
    m = int(config["batch_size"])
    xs, ys = train_set.tensors
    per_example = calibrate(net, xs, ys, m)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.02, momentum=0.9)
    model = ptorch.AdaptiveDataParallel(net, optimizer)
    loader = ptorch.AdaptiveDataLoader(train_set, batch_size=m, shuffle=True, seed=config.get("seed", 0))

    def epoch(slow: bool, sizes: list[int] | None = None, switch: tuple[int, int] | None = None,
              step0: int = 0, reports: list[Any] | None = None, walls: list[float] | None = None
              ) -> float:
        t_start = t_step = time.perf_counter()
        step = step0
        for x, y in loader:
            if switch is not None and step >= switch[0]:
                slow = rank == switch[1]
            optimizer.zero_grad()
            if slow:            # half speed: the batch twice over, the same mean gradient (docstring)
                x, y = torch.cat([x, x]), torch.cat([y, y])
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if sizes is not None:
                sizes.append(len(y) // 2 if slow else len(y))
            if reports is not None:
                reports.append(balance_report(model.to_scalars()))
            if walls is not None:
                now = time.perf_counter()
                walls.append(now - t_step)
                t_step = now
            step += 1
        return time.perf_counter() - t_start

    loader.balance_batches("off")
    for _ in range(int(config.get("warmup_epochs", 1))):
        epoch(False)
    blocks = []
    for block in config["blocks"]:
        loader.balance_batches(block["balance"])
        sizes: list[int] = []
        reports: list[Any] = []
        times: list[float] = []
        walls: list[float] = []
        slow = block.get("slow") == rank
        switch = tuple(block["switch"]) if block.get("switch") else None
        for _ in range(int(block["epochs"])):
            times.append(epoch(slow, sizes, switch, len(sizes), reports, walls))
        blocks.append({"balance": block["balance"], "epoch_times": times, "sizes": sizes,
                       "reports": reports, "step_seconds": walls})
    result = {"rank": rank, "compute_s_per_example": per_example, "blocks": blocks,
              "affinity": sorted(os.sched_getaffinity(0))}
    Path(out.replace("RANK", str(rank))).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
