#!/usr/bin/env python3
"""LB-BSP (unequal per-replica batches, issue 12): benchmarks of the balancers and their predictors.

Usage:
    benchmarks/lbbsp.py [--json]                       # every section
    benchmarks/lbbsp.py --only predictor_rmse --json   # one section

Sections (each a function ``section_NAME(args) -> dict`` registered in ``SECTIONS``):

* ``predictor_rmse``: the speed predictors of the CPU algorithm on a replayed, seeded speed trace.
  A replica's available CPU share (the load feature) changes at seeded moments, mid-iteration, and
  drives its speed; on top come transient bursts and dips that the load does not show (a page-cache
  flush, a short-lived neighbour) and a little measurement noise. Each predictor sees the speed of
  every iteration and the load read at its end, and predicts the next iteration's speed. Reported:
  the RMSE (samples/s) of the NARX predictor, the moving average (EMA, α = 0.2) and the last value,
  averaged over ``--traces`` seeded traces, per trace too, and as a floor the RMSE of an oracle that
  knows the true share and the speed model (only noise and spikes left). Criterion: NARX lowest
  (paper, Table 3: NARX 4.78 < EMA 7.85 < last value 11.85).

Training sections: 2 gloo replicas on 127.0.0.1 (``benchmarks/lbbsp_worker.py``, started and stopped
by PID), one thread each, each pinned to its own core (``os.sched_setaffinity``), training the
digits CNN of ``examples/digits`` (channels × ``--width``, default 4: see the worker's docstring) with
the global batch FIXED at ``--train-batch`` (no ``autoscale_batch_size``), balancing turned on and off
with ``loader.balance_batches("cpu")`` / ``("off")`` in alternating blocks of epochs inside ONE
group of replicas (so each ratio is measured in one run, and slow drifts of a noisy machine cancel).
"cpu" is what "auto" picks without CUDA. Every block with balancing on starts from equal shares.
Ratios are medians over (on, off) pairs of the blocks' summed epoch times (rank 0's wall clock);
the training sections skip each block's first epoch (``ratio``; ``ratio_whole_blocks`` counts it).

* ``injected_half_speed``: rank 1 runs at half speed: it computes each batch it holds twice over
  (the batch concatenated with itself: the same mean gradient, the time of twice the samples, so the
  balance point is 2 : 1 whatever the shape of compute time against batch size). Reported: epoch
  time balanced / equal (target ≤ 0.75, ideal 2/3); iterations from a block's start until the shares
  are within ±5 % of 2 : 1 (fast : slow, i.e. a ratio in [1.9, 2.1]; target ≤ 10), per on-block and
  their median (a block that never got there counts as infinite), and the shares of the first block's
  first ~30 iterations; in ``--switch-blocks`` last blocks (default 3) whose slowdown moves to the
  other rank at iteration ``--switch-at``, the iterations until 1 : 2 (or 2 : 1) ± 5 %, per block and
  their median (≤ 10). Medians, because on a 2-core VM one block's first window can catch a hiccup
  (one core 25 % slower for a few steps) that sets that block's landing point.
* ``real_contention``: a python busy loop (started and stopped by PID) pinned to rank 1's core, so
  the kernel gives rank 1 about half of it; ratio balanced / equal (target ≤ 0.8).
* ``overhead_equal_speed``: no slowdown; balancing on / off in alternating blocks long enough for
  the NARX predictor to fit and refit; median ratio of whole blocks (target ≤ 1.01). Reported beside
  it: the share changes per block, the fraction of steps run on unequal shares, and the balancing
  work per step measured in-process (``bookkeeping_us_per_step``, free of the machine's noise).

``--log-dir DIR`` keeps the replicas' logs (the agent's ``batch shares`` lines) and their raw
records (``NAME-results.json``: per block and step the local batch, the wall seconds of the step and
the agent's balancer report).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pollux import contract as C

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lbbsp_predictors import section_predictor_rmse

# --------------------------------------------------------------------------------------------
# Training scenarios: 2 gloo replicas on 127.0.0.1 (benchmarks/lbbsp_worker.py)
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "lbbsp_worker.py"
#: ±5 % of the ideal 2 : 1 ratio of the fast replica's share to the slow one's.
BAND = 0.05
#: Where the replicas' logs (the agent's "batch shares" lines) are kept (``--log-dir``; None: dropped).
LOG_DIR: Path | None = None


def log(message: str) -> None:
    print(f"[lbbsp {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen) -> None:
    """Stop one process we started, by its PID."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def run_replicas(config: dict[str, Any], timeout: float = 900.0, replicas: int = 2) -> list[dict[str, Any]]:
    """Start ``replicas`` worker processes with the POLLUX_* contract, wait, return their results."""
    with tempfile.TemporaryDirectory(prefix="lbbsp-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(config))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
        env.update({"PYTHONPATH": str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""),
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    C.ENV_JOB_ID: "lbbsp-bench", C.ENV_NUM_REPLICAS: str(replicas), C.ENV_NUM_NODES: "1",
                    C.ENV_NODE_RANK: "0", C.ENV_MASTER_ADDR: "127.0.0.1", C.ENV_MASTER_PORT: str(port)})
        procs: list[subprocess.Popen] = []
        logs = [Path(tmp) / f"rank{r}.log" for r in range(replicas)]
        try:
            for r in range(replicas):
                with open(logs[r], "wb") as out:
                    procs.append(subprocess.Popen(
                        [sys.executable, str(WORKER), str(cfg_path), str(Path(tmp) / "out-RANK.json")],
                        env={**env, C.ENV_RANK: str(r)}, stdout=out, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"replicas did not finish in {timeout} s:\n"
                               + "\n".join(f.read_text(errors="replace")[-3000:] for f in logs)) from None
        finally:
            for p in procs:
                stop(p)
            if LOG_DIR is not None:
                LOG_DIR.mkdir(parents=True, exist_ok=True)
                for r, f in enumerate(logs):
                    if f.exists():
                        (LOG_DIR / f"{config.get('name', 'run')}-rank{r}.log").write_bytes(f.read_bytes())
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError("a replica failed:\n"
                               + "\n".join(f.read_text(errors="replace")[-3000:] for f in logs))
        results = [json.loads((Path(tmp) / f"out-{r}.json").read_text()) for r in range(replicas)]
        if LOG_DIR is not None:            # the replicas' raw records (per-step shares, times, reports)
            (LOG_DIR / f"{config.get('name', 'run')}-results.json").write_text(json.dumps(results))
        return results


def block_shares(results: list[dict[str, Any]], block: int) -> list[list[int]]:
    """Per step of a block, the local batch of every rank (tail steps of an epoch included)."""
    per_rank = [r["blocks"][block]["sizes"] for r in results]
    return [list(step) for step in zip(*per_rank, strict=True)]


def iterations_to_band(shares: list[list[int]], fast: int, total: int, start: int = 0) -> int | None:
    """Iterations from ``start`` until the first full step whose fast : slow ratio is 2 ± 5 %."""
    return iterations_to_ratio(shares, fast, total, 2.0, start)


def iterations_to_settled(shares: list[list[int]], fast: int, total: int, start: int = 0,
                          end: int | None = None) -> tuple[float | None, int | None]:
    """The settled fast : slow ratio (median over the second half of ``[start, end)``) and the
    iterations from ``start`` until the ratio is first within ±5 % of it."""
    window = [x for x in shares[start:end] if sum(x) == total and min(x) > 0]
    if not window:
        return None, None
    settled = statistics.median(x[fast] / x[1 - fast] for x in window[len(window) // 2:])
    for i in range(start, len(shares) if end is None else end):
        x = shares[i]
        if sum(x) == total and x[1 - fast] > 0 and abs(x[fast] / x[1 - fast] / settled - 1.0) <= BAND:
            return settled, i - start + 1
    return settled, None


def equal_finish_ratio(results: list[dict[str, Any]], block: int, fast: int, start: int = 0,
                       end: int | None = None) -> float | None:
    """The fast : slow share ratio at which the two replicas' compute times are equal, from the
    agent's own reports (``to_scalars()``) over the second half of steps ``[start, end)`` of a block:
    the median of ``(t_slow/x_slow) / (t_fast/x_fast)``, each replica's compute seconds per sample
    (at equal finish times this is the share ratio). It is the target of the balancer, and differs
    from the nominal 2 : 1 by however much the two cores' own speeds differ at the time (on a shared
    VM, by up to ~20 %: see ``compute_ms_per_example``)."""
    reports = results[0]["blocks"][block].get("reports") or []
    window = reports[start:end]
    window = window[len(window) // 2:]
    ratios = []
    for prev, rep in itertools.pairwise(window):
        if rep is None or prev is None or rep[0] != prev[0]:
            continue                        # the report of a change: times of the old shares
        (x, t) = rep
        slow = 1 - fast
        if min(x) > 0 and min(t) > 0:
            ratios.append((t[slow] / x[slow]) / (t[fast] / x[fast]))
    return statistics.median(ratios) if ratios else None


def iterations_to_ratio(shares: list[list[int]], fast: int, total: int, target: float | None,
                        start: int = 0) -> int | None:
    """Iterations from ``start`` until the first full step whose fast : slow ratio is within ±5 % of
    ``target``."""
    if target is None:
        return None
    for i in range(start, len(shares)):
        x = shares[i]
        if sum(x) == total and x[1 - fast] > 0 and abs(x[fast] / x[1 - fast] / target - 1.0) <= BAND:
            return i - start + 1
    return None


def in_band_fraction(shares: list[list[int]], fast: int, total: int, start: int, end: int) -> float:
    full = [x for x in shares[start:end] if sum(x) == total]
    ok = [x for x in full if abs(x[fast] / max(x[1 - fast], 1) / 2.0 - 1.0) <= BAND]
    return len(ok) / max(len(full), 1)


def paired_ratio(results: list[dict[str, Any]], on: list[int], off: list[int],
                 skip: int = 0) -> dict[str, Any]:
    """Time balanced / equal from alternating blocks (rank 0's wall clock per epoch).

    ``ratio``: the median over pairs (each on-block with its neighbouring off-block) of the summed
    epoch times without the first ``skip`` epochs of each block (the steady state: with balancing on,
    a block starts from equal shares); ``ratio_whole_blocks``: the same with every epoch counted, so
    the convergence at each block's start included; ``ratio_of_totals``: all steady epochs pooled.
    """
    epochs = [results[0]["blocks"][b]["epoch_times"] for b in range(len(results[0]["blocks"]))]
    steady = [sum(e[skip:]) for e in epochs]
    whole = [sum(e) for e in epochs]
    pairs = [steady[a] / steady[b] for a, b in zip(on, off, strict=True)]
    whole_pairs = [whole[a] / whole[b] for a, b in zip(on, off, strict=True)]
    return {"ratio": statistics.median(pairs), "pair_ratios": pairs,
            "ratio_whole_blocks": statistics.median(whole_pairs),
            "ratio_of_totals": sum(steady[a] for a in on) / sum(steady[b] for b in off),
            "epochs_skipped_per_block": skip,
            "epoch_seconds_on": [epochs[a] for a in on], "epoch_seconds_off": [epochs[b] for b in off]}


def worker_config(name: str, args: argparse.Namespace, cores: list[int] | None,
                  blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "batch_size": args.train_batch, "width": args.width, "seed": args.seed,
            "cores": cores, "warmup_epochs": 2, "blocks": blocks}


def alternating(pairs: int, epochs: int, slow: int | None = None) -> list[dict[str, Any]]:
    """Blocks off, on, on, off, off, on, … (ABBA: a drift of the machine's speed over the run
    cancels within each pair of pairs instead of favouring whichever mode comes first)."""
    order = [("off", "cpu") if i % 2 == 0 else ("cpu", "off") for i in range(pairs)]
    return [{"balance": mode, "epochs": epochs, "slow": slow} for pair in order for mode in pair]


def on_off(blocks: list[dict[str, Any]], pairs: int) -> tuple[list[int], list[int]]:
    """Indices of the balanced and the equal block of each of the first ``pairs`` pairs."""
    on = [i for i in range(2 * pairs) if blocks[i]["balance"] != "off"]
    off = [i for i in range(2 * pairs) if blocks[i]["balance"] == "off"]
    return on, off


def median_iterations(values: list[int | None]) -> int | None:
    """The (upper) median of per-block iteration counts, a block that never got there counting as
    infinite (None when the median block did not get there): the figure of the typical block, which
    one block's first measurements (a hiccup of the VM in its first window) cannot decide alone."""
    if not values:
        return None
    mid = statistics.median_high(math.inf if v is None else v for v in values)
    return None if math.isinf(mid) else int(mid)


def section_injected_half_speed(args: argparse.Namespace) -> dict[str, Any]:
    m, pairs, epochs = args.train_batch, args.pairs, args.block_epochs
    blocks = alternating(pairs, epochs, slow=1)
    switch_at = args.switch_at
    cores = sorted(os.sched_getaffinity(0))
    pin = [cores[0], cores[1]] if len(cores) >= 2 else None     # one core per replica, like two devices
    # switch blocks: the slowdown starts on rank 1, 0, 1, … and moves to the other rank at switch_at
    first_slow = [1 - j % 2 for j in range(args.switch_blocks)]
    blocks += [{"balance": "cpu", "epochs": args.switch_epochs, "slow": s, "switch": [switch_at, 1 - s]}
               for s in first_slow]
    log(f"injected_half_speed: M={m}, {pairs} ABBA pairs of off/cpu blocks of {epochs} epochs, "
        f"rank 1 at half speed, then {args.switch_blocks} cpu blocks whose slowdown moves to the other "
        f"rank at iteration {switch_at}")
    t0 = time.perf_counter()
    results = run_replicas(worker_config("injected_half_speed", args, pin, blocks), args.section_timeout)
    on, off = on_off(blocks, pairs)
    timing = paired_ratio(results, on, off, skip=1)
    first = block_shares(results, on[0])
    per_block = [iterations_to_band(block_shares(results, b), 0, m) for b in on]
    it_median = median_iterations(per_block)
    targets = [equal_finish_ratio(results, b, 0) for b in on]
    per_block_eq = [iterations_to_ratio(block_shares(results, b), 0, m, r)
                    for b, r in zip(on, targets, strict=True)]
    switches = []
    for j, s in enumerate(first_slow):
        b = 2 * pairs + j
        sw = block_shares(results, b)
        target_sw = equal_finish_ratio(results, b, s, start=switch_at)
        switches.append({
            "slow_before": s, "slow_after": 1 - s, "switch_at_iteration": switch_at,
            "iterations_to_2to1_before_switch": iterations_to_band(sw, 1 - s, m),
            # after the switch the formerly slow rank s is the fast one
            "iterations_to_rebalance": iterations_to_band(sw, s, m, start=switch_at),
            "equal_finish_ratio_after_switch": target_sw,
            "iterations_to_equal_finish_after_switch": iterations_to_ratio(sw, s, m, target_sw,
                                                                           start=switch_at),
            "settled_ratio_and_iterations_after_switch": iterations_to_settled(sw, s, m, start=switch_at),
            "shares": sw})
    after_per = [w["iterations_to_rebalance"] for w in switches]
    after = median_iterations(after_per)
    after_eq_per = [w["iterations_to_equal_finish_after_switch"] for w in switches]
    out = {
        "mode": "cpu (what 'auto' picks without CUDA)",
        "global_batch": m,
        "slowdown": "the slow rank computes its batch twice over (concatenated with itself: the same "
                    "mean gradient, the time of twice the samples)",
        "epoch_time_ratio_balanced_over_equal": timing["ratio"],
        **timing,
        "iterations_to_2to1": it_median,
        "iterations_to_2to1_first_block": per_block[0],
        "iterations_to_2to1_per_block": per_block,
        "in_band_fraction_after_converged": in_band_fraction(
            first, 0, m, (per_block[0] or len(first)), len(first)),
        "iterations_to_rebalance_after_switch": after,
        "iterations_to_rebalance_per_switch_block": after_per,
        "equal_finish_ratio_per_block": targets,
        "iterations_to_equal_finish_per_block": per_block_eq,
        "iterations_to_equal_finish_after_switch_per_block": after_eq_per,
        "settled_ratio_and_iterations_first_block": iterations_to_settled(first, 0, m),
        "switch_blocks": switches,
        "shares_trajectory": first[:30],
        "compute_ms_per_example": [1e3 * r["compute_s_per_example"] for r in results],
        "targets": {"epoch_time_ratio": 0.75, "ideal": 2 / 3, "iterations_to_2to1": 10,
                    "iterations_to_rebalance": 10,
                    "statistic": "ratio: median over the ABBA pairs; iterations: median over the blocks "
                                 "(a block that never reached the band counts as infinite)"},
        "seconds": time.perf_counter() - t0,
    }
    out["ok_epoch_time"] = timing["ratio"] <= 0.75
    out["ok_converge"] = it_median is not None and it_median <= 10
    out["ok_rebalance"] = after is not None and after <= 10
    eq_conv, eq_after = median_iterations(per_block_eq), median_iterations(after_eq_per)
    out["ok_converge_equal_finish"] = eq_conv is not None and eq_conv <= 10
    out["ok_rebalance_equal_finish"] = eq_after is not None and eq_after <= 10
    out["ok"] = out["ok_epoch_time"] and out["ok_converge"] and out["ok_rebalance"]
    pairs_text = [round(p, 3) for p in timing["pair_ratios"]]
    log(f"injected_half_speed: ratio {timing['ratio']:.3f} (pairs {pairs_text}),"
        f" 2:1 after {it_median} iterations (per block {per_block}), re-balanced {after} iterations"
        f" after the switch (per block {after_per}); equal-finish ratios"
        f" {[None if r is None else round(r, 2) for r in targets]} reached after {per_block_eq}"
        f" iterations, after the switch {after_eq_per}")
    return out


def busy_process(core: int) -> subprocess.Popen:
    """A python busy loop pinned to ``core`` (stopped by the caller, by PID)."""
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def section_real_contention(args: argparse.Namespace) -> dict[str, Any]:
    m, pairs, epochs = args.train_batch, args.pairs, args.block_epochs
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return {"ok": False, "skipped": f"needs 2 cores, this process may use {cores}"}
    pin = [cores[0], cores[1]]
    log(f"real_contention: M={m}, replicas pinned to cores {pin}, a busy loop pinned to core {pin[1]} "
        f"(beside rank 1); {pairs} ABBA pairs of off/cpu blocks of {epochs} epochs")
    t0 = time.perf_counter()
    busy = busy_process(pin[1])
    try:
        log(f"real_contention: busy process PID {busy.pid}")
        config = worker_config("real_contention", args, pin, alternating(pairs, epochs))
        results = run_replicas(config, args.section_timeout)
    finally:
        stop(busy)
        log(f"real_contention: busy process PID {busy.pid} stopped")
    on, off = on_off(config["blocks"], pairs)
    timing = paired_ratio(results, on, off, skip=1)
    shares = [block_shares(results, b) for b in on]
    full = [x for s in shares for x in s[len(s) // 2:] if sum(x) == m]
    out = {
        "mode": "cpu", "global_batch": m, "cores": pin, "busy_core": pin[1],
        "epoch_time_ratio_balanced_over_equal": timing["ratio"], **timing,
        "shares_trajectory": shares[0][:30],
        "median_share_rank0_second_half": statistics.median(x[0] for x in full) if full else None,
        "affinity": [r["affinity"] for r in results],
        "targets": {"epoch_time_ratio": 0.8},
        "seconds": time.perf_counter() - t0,
    }
    out["ok"] = timing["ratio"] <= 0.8
    log(f"real_contention: ratio {timing['ratio']:.3f} (pairs {[round(p, 3) for p in timing['pair_ratios']]}"
        ")")
    return out


def bookkeeping_us_per_step(steps: int = 3000, step_s: float = 0.025, noise: float = 0.05,
                            seed: int = 0) -> float:
    """The agent's balancing work per training step (µs), measured in this process: the CPU
    balancer of one ``LoaderBalance`` fed ``steps`` steps of two equally fast replicas whose compute
    times (``step_s``) carry ``noise`` (log-normal), as the agent feeds it (times one step late).
    The wall-clock ratio of ``overhead_equal_speed`` includes this and every other cost; this part
    alone is free of the machine's noise. (The caller runs it once before measuring: the first call
    imports scikit-learn, once per process, ~0.3 s.)"""
    from pollux.torch.api import BatchConfig
    from pollux.torch.shares import LoaderBalance

    rng = np.random.default_rng(seed)
    bal = LoaderBalance()
    bal.set_mode("cpu")
    cfg = BatchConfig(2, 128)
    packet: list[float] | None = None
    spent = 0.0
    for k in range(steps):
        shares = bal.shares_for(cfg, 1, None) or (128, 128)
        times = [step_s * x / 128 * math.exp(noise * rng.standard_normal()) for x in shares]
        t0 = time.perf_counter()
        bal.after_step(cfg, shares, times[0], packet, 1, None, 1, float(k))
        spent += time.perf_counter() - t0
        packet = [*times, 0.0, 0.0]
    return 1e6 * spent / steps


def section_overhead_equal_speed(args: argparse.Namespace) -> dict[str, Any]:
    m, pairs, epochs = args.train_batch, args.overhead_pairs, args.overhead_epochs
    cores = sorted(os.sched_getaffinity(0))
    pin = [cores[0], cores[1]] if len(cores) >= 2 else None
    log(f"overhead_equal_speed: M={m}, equally fast replicas pinned to {pin}; {pairs} ABBA pairs of "
        f"off/cpu blocks of {epochs} epochs")
    t0 = time.perf_counter()
    config = worker_config("overhead_equal_speed", args, pin, alternating(pairs, epochs))
    results = run_replicas(config, args.section_timeout)
    on, off = on_off(config["blocks"], pairs)
    timing = paired_ratio(results, on, off)
    shares = [block_shares(results, b) for b in on]
    full = [x for s in shares for x in s if sum(x) == m]
    changes = [sum(1 for a, b in itertools.pairwise(s) if a != b and sum(a) == sum(b) == m)
               for s in shares]
    steps_off = sum(len(block_shares(results, b)) for b in off)
    step_s = sum(sum(results[0]["blocks"][b]["epoch_times"]) for b in off) / max(steps_off, 1)
    bookkeeping_us_per_step(step_s=step_s, seed=1)  # one-time work: imports, the first fits
    cost_us = bookkeeping_us_per_step(step_s=step_s)
    out = {
        "mode": "cpu", "global_batch": m, "cores": pin,
        "time_ratio_on_over_off": timing["ratio"], **timing,
        "steps_per_on_block": [len(s) for s in shares],
        "share_rank0_range": [min(x[0] for x in full), max(x[0] for x in full)] if full else None,
        "share_changes_per_on_block": changes,
        "unequal_share_steps_fraction": sum(1 for x in full if x[0] != x[1]) / max(len(full), 1),
        "mean_step_seconds_off": step_s,
        "bookkeeping_us_per_step": cost_us,
        "bookkeeping_fraction_of_step": cost_us * 1e-6 / step_s,
        "targets": {"time_ratio": 1.01},
        "seconds": time.perf_counter() - t0,
    }
    out["ok"] = timing["ratio"] <= 1.01
    log(f"overhead_equal_speed: ratio {timing['ratio']:.4f} "
        f"(pairs {[round(p, 4) for p in timing['pair_ratios']]}); share changes per block {changes}; "
        f"balancing work {cost_us:.0f} µs a step = {100 * out['bookkeeping_fraction_of_step']:.2f} % of "
        f"a {1e3 * step_s:.1f} ms step")
    return out


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "predictor_rmse": section_predictor_rmse,
    "injected_half_speed": section_injected_half_speed,
    "real_contention": section_real_contention,
    "overhead_equal_speed": section_overhead_equal_speed,
}


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Counts that cannot work are a clear error naming the option, not a traceback later."""
    for name in ("pairs", "block_epochs", "switch_epochs", "switch_blocks", "overhead_pairs",
                 "overhead_epochs", "traces", "length", "train_batch", "width"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append",
                        help="run only this section (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="first trace seed")
    parser.add_argument("--traces", type=int, default=5, help="predictor_rmse: seeded traces")
    parser.add_argument("--length", type=int, default=1500, help="predictor_rmse: iterations")
    parser.add_argument("--train-batch", type=int, default=256,
                        help="training sections: the fixed global batch M (default 256)")
    parser.add_argument("--width", type=int, default=4,
                        help="training sections: channel multiplier of the example's CNN (default 4)")
    parser.add_argument("--pairs", type=int, default=5,
                        help="injected_half_speed, real_contention: alternating (off, on) block pairs")
    parser.add_argument("--block-epochs", type=int, default=8,
                        help="injected_half_speed, real_contention: epochs per block (default 8)")
    parser.add_argument("--switch-at", type=int, default=18,
                        help="injected_half_speed: iteration of each switch block when the slowdown moves")
    parser.add_argument("--switch-epochs", type=int, default=6,
                        help="injected_half_speed: epochs of each block with a switch (default 6)")
    parser.add_argument("--switch-blocks", type=int, default=3,
                        help="injected_half_speed: blocks whose slowdown moves mid-block (default 3; the "
                             "first moves it from rank 1 to rank 0, the next back, …)")
    parser.add_argument("--overhead-pairs", type=int, default=20,
                        help="overhead_equal_speed: alternating (on, off) block pairs (default 20: the "
                             "pairs' ratios scatter by ±3 %% on a shared VM, and the target is 1 %%)")
    parser.add_argument("--overhead-epochs", type=int, default=30,
                        help="overhead_equal_speed: epochs per block (default 30: 180 steps, > 50 balancer "
                             "updates at the steady window of ~3 steps, so the NARX predictor fits)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="training sections: keep the replicas' logs (agent log lines) here")
    parser.add_argument("--section-timeout", type=float, default=900.0,
                        help="seconds a training section's replicas may run before the section fails "
                             "as hung (default 900: the overhead section's 7200 steps took 5 min 20 s "
                             "at 43 ms a step on the 2-core VM on 2026-11-28)")
    return check_args(parser, parser.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    global LOG_DIR
    LOG_DIR = args.log_dir
    names = args.only or list(SECTIONS)
    result: dict[str, Any] = {}
    for name in names:
        result[name] = SECTIONS[name](args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, section in result.items():
            print(f"== {name}")
            for key, value in section.items():
                if key != "per_trace":
                    print(f"  {key}: {value}")
    return 0 if all(section.get("ok", True) for section in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
