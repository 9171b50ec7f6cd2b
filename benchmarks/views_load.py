"""The web view's and ``/metrics``' leg of the service-load benchmark (issue 35).

A store with 1,000 jobs (200 running, each with a history of hints; 300 pending; 500 ended) under
the real API on loopback, in this process as in the service. Measured, back to back in one run:

* ``GET /metrics`` (the admin's scrape: every job's series) and, when the web view is there, the
  jobs page ``GET /`` and a job page ``GET /jobs/<id>``: latency over ``--requests`` calls each
  (targets: p99 ≤ 200 ms);
* a scheduling round (the Pollux policy on 64 nodes × 4 GPUs, its outlook, and its write) with the
  view idle and with a client requesting the jobs page and ``/metrics`` without pause: the ratio of
  the median round times (the view shares the service's process, as in production). The rounds run
  inside the application's :class:`RoundGate`, as the controller runs them, so a page waits for the
  round under way; the client's request times during those rounds are reported, and so are rounds
  the gate does not hold (``round_viewed_ungated``: the view renders during them, as before the gate);
* the outlook's own share of a round: a round whose jobs all changed against one where none did.

Usage::

    .venv/bin/python benchmarks/views_load.py --json
    .venv/bin/python benchmarks/service_load.py --views --json     # the same, as a leg of that one
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pollux.cluster.api.app import create_app
from pollux.cluster.api.listener import api_socket
from pollux.cluster.control.round_gate import RoundGate
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.store import JobStore
from pollux.goodput import GradStats, ThroughputParams
from pollux.hints import build_hints
from pollux.policy.base import Cluster
from service_load import stats_ms

ADMIN = "views-load-admin-token"


def log(msg: str) -> None:
    print(f"[views] {msg}", file=sys.stderr, flush=True)


def hints(rng: np.random.Generator, init_batch_size: int, seen: int) -> dict[str, Any]:
    """Plausible hints: throughput parameters and gradient statistics drawn around a real job's."""
    scale = float(rng.uniform(0.5, 2.0))
    params = ThroughputParams(0.0177 * scale, 0.000697 * scale, 0.0342, 0.00165, 0.128, 0.0026, 2.23)
    grad = GradStats(sqr=float(rng.uniform(1, 20)), var=float(rng.uniform(1, 40)))
    return build_hints(params=params, grad=grad, init_batch_size=init_batch_size, max_batch_size=4096,
                       local_bsz_bounds=(16, 512), accumulation=True, max_replicas_seen=seen,
                       progress=float(rng.uniform(0, 1e5)), epoch=int(rng.integers(0, 30)))


def fill(store: JobStore, args: argparse.Namespace, rng: np.random.Generator) -> list[str]:
    """The jobs; returns the running ones' ids."""
    spec = {"entrypoint": "/bin/true", "init_batch_size": 64, "max_batch_size": 4096}
    running: list[str] = []
    t = 1000.0
    for i in range(args.jobs):
        owner = f"user{i % 10}" if i % 3 else None
        job = store.submit(spec, owner=owner, now=t)
        t += 1.0
        if i < args.running:
            store.transition(job.id, "starting", now=t)
            store.set_allocation(job.id, {f"node-{i % args.nodes}": 1 + i % 4}, now=t)
            store.transition(job.id, "running", now=t)
            for k in range(args.history):
                store.put_hints(job.id, hints(rng, 64, 1 + k % 4), now=t + k)
            running.append(job.id)
        elif i >= args.running + args.pending:
            store.transition(job.id, "cancelled" if i % 2 else "failed", now=t)
    return running


def serve(app: Any) -> tuple[Any, threading.Thread, str]:
    """The app under uvicorn in a thread on a free loopback port."""
    import uvicorn

    sock = api_socket("127.0.0.1", 0)   # as the service makes it
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def latencies(client: httpx.Client, path: str, n: int) -> dict[str, Any] | None:
    """``n`` sequential calls; None where the route does not exist (no web view yet)."""
    first = client.get(path)
    if first.status_code == 404:
        return None
    first.raise_for_status()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        client.get(path).raise_for_status()
        out.append(time.perf_counter() - start)
    return {**stats_ms(out), "bytes": len(first.content)}


def round_times(sched: Scheduler, store: JobStore, cluster: Cluster, rounds: int, t0: float,
                gate: RoundGate | None = None) -> list[float]:
    """Wall seconds of ``rounds`` rounds: the policy, the outlook and the write, inside ``gate``'s
    round as the controller runs them (a gate the application does not hold: nothing waits)."""
    gate = RoundGate() if gate is None else gate
    out = []
    for r in range(rounds):
        start = time.perf_counter()
        with gate.round():
            result = sched.decide(t0 + r, cluster)
            store.apply_round(result.policy, result.policy_state, result.changed, now=t0 + r,
                              outlook=result.outlook.values(), duration_s=result.duration_s,
                              jobs=result.num_jobs, objective=result.objective)
        out.append(time.perf_counter() - start)
    return out


def viewed_rounds(url: str, rounds: Callable[[], list[float]]) -> tuple[list[float], list[float]]:
    """``rounds()`` while a client (a thread of this process) reads the jobs page and ``/metrics``
    back to back without pause; returns the rounds' times and the client's request times."""
    stop = threading.Event()
    waits: list[float] = []

    def browse() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60) as reader:
            while not stop.is_set():
                for path in ("/", "/metrics"):
                    start = time.perf_counter()
                    reader.get(path)
                    waits.append(time.perf_counter() - start)

    reader = threading.Thread(target=browse, daemon=True)
    reader.start()
    try:
        times = rounds()
    finally:
        stop.set()
        reader.join(60)
    return times, waits


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    work = Path(tempfile.mkdtemp(prefix="pollux-views-"))
    out: dict[str, Any] = {"jobs": args.jobs, "running": args.running, "history": args.history}
    with JobStore(work / "jobs.db") as store:
        start = time.perf_counter()
        running = fill(store, args, rng)
        out["fill_s"] = round(time.perf_counter() - start, 1)
        log(f"{args.jobs} jobs in the store ({out['fill_s']} s)")
        cluster = Cluster.uniform(args.nodes, 4)
        sched = Scheduler(store, policy_name=args.policy, seed=args.seed)
        round_times(sched, store, cluster, 1, 10_000.0)    # warm: every outlook computed once
        gate = RoundGate()   # the controller's: the view waits while a round runs, as in the service
        app = create_app(store, ADMIN, check_files=False, wait_for_round=gate.wait_quiet)
        server, thread, url = serve(app)
        try:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            with httpx.Client(base_url=url, headers=admin, timeout=60) as client:
                out["metrics"] = latencies(client, "/metrics", args.requests)
                out["jobs_page"] = latencies(client, "/", args.requests)
                out["job_page"] = latencies(client, f"/jobs/{running[0]}", args.requests)
                log(f"latency: metrics {out['metrics']}, jobs page {out['jobs_page']}")
                idle = round_times(sched, store, cluster, args.rounds, 20_000.0, gate)
                busy, waits = viewed_rounds(url, lambda: round_times(sched, store, cluster, args.rounds,
                                                                     30_000.0, gate))
                ungated, _ = viewed_rounds(url, lambda: round_times(sched, store, cluster, args.rounds,
                                                                    35_000.0))
            out["round_idle"] = stats_ms(idle)
            out["round_viewed"] = stats_ms(busy)
            out["round_ratio_viewed_over_idle"] = round(float(np.median(busy) / np.median(idle)), 3)
            out["view_requests_during_rounds"] = stats_ms(waits)
            out["round_viewed_ungated"] = stats_ms(ungated)
            out["round_ratio_ungated_over_idle"] = round(float(np.median(ungated) / np.median(idle)), 3)
            fresh = []
            for r in range(args.rounds):
                sched.forget_outlooks()
                fresh += round_times(sched, store, cluster, 1, 40_000.0 + r)
            steady = round_times(sched, store, cluster, args.rounds, 50_000.0)
            out["round_all_outlooks_new"] = stats_ms(fresh)
            out["round_outlooks_cached"] = stats_ms(steady)
        finally:
            server.should_exit = True
            thread.join(30)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--running", type=int, default=200)
    p.add_argument("--pending", type=int, default=300)
    p.add_argument("--history", type=int, default=20, help="hints per running job")
    p.add_argument("--nodes", type=int, default=64, help="nodes of 4 GPUs")
    p.add_argument("--requests", type=int, default=100, help="calls per measured route")
    p.add_argument("--rounds", type=int, default=5, help="rounds per measured case")
    p.add_argument("--policy", default="pollux")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = run(args)
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
