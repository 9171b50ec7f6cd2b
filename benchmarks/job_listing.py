#!/usr/bin/env python3
"""What one listing of every job (``GET /v1/jobs``, what ``pollux ls`` asks) costs the service at
5,000 jobs: the plain way against the remembered one (:mod:`pollux.cluster.api.listing`), back to back
in one process, over one store.

The store (a fresh SQLite file) is filled through :class:`~pollux.cluster.state.store.JobStore`'s own
calls with ``--jobs`` jobs, as ``benchmarks/service_scale.py`` fills it: ``--active`` jobs holding
GPUs (most running, some starting or rescaling, some restarted), ``--pending`` waiting, the rest
ended (succeeded, failed with a reason, cancelled); three jobs in four belong to one of 20 users.
Allocations name nodes of a typed cluster (``--nodes``, half ``a100``, half ``t4``), so every job's
``gpu_types`` is looked up.

Measured, ``--repeats`` times each, in CPU milliseconds of the listing's thread (``time.thread_time``:
what the API's one process spends; the wall time beside it, on a shared machine, is noisier):

* ``old``: the plain way, as the API answered before: ``store.list_jobs`` into records, each into
  :func:`~pollux.cluster.api.answers.job_dict`, the list rendered by ``SafeJSONResponse``;
* ``new_cold``: a new :class:`~pollux.cluster.api.listing.JobListing`'s first answer (nothing
  remembered yet: what the first ``pollux ls`` after a service start costs);
* ``new_warm``: its answer when no job changed since its last one;
* ``new_after_round``: its answer after a scheduling round's writes: each active job's attained service
  grows (the controller's ``add_service`` before every round), so every active job's row differs;
* ``running_only`` and ``user_own``: ``?state=running`` and one user's own jobs, old and warm.

Every answer of the new way is compared with the old way's, byte for byte (``identical``); the run
fails if any differs. Target: the warm full listing at least 3x cheaper than the old one.

Usage::

    .venv/bin/python benchmarks/job_listing.py --json            # 5,000 jobs (about 20 s to fill)
    .venv/bin/python benchmarks/job_listing.py --json --quick    # 300 jobs, a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pollux.cluster.api.answers import SafeJSONResponse, job_dict  # noqa: E402
from pollux.cluster.api.listing import JobListing  # noqa: E402
from pollux.cluster.state.store import JobStore  # noqa: E402

#: The warm full listing must cost at most this fraction of the old one.
TARGET_SPEEDUP = 3.0
#: How the jobs that ended, ended.
ENDINGS = ("succeeded", "succeeded", "succeeded", "failed", "cancelled")


def log(msg: str) -> None:
    print(f"[job listing] {msg}", file=sys.stderr, flush=True)


def node_types(nodes: int) -> dict[str, str]:
    """``{node: GPU type}`` of a typed cluster: even nodes ``t4``, odd ``a100``."""
    return {f"node-{i:04d}": ("a100" if i % 2 else "t4") for i in range(nodes)}


def job_spec(entrypoint: Path, min_gpus: int) -> dict[str, Any]:
    """A spec like ``benchmarks/service_scale.py``'s."""
    return {"entrypoint": str(entrypoint), "args": ["--epochs", "90"], "init_batch_size": 128,
            "max_batch_size": 4096, "min_replicas": min_gpus, "max_replicas": max(4 * min_gpus, 16)}


def allocation(rng: np.random.Generator, nodes: int) -> dict[str, int]:
    """GPUs on one to three random nodes."""
    picked = rng.choice(nodes, size=int(rng.integers(1, 4)), replace=False)
    return {f"node-{int(n):04d}": int(rng.integers(1, 5)) for n in picked}


def fill(store: JobStore, args: argparse.Namespace, entrypoint: Path) -> list[str]:
    """The store's jobs (see the module docstring); returns the ids of the active ones."""
    rng = np.random.default_rng(args.seed)
    ended = args.jobs - args.active - args.pending
    t = 1.7e9
    active: list[str] = []
    for i in range(args.jobs):
        if i and i % 1000 == 0:
            log(f"filled {i}/{args.jobs} job(s)")
        owner = f"user{i % 20}" if i % 4 else None
        job = store.submit(job_spec(entrypoint, 1 + i % 4), name=f"train-{i:05d}", owner=owner, now=t)
        t += 60.0
        if i >= ended + args.active:
            continue                                   # pending
        store.transition(job.id, "starting", now=t, allocation=allocation(rng, args.nodes))
        store.transition(job.id, "running", now=t + 30)
        if rng.random() < 0.1:                         # a replica failed once; the job restarted
            store.transition(job.id, None, now=t + 60, failure=True, restart=True)
        store.add_service(job.id, float(rng.uniform(0, 1e5)))
        if i < ended:
            ending = ENDINGS[i % len(ENDINGS)]
            store.transition(job.id, ending, "exit code 1" if ending == "failed" else None, now=t + 3600)
            continue
        active.append(job.id)
        moved = rng.random()
        if moved < 0.05:
            store.transition(job.id, "rescaling", now=t + 90, allocation=allocation(rng, args.nodes))
        elif moved < 0.10:
            store.transition(job.id, "pending", now=t + 90)
            store.transition(job.id, "starting", now=t + 120, allocation=allocation(rng, args.nodes))
    return active


def timed(fn: Callable[[], bytes]) -> tuple[bytes, float, float]:
    """``fn()``, its thread's CPU time and its wall time, in ms."""
    c0, w0 = time.thread_time(), time.perf_counter()
    out = fn()
    return out, (time.thread_time() - c0) * 1e3, (time.perf_counter() - w0) * 1e3


def summary(cpu: list[float], wall: list[float]) -> dict[str, float]:
    return {"cpu_ms_p50": round(statistics.median(cpu), 2), "cpu_ms_min": round(min(cpu), 2),
            "wall_ms_p50": round(statistics.median(wall), 2), "n": len(cpu)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="300 jobs, 3 repeats (for tests)")
    ap.add_argument("--jobs", type=int, default=None, help="jobs in the store (5000; --quick: 300)")
    ap.add_argument("--active", type=int, default=None, help="jobs holding GPUs (1000; --quick: 60)")
    ap.add_argument("--pending", type=int, default=None, help="jobs waiting (200; --quick: 20)")
    ap.add_argument("--nodes", type=int, default=1024, help="typed nodes (half a100, half t4)")
    ap.add_argument("--repeats", type=int, default=None, help="measurements of each kind (7; --quick: 3)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.jobs = args.jobs if args.jobs is not None else (300 if args.quick else 5000)
    args.active = args.active if args.active is not None else (60 if args.quick else 1000)
    args.pending = args.pending if args.pending is not None else (20 if args.quick else 200)
    args.repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    if min(args.active, args.pending, args.nodes - 3) < 0 or args.active + args.pending > args.jobs:
        ap.error("--jobs, --active, --pending, --nodes: need 0 <= active + pending <= jobs and 3+ nodes")
    if args.repeats < 1:
        ap.error(f"--repeats: need at least 1, got {args.repeats}")

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pollux-listing-") as tmp:
        entrypoint = Path(tmp) / "train.py"
        entrypoint.write_text("print('train')\n")
        with JobStore(Path(tmp) / "jobs.db") as store:
            active = fill(store, args, entrypoint)
            log(f"filled in {time.perf_counter() - t_start:.1f} s")
            result = measure(store, args, active)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0 if result["identical"] else 1


def measure(store: JobStore, args: argparse.Namespace, active: list[str]) -> dict[str, Any]:
    """Every measurement of the module docstring over the filled ``store``."""
    types = node_types(args.nodes)
    some_user = "user1"

    def old(states: list[str] | None = None, owner: str | None = None) -> bytes:
        jobs = store.list_jobs(states, owner=owner)
        return bytes(SafeJSONResponse([job_dict(j, types=types) for j in jobs]).body)

    cpu: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    identical = True

    def record(kind: str, fn: Callable[[], bytes], reference: bytes | None) -> bytes:
        nonlocal identical
        body, c, w = timed(fn)
        cpu.setdefault(kind, []).append(c)
        wall.setdefault(kind, []).append(w)
        if reference is not None and body != reference:
            identical = False
            log(f"{kind}: answer differs from the old way's")
        return body

    listing = JobListing(store)
    for r in range(args.repeats):
        reference = record("old", old, None)
        record("new_cold", lambda: JobListing(store).render(None, types=types), reference)
        record("new_warm", lambda: listing.render(None, types=types), reference)
        record("new_warm", lambda: listing.render(None, types=types), reference)
        for job_id in active:              # a round's accounting: every active job's row changes
            store.add_service(job_id, 30.0)
        reference = record("old", old, None)
        record("new_after_round", lambda: listing.render(None, types=types), reference)
        running = record("running_old", lambda: old(["running"]), None)
        record("running_new_warm", lambda: listing.render(["running"], types=types), running)
        own = record("user_old", lambda: old(None, some_user), None)
        record("user_new_warm", lambda: listing.render(None, owner=some_user, types=types), own)
        log(f"repeat {r + 1}/{args.repeats}: old {cpu['old'][-1]:.1f} ms, warm {cpu['new_warm'][-1]:.1f} ms, "
            f"after a round {cpu['new_after_round'][-1]:.1f} ms (CPU)")
    remembered = listing.remembered()
    stats = {kind: summary(cpu[kind], wall[kind]) for kind in cpu}
    old_p50 = stats["old"]["cpu_ms_p50"]
    speedup = {kind: round(old_p50 / max(stats[kind]["cpu_ms_p50"], 1e-6), 2)
               for kind in ("new_cold", "new_warm", "new_after_round")}
    speedup["running_only"] = round(stats["running_old"]["cpu_ms_p50"]
                                    / max(stats["running_new_warm"]["cpu_ms_p50"], 1e-6), 2)
    speedup["user_own"] = round(stats["user_old"]["cpu_ms_p50"]
                                / max(stats["user_new_warm"]["cpu_ms_p50"], 1e-6), 2)
    return {
        "benchmark": "job_listing",
        "quick": args.quick,
        "seed": args.seed,
        "jobs": args.jobs,
        "active": len(active),
        "changed_per_round": len(active),
        "nodes": args.nodes,
        "repeats": args.repeats,
        "answer_bytes": len(old()),
        "running_jobs": len(store.list_jobs(["running"])),
        "user_jobs": len(store.list_jobs(owner=some_user)),
        "identical": identical,
        "listing": stats,
        "speedup_cpu_p50": speedup,
        "remembered": {"jobs": len(remembered), "json_bytes": sum(len(e.json) for e in remembered),
                       "row_bytes": sum(sys.getsizeof(e.row) + sum(sys.getsizeof(v) for v in e.row)
                                        for e in remembered)},
        "target": {"warm_speedup_at_least": TARGET_SPEEDUP, "pass": speedup["new_warm"] >= TARGET_SPEEDUP},
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    sys.exit(main())
