#!/usr/bin/env python3
"""Overhead of the agent's AdaptiveDataParallel over plain DistributedDataParallel.

Usage:
    benchmarks/agent_overhead.py [--json]                  # CPU: 2 gloo processes on 127.0.0.1
    benchmarks/agent_overhead.py --device cuda [--json]    # one GPU (NCCL, world of one), ResNet-18
    benchmarks/agent_overhead.py --blocks 1 --steps 3 --warmup 1 --json     # smoke run

Both wrappers train identical copies of the same model (same initial weights, same fixed batch per
replica, SGD with momentum) inside the same processes, over the same process group. The agent
computes its gradient statistics on every step (K ≥ 2: per-bucket norms and the extra small
all-reduce; K = 1: the differenced estimator) and keeps a fixed batch (no loader, no autoscaling).
A step is zero_grad, forward, backward (gradient all-reduce included) and the optimiser step.

Timing: after a few untimed warm-up steps of each, ``--blocks`` blocks; in each block both copies
take ``--steps`` timed steps, alternately step by step (``--interleave step``, the default, so that
load from elsewhere on the machine hits both alike) or one run after the other (``block``), the
order alternating from block to block. Reported: each block's median step time per wrapper, the
median of the block medians, ``overhead = median(ADP) / median(DDP) − 1``, and a paired figure
(median over the block of the ratio of each ADP step to its neighbouring DDP step, then the median
over blocks), plus the machine.

On CPU the model is a small CNN on 32×32×3 inputs, 32 examples per replica, sized so that one step
takes ≥ 50 ms on one core (``torch.set_num_threads(1)`` in each process). On CUDA it is a ResNet-18
defined here (torchvision is not a dependency) on 224×224 inputs, 128 examples, in one process;
``--amp`` adds float16 autocast with a GradScaler on both copies.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import pollux.torch as ptorch

# ---------------------------------------------------------------------------------------------
# Models


def small_cnn(num_classes: int = 10) -> nn.Module:
    """About 1.1 M parameters; ≈ 65 ms per step of 32 examples on one core of the dev VM."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, num_classes),
    )


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.down(x))


class ResNet18(nn.Module):
    """The ImageNet ResNet-18 layout (11.7 M parameters): stem, 4 stages of 2 basic blocks, linear head."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = 64
        for i, cout in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"cnn": (small_cnn, (3, 32, 32), 10), "resnet18": (ResNet18, (3, 224, 224), 1000)}


# ---------------------------------------------------------------------------------------------
# The benchmark proper (runs in every process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
        "processor": platform.machine(), "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["loadavg_1min_end"] = os.getloadavg()[0]     # other work on the machine skews CPU timings
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


class Bench:
    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args = args
        self.device = device
        build, shape, classes = MODELS[args.model]
        torch.manual_seed(args.seed)
        base = build().to(device)
        # One fixed batch per replica (seeded by rank), reused by both wrappers.
        rank = dist.get_rank() if dist.is_initialized() else 0
        gen = torch.Generator().manual_seed(args.seed + 1000 * rank)
        self.x = torch.randn(args.batch, *shape, generator=gen).to(device)
        self.y = torch.randint(0, classes, (args.batch,), generator=gen).to(device)
        ddp_model = build().to(device)
        ddp_model.load_state_dict(base.state_dict())
        adp_model = build().to(device)
        adp_model.load_state_dict(base.state_dict())
        self.ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
        self.adp_opt = torch.optim.SGD(adp_model.parameters(), lr=args.lr, momentum=0.9)
        ids = [device.index] if device.type == "cuda" else None
        # --amp: autocast (float16 on CUDA, bfloat16 on CPU) with a GradScaler per copy.
        self.amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.scalers = {w: torch.amp.GradScaler(device.type, enabled=args.amp) for w in ("ddp", "adp")}
        self.ddp = nn.parallel.DistributedDataParallel(ddp_model, device_ids=ids)
        self.adp = ptorch.AdaptiveDataParallel(adp_model, self.adp_opt,
                                               scaler=self.scalers["adp"] if args.amp else None,
                                               device_ids=ids)
        self.ddp.train()
        self.adp.train()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, which: str) -> None:
        model, opt = (self.ddp, self.ddp_opt) if which == "ddp" else (self.adp, self.adp_opt)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.args.amp):
            loss = F.cross_entropy(model(self.x), self.y)
        if self.args.amp:
            scaler = self.scalers[which]
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    def timed_step(self, which: str) -> float:
        start = time.perf_counter()
        self.step(which)
        self.sync()
        return time.perf_counter() - start

    def run_block(self, order: tuple[str, str], steps: int, interleave: str) -> dict[str, list[float]]:
        """``steps`` timed steps of each wrapper: alternating step by step, or one run after the other."""
        times: dict[str, list[float]] = {"ddp": [], "adp": []}
        self.sync()
        dist.barrier()
        if interleave == "step":
            for _ in range(steps):
                for which in order:
                    times[which].append(self.timed_step(which))
        else:
            for which in order:
                for _ in range(steps):
                    times[which].append(self.timed_step(which))
        return times

    def run(self) -> dict[str, Any]:
        a = self.args
        self.run_block(("ddp", "adp"), a.warmup, "block")
        blocks: dict[str, list[float]] = {"ddp": [], "adp": []}
        paired: list[float] = []
        for b in range(a.blocks):
            order = ("ddp", "adp") if b % 2 == 0 else ("adp", "ddp")
            times = self.run_block(order, a.steps, a.interleave)
            for which in ("ddp", "adp"):
                blocks[which].append(statistics.median(times[which]))
            # i-th ADP step over the i-th DDP step (neighbours in time with --interleave step).
            ratios = [t / d for t, d in zip(times["adp"], times["ddp"], strict=True)]
            paired.append(statistics.median(ratios) - 1.0)
        # The copies start equal and see the same data; AdaScale at S = 1 leaves the LR unchanged, so
        # they should stay (numerically almost) equal: a check that both did the same work.
        diff = max(float((p - q).detach().abs().max()) for p, q in zip(self.ddp.module.parameters(),
                                                               self.adp.module.parameters(), strict=True))
        stats = self.adp.grad_stats
        ddp_med = statistics.median(blocks["ddp"])
        adp_med = statistics.median(blocks["adp"])
        return {
            "overhead": adp_med / ddp_med - 1.0,
            "step_time_ddp_s": ddp_med,
            "step_time_adp_s": adp_med,
            "block_medians_ddp_s": blocks["ddp"],
            "block_medians_adp_s": blocks["adp"],
            "block_paired_overhead": paired,
            "overhead_paired": statistics.median(paired),
            "adp_optimizer_steps": self.adp.steps,
            "adp_grad_sqr": stats.sqr,
            "adp_grad_var": stats.var,
            "max_param_diff": diff,
        }


def worker(rank: int, args: argparse.Namespace, port: int, out_path: str) -> None:
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(args.nproc), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(args.nproc),
    })
    for key in [k for k in os.environ if k.startswith("POLLUX_")]:
        del os.environ[key]  # a benchmark: no scheduler, no checkpoints
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    ptorch.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        result = Bench(args, device).run()
        if rank == 0:
            result.update({
                "device": str(device.type), "model": args.model, "replicas": dist.get_world_size(),
                "batch_per_replica": args.batch, "blocks": args.blocks, "steps_per_block": args.steps,
                "interleave": args.interleave,
                "threads": args.threads, "amp": args.amp, "machine": machine_info(device),
            })
            with open(out_path, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model", choices=tuple(MODELS), default=None,
                   help="default: cnn on CPU, resnet18 on CUDA")
    p.add_argument("--nproc", type=int, default=None, help="processes (default: 2 on CPU, 1 on CUDA)")
    p.add_argument("--batch", type=int, default=None, help="examples per replica (default 32 CPU, 128 CUDA)")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--steps", type=int, default=50, help="steps per block")
    p.add_argument("--interleave", choices=("step", "block"), default="step",
                   help="within a block, alternate the wrappers every step (default) or run one block of "
                        "steps of each")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per wrapper before the first block")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each process")
    p.add_argument("--amp", action="store_true", help="mixed precision with a GradScaler (both copies)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.model is None:
        args.model = "resnet18" if args.device == "cuda" else "cnn"
    if args.nproc is None:
        args.nproc = 1 if args.device == "cuda" else 2
    if args.batch is None:
        args.batch = 128 if args.device == "cuda" else 32
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        mp.start_processes(worker, args=(args, free_port(), out_path), nprocs=args.nproc,
                           start_method="spawn")
        with open(out_path) as f:
            result = json.load(f)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"device {result['device']}  model {result['model']}  replicas {result['replicas']}  "
              f"batch/replica {result['batch_per_replica']}")
        for i, (d, a) in enumerate(zip(result["block_medians_ddp_s"], result["block_medians_adp_s"],
                                       strict=True)):
            print(f"block {i}: DDP {d * 1e3:8.2f} ms   ADP {a * 1e3:8.2f} ms")
        per_block = ", ".join(f"{x:+.2%}" for x in result["block_paired_overhead"])
        print(f"paired overhead per block: {per_block}; median {result['overhead_paired']:+.3%}")
        print(f"median step: DDP {result['step_time_ddp_s'] * 1e3:.2f} ms, "
              f"ADP {result['step_time_adp_s'] * 1e3:.2f} ms; overhead {result['overhead']:+.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
