#!/usr/bin/env python3
"""Litz jobs under the scheduler (issue 14, "Live"): in-place resizes and what they save.

Two measurements, printed as one JSON object with ``--json`` (progress on stderr):

``live``
    The embedded cluster (3 virtual nodes × 2 GPU slots), policy ``pollux`` with 3 s rounds: a Litz
    MLR job submitted as an elastic job (``examples/litz/mlr_job.py``) and, a little later, two digits
    jobs that come and go. Reported: the Litz job's restarts (target 0), its in-place resizes, and the
    delay from each round's new allocation to its master's acknowledgement (median, target ≤ 5 s).

``scripted``
    The thesis experiment (§4.6: a priority job takes part of the nodes for a while), on the Litz
    runtime itself: MLR on 4 workers; at ``t1`` the job must give up 2 of them, at ``t2`` it gets them
    back. *Elastic*: :meth:`LitzRuntime.resize` while it runs. *Checkpoint-restart*: the run stops with
    a checkpoint at ``t1``, a new run on 2 workers resumes from it, stops again at ``t2``, and a run on
    4 workers resumes and finishes — what a job that cannot resize in place goes through (a real
    cluster adds the relaunch of its processes on top). Reported: both completion times.

Node speed is emulated on CPU: every micro-task is padded to ``task_floor_s`` (so 2 cores can show 4
workers); the output says so.

    .venv/bin/python benchmarks/litz_service.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pollux import raylink

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "litz" / "mlr_job.py"
DIGITS = ROOT / "examples" / "digits" / "train.py"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def live(iterations: int, task_floor_s: float, digits_epochs: int = 40) -> dict[str, Any]:
    """The Litz job among digits jobs (`digits_epochs` each) on the embedded cluster under the pollux
    policy."""
    import httpx

    from pollux.cluster import server
    from pollux.cluster.backends import processes, rayhost

    with tempfile.TemporaryDirectory(prefix="litz-live-") as tmp:
        state = Path(tmp) / "state"
        info = server.start(state, local_nodes=3, gpus_per_node=2, policy="pollux", interval_s=3.0,
                            timeout_s=150, stop_grace_s=10.0)
        try:
            client = httpx.Client(base_url=info.url, timeout=30,
                                  headers={"Authorization": f"Bearer {info.token}"})
            spec = {"entrypoint": str(JOB), "kind": "elastic", "working_dir": str(ROOT),
                    "init_batch_size": 16, "max_replicas": 6,
                    "args": ["--iterations", str(iterations), "--task-floor", str(task_floor_s)]}
            litz = client.post("/v1/jobs", json={"name": "litz", "spec": spec}).json()["id"]
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and client.get(f"/v1/jobs/{litz}").json()["state"] != "running":
                time.sleep(0.5)
            time.sleep(8.0)
            ids = [litz]
            for k in range(2):
                body = {"name": f"digits{k}", "spec": {
                    "entrypoint": str(DIGITS), "args": ["--epochs", str(digits_epochs)],
                    "working_dir": str(ROOT),
                    "init_batch_size": 16, "max_batch_size": 256, "local_bsz_bounds": [8, 128],
                    "max_replicas": 2}}
                ids.append(client.post("/v1/jobs", json=body).json()["id"])
            deadline = time.monotonic() + 600
            jobs: dict[str, Any] = {}
            while time.monotonic() < deadline:
                jobs = {i: client.get(f"/v1/jobs/{i}").json() for i in ids}
                if all(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs.values()):
                    break
                time.sleep(1.0)
            job = jobs[litz]
            history = [a for a in job["allocation_history"] if a["allocation"]]
            delays = [a["applied"] - a["time"] for a in history[1:] if a["applied"] is not None]
            log = client.get(f"/v1/jobs/{litz}/logs").text
            lines = [ln for ln in log.splitlines() if ln.startswith("{")]
            out = {
                "states": {j["name"]: j["state"] for j in jobs.values()},
                "litz_restarts": job["restarts"],
                "litz_jct_s": (job["end_time"] or time.time()) - job["submit_time"],
                "digits_end_s": [(j["end_time"] or time.time()) - job["submit_time"] for i, j in jobs.items()
                                 if i != litz],
                "allocations": [{"gpus": sum(a["allocation"].values()), "nodes": sorted(a["allocation"]),
                                 "at_s": a["time"] - job["submit_time"],
                                 "applied_after_s": None if a["applied"] is None
                                 else a["applied"] - a["time"]} for a in history],
                "all_applied": all(a["applied"] is not None for a in history),
                "in_place_resizes": len(delays),
                "resize_delays_s": delays,
                "resize_delay_median_s": statistics.median(delays) if delays else None,
                "resize_delay_max_s": max(delays) if delays else None,
                "target_resize_delay_s": 5.0,
                "litz_summary": json.loads(lines[-1]) if lines else None,
                "ok": job["restarts"] == 0 and bool(delays) and statistics.median(delays) <= 5.0,
            }
        finally:
            report = server.stop(state, timeout_s=60)
        out["left_processes"] = sorted(rayhost.cluster_processes(state))
        out["service_stopped"] = bool(report["was_running"]) and not processes.pid_alive(info.service_pid) \
            and not processes.pid_alive(info.rayhost_pid)
        return out


def scripted(iterations: int, task_floor_s: float, t1: float, t2: float) -> dict[str, Any]:
    """Elastic scale-in/out against stop-checkpoint-resume on the same schedule."""

    from pollux.litz.apps import mlr_app
    from pollux.litz.records import RuntimeConfig
    from pollux.litz.runtime import LitzRuntime

    def config(workers: int, folder: str | None = None, resume: bool = False) -> Any:
        return RuntimeConfig(num_executors=8, num_workers=workers, num_shards=2, seed=0,
                             task_floor_s=task_floor_s, checkpoint_dir=folder, resume=resume)

    app = mlr_app(iterations=iterations, report_every=50)
    # Elastic: one run, resized by timers.
    rt = LitzRuntime(app, config(4))
    start = time.monotonic()

    def script() -> None:
        time.sleep(t1)
        rt.resize(num_workers=2)
        time.sleep(max(t2 - t1, 0.0))
        rt.resize(num_workers=4)

    threading.Thread(target=script, daemon=True).start()
    summary = rt.run()
    elastic_s = time.monotonic() - start
    elastic_obj = summary.final.get("objective")
    say(f"scripted: elastic {elastic_s:.1f} s, objective {elastic_obj}")
    # Checkpoint-restart: three runs, each stopping with a checkpoint at the schedule's next point.
    with tempfile.TemporaryDirectory(prefix="litz-restart-") as folder:
        start = time.monotonic()
        loads = 0
        final: dict[str, Any] = {}
        for k, (workers, until) in enumerate(((4, t1), (2, t2), (4, None))):
            run = LitzRuntime(app, config(workers, folder, resume=k > 0))
            if until is not None:
                delay = max(until - (time.monotonic() - start), 0.0)
                timer = threading.Timer(delay, lambda r=run: r.stop(checkpoint=True))
                timer.daemon = True
                timer.start()
            s = run.run()
            loads += s.checkpoints_loaded
            final = s.final or final
        restart_s = time.monotonic() - start
    say(f"scripted: checkpoint-restart {restart_s:.1f} s, objective {final.get('objective')}")
    return {"elastic_s": elastic_s, "checkpoint_restart_s": restart_s,
            "elastic_objective": elastic_obj, "restart_objective": final.get("objective"),
            "restart_checkpoint_loads": loads, "schedule": {"t1_s": t1, "t2_s": t2, "workers": [4, 2, 4]},
            "saving": 1.0 - elastic_s / restart_s if restart_s else None,
            "ok": elastic_s < restart_s, "thesis": "120 min elastic vs 190 min kill-and-restart"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    ap.add_argument("--only", choices=("live", "scripted"), help="one measurement")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    os.environ.update(raylink.LOOPBACK_ENV)
    floor = 0.05
    out: dict[str, Any] = {"emulated": True,
                           "note": f"node speed emulated on CPU: every micro-task padded to {floor} s"}
    if args.only in (None, "scripted"):
        import ray
        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, logging_level="ERROR")
        try:
            iters = 120 if args.quick else 300
            out["scripted"] = scripted(iters, floor, t1=0.25 * iters * 2 * floor, t2=0.6 * iters * 2 * floor)
        finally:
            ray.shutdown()
    if args.only in (None, "live"):
        out["live"] = live(120 if args.quick else 240, floor)
        say(f"live: {out['live']['in_place_resizes']} in-place resizes, median delay "
            f"{out['live']['resize_delay_median_s']}, restarts {out['live']['litz_restarts']}")
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
