#!/usr/bin/env python3
"""Live-cluster benchmarks (issue 5): re-allocation delay of a real job, and scheduling round time.

``reallocation``: an embedded Ray cluster (its own host process, 4 virtual nodes x 2 GPU slots) and
the service's controller in this process run the digits example
(``examples/digits/train.py``, endless epochs). The benchmark moves the job through a cycle of
placements with different replica counts and nodes; each move is a real re-allocation — SIGTERM to
every replica, checkpoint, exit 143, relaunch on the new placement from the checkpoint. The delay of
one move is from the SIGTERM to the moment the *last* new replica finished its first optimizer step
(the agent logs that line with a timestamp). The policy is bypassed so that the moves are chosen
here; everything else is the service's own code path.

``round``: one scheduling round of the live loop (read jobs and hints from SQLite, run the ``pollux``
policy, save its state, write the changed allocations) with N submitted jobs, half of them with
fitted hints, on a 16 x 4-GPU cluster; first round (empty cluster) and steady-state rounds.

    .venv/bin/python benchmarks/cluster.py --json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "train.py"
PLACEMENTS = [
    {"node-0": 1},
    {"node-0": 1, "node-1": 1},
    {"node-2": 2, "node-3": 1},
    {"node-1": 2},
    {"node-0": 2, "node-1": 2},
    {"node-3": 1},
]


def log(msg: str) -> None:
    print(f"[cluster bench] {msg}", file=sys.stderr, flush=True)


def first_step_times(log_dir: Path, job_id: str, restart: int, replicas: int) -> list[float]:
    """Wall-clock times at which each rank of a restart finished its first optimizer step: the
    ``first_step`` event (:data:`pollux.contract.EVENT_FIRST_STEP`) the agent writes to its rank log.
    Empty until every rank has written one."""
    from pollux.contract import EVENT_FIRST_STEP, parse_events

    out = []
    for rank in range(replicas):
        path = log_dir / job_id / f"restart-{restart}" / f"rank-{rank}.log"
        try:
            events = parse_events(path.read_text(errors="replace"), EVENT_FIRST_STEP)
        except FileNotFoundError:
            events = []
        if not events:
            return []
        out.append(events[0].time)
    return out


def bench_reallocation(moves: int, timeout_s: float) -> dict:
    from pollux.cluster import server
    from pollux.cluster.backends import processes
    from pollux.cluster.backends.ray_backend import RayBackend
    from pollux.cluster.control.controller import Controller, ControllerConfig
    from pollux.cluster.control.scheduler import Scheduler
    from pollux.cluster.state.store import JobStore

    tmp = Path(tempfile.mkdtemp(prefix="pollux-bench-"))
    host = None
    backend = controller = None
    delays: list[float] = []
    stop_to_exit: list[float] = []
    try:
        t = time.perf_counter()
        host, address = server.spawn_rayhost(tmp, 4, 2, timeout_s=180)
        log(f"embedded Ray cluster up in {time.perf_counter() - t:.1f} s at {address}")
        store = JobStore(tmp / "jobs.db")
        backend = RayBackend(address)
        scheduler = Scheduler(store, policy_name="pollux", interval_s=1e9)
        config = ControllerConfig(state_dir=tmp, interval_s=1e9, tick_s=0.2, stop_grace_s=60.0)
        controller = Controller(store, backend, scheduler, config)
        controller.recover()
        controller.refresh_nodes()
        # Placements are chosen here, not by the policy: a round only refreshes the nodes.
        controller.run_round = lambda now: controller.refresh_nodes()  # type: ignore[method-assign]
        job = store.submit({"entrypoint": str(DIGITS), "args": ["--epochs", "100000"],
                            "working_dir": str(ROOT), "init_batch_size": 16, "max_batch_size": 512,
                            "local_bsz_bounds": [8, 256]}, name="digits")
        store.transition(job.id, "starting", allocation=PLACEMENTS[0])

        def tick_until(cond, what: str) -> None:
            deadline = time.monotonic() + timeout_s
            while not cond():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out waiting for {what}")
                controller.tick()
                time.sleep(0.2)

        def training(restart: int, replicas: int) -> bool:
            return len(first_step_times(config.log_dir, job.id, restart, replicas)) == replicas

        tick_until(lambda: job.id in controller.groups, "the first launch")
        tick_until(lambda: training(0, 1), "the first run to train")
        for i in range(1, moves + 1):
            placement = PLACEMENTS[i % len(PLACEMENTS)]
            time.sleep(2.0)                      # let it train a little
            old = controller.groups[job.id]
            store.set_allocation(job.id, placement)
            tick_until(lambda old=old: old.stop_requested_at is not None, "the SIGTERM")
            t0 = old.stop_requested_at
            tick_until(lambda old=old: controller.groups.get(job.id) is not old, "the old replicas to exit")
            exited = [r.end_time for r in store.replicas(job.id, old.restart) if r.end_time]
            codes = sorted({r.exit_code for r in store.replicas(job.id, old.restart)})
            new_restart = store.get_job(job.id).restarts
            replicas = sum(placement.values())
            tick_until(lambda r=new_restart, n=replicas: training(r, n), "the new replicas to train")
            t1 = max(first_step_times(config.log_dir, job.id, new_restart, replicas))
            delays.append(t1 - t0)
            stop_to_exit.append(max(exited) - t0 if exited else float("nan"))
            log(f"move {i}: {sum(old.placement.values())} -> {replicas} replica(s) on {placement}: "
                f"exit codes {codes}, delay {t1 - t0:.2f} s (of which stopping {stop_to_exit[-1]:.2f} s)")
    finally:
        if controller is not None:
            controller.shutdown(grace_s=30)
        if backend is not None:
            backend.shutdown()
        if host is not None:
            processes.stop_pid(host.pid, 60)
    return {"moves": len(delays), "median_s": round(statistics.median(delays), 2) if delays else None,
            "max_s": round(max(delays), 2) if delays else None,
            "delays_s": [round(d, 2) for d in delays],
            "median_stop_s": round(statistics.median(stop_to_exit), 2) if stop_to_exit else None}


def bench_round(num_jobs: int, rounds: int, seed: int) -> dict:
    from pollux.cluster.control.scheduler import Scheduler
    from pollux.cluster.state.store import JobStore
    from pollux.policy.base import Cluster

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore(Path(tmp) / "jobs.db")
        for i in range(num_jobs):
            m0 = int(rng.choice([16, 32, 64, 128]))
            job = store.submit({"entrypoint": "train.py", "init_batch_size": m0, "max_batch_size": m0 * 32,
                                "local_bsz_bounds": [8, m0 * 4]}, name=f"j{i}", now=float(i))
            if i % 2 == 0:
                store.put_hints(job.id, {
                    "version": 1,
                    "throughput": {"alpha_grad": float(rng.uniform(0.01, 0.1)),
                                   "beta_grad": float(rng.uniform(1e-4, 1e-3)), "alpha_local": 0.01,
                                   "beta_local": 1e-4, "alpha_node": 0.05, "beta_node": 1e-4, "gamma": 1.5},
                    "grad": {"sqr": float(rng.uniform(0.1, 1.0)), "var": float(rng.uniform(1.0, 50.0))},
                    "init_batch_size": m0, "max_batch_size": m0 * 32, "local_bsz_bounds": [8, m0 * 4],
                    "accumulation": True, "max_replicas_seen": int(rng.integers(1, 9)),
                    "progress": 10.0, "epoch": 1})
        sched = Scheduler(store, policy_name="pollux", seed=seed)
        cluster = Cluster.uniform(16, 4)
        times = []
        for r in range(rounds):
            now = float(num_jobs + 60 * r)
            t = time.perf_counter()
            result = sched.decide(now, cluster)
            # what Controller.run_round writes after a round
            store.apply_round(result.policy, result.policy_state, result.changed, now=now)
            times.append(time.perf_counter() - t)
        store.close()
    return {"jobs": num_jobs, "cluster": "16 nodes x 4 GPUs", "rounds": rounds,
            "first_round_s": round(times[0], 4), "median_round_s": round(statistics.median(times[1:]), 4),
            "max_round_s": round(max(times), 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--moves", type=int, default=5, help="re-allocations to time")
    p.add_argument("--jobs", type=int, default=100, help="jobs in the round-time benchmark")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--timeout", type=float, default=180.0, help="per wait, seconds")
    p.add_argument("--skip-reallocation", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-up of the finally blocks
    os.environ.setdefault("POLLUX_REFIT_INTERVAL_S", "5")
    out = {"machine": f"{platform.node()} ({os.cpu_count()} cores)",
           "round": bench_round(args.jobs, args.rounds, seed=0)}
    log(f"round with {args.jobs} jobs: median {out['round']['median_round_s']} s, "
        f"first {out['round']['first_round_s']} s")
    if not args.skip_reallocation:
        out["reallocation"] = bench_reallocation(args.moves, args.timeout)
    out["targets"] = {"reallocation_median_s": 30.0, "round_s": 1.0}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
