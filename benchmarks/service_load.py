#!/usr/bin/env python3
"""Load benchmark of the live service (issue 10): N jobs submitted and cancelled in a burst.

A real Pollux server (``pollux.cluster.server.start``: an embedded Ray host with 4 virtual nodes x 2
GPU slots and the service process, policy ``pollux``, a short scheduling interval) runs from a fresh
temporary state folder. Several client threads then

1. submit N jobs in a burst (``POST /v1/jobs``) while another thread keeps listing them
   (``GET /v1/jobs``);
2. describe each job (``GET /v1/jobs/{id}``);
3. wait until the cluster's GPU slots are taken by running jobs;
4. cancel all N in a burst (``POST /v1/jobs/{id}/cancel``), the lister still running.

Each job is a small real script written to the temporary folder: it starts one child process
(``sleep``), records its own PID and its child's in a folder the benchmark watches, and sleeps until
SIGTERM, on which it exits 143 as the Pollux agent does after checkpointing. A thread of the benchmark
polls ``/proc`` every 50 ms for every such process and for every PID the store records in the job's
``replicas``, so it sees when each one ends (a zombie counts as ended); a replica is gone when its
main process *and its child* are.

Reported: p50/p99 latencies of submit, ls, describe and cancel; for the jobs that had a replica alive
at or after their cancel, the time from sending the cancel to the moment the last of their processes
was gone (a job still not gone when the watch ends, after ``--timeout``, counts with its time so
far and in ``not_gone``); jobs *lost* (acknowledged with 201 but missing from ``ls`` at the end, or
not ``cancelled`` there) and *duplicated* (two jobs for one submission; two processes for one (job,
restart, rank); two runs of one job alive at once, seen in ``/proc`` or in the store's replica
records); processes left alive after ``server stop`` (killed by PID, and counted); wall time, cores
and the commit.
Progress goes to stderr, the JSON to stdout. The server is stopped whatever happens.

    .venv/bin/python benchmarks/service_load.py --json                 # 200 jobs, 8 client threads
    .venv/bin/python benchmarks/service_load.py --json --jobs 10 --threads 4
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: Names of the benchmark's jobs start with this (one name per submission: duplicates show up by name).
NAME_PREFIX = "load-"
#: The job's child: a plain ``sleep`` (dies on SIGTERM), or with ``--stubborn-children`` one that
#: ignores SIGTERM, which only a kill of the replica's whole process group after it exits can stop.
CHILD = ["sleep", "86400"]
STUBBORN_CHILD = ["sh", "-c", "trap '' TERM; exec sleep 86400"]

JOB_SCRIPT = '''\
"""A stand-in replica for benchmarks/service_load.py (see there): runs until SIGTERM, exits 143."""
import json, os, signal, subprocess, sys, time

started = time.time()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
child = subprocess.Popen(CHILD_COMMAND, stdin=subprocess.DEVNULL)
record = {"job": os.environ.get("POLLUX_JOB_ID", "?"), "restart": int(os.environ.get("POLLUX_RESTARTS", -1)),
          "rank": int(os.environ.get("POLLUX_RANK", -1)), "pid": os.getpid(), "child": child.pid,
          "time": started}
path = os.path.join(sys.argv[1], "{job}.{restart}.{rank}.{pid}.json".format(**record))
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
print("replica", record, flush=True)
while True:
    time.sleep(1.0)
'''


def log(msg: str) -> None:
    print(f"[service load] {msg}", file=sys.stderr, flush=True)


def stats_ms(seconds: Iterable[float]) -> dict[str, Any]:
    """Count, p50, p99 and max of latencies given in seconds, in milliseconds."""
    xs = np.asarray(list(seconds), dtype=float) * 1000.0
    if xs.size == 0:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": int(xs.size), "p50": round(float(np.percentile(xs, 50)), 1),
            "p99": round(float(np.percentile(xs, 99)), 1), "max": round(float(xs.max()), 1)}


# ----------------------------------------------------------------------------------- process watch


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state letter, start time in clock ticks)`` of a process, or None if it does not exist."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return fields[0], int(fields[19])


def carries_job(pid: int, job_id: str) -> bool:
    """Whether process ``pid`` has ``POLLUX_JOB_ID=job_id`` (True if its environment is unreadable)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except PermissionError:
        return True
    except OSError:
        return False
    return f"POLLUX_JOB_ID={job_id}".encode() in environ.split(b"\0")


@dataclass
class Proc:
    """One process of a replica (its main process or its child) as the watcher saw it."""

    job: str
    restart: int
    rank: int
    pid: int
    kind: str                    # "main" or "child"
    start: float                 # wall time it started (the script's own clock, or the store's)
    source: str                  # "file" (the script's record) or "store" (replicas[].pid)
    ticks: int | None = None     # its /proc start time, against PID reuse
    end: float | None = None     # wall time it was first seen gone


class Watcher(threading.Thread):
    """Finds the replicas' PID files and polls /proc for each process they and the store name."""

    def __init__(self, folder: Path, period_s: float = 0.05) -> None:
        super().__init__(name="proc-watch", daemon=True)
        self.folder = folder
        self.period_s = period_s
        self.procs: dict[int, Proc] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.last_change = time.time()
        self._seen_files: set[str] = set()

    def add(self, proc: Proc) -> None:
        """Start watching ``proc`` (no-op for a PID already watched)."""
        now = time.time()
        with self.lock:
            if proc.pid in self.procs:
                return
            st = proc_stat(proc.pid)
            if st is None or st[0] == "Z" or not carries_job(proc.pid, proc.job):
                # already gone (or the PID is another process's by now): keep the end the caller
                # knows (the store's record of the exit), else now
                proc.end = now if proc.end is None else proc.end
            else:
                proc.ticks, proc.end = st[1], None
            self.procs[proc.pid] = proc
            self.last_change = now

    def _scan_files(self) -> None:
        try:
            names = [e.name for e in os.scandir(self.folder) if e.name.endswith(".json")]
        except OSError:
            return
        for name in names:
            if name in self._seen_files:
                continue
            try:
                rec = json.loads((self.folder / name).read_text())
            except (OSError, ValueError):
                continue
            self._seen_files.add(name)
            for pid, kind in ((rec["pid"], "main"), (rec["child"], "child")):
                self.add(Proc(rec["job"], rec["restart"], rec["rank"], pid, kind, rec["time"], "file"))

    def poll(self) -> None:
        self._scan_files()
        now = time.time()
        with self.lock:
            for p in self.procs.values():
                if p.end is None:
                    st = proc_stat(p.pid)
                    if st is None or st[0] == "Z" or st[1] != p.ticks:
                        p.end = now
                        self.last_change = now

    def run(self) -> None:
        while not self.halt.wait(self.period_s):
            self.poll()

    def alive(self) -> list[Proc]:
        with self.lock:
            return [p for p in self.procs.values() if p.end is None]

    def of_job(self, job: str) -> list[Proc]:
        with self.lock:
            return [p for p in self.procs.values() if p.job == job]


# ----------------------------------------------------------------------------------- client side


class Clients:
    """One API client per thread (each with its own connection pool, opened before it is timed)."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        self.url, self.token, self.timeout_s = url, token, timeout_s
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def get(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            from pollux.cluster.client import PolluxClient
            client = self._local.client = PolluxClient(self.url, self.token, timeout=self.timeout_s)
            with self._lock:
                self._all.append(client)
            try:
                client.health()       # connect now: a client's own set-up is not the service's latency
            except Exception:
                pass
        return client

    def call(self, fn: Callable[[Any], Any], ok_status: int = 200) -> Call:
        """``fn(client)`` timed, with this thread's client."""
        client = self.get()
        return timed(lambda: fn(client), ok_status)

    def close(self) -> None:
        with self._lock:
            for c in self._all:
                c.close()
            self._all.clear()


@dataclass
class Call:
    """One timed API call: when it was sent, how long it took, its status (0: no answer) and body."""

    sent: float
    latency_s: float
    status: int
    body: Any = None
    error: str | None = None


def timed(fn: Callable[[], Any], ok_status: int = 200) -> Call:
    from pollux.cluster.client import ClientError
    sent = time.time()
    t = time.perf_counter()
    try:
        body = fn()
    except ClientError as exc:
        return Call(sent, time.perf_counter() - t, exc.status, None, str(exc)[:200])
    return Call(sent, time.perf_counter() - t, ok_status, body)


class Lister(threading.Thread):
    """Keeps calling ``GET /v1/jobs`` (pausing ``pause_s`` between calls) until stopped."""

    def __init__(self, clients: Clients, pause_s: float) -> None:
        super().__init__(name="lister", daemon=True)
        self.clients, self.pause_s = clients, pause_s
        self.calls: list[Call] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.calls.append(self.clients.call(lambda c: c.jobs()))
            self.halt.wait(self.pause_s)

    def finish(self) -> list[Call]:
        self.halt.set()
        self.join(timeout=60)
        return self.calls


# ----------------------------------------------------------------------------------- checks


def overlaps(intervals: list[tuple[float, float]], slack_s: float = 0.0) -> bool:
    """Whether any two ``(start, end)`` intervals overlap by more than ``slack_s``."""
    xs = sorted(intervals)
    return any(b[0] < a[1] - slack_s for a, b in itertools.pairwise(xs))


def duplicated_runs(watcher: Watcher, replicas: dict[str, list[dict]]) -> dict[str, list[str]]:
    """Jobs with two processes for one (restart, rank), or two runs alive at once (``/proc``, store)."""
    found: dict[str, list[str]] = {"same_rank_twice": [], "overlapping_runs_proc": [],
                                   "overlapping_runs_store": []}
    with watcher.lock:
        mains = [p for p in watcher.procs.values() if p.kind == "main"]
    inf = float("inf")
    by_job: dict[str, list[Proc]] = {}
    for p in mains:
        by_job.setdefault(p.job, []).append(p)
    for job, procs in sorted(by_job.items()):
        ranks: dict[tuple[int, int], set[int]] = {}
        runs: dict[int, list[Proc]] = {}
        for p in procs:
            ranks.setdefault((p.restart, p.rank), set()).add(p.pid)
            runs.setdefault(p.restart, []).append(p)
        if any(len(pids) > 1 for pids in ranks.values()):
            found["same_rank_twice"].append(job)
        spans = [(min(p.start for p in ps), max(inf if p.end is None else p.end for p in ps))
                 for ps in runs.values()]
        # a run's start is its script's first instant and its end the first poll that saw it gone,
        # so a successor may appear to start up to one poll period before its predecessor ended
        if overlaps(spans, slack_s=2 * watcher.period_s):
            found["overlapping_runs_proc"].append(job)
    for job, reps in sorted(replicas.items()):
        runs_s: dict[int, list[dict]] = {}
        for r in reps:
            if r.get("pid"):
                runs_s.setdefault(int(r["restart"]), []).append(r)
        spans = [(min(r["start_time"] for r in rs),
                  max(inf if r["end_time"] is None else r["end_time"] for r in rs)) for rs in runs_s.values()]
        if overlaps(spans):
            found["overlapping_runs_store"].append(job)
    return found


def left_alive(watcher: Watcher, job_ids: set[str]) -> list[int]:
    """PIDs still alive of the watched processes, or of any process carrying one of ``job_ids``."""
    watcher.poll()
    pids = {p.pid for p in watcher.alive()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in environ:
            if var.startswith(b"POLLUX_JOB_ID=") and var[14:].decode(errors="replace") in job_ids:
                st = proc_stat(int(entry))
                if st is not None and st[0] != "Z":
                    pids.add(int(entry))
                break
    return sorted(pids)


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD") or None,
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


# ----------------------------------------------------------------------------------- the benchmark


def run(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    """The benchmark; fills ``out`` as it goes, so that a run broken mid-way still reports."""
    from pollux.cluster import server

    started = time.perf_counter()
    state, pids_dir = work / "state", work / "pids"
    pids_dir.mkdir()
    script = work / "replica.py"
    child = STUBBORN_CHILD if args.stubborn_children else CHILD
    script.write_text(JOB_SCRIPT.replace("CHILD_COMMAND", json.dumps(child)))
    spec = {"entrypoint": str(script), "args": [str(pids_dir)], "init_batch_size": 32,
            "working_dir": str(work)}
    out.update({"jobs": args.jobs, "threads": args.threads, "nodes": args.nodes,
                "gpus_per_node": args.gpus_per_node, "policy": "pollux", "interval_s": args.interval,
                "stubborn_children": args.stubborn_children})
    watcher = Watcher(pids_dir)
    pool = ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="client")
    halt = threading.Event()
    clients: Clients | None = None
    lister: Lister | None = None
    job_ids: set[str] = set()
    try:
        t = time.perf_counter()
        info = server.start(state, local_nodes=args.nodes, gpus_per_node=args.gpus_per_node, policy="pollux",
                            interval_s=args.interval, stop_grace_s=args.stop_grace, timeout_s=args.timeout,
                            progress=log)
        out["server_start_s"] = round(time.perf_counter() - t, 1)
        log(f"server up at {info.url} in {out['server_start_s']} s (state {state})")
        clients = Clients(info.url, info.token, args.request_timeout)
        watcher.start()

        def each(fn: Callable[[Any], Call], items: list[Any]) -> list[Call]:
            def task(item: Any) -> Call:
                if halt.is_set():
                    raise RuntimeError("stopped")
                return fn(item)
            return list(pool.map(task, items))

        # 1. the submit burst, with a lister
        lister = Lister(clients, args.ls_pause)
        lister.start()
        t = time.perf_counter()
        submits = each(lambda i: clients.call(lambda c: c.submit(spec, name=f"{NAME_PREFIX}{i:05d}"), 201),
                       list(range(args.jobs)))
        burst_s = time.perf_counter() - t
        ls_submit = lister.finish()
        acked = {c.body["id"]: c.body["name"] for c in submits if c.status == 201}
        job_ids |= set(acked)
        log(f"submitted {len(acked)}/{args.jobs} in {burst_s:.1f} s; "
            f"{sum(c.status != 201 for c in submits)} error(s); {len(ls_submit)} ls call(s) meanwhile")
        bad = next((c for c in submits if c.status != 201), None)
        if bad is not None:
            log(f"  first submit error: {bad.status} {bad.error}")
        # a submission answered with an error (or not at all) may still have stored a job: find it by name
        listed = clients.get().jobs()
        extra = [j["id"] for j in listed if j["name"].startswith(NAME_PREFIX) and j["id"] not in acked]
        job_ids |= set(extra)
        every = sorted(job_ids)

        # 2. describe each job
        describes = each(lambda jid: clients.call(lambda c: c.job(jid)), every)
        log(f"described {len(every)} job(s): p50 {stats_ms(c.latency_s for c in describes)['p50']} ms")

        # 3. wait until the slots are taken
        slots = int(clients.get().cluster().get("total_gpus") or args.nodes * args.gpus_per_node)
        target = min(slots, len(every))
        deadline = time.monotonic() + args.timeout
        running: list[dict] = []
        while time.monotonic() < deadline:
            running = clients.get().jobs(["running"])
            gpus = sum(sum(j["allocation"].values()) for j in running)
            if len(running) >= target or gpus >= slots:
                break
            time.sleep(0.5)
        else:
            log(f"only {len(running)} job(s) running after {args.timeout:.0f} s (wanted {target}); "
                "cancelling anyway")
        waited = time.monotonic()
        while time.monotonic() - waited < 15 and \
                {j["id"] for j in running} - {p.job for p in watcher.alive() if p.kind == "main"}:
            time.sleep(0.1)
        out["running_before_cancel"] = len(running)
        out["slots"] = slots
        log(f"{len(running)} job(s) running on {slots} slot(s); "
            f"{len(watcher.alive())} replica process(es) alive")

        # 4. the cancel burst, with a lister
        lister = Lister(clients, args.ls_pause)
        lister.start()
        t = time.perf_counter()
        cancels = dict(zip(every, each(lambda jid: clients.call(lambda c: c.cancel(jid)), every),
                           strict=True))
        cancel_burst_s = time.perf_counter() - t
        ls_cancel = lister.finish()
        log(f"cancelled {sum(c.status == 200 for c in cancels.values())}/{len(every)} "
            f"in {cancel_burst_s:.1f} s; statuses {sorted({c.status for c in cancels.values()})}")

        # 5. wait until every replica process is gone (and nothing new started for a while), then
        # read the store's view and watch any recorded PID the scripts did not report
        replicas: dict[str, list[dict]] = {}
        final: dict[str, dict] = {}
        deadline = time.monotonic() + args.timeout
        while True:
            while time.monotonic() < deadline and \
                    (watcher.alive() or time.time() - watcher.last_change < args.quiet):
                time.sleep(0.1)
            reads = each(lambda jid: clients.call(lambda c: c.job(jid)), every)
            for jid, read in zip(every, reads, strict=True):
                if read.status == 200:
                    final[jid] = read.body
                    replicas[jid] = read.body.get("replicas") or []
                    for r in replicas[jid]:
                        if r.get("pid"):
                            watcher.add(Proc(jid, int(r["restart"]), int(r["rank"]), int(r["pid"]), "main",
                                             float(r["start_time"]), "store", end=r.get("end_time")))
            if not watcher.alive() or time.monotonic() >= deadline:
                break
        still = watcher.alive()
        if still:
            log(f"{len(still)} replica process(es) still alive {args.timeout:.0f} s after the cancels")
        listed = {j["id"]: j for j in clients.get().jobs()}

        # figures
        out["latency_ms"] = {"submit": stats_ms(c.latency_s for c in submits),
                             "ls": stats_ms(c.latency_s for c in ls_submit),
                             "describe": stats_ms(c.latency_s for c in describes),
                             "cancel": stats_ms(c.latency_s for c in cancels.values()),
                             "ls_during_cancels": stats_ms(c.latency_s for c in ls_cancel)}
        out["errors"] = {"submit": sum(c.status != 201 for c in submits),
                         "ls": sum(c.status != 200 for c in ls_submit + ls_cancel),
                         "describe": sum(c.status != 200 for c in describes),
                         "cancel": sum(c.status != 200 for c in cancels.values())}
        out["bursts_s"] = {"submit": round(burst_s, 2), "cancel": round(cancel_burst_s, 2)}
        first = min(c.sent for c in submits)
        out["slowest_submits"] = [{"index": i, "sent_s": round(c.sent - first, 3),
                                   "ms": round(c.latency_s * 1000.0, 1)}
                                  for i, c in sorted(enumerate(submits), key=lambda ic: -ic[1].latency_s)[:5]]
        # a job still not gone when the watch ended counts with the time until then (a lower bound)
        watch_end = time.time()
        gone: dict[str, float] = {}
        at_cancel = after_cancel = not_gone = 0
        for jid, call in cancels.items():
            t0 = call.sent
            procs = [p for p in watcher.of_job(jid) if p.end is None or p.end > t0]
            if not procs:
                continue
            at_cancel += any(p.kind == "main" and p.start <= t0 for p in procs)
            after_cancel += any(p.kind == "main" and p.start > t0 for p in procs)
            not_gone += any(p.end is None for p in procs)
            gone[jid] = max(watch_end if p.end is None else p.end for p in procs) - t0
        g = stats_ms(gone.values())
        out["cancel_to_gone_s"] = {"jobs": len(gone), "running_at_cancel": at_cancel,
                                   "launched_after_cancel": after_cancel, "not_gone": not_gone,
                                   **{k: (None if g[k] is None else round(g[k] / 1000.0, 2))
                                      for k in ("p50", "p99", "max")},
                                   "slowest": [[j, round(v, 2)] for j, v in
                                               sorted(gone.items(), key=lambda kv: -kv[1])[:5]]}
        missing = sorted(set(acked) - set(listed))
        by_state: dict[str, int] = {}
        for jid in acked:
            if jid in listed and listed[jid]["state"] != "cancelled":
                by_state[listed[jid]["state"]] = by_state.get(listed[jid]["state"], 0) + 1
        out["lost"] = len(missing) + sum(by_state.values())
        out["lost_detail"] = {"missing": missing[:20], "not_cancelled_by_state": by_state,
                              "unacknowledged_but_stored": sorted(extra)[:20]}
        names: dict[str, list[str]] = {}
        for j in listed.values():
            if j["name"].startswith(NAME_PREFIX):
                names.setdefault(j["name"], []).append(j["id"])
        dup = duplicated_runs(watcher, replicas)
        dup["two_jobs_for_one_submission"] = sorted(n for n, ids in names.items() if len(ids) > 1)
        out["duplicated"] = len({*dup["same_rank_twice"], *dup["overlapping_runs_proc"],
                                 *dup["overlapping_runs_store"]}) + len(dup["two_jobs_for_one_submission"])
        out["duplicated_detail"] = {k: v[:20] for k, v in dup.items()}
        with watcher.lock:
            mains = [p for p in watcher.procs.values() if p.kind == "main"]
        store_pids = {int(r["pid"]) for reps in replicas.values() for r in reps if r.get("pid")}
        out["replica_runs"] = {"processes": len(mains), "recorded_in_store": len(store_pids),
                               "unrecorded": len([p for p in mains if p.pid not in store_pids])}
        out["restarts"] = sum(int(j.get("restarts") or 0) for j in final.values())
        out["failures"] = sum(int(j.get("failures") or 0) for j in final.values())
    finally:
        halt.set()
        if lister is not None:
            lister.halt.set()
        pool.shutdown(wait=False, cancel_futures=True)
        t = time.perf_counter()
        try:
            out["server_stop"] = server.stop(state, timeout_s=120, progress=log)
        except Exception as exc:  # report, and still look for leftovers
            out["server_stop"] = {"error": f"{type(exc).__name__}: {exc}"}
        out["server_stop_s"] = round(time.perf_counter() - t, 1)
        leftovers = left_alive(watcher, job_ids)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out["left_alive_after_stop"] = len(leftovers)
        if leftovers:
            log(f"{len(leftovers)} replica process(es) left alive after server stop, "
                f"killed: {leftovers[:20]}")
        watcher.halt.set()
        if clients is not None:
            clients.close()
        out["wall_s"] = round(time.perf_counter() - started, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--jobs", type=int, default=200, help="jobs to submit and cancel")
    p.add_argument("--threads", type=int, default=8, help="client threads of the bursts")
    p.add_argument("--nodes", type=int, default=4, help="virtual Ray nodes")
    p.add_argument("--gpus-per-node", type=int, default=2, help="GPU slots per node")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between scheduling rounds")
    p.add_argument("--stop-grace", type=float, default=30.0, help="the service's --stop-grace")
    p.add_argument("--ls-pause", type=float, default=0.05, help="seconds between the lister's calls")
    p.add_argument("--quiet", type=float, default=3.0,
                   help="seconds with no replica starting or ending before the end counts as reached")
    p.add_argument("--timeout", type=float, default=180.0, help="per wait, seconds")
    p.add_argument("--request-timeout", type=float, default=60.0, help="per API call, seconds")
    p.add_argument("--stubborn-children", action="store_true",
                   help="the jobs' child processes ignore SIGTERM")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (state, logs)")
    p.add_argument("--views", action="store_true",
                   help="run the web view's and /metrics' leg instead (benchmarks/views_load.py)")
    args = p.parse_args(argv)
    if args.views:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import views_load

        return int(views_load.main(["--json"] if args.json else []))
    if min(args.jobs, args.threads, args.nodes, args.gpus_per_node) < 1:
        p.error("--jobs, --threads, --nodes and --gpus-per-node must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-up of the finally blocks
    work = Path(tempfile.mkdtemp(prefix="pollux-load-"))
    out: dict[str, Any] = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "cores": os.cpu_count(),
                           **git_commit()}
    try:
        run(args, work, out)
    except Exception as exc:      # the service broke mid-way: report what was measured, and why
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"the run broke: {out['error']}")
        print(json.dumps(out) if args.json else json.dumps(out, indent=2))
        return 1
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    gone = out["cancel_to_gone_s"]
    out["targets"] = {"lost": 0, "duplicated": 0, "cancel_to_gone_p99_s": 5.0, "submit_p99_ms": 200.0}
    # no replica alive at a cancel means the cancel-to-gone time was not measured at all
    out["targets_met"] = bool(gone["jobs"] > 0 and out["lost"] == 0 and out["duplicated"] == 0
                              and out["left_alive_after_stop"] == 0 and gone["not_gone"] == 0
                              and (gone["p99"] or 0.0) <= 5.0
                              and (out["latency_ms"]["submit"]["p99"] or 0.0) <= 200.0)
    log(f"lost {out['lost']}, duplicated {out['duplicated']}, cancel->gone p99 {gone['p99']} s "
        f"({gone['jobs']} job(s), {gone['not_gone']} not gone), "
        f"submit p99 {out['latency_ms']['submit']['p99']} ms, wall {out['wall_s']} s")
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
