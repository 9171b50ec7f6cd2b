"""The live demo (``make demo``): real training jobs scheduled by Pollux on an embedded Ray cluster.

Starts a server with an embedded local Ray cluster (4 virtual nodes x 2 GPU slots by default),
submits digits training jobs (``examples/digits/train.py``) of different sizes at different times,
prints their progress as the service re-allocates them, and ends with a summary table and one JSON
line ``{"jobs", "succeeded", "rescales", "avg_jct_s", ...}``. Everything it started is stopped
before it returns, also on Ctrl-C or an error.

A *rescale* is a change of a job's number of replicas while it runs, as recorded in the store's
allocation history; the first allocation and the final release do not count. A *batch-size change*
is a change of a job's global batch size, as its agent decided and its final report lists
(``batch_sizes``, kept across restarts).

The jobs are sized so that the demo ends in about three minutes on a quiet 2-core machine: digits
reaches its final test accuracy (about 0.98) within 20-30 epochs, so longer jobs only repeat it.
The deadline is a safety net: the demo gives up only when no job has advanced (an epoch, a state, an
allocation or a batch size) for ``--stall-timeout`` seconds, or after ``--timeout`` seconds in all,
and then says what was still running and how far it got.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
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
    ("digits-a", 0.0, 50, 16),
    ("digits-b", 10.0, 30, 32),
    ("digits-c", 20.0, 40, 16),
    ("digits-d", 30.0, 25, 64),
    ("digits-e", 40.0, 30, 16),
)
TERMINAL = ("succeeded", "failed", "cancelled")
#: Seconds between two lines of the progress table.
PRINT_EVERY_S = 5.0


@dataclass
class DemoJob:
    name: str
    arrival: float
    epochs: int
    batch_size: int
    id: str | None = None


@dataclass
class JobView:
    """What the progress table shows of one job, read from the service and the job's epoch lines."""

    state: str = "pending"
    gpus: int = 0
    epoch: int | None = None
    batch_size: int | None = None

    def key(self) -> tuple[Any, ...]:
        return (self.state, self.gpus, self.epoch, self.batch_size)


class DemoStateError(RuntimeError):
    """The demo's state folder cannot be started afresh (another folder's, or a service runs there)."""


#: The file that marks a state folder as the demo's own, so that a later demo may clear it.
DEMO_MARK = ".pollux-demo"
#: The demo's default state folder (``make demo``), its own even when an older demo left it unmarked.
DEFAULT_STATE_DIR = Path("out/demo-state")


def fresh_state_dir(state: Path) -> None:
    """Give every demo an empty state folder: a folder an earlier demo used (it holds ``DEMO_MARK``) is
    removed whole — job store, logs, checkpoints — unless a service still runs from it, and so is the
    default folder; any other non-empty folder is left alone and refused. (Removing the job store
    alone left the store's own marker behind, and the service rightly refused to start on a store
    that vanished: a second ``make demo`` failed at once.)"""
    if state.exists() and any(state.iterdir()):
        if not (state / DEMO_MARK).exists() and state.resolve() != DEFAULT_STATE_DIR.resolve():
            raise DemoStateError(f"--state-dir {state}: not empty and not an earlier demo's folder; "
                                 "give an empty or new folder")
        if server.status(state, probe_ray=False)["service_alive"]:
            raise DemoStateError(f"--state-dir {state}: a service still runs from it; stop it with "
                                 f"'pollux server stop --state-dir {state}' first")
        shutil.rmtree(state)
    state.mkdir(parents=True, exist_ok=True)
    (state / DEMO_MARK).write_text("a state folder of the Pollux demo; the next demo clears it\n")


class DemoStalled(TimeoutError):
    """The demo gave up: nothing advanced for too long (or it ran past its overall limit)."""


def rescales(history: list[dict[str, Any]]) -> int:
    """Changes of the replica count between consecutive non-empty allocations."""
    sizes = [sum(a["allocation"].values()) for a in history if a["allocation"]]
    return sum(1 for a, b in itertools.pairwise(sizes) if a != b)


def last_epoch_line(log: str) -> dict[str, Any] | None:
    """The newest ``{"event": "epoch", ...}`` line the digits example printed (``--json-epochs``)."""
    for line in reversed(log.splitlines()):
        if line.startswith('{"event": "epoch"'):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def batch_size_changes(report: dict[str, Any] | None) -> int:
    """Changes of the global batch size a job's final report lists (its distinct sizes, in order)."""
    sizes = (report or {}).get("batch_sizes") or []
    return max(len(sizes) - 1, 0)


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
        jobs: list[DemoJob], timeout_s: float, stall_timeout_s: float, script: Path) -> dict[str, Any]:
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    info = server.start(state_dir, local_nodes=nodes, gpus_per_node=gpus_per_node, interval_s=interval_s,
                        policy=policy, stop_grace_s=30.0, progress=say)
    say(f"service at {info.url} (state in {info.state_dir}); {nodes} nodes x {gpus_per_node} GPU slots")
    token_file = Path(info.state_dir) / "admin-token"
    say(f"web view: {info.url.rstrip('/')}/ (log in with the admin token in {token_file})")
    summary: dict[str, Any] = {}
    try:
        with PolluxClient(info.url, info.token) as client:
            _follow(client, jobs, script, say, timeout_s=timeout_s, stall_timeout_s=stall_timeout_s)
            summary = _summarize(client, jobs, nodes, gpus_per_node, policy, time.monotonic() - t0)
    finally:
        say("stopping the server and the embedded Ray cluster")
        server.stop(state_dir, progress=say)
    return summary


def demo_spec(job: DemoJob, script: Path) -> dict[str, Any]:
    """The spec the demo submits for ``job`` (the digits example at ``script``); the Prometheus test
    submits the same workload."""
    return {"entrypoint": str(script), "working_dir": str(script.parent),
            "args": ["--epochs", str(job.epochs), "--batch-size", str(job.batch_size), "--json-epochs"],
            "init_batch_size": job.batch_size, "max_batch_size": 512, "local_bsz_bounds": [8, 256]}


def _submit(client: PolluxClient, job: DemoJob, script: Path) -> str:
    return str(client.submit(demo_spec(job, script), name=job.name)["id"])


def _view(client: PolluxClient, job: DemoJob, listed: dict[str, Any], before: JobView | None) -> JobView:
    """The job's state and GPUs from the service; its epoch and batch size from its newest epoch line
    (kept from ``before`` while a restarted run has not printed one yet). A job already seen ended
    is not read again: its log no longer changes."""
    assert job.id is not None
    if before is not None and before.state in TERMINAL:
        return before
    j = listed[job.id]
    view = JobView(state=j["state"], gpus=sum(j["allocation"].values()))
    if before is not None:
        view.epoch, view.batch_size = before.epoch, before.batch_size
    if j["state"] in ("running", "succeeded"):
        line = last_epoch_line(client.logs(job.id, rank=0))
        if line is not None:
            view.epoch, view.batch_size = int(line["epoch"]) + 1, int(line["batch_size"])
    return view


def _progress_line(jobs: list[DemoJob], views: dict[str, JobView]) -> str:
    parts = []
    for job in jobs:
        view = views.get(job.name)
        if job.id is None or view is None:
            continue
        text = f"{job.name} {view.state} {view.gpus}g"
        if view.epoch is not None and view.state not in TERMINAL:
            text += f" ep {view.epoch}/{job.epochs}"
        if view.batch_size is not None and view.state not in TERMINAL:
            text += f" bs {view.batch_size}"
        parts.append(text)
    return " | ".join(parts)


def _follow(client: PolluxClient, jobs: list[DemoJob], script: Path, say: Any, *, timeout_s: float,
            stall_timeout_s: float) -> None:
    """Submit the jobs at their arrival times and print their progress until every one has ended."""
    start = time.monotonic()
    pending = sorted(jobs, key=lambda j: j.arrival)
    views: dict[str, JobView] = {}
    last_print = -PRINT_EVERY_S
    last_change = start
    while True:
        now = time.monotonic() - start
        while pending and pending[0].arrival <= now:
            job = pending.pop(0)
            job.id = _submit(client, job, script)
            last_change = time.monotonic()
            say(f"submitted {job.name} ({job.id}): {job.epochs} epochs, initial batch {job.batch_size}")
        listed = {j["id"]: j for j in client.jobs()}
        if now - last_print >= PRINT_EVERY_S:
            last_print = now
            for job in jobs:
                if job.id is not None:
                    view = _view(client, job, listed, views.get(job.name))
                    if views.get(job.name) is None or view.key() != views[job.name].key():
                        last_change = time.monotonic()
                    views[job.name] = view
            say(_progress_line(jobs, views))
        if not pending and all(listed[j.id]["state"] in TERMINAL for j in jobs if j.id):
            return
        stalled = time.monotonic() - last_change
        if stalled > stall_timeout_s or now > timeout_s:
            why = (f"no job advanced for {stalled:.0f} s" if stalled > stall_timeout_s
                   else f"the demo ran past its limit of {timeout_s:.0f} s")
            raise DemoStalled(f"{why}; still running: {_unfinished(jobs, views)}")
        time.sleep(1.0)


def _unfinished(jobs: list[DemoJob], views: dict[str, JobView]) -> str:
    rows = []
    for job in jobs:
        view = views.get(job.name)
        if job.id is None:
            rows.append(f"{job.name} (not submitted)")
        elif view is not None and view.state not in TERMINAL:
            epoch = "?" if view.epoch is None else str(view.epoch)
            rows.append(f"{job.name} ({job.id}) {view.state} on {view.gpus} GPU(s), "
                        f"epoch {epoch}/{job.epochs}")
    return "; ".join(rows) or "nothing"


def _sequence(values: list[int]) -> str:
    """``[1, 1, 4, 2]`` -> ``"1>4>2"``: the values as they changed."""
    changed = [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
    return ">".join(map(str, changed)) or "-"


def _summarize(client: PolluxClient, jobs: list[DemoJob], nodes: int, gpus_per_node: int, policy: str,
               wall_s: float) -> dict[str, Any]:
    rows, jcts, total_rescales, total_batch_changes, ok = [], [], 0, 0, 0
    for job in jobs:
        assert job.id is not None
        d = client.job(job.id)
        r = rescales(d["allocation_history"])
        total_rescales += r
        jct = (d["end_time"] - d["submit_time"]) if d["end_time"] else float("nan")
        jcts.append(jct)
        ok += d["state"] == "succeeded"
        rep = final_report(client, job.id) or {}
        changes = batch_size_changes(rep)
        total_batch_changes += changes
        replicas = [sum(a["allocation"].values()) for a in d["allocation_history"] if a["allocation"]]
        acc = rep.get("test_accuracy")
        rows.append([job.name, d["state"], f"{jct:.1f}", d["restarts"], r, _sequence(replicas),
                     _sequence([int(b) for b in rep.get("batch_sizes") or []]),
                     "-" if acc is None else f"{acc:.3f}"])
    print()
    print(_table(rows, ["JOB", "STATE", "JCT_S", "RESTARTS", "RESCALES", "REPLICAS", "BATCH_SIZES",
                        "TEST_ACC"]))
    finished = [j for j in jcts if j == j]
    return {"jobs": len(jobs), "succeeded": ok, "rescales": total_rescales,
            "batch_size_changes": total_batch_changes,
            "avg_jct_s": round(sum(finished) / max(len(finished), 1), 2), "policy": policy,
            "nodes": nodes, "gpus": nodes * gpus_per_node, "wall_s": round(wall_s, 1)}


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[3]
    p = argparse.ArgumentParser(prog="python -m pollux.cluster.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                   help="the demo's own folder, cleared at every start (default out/demo-state)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--interval", type=float, default=8.0, help="seconds between scheduling rounds")
    p.add_argument("--policy", default="pollux", choices=policy_names(live=True))
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="give up after this many seconds in all, progressing or not (default 1800)")
    p.add_argument("--stall-timeout", type=float, default=180.0,
                   help="give up when no job has advanced (epoch, state, GPUs, batch size) for this many "
                        "seconds (default 180)")
    p.add_argument("--script", type=Path, default=root / "examples" / "digits" / "train.py")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every job's epochs (shorter demo: <1)")
    args = p.parse_args(argv)
    if not args.script.exists():
        p.error(f"--script: {args.script} does not exist")
    jobs = [DemoJob(n, a, max(round(e * args.scale), 1), b) for n, a, e, b in DEFAULT_JOBS]
    state = args.state_dir
    try:
        fresh_state_dir(state)
    except DemoStateError as exc:
        print(f"pollux demo: error: {exc}", file=sys.stderr)
        return 1
    try:
        summary = run(state, nodes=args.nodes, gpus_per_node=args.gpus_per_node, interval_s=args.interval,
                      policy=args.policy, jobs=jobs, timeout_s=args.timeout,
                      stall_timeout_s=args.stall_timeout, script=args.script.resolve())
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
