#!/usr/bin/env python3
"""The `vs_ddp` baseline of issue 14: the Litz MLR model trained with PyTorch DDP over gloo.

Usage:
    benchmarks/litz_ddp.py [--json] [--n 60000 --d 64 --classes 10 --batch 128 --steps 300 ...]

`benchmarks/litz.py` imports `run_ddp(DdpConfig(...))` and sets the same data and batch as its Litz
MLR run, so the examples/s ratio compares runtimes, not models:

- the same data: `pollux.datasets.gaussian_mixture(n, d, classes, seed, separation)`, split
  over the processes like Litz's executors (`partition`: strided rows);
- the same model and step: multinomial logistic regression (`torch.nn.Linear(d, classes)`, weights
  and bias starting at zero, like the Litz table) with mean cross-entropy and plain SGD; DDP averages
  the processes' gradients, which is what `W -= lr * grad / num_executors` summed over executors is;
- the same mini-batches: process r draws `batch_per_process` rows of its partition per step from a
  seeded permutation per epoch, as `pollux.litz.apps.mlr.batch_rows` does for executor r;
- float64 by default (the Litz tables' dtype), one torch thread per process
  (`torch.set_num_threads(1)`), `world_size` processes (default 2) started with
  `multiprocessing` (spawn) on loopback (gloo on ``lo``, rendezvous through a file store, so no port
  is raced for); optionally pinned one per core.

Throughput is measured after `warmup_steps` steps, between two barriers, on rank 0's clock:
examples/s = steps × batch_per_process × world_size / seconds; beside it the median over 5 equal
chunks of the measured steps, which a burst of load from elsewhere on a shared machine moves less.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DdpConfig:
    """One DDP baseline run (defaults: the `vs_ddp` configuration reported in docs/benchmarks.md)."""

    n: int = 60000
    d: int = 64
    classes: int = 10
    separation: float = 1.5
    seed: int = 0
    batch_per_process: int = 128
    steps: int = 1000
    warmup_steps: int = 50
    lr: float = 0.5
    world_size: int = 2
    dtype: str = "float64"
    pin_cores: bool = False
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("n", "d", "batch_per_process", "steps", "world_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DdpConfig.{name}: {getattr(self, name)} must be >= 1")
        if self.classes < 2:
            raise ValueError(f"DdpConfig.classes: {self.classes} must be >= 2")
        if self.warmup_steps < 0:
            raise ValueError(f"DdpConfig.warmup_steps: {self.warmup_steps} must be >= 0")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"DdpConfig.dtype: {self.dtype!r} must be 'float32' or 'float64'")
        if self.n // self.world_size < self.batch_per_process:
            raise ValueError(
                f"DdpConfig.batch_per_process: {self.batch_per_process} exceeds a process's "
                f"{self.n // self.world_size} rows"
            )


class _Batches:
    """Mini-batch rows of one process's partition: a seeded permutation per epoch, cut into
    floor(rows / batch) batches (the epoch's tail dropped) — `mlr.batch_rows` with the permutation
    kept for the epoch instead of redrawn every step."""

    def __init__(self, num_rows: int, batch: int, seed: int, rank: int) -> None:
        self.num_rows, self.batch, self.seed, self.rank = num_rows, batch, seed, rank
        self.per_epoch = max(1, num_rows // batch)
        self._epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    def rows(self, step: int) -> np.ndarray:
        epoch, j = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = np.random.default_rng([self.seed, 1, self.rank, epoch]).permutation(self.num_rows)
        return self._perm[j * self.batch : (j + 1) * self.batch]


def _worker(rank: int, cfg: DdpConfig, rendezvous: str, results: Any) -> None:
    """One DDP process: train, then send (rank, pid, result or error) to the parent."""
    import datetime

    phases = {"entered": time.time()}
    try:
        if cfg.pin_cores and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[rank % len(cores)]})
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel

        from pollux.datasets import gaussian_mixture, partition

        phases["imported"] = time.time()
        torch.set_num_threads(1)
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=rendezvous,
            rank=rank,
            world_size=cfg.world_size,
            timeout=datetime.timedelta(seconds=cfg.timeout_s),
        )
        phases["group_ready"] = time.time()
        dtype = getattr(torch, cfg.dtype)
        data = gaussian_mixture(cfg.n, cfg.d, cfg.classes, cfg.seed, cfg.separation)
        mine = partition(cfg.n, cfg.world_size, rank)
        X = torch.from_numpy(np.ascontiguousarray(data.X[mine])).to(dtype)
        y = torch.from_numpy(np.ascontiguousarray(data.y[mine]))
        model = torch.nn.Linear(cfg.d, cfg.classes, dtype=dtype)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
        batches = _Batches(len(mine), cfg.batch_per_process, cfg.seed, rank)
        phases["data_ready"] = time.time()
        losses: list[float] = []
        stamps: list[float] = []  # after each measured step: per-chunk rates resist a noisy machine
        t0 = time.perf_counter()
        for step in range(cfg.warmup_steps + cfg.steps):
            if step == cfg.warmup_steps:
                dist.barrier()
                t0 = time.perf_counter()
            idx = torch.from_numpy(batches.rows(step))
            loss = F.cross_entropy(ddp(X[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if step >= cfg.warmup_steps:
                stamps.append(time.perf_counter() - t0)
        dist.barrier()
        seconds = time.perf_counter() - t0
        out: dict[str, Any] = {"seconds": seconds, "losses": losses, "stamps": stamps}
        if rank == 0:
            with torch.no_grad():
                Xa = torch.from_numpy(data.X).to(dtype)
                ya = torch.from_numpy(data.y)
                out["objective_end"] = float(F.cross_entropy(model(Xa), ya))
        dist.destroy_process_group()
        phases["done"] = time.time()
        out["phases"] = phases
        results.put((rank, os.getpid(), out, None))
    except BaseException as exc:  # the parent reports it with the rank
        results.put((rank, os.getpid(), None, f"{type(exc).__name__}: {exc}"))
        raise


def run_ddp(cfg: DdpConfig | None = None) -> dict[str, Any]:
    """Train `cfg` with DDP on `cfg.world_size` fresh processes; all have exited when this returns."""
    cfg = cfg or DdpConfig()
    ctx = multiprocessing.get_context("spawn")  # stdlib: the parent never needs torch
    results = ctx.Queue()
    # Rendezvous through a file store: no port to pick, so no race with other programs for a free
    # port; gloo then opens its own loopback sockets (GLOO_SOCKET_IFNAME=lo, 127.0.0.1).
    rdv_dir = tempfile.mkdtemp(prefix="litz-ddp-")
    rendezvous = f"file://{os.path.join(rdv_dir, 'store')}"
    child_env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        child_env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo would otherwise bind the hostname's address
    saved = {k: os.environ.get(k) for k in child_env}
    os.environ.update(child_env)  # children inherit these
    procs = []
    t_start = time.perf_counter()
    t_wall = time.time()
    try:
        for rank in range(cfg.world_size):
            p = ctx.Process(target=_worker, args=(rank, cfg, rendezvous, results), daemon=True)
            p.start()
            procs.append(p)
        got: dict[int, tuple[int, dict[str, Any]]] = {}
        errors: list[str] = []
        deadline = time.monotonic() + cfg.timeout_s
        while len(got) + len(errors) < cfg.world_size:
            try:
                rank, pid, out, err = results.get(timeout=1.0)
            except queue.Empty as exc:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    codes = {p.pid: p.exitcode for p in procs}
                    raise RuntimeError(
                        f"DDP baseline: processes failed or timed out (exit codes {codes})"
                    ) from exc
                continue
            if err is not None:
                errors.append(f"rank {rank}: {err}")
            else:
                got[rank] = (pid, out)
        if errors:
            raise RuntimeError("DDP baseline failed: " + "; ".join(errors))
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        shutil.rmtree(rdv_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = max(out["seconds"] for _, out in got.values())
    examples = cfg.steps * cfg.batch_per_process * cfg.world_size
    losses0 = got[0][1]["losses"]
    chunks = np.array_split(np.diff(np.concatenate([[0.0], got[0][1]["stamps"]])), min(5, cfg.steps))
    chunk_rates = [len(c) * cfg.batch_per_process * cfg.world_size / float(c.sum()) for c in chunks]
    return {
        "what": "MLR (nn.Linear + cross-entropy, SGD) under torch DistributedDataParallel, gloo, 127.0.0.1",
        "config": asdict(cfg),
        "examples_per_s": examples / seconds,
        "examples_per_s_median_of_5_chunks": float(np.median(chunk_rates)),
        "step_ms": 1000.0 * seconds / cfg.steps,
        "measured_s": seconds,
        "total_s": time.perf_counter() - t_start,
        "phases_s": {  # rank 0, from the parent's start: where the wall time of a run goes
            k: round(v - t_wall, 3) for k, v in got[0][1]["phases"].items()
        },
        "objective_start": float(np.log(cfg.classes)),  # zero weights: uniform softmax
        "objective_end": got[0][1]["objective_end"],
        "loss_first": losses0[0],
        "loss_last_mean10": float(np.mean(losses0[-10:])),
        "losses_rank0": losses0,
        "pids": [pid for pid, _ in got.values()],
        "exitcodes": [p.exitcode for p in procs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = DdpConfig()
    parser.add_argument("--n", type=int, default=d.n)
    parser.add_argument("--d", type=int, default=d.d)
    parser.add_argument("--classes", type=int, default=d.classes)
    parser.add_argument(
        "--batch", type=int, default=d.batch_per_process, help="examples per process per step"
    )
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--warmup", type=int, default=d.warmup_steps)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--world-size", type=int, default=d.world_size)
    parser.add_argument("--dtype", default=d.dtype, choices=["float32", "float64"])
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--pin", action="store_true", help="pin process r to core r")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    cfg = DdpConfig(
        n=args.n, d=args.d, classes=args.classes, batch_per_process=args.batch, steps=args.steps,
        warmup_steps=args.warmup, lr=args.lr, world_size=args.world_size, dtype=args.dtype,
        seed=args.seed, pin_cores=args.pin,
    )  # fmt: skip
    res = run_ddp(cfg)
    if args.json:
        res = {k: v for k, v in res.items() if k != "losses_rank0"}
        print(json.dumps({"vs_ddp_baseline": res}, indent=2))
    else:
        print(
            f"DDP MLR, {cfg.world_size} processes, batch {cfg.batch_per_process}/process: "
            f"{res['examples_per_s']:.0f} examples/s ({res['step_ms']:.2f} ms/step), "
            f"objective {res['objective_start']:.4f} -> {res['objective_end']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
