"""The live demo (``make demo``): real training jobs scheduled by Pollux on an embedded Ray cluster.

Starts a server with an embedded local Ray cluster (4 virtual nodes x 2 GPU slots by default),
submits digits training jobs (``examples/digits/train.py``) of different sizes at different times,
prints their progress as the service re-allocates them, and ends with a summary table and one JSON
line ``{"jobs", "succeeded", "rescales", "avg_jct_s", ...}``. Everything it started is stopped
before it returns, also on Ctrl-C or an error.

A *rescale* is a change of a job's number of replicas while it runs, as recorded in the store's
allocation history; the first allocation and the final release do not count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.cluster import server
from pollux.cluster.client import PolluxClient
from pollux.policy.registry import policy_names

#: (name, arrival offset in seconds, epochs, initial batch size): different sizes, staggered arrivals.
DEFAULT_JOBS: tuple[tuple[str, float, int, int], ...] = (
    ("digits-a", 0.0, 300, 16),
    ("digits-b", 15.0, 150, 32),
    ("digits-c", 30.0, 240, 16),
    ("digits-d", 45.0, 100, 64),
    ("digits-e", 60.0, 200, 16),
)
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class DemoJob:
    name: str
    arrival: float
    epochs: int
    batch_size: int
    id: str | None = None


def rescales(history: list[dict[str, Any]]) -> int:
    """Changes of the replica count between consecutive non-empty allocations."""
    sizes = [sum(a["allocation"].values()) for a in history if a["allocation"]]
    return sum(1 for a, b in itertools.pairwise(sizes) if a != b)


def final_report(client: PolluxClient, job_id: str) -> dict[str, Any] | None:
    """The JSON line the digits example prints at the end (rank 0 of the last run)."""
    text = client.logs(job_id, rank=0)
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), *(fmt.format(*map(str, r)) for r in rows)])


def run(state_dir: Path, *, nodes: int, gpus_per_node: int, interval_s: float, policy: str,
        jobs: list[DemoJob], timeout_s: float, script: Path) -> dict[str, Any]:
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    info = server.start(state_dir, local_nodes=nodes, gpus_per_node=gpus_per_node, interval_s=interval_s,
                        policy=policy, stop_grace_s=30.0, progress=say)
    say(f"service at {info.url} (state in {info.state_dir}); {nodes} nodes x {gpus_per_node} GPU slots")
    summary: dict[str, Any] = {}
    try:
        with PolluxClient(info.url, info.token) as client:
            start = time.monotonic()
            pending = sorted(jobs, key=lambda j: j.arrival)
            last_print = 0.0
            while True:
                now = time.monotonic() - start
                while pending and pending[0].arrival <= now:
                    job = pending.pop(0)
                    spec = {"entrypoint": str(script), "working_dir": str(script.parent),
                            "args": ["--epochs", str(job.epochs), "--batch-size", str(job.batch_size)],
                            "init_batch_size": job.batch_size, "max_batch_size": 512,
                            "local_bsz_bounds": [8, 256]}
                    job.id = client.submit(spec, name=job.name)["id"]
                    say(f"submitted {job.name} ({job.id}): {job.epochs} epochs, "
                        f"initial batch {job.batch_size}")
                listed = {j["id"]: j for j in client.jobs()}
                if now - last_print >= 5.0:
                    last_print = now
                    parts = []
                    for job in jobs:
                        if job.id is None:
                            continue
                        j = listed[job.id]
                        gpus = sum(j["allocation"].values())
                        epoch = _epoch(client, job.id) if j["state"] == "running" else None
                        prog = f" ep {epoch}/{job.epochs}" if epoch is not None else ""
                        parts.append(f"{job.name} {j['state']} {gpus}g{prog}")
                    say(" | ".join(parts))
                if not pending and all(listed[j.id]["state"] in TERMINAL for j in jobs if j.id):
                    break
                if now > timeout_s:
                    raise TimeoutError(f"the demo jobs did not finish within {timeout_s:.0f} s")
                time.sleep(1.0)
            summary = _summarize(client, jobs, nodes, gpus_per_node, policy, time.monotonic() - t0)
    finally:
        say("stopping the server and the embedded Ray cluster")
        server.stop(state_dir, progress=say)
    return summary


def _epoch(client: PolluxClient, job_id: str) -> int | None:
    hints = client.job(job_id).get("hints")
    return None if not hints else int(hints.get("epoch", 0))


def _summarize(client: PolluxClient, jobs: list[DemoJob], nodes: int, gpus_per_node: int, policy: str,
               wall_s: float) -> dict[str, Any]:
    rows, jcts, total_rescales, ok = [], [], 0, 0
    for job in jobs:
        assert job.id is not None
        d = client.job(job.id)
        r = rescales(d["allocation_history"])
        total_rescales += r
        jct = (d["end_time"] - d["submit_time"]) if d["end_time"] else float("nan")
        jcts.append(jct)
        ok += d["state"] == "succeeded"
        rep = final_report(client, job.id) or {}
        sizes = sorted({sum(a["allocation"].values()) for a in d["allocation_history"] if a["allocation"]})
        acc = rep.get("test_accuracy")
        rows.append([job.name, d["state"], f"{jct:.1f}", d["restarts"], r, ",".join(map(str, sizes)),
                     rep.get("final_batch_size", "-"), "-" if acc is None else f"{acc:.3f}"])
    print()
    print(_table(rows, ["JOB", "STATE", "JCT_S", "RESTARTS", "RESCALES", "REPLICAS", "FINAL_BATCH",
                        "TEST_ACC"]))
    finished = [j for j in jcts if j == j]
    return {"jobs": len(jobs), "succeeded": ok, "rescales": total_rescales,
            "avg_jct_s": round(sum(finished) / max(len(finished), 1), 2), "policy": policy,
            "nodes": nodes, "gpus": nodes * gpus_per_node, "wall_s": round(wall_s, 1)}




def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[3]
    p = argparse.ArgumentParser(prog="python -m pollux.cluster.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=Path("out/demo-state"))
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--interval", type=float, default=8.0, help="seconds between scheduling rounds")
    p.add_argument("--policy", default="pollux", choices=policy_names(live=True))
    p.add_argument("--timeout", type=float, default=420.0, help="give up after this many seconds")
    p.add_argument("--script", type=Path, default=root / "examples" / "digits" / "train.py")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every job's epochs (shorter demo: <1)")
    args = p.parse_args(argv)
    if not args.script.exists():
        p.error(f"--script: {args.script} does not exist")
    jobs = [DemoJob(n, a, max(round(e * args.scale), 1), b) for n, a, e, b in DEFAULT_JOBS]
    state = args.state_dir
    if (state / "jobs.db").exists():
        (state / "jobs.db").unlink()     # every demo starts from an empty job store
        for extra in ("jobs.db-wal", "jobs.db-shm"):
            (state / extra).unlink(missing_ok=True)
    try:
        summary = run(state, nodes=args.nodes, gpus_per_node=args.gpus_per_node, interval_s=args.interval,
                      policy=args.policy, jobs=jobs, timeout_s=args.timeout, script=args.script.resolve())
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except (server.ServerError, TimeoutError) as exc:
        print(f"pollux demo: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0 if summary["succeeded"] == summary["jobs"] else 1


if __name__ == "__main__":
    sys.exit(main())
