#!/usr/bin/env python3
"""The chaos leg of issue 38: the service process SIGKILLed at random moments of a real run.

A real Pollux server (``pollux.cluster.server.start``: an embedded Ray host, by default 2 virtual
nodes x 2 GPU slots, and the service process, policy ``pollux``, rounds every 2 s, the API on one
fixed loopback port) runs from a fresh temporary folder. Two threads then run against it:

* **the workload** submits ``--jobs`` short training jobs in seeded bursts (4 client threads) and,
  after some bursts, cancels a seeded random part of the jobs not yet final, in a burst too. The
  bursts are spread over the kills (burst ``b`` of ``B`` waits for ``b·K/B`` kills). A call the
  service did not answer (it was killed meanwhile) waits for the restarted service and is settled
  the way a careful user would: a submit is looked up by its unique name and sent again only if the
  store does not hold it; a cancel is sent again (409 "already final" ends it).
* **the chaos** waits a seeded random time (``--gap``, uniform, counted from the previous recovery),
  lists the jobs, SIGKILLs the *service process* (the PID ``server.start`` returned; nothing else: not
  the Ray host, not the replicas), waits until it is reaped, and restarts it exactly as a user would
  after a crash: ``server.start`` on the same folder with the same options (what ``pollux server
  start`` calls, and what ``tests/test_cluster_e2e.py`` calls), which reuses the Ray host that is
  still up and starts only the service; that service adopts the replicas still running.

What dies with the service: nothing but the service. Every replica is a *detached* Ray actor whose
training process is the actor's child (``cluster/backends/ray_backend.py``), so a killed service
leaves them all training; the next service adopts each run whose replicas all live, stops a run
that lost some (none here: nothing else is killed) and stops every actor no stored run owns — a
launch cut short by the kill, whose job then starts again under a fresh restart number
(``cluster/control/recovery.py``). The report counts each (from ``service.log``).

**Recovery time** of a kill: from the instant before ``os.kill`` to the first answer of the
restarted service's ``GET /v1/cluster`` whose ``rounds`` is at least 1, i.e. the new service
answers its API *and* has finished a scheduling round of its own (``rounds`` counts the rounds of
the running process; it starts at 0). It includes reaping the killed process, ``server.start``
(its checks, spawning the service, the service's imports, connecting to Ray, adopting runs, opening
the API) and the first round. The API alone (first ``GET /v1/health`` answered) is reported too,
and per kill the new life's own account (``service.log``: seconds to connect to Ray and recover,
runs adopted, orphaned actors stopped). ``service_log.adoptions`` sums the runs adopted over all
lives (a run adopted by three lives counts three times).

**The job** is a small real script written to the temporary folder: a linear model on 256 fixed
examples, trained with ``pollux.torch`` (``AdaptiveDataParallel``, ``AdaptiveDataLoader`` at a fixed
global batch of 16, so an epoch is exactly one pass, ``remaining_epochs_until``, checkpoints through
the agent in ``POLLUX_CHECKPOINT_DIR``), 2–4 epochs of 16 steps, each step sleeping ``--step-s``
(the "work", which costs no CPU). Its dataset yields each example's index; every micro-batch appends
one line ``{"e": epoch, "p": global sample index of the step, "i": [indices]}`` to
``seen/<job>.<restart>.<rank>.jsonl``, after a header ``{"start": position, "epoch": e}`` giving
where the run resumed. Each process also writes a PID record that a thread polls in ``/proc``
every 50 ms (the watcher of ``benchmarks/service_load.py``).

Checks (reported in the JSON):

* **submitted**: jobs the service acknowledged (201), or stored though its answer was lost;
  **lost**: submitted but missing from ``GET /v1/jobs`` at the end, or not in a final state
  (succeeded, cancelled, failed) after ``--drain-timeout``; final states and failure reasons counted.
* **run twice** (per job, any of): two processes for one (restart, rank); two runs alive at once
  (seen in ``/proc``, or in the store's replica records); two stored jobs for one submission; and
  the examples: a run that resumed at position P undoes whatever earlier runs did at positions
  >= P (that is what resuming from a checkpoint means); what is left, per epoch, must hold every
  example at most once, and exactly once in a finished epoch (every epoch of a succeeded job, every
  epoch before the last of another). Work undone after a run that ended by SIGKILL (or without a
  stored record) is expected and counted as ``examples_redone_after_kill``; work undone after a run
  whose replicas all exited 0 or 143 (a graceful stop checkpoints first) is a violation.
* recovery time after each kill (p50, p99, max), kills done, wall time, the commit (read from
  ``.git``; git is not run).

Progress goes to stderr, one JSON object to stdout (``--json``). The server is stopped whatever
happens, and every process of the run still alive after that is killed by PID and counted.

    .venv/bin/python benchmarks/chaos.py --json                        # 100 kills, 300 jobs
    .venv/bin/python benchmarks/chaos.py --quick --json                # 3 kills, 12 jobs (< 2 min)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import commit_id
import service_load  # the /proc watcher and the duplicate-run checks

ROOT = Path(__file__).resolve().parents[1]
NAME_PREFIX = "chaos-"
#: Examples in each job's dataset and its fixed global batch: 16 steps an epoch, one pass each, and
#: no position skipped on 1 or 2 replicas (the sampler skips < K positions only where K·m does not
#: divide the pass).
EXAMPLES = 256
BATCH = 16
#: Exit codes of a run that stopped gracefully (the agent checkpoints before 143).
GRACEFUL = {0, 143}
FINAL = ("succeeded", "cancelled", "failed")
#: Every process that starts or joins Ray gets these (the project's rule for this machine).
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

JOB_SCRIPT = '''\
"""A chaos-leg job (benchmarks/chaos.py): a linear model on 256 examples with the Pollux agent."""
import json, os, sys, time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import pollux.torch as ptorch

out, epochs, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
os.environ["POLLUX_REFIT_INTERVAL_S"] = sys.argv[4]     # the agent's refits and hints
N, M0 = EXAMPLES, BATCH
job = os.environ.get("POLLUX_JOB_ID", "?")
restart = int(os.environ.get("POLLUX_RESTARTS", "-1"))
torch.set_num_threads(1)
started = time.time()
ptorch.init_process_group("gloo")
rank = dist.get_rank()
record = {"job": job, "restart": restart, "rank": rank, "pid": os.getpid(), "child": os.getpid(),
          "time": started}
path = os.path.join(out, "pids", "{job}.{restart}.{rank}.{pid}.json".format(**record))
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
gen = torch.Generator().manual_seed(0)
x = torch.randn(N, 8, generator=gen)
data = TensorDataset(x, (x[:, 0] > 0).long(), torch.arange(N))
net = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
model = ptorch.AdaptiveDataParallel(net, opt)            # restores model and optimiser if resuming
loader = ptorch.AdaptiveDataLoader(data, batch_size=M0, shuffle=True, seed=0)   # and its position
seen = open(os.path.join(out, "seen", f"{job}.{restart}.{rank}.jsonl"), "a", buffering=1)


def note(**kw):
    seen.write(json.dumps(kw) + "\\n")


note(start=loader.sampler.position, epoch=ptorch.current_epoch(), replicas=dist.get_world_size(),
     pid=os.getpid(), time=started)
for epoch in ptorch.remaining_epochs_until(epochs):
    for xb, yb, ib in loader:
        note(e=epoch, p=loader.sampler.position, i=ib.tolist())
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        time.sleep(step_s)
        opt.step()
    if rank == 0:
        note(end_epoch=epoch)
note(done=True, epoch=ptorch.current_epoch())
print("done", job, restart, rank, flush=True)
'''


def log(msg: str) -> None:
    print(f"[chaos] {msg}", file=sys.stderr, flush=True)


def stats_s(values: list[float]) -> dict[str, Any]:
    """Count, p50, p99 and max of durations in seconds."""
    xs = np.asarray(values, dtype=float)
    if xs.size == 0:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": int(xs.size), "p50": round(float(np.percentile(xs, 50)), 2),
            "p99": round(float(np.percentile(xs, 99)), 2), "max": round(float(xs.max()), 2)}


def read_commit() -> str | None:
    """The checked-out commit (:func:`commit_id.read_commit`)."""
    return commit_id.read_commit(ROOT)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------- the examples


def read_seen(folder: Path) -> dict[str, dict[int, dict[int, list[dict]]]]:
    """``job -> restart -> rank -> lines`` of the jobs' ``seen`` files (a torn last line is dropped)."""
    out: dict[str, dict[int, dict[int, list[dict]]]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        job, restart, rank = path.name[:-len(".jsonl")].rsplit(".", 2)
        lines = []
        for text in path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except ValueError:
                continue
        out.setdefault(job, {}).setdefault(int(restart), {})[int(rank)] = lines
    return out


def check_examples(runs: dict[int, dict[int, list[dict]]], graceful: dict[int, bool], epochs: int,
                   examples: int, succeeded: bool) -> dict[str, Any]:
    """One job's examples across its runs: see the module docstring.

    ``runs``: restart -> rank -> the lines of its ``seen`` file; ``graceful``: restart -> whether
    every replica of that run exited 0 or 143 (a run missing there counts as killed).
    """
    kept: list[tuple[int, dict]] = []               # (restart, data line), in the order trained
    redone_kill = redone_graceful = 0
    for restart in sorted(runs):
        ranks = runs[restart]
        starts = [ln["start"] for lines in ranks.values() for ln in lines if "start" in ln]
        resume = min(starts) if starts else math.inf      # no header (torn): nothing undone
        still = []
        for r, ln in kept:
            if ln["p"] >= resume:                  # undone: the run resumed before it
                if graceful.get(r, False):
                    redone_graceful += len(ln["i"])
                else:
                    redone_kill += len(ln["i"])
            else:
                still.append((r, ln))
        kept = still
        data = sorted((ln for lines in ranks.values() for ln in lines if "p" in ln), key=lambda ln: ln["p"])
        kept += [(restart, ln) for ln in data]
    per_epoch: dict[int, Counter[int]] = {}
    for _, ln in kept:
        per_epoch.setdefault(int(ln["e"]), Counter()).update(int(i) for i in ln["i"])
    last = max(per_epoch, default=-1)
    complete = set(range(epochs)) if succeeded else set(range(last))
    duplicated = sorted(e for e, c in per_epoch.items() if any(v > 1 for v in c.values()))
    missing = sorted(e for e in complete
                     if set(per_epoch.get(e, Counter())) != set(range(examples)))
    exact = sorted(e for e in complete if e not in duplicated and e not in missing)
    return {"epochs_complete": len(complete), "epochs_exact": len(exact), "duplicated_epochs": duplicated,
            "missing_epochs": missing, "examples_redone_after_kill": redone_kill,
            "examples_redone_after_graceful_stop": redone_graceful,
            "runs_with_data": sum(1 for r in runs.values() if any(ln for ln in r.values()))}


def graceful_runs(replicas: list[dict]) -> dict[int, bool]:
    """restart -> whether the store records every replica of that run exiting 0 or 143."""
    by: dict[int, list[Any]] = {}
    for r in replicas:
        by.setdefault(int(r["restart"]), []).append(r.get("exit_code"))
    return {k: all(c in GRACEFUL for c in codes) for k, codes in by.items()}


# ----------------------------------------------------------------------------------- the run


class Outage:
    """Whether the service is up; callers that got no answer wait here for the restarted one."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.halt = threading.Event()

    def wait_up(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.halt.is_set() and time.monotonic() < deadline:
            if self.up.wait(0.2):
                return True
        return False


class Chaos:
    """The run: the server, the workload, the kills, the final reading; fills ``out`` as it goes."""

    def __init__(self, args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
        self.args, self.work, self.out = args, work, out
        self.state = work / "state"
        self.rng = random.Random(args.seed)
        self.outage = Outage()
        self.lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = ""
        self.service_pid = 0
        self.kills: list[dict[str, Any]] = []
        self.kills_done = 0
        self.subs: dict[str, dict[str, Any]] = {}     # name -> submission record
        self.cancels: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._local = threading.local()
        self._clients: list[Any] = []

    # -- clients

    def client(self) -> Any:
        c = getattr(self._local, "client", None)
        if c is None:
            from pollux.cluster.client import PolluxClient
            c = self._local.client = PolluxClient(self.url, self.token, timeout=self.args.request_timeout)
            with self.lock:
                self._clients.append(c)
        return c

    def call(self, fn: Callable[[Any], Any], what: str) -> Any:
        """``fn(client)``, waiting out outages (no answer or 5xx) and retrying; ClientError otherwise."""
        from pollux.cluster.client import ClientError
        deadline = time.monotonic() + self.args.timeout
        while True:
            try:
                return fn(self.client())
            except ClientError as exc:
                if exc.status and exc.status < 500:
                    raise
                if time.monotonic() > deadline or self.outage.halt.is_set():
                    raise RuntimeError(f"{what}: no answer for {self.args.timeout:.0f} s: {exc}") from exc
                self.outage.wait_up(self.args.timeout)
                time.sleep(0.1)

    # -- the server

    def start_server(self, first: bool) -> None:
        from pollux.cluster import server
        a = self.args
        for attempt in range(3):
            try:
                info = server.start(self.state, local_nodes=a.nodes, gpus_per_node=a.gpus_per_node,
                                    policy="pollux", interval_s=a.interval, port=self.port,
                                    stop_grace_s=a.stop_grace, max_retries=a.max_retries, seed=a.seed,
                                    timeout_s=a.timeout, progress=log if first else None)
            except server.ServerError as exc:
                log(f"start failed (attempt {attempt + 1}): {exc}")
                self.errors.append(f"start: {str(exc)[:300]}")
                time.sleep(1.0)
                continue
            self.token, self.service_pid = info.token, info.service_pid
            return
        raise RuntimeError("the service could not be restarted 3 times in a row")

    def rounds(self) -> int | None:
        import httpx
        try:
            with httpx.Client(base_url=self.url, timeout=2.0,
                              headers={"Authorization": f"Bearer {self.token}"}) as c:
                r = c.get("/v1/cluster")
                return int(r.json()["rounds"]) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def health(self) -> bool:
        import httpx
        try:
            return httpx.get(f"{self.url}/v1/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    # -- the chaos

    def kill_once(self, index: int) -> dict[str, Any]:
        from pollux.cluster.backends.processes import pid_alive
        listing: list[dict] = []
        try:
            listing = self.client().jobs()
        except Exception:
            pass
        active = Counter(j["state"] for j in listing if j["name"].startswith(NAME_PREFIX)
                         and j["state"] not in FINAL)
        pid = self.service_pid
        self.outage.up.clear()
        t0 = time.monotonic()
        wall = time.time()
        os.kill(pid, signal.SIGKILL)
        while pid_alive(pid) and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        gone = time.monotonic() - t0
        # /proc shows the main thread a zombie while the process's other threads are still exiting,
        # and they hold its files (the service lock) until the last one is gone; the service is this
        # process's child, and waitpid returns only then. A start before that finds the folder's
        # service "already running" (see the docs' section).
        while time.monotonic() - t0 < 30:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:   # reaped elsewhere: wait for the lock instead
                from pollux.cluster.state.folder import SERVICE_LOCK, lock_holder
                while lock_holder(self.state / SERVICE_LOCK) is not None and time.monotonic() - t0 < 30:
                    time.sleep(0.01)
                break
            time.sleep(0.01)
        reaped = time.monotonic() - t0
        self.start_server(first=False)
        started = time.monotonic() - t0
        api = None
        while time.monotonic() - t0 < self.args.timeout:
            if self.health():
                api = time.monotonic() - t0
                break
            time.sleep(0.05)
        recovered = None
        while time.monotonic() - t0 < self.args.timeout:
            n = self.rounds()
            if n is not None and n >= 1:
                recovered = time.monotonic() - t0
                break
            time.sleep(0.05)
        self.outage.up.set()
        life = re.findall(r"in ([\d.]+) s; \d+ node\(s\); adopted (\d+) job\(s\), stopped (\d+) orphan\(s\)",
                          (self.state / "service.log").read_text(errors="replace"))
        rec = {"kill": index + 1, "at_s": round(wall - self.t_start, 2), "killed_pid": pid,
               "active_jobs": dict(active), "pid_gone_s": round(gone, 3), "reaped_s": round(reaped, 3),
               "start_returned_s": round(started, 2),
               "api_s": None if api is None else round(api, 2),
               "recovery_s": None if recovered is None else round(recovered, 2), "new_pid": self.service_pid,
               # the new life's own line: seconds to connect to Ray and recover, runs adopted, orphans
               "ray_and_recover_s": float(life[-1][0]) if life else None,
               "adopted": int(life[-1][1]) if life else None,
               "orphans_stopped": int(life[-1][2]) if life else None}
        log(f"kill {index + 1}/{self.args.kills}: PID {pid} ({dict(active)} active) -> PID "
            f"{self.service_pid}, API in {rec['api_s']} s, a round in {rec['recovery_s']} s; adopted "
            f"{rec['adopted']} run(s), stopped {rec['orphans_stopped']} orphan(s)")
        return rec

    def chaos(self) -> None:
        try:
            for k in range(self.args.kills):
                lo, hi = self.args.gap
                if self.outage.halt.wait(self.rng_chaos.uniform(lo, hi)):
                    return
                rec = self.kill_once(k)
                with self.lock:
                    self.kills.append(rec)
                    self.kills_done = k + 1
                if rec["recovery_s"] is None:
                    raise RuntimeError(f"kill {k + 1}: the service did not recover in "
                                       f"{self.args.timeout:.0f} s")
        except Exception as exc:
            self.errors.append(f"chaos: {type(exc).__name__}: {exc}")
            log(f"the chaos thread broke: {exc}")
            self.outage.halt.set()

    # -- the workload

    def submit(self, name: str, epochs: int) -> None:
        from pollux.cluster.client import ClientError
        spec = {"entrypoint": str(self.work / "job.py"),
                "args": [str(self.work), str(epochs), str(self.args.step_s), "2"],
                "working_dir": str(self.work), "init_batch_size": BATCH, "min_replicas": 1,
                "max_replicas": self.args.max_replicas}
        rec: dict[str, Any] = {"name": name, "epochs": epochs, "id": None, "how": None, "sends": 0,
                               "sent_at": time.time()}
        with self.lock:
            self.subs[name] = rec
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline and not self.outage.halt.is_set():
            rec["sends"] += 1
            try:
                rec["id"] = self.client().submit(spec, name=name)["id"]
                rec["how"] = "answered"
                return
            except ClientError as exc:
                if exc.status and exc.status < 500:
                    rec["how"] = f"refused {exc.status}: {str(exc)[:120]}"
                    return
            # no answer: the service died with the request; was it stored?
            self.outage.wait_up(self.args.timeout)
            try:
                found = [j["id"] for j in self.call(lambda c: c.jobs(), "ls") if j["name"] == name]
            except Exception:
                continue
            if found:
                rec["id"], rec["how"] = found[0], "stored_without_answer"
                return
        rec["how"] = rec["how"] or "gave up"

    def cancel(self, job_id: str) -> None:
        from pollux.cluster.client import ClientError
        rec: dict[str, Any] = {"id": job_id, "sent_at": time.time(), "result": None, "sends": 0}
        with self.lock:
            self.cancels.append(rec)
        deadline = time.monotonic() + self.args.timeout
        while time.monotonic() < deadline and not self.outage.halt.is_set():
            rec["sends"] += 1
            try:
                rec["result"] = self.client().cancel(job_id)["state"]
                return
            except ClientError as exc:
                if exc.status == 409:
                    rec["result"] = "already final"
                    return
                if exc.status and exc.status < 500:
                    rec["result"] = f"refused {exc.status}"
                    return
            self.outage.wait_up(self.args.timeout)
        rec["result"] = rec["result"] or "gave up"

    def workload(self) -> None:
        a = self.args
        rng = self.rng_work
        sizes: list[int] = []
        while sum(sizes) < a.jobs:
            sizes.append(min(rng.randint(*a.burst), a.jobs - sum(sizes)))
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="client")
        try:
            n = 0
            for b, size in enumerate(sizes):
                need = math.floor(b * a.kills / len(sizes))
                while self.kills_done < need and not self.outage.halt.is_set():
                    time.sleep(0.1)
                if self.outage.halt.wait(rng.uniform(0.0, 1.0)):
                    return
                names = [(f"{NAME_PREFIX}{n + i:05d}", rng.randint(a.epochs[0], a.epochs[1]))
                         for i in range(size)]
                n += size
                list(pool.map(lambda ne: self.submit(*ne), names))
                log(f"burst {b + 1}/{len(sizes)}: submitted {size} ({n}/{a.jobs}); "
                    f"kills so far {self.kills_done}")
                if rng.random() < a.cancel_prob:
                    if self.outage.halt.wait(rng.uniform(0.5, 3.0)):
                        return
                    try:
                        live = [j["id"] for j in self.call(lambda c: c.jobs(), "ls")
                                if j["name"].startswith(NAME_PREFIX) and j["state"] not in FINAL]
                    except Exception as exc:
                        self.errors.append(f"ls before a cancel burst: {exc}")
                        continue
                    victims = rng.sample(sorted(live), k=round(len(live) * rng.uniform(*a.cancel_fraction)))
                    list(pool.map(self.cancel, victims))
                    log(f"  cancelled {len(victims)} of {len(live)} job(s) not yet final")
        except Exception as exc:
            self.errors.append(f"workload: {type(exc).__name__}: {exc}")
            log(f"the workload thread broke: {exc}")
            self.outage.halt.set()
        finally:
            pool.shutdown(wait=True)

    # -- the whole

    def run(self) -> None:
        a = self.args
        self.t_start = time.time()
        self.rng_chaos = random.Random(self.rng.random())
        self.rng_work = random.Random(self.rng.random())
        (self.work / "pids").mkdir()
        (self.work / "seen").mkdir()
        (self.work / "job.py").write_text(JOB_SCRIPT.replace("EXAMPLES", str(EXAMPLES))
                                          .replace("BATCH", str(BATCH)))
        t = time.perf_counter()
        self.start_server(first=True)
        self.out["server_start_s"] = round(time.perf_counter() - t, 1)
        log(f"server up at {self.url} in {self.out['server_start_s']} s (state {self.state})")
        self.outage.up.set()
        self.watcher = service_load.Watcher(self.work / "pids")
        self.watcher.start()
        workload = threading.Thread(target=self.workload, name="workload", daemon=True)
        chaos = threading.Thread(target=self.chaos, name="chaos", daemon=True)
        workload.start()
        chaos.start()
        while workload.is_alive() or chaos.is_alive():
            time.sleep(0.2)
        self.out["load_s"] = round(time.time() - self.t_start, 1)
        if self.errors and self.outage.halt.is_set():
            raise RuntimeError("; ".join(self.errors[-3:]))
        # drain: every job the service holds must reach a final state
        ids = {r["id"] for r in self.subs.values() if r["id"]}
        deadline = time.monotonic() + a.drain_timeout
        left: list[dict] = []
        while time.monotonic() < deadline:
            listed = self.call(lambda c: c.jobs(), "ls")
            left = [j for j in listed if j["name"].startswith(NAME_PREFIX) and j["state"] not in FINAL]
            if not left:
                break
            time.sleep(1.0)
        self.out["drain_s"] = round(time.time() - self.t_start - self.out["load_s"], 1)
        if left:
            log(f"{len(left)} job(s) not final {a.drain_timeout:.0f} s after the load: "
                f"{Counter(j['state'] for j in left)}")
        time.sleep(0.5)
        self.watcher.poll()
        self.final(ids)

    def final(self, ids: set[str]) -> None:
        """Read the store's view, check it and the jobs' files; fill the report."""
        a = self.args
        listed = {j["id"]: j for j in self.call(lambda c: c.jobs(), "ls")}
        details: dict[str, dict] = {}
        for jid in sorted(set(listed) | ids):
            try:
                details[jid] = self.call(functools.partial(describe, job_id=jid), "describe")
            except Exception as exc:
                self.errors.append(f"describe {jid}: {exc}")
        subs = list(self.subs.values())
        submitted = [r for r in subs if r["id"]]
        missing = sorted(r["id"] for r in submitted if r["id"] not in listed)
        not_final = {r["id"]: listed[r["id"]]["state"] for r in submitted
                     if r["id"] in listed and listed[r["id"]]["state"] not in FINAL}
        states = Counter(listed[r["id"]]["state"] for r in submitted if r["id"] in listed)
        reasons = Counter(reason_key(details.get(r["id"], {}).get("failure_reason")) for r in submitted
                          if r["id"] in listed and listed[r["id"]]["state"] == "failed")
        self.out["jobs"] = {"asked": a.jobs, "submitted": len(submitted),
                            "answered": sum(r["how"] == "answered" for r in subs),
                            "stored_without_answer": sum(r["how"] == "stored_without_answer" for r in subs),
                            "sent_again_after_no_answer": sum(r["sends"] - 1 for r in subs),
                            "not_submitted": Counter(r["how"] for r in subs if not r["id"]),
                            "final_states": dict(states), "failure_reasons": dict(reasons),
                            "cancels": {"sent": len(self.cancels),
                                        "results": dict(Counter(c["result"] for c in self.cancels)),
                                        "sent_again_after_no_answer":
                                            sum(c["sends"] - 1 for c in self.cancels)},
                            "restarts": sum(int(d.get("restarts") or 0) for d in details.values()),
                            "failures": sum(int(d.get("failures") or 0) for d in details.values())}
        self.out["lost"] = len(missing) + len(not_final)
        self.out["lost_detail"] = {"missing": missing[:20], "not_final": dict(list(not_final.items())[:20])}
        self.out["every_job_final"] = not missing and not not_final
        # run twice: processes, store records, names
        replicas = {jid: d.get("replicas") or [] for jid, d in details.items()}
        for jid, reps in replicas.items():
            for r in reps:
                if r.get("pid"):
                    self.watcher.add(service_load.Proc(jid, int(r["restart"]), int(r["rank"]), int(r["pid"]),
                                                       "main", float(r["start_time"]), "store",
                                                       end=r.get("end_time")))
        dup = service_load.duplicated_runs(self.watcher, replicas)
        names = Counter(j["name"] for j in listed.values() if j["name"].startswith(NAME_PREFIX))
        dup["two_jobs_for_one_submission"] = sorted(n for n, c in names.items() if c > 1)
        # the examples
        seen = read_seen(self.work / "seen")
        by_name = {r["id"]: r for r in submitted}
        ex_total: Counter[str] = Counter()
        dup["examples_duplicated"], dup["examples_missing"], dup["redone_after_graceful_stop"] = [], [], []
        for jid, rec in sorted(by_name.items()):
            state = listed.get(jid, {}).get("state")
            res = check_examples(seen.get(jid, {}), graceful_runs(replicas.get(jid, [])), rec["epochs"],
                                 EXAMPLES, state == "succeeded")
            for key in ("epochs_complete", "epochs_exact", "examples_redone_after_kill",
                        "examples_redone_after_graceful_stop", "runs_with_data"):
                ex_total[key] += res[key]
            if res["duplicated_epochs"]:
                dup["examples_duplicated"].append(jid)
            if res["missing_epochs"]:
                dup["examples_missing"].append(jid)
            if res["examples_redone_after_graceful_stop"]:
                dup["redone_after_graceful_stop"].append(jid)
        self.out["examples"] = {"jobs_with_data": sum(1 for j in by_name if seen.get(j)), **ex_total}
        twice = set().union(*(set(v) for k, v in dup.items() if k != "two_jobs_for_one_submission"))
        self.out["run_twice"] = len(twice) + len(dup["two_jobs_for_one_submission"])
        self.out["run_twice_detail"] = {k: v[:20] for k, v in dup.items()}
        with self.watcher.lock:
            mains = [p for p in self.watcher.procs.values() if p.kind == "main"]
        store_pids = {int(r["pid"]) for reps in replicas.values() for r in reps if r.get("pid")}
        self.out["replica_runs"] = {"processes": len(mains), "recorded_in_store": len(store_pids),
                                    "unrecorded": len([p for p in mains if p.pid not in store_pids])}
        self.out["service_log"] = service_log_counts(self.state / "service.log")


def describe(client: Any, job_id: str) -> Any:
    return client.job(job_id)


def reason_key(reason: str | None) -> str:
    """A failure reason without its ids and numbers, so that like reasons count together."""
    return re.sub(r"\d+", "N", re.sub(r"[0-9a-f]{8,}", "…", reason or "?"))[:160]


def service_log_counts(path: Path) -> dict[str, int]:
    """What the service's lives said about recovery (``service.log``)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    adopted = [int(m) for m in re.findall(r"adopted (\d+) job\(s\)", text)]
    orphans = [int(m) for m in re.findall(r"stopped (\d+) orphan\(s\)", text)]
    return {"lives": len(re.findall(r"pollux service: API at", text)), "adoptions": sum(adopted),
            "orphan_actors_stopped": sum(orphans),
            "runs_partly_lost": len(re.findall(r"lost \d+ of \d+ replica\(s\) while the service was down",
                                               text)),
            "tracebacks": text.count("Traceback (most recent call last)")}


def sweep(work: Path, job_ids: set[str], watcher: Any) -> list[int]:
    """PIDs still alive of the run: its watched replicas, processes carrying one of its jobs, and
    processes whose working folder is inside ``work`` (a Ray worker or raylet started from it)."""
    pids = set(service_load.left_alive(watcher, job_ids)) if watcher is not None else set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == str(work) or cwd.startswith(str(work) + os.sep):
            st = service_load.proc_stat(int(entry))
            if st is not None and st[0] != "Z":
                pids.add(int(entry))
    return sorted(pids)


def parse_pair(kind: type) -> Callable[[str], tuple[Any, Any]]:
    def parse(text: str) -> tuple[Any, Any]:
        lo, _, hi = text.partition(":")
        a, b = kind(lo), kind(hi or lo)
        if not 0 <= a <= b:
            raise argparse.ArgumentTypeError(f"expected LO:HI with 0 <= LO <= HI, got {text!r}")
        return a, b
    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--kills", type=int, default=100, help="SIGKILLs of the service (default 100)")
    p.add_argument("--jobs", type=int, default=300, help="jobs to submit (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="3 kills, 12 jobs, gaps of 0.5-2 s, a cancel burst after each submit burst (< 2 min)")
    p.add_argument("--nodes", type=int, default=2, help="virtual Ray nodes (default 2)")
    p.add_argument("--gpus-per-node", type=int, default=2, help="GPU slots per node (default 2)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between scheduling rounds")
    p.add_argument("--max-replicas", type=int, default=2, help="each job's max_replicas (1 or 2)")
    p.add_argument("--epochs", type=parse_pair(int), default=(2, 4), help="epochs per job, LO:HI (2:4)")
    p.add_argument("--step-s", type=float, default=0.04, help="seconds each training step sleeps")
    p.add_argument("--gap", type=parse_pair(float), default=(1.0, 8.0),
                   help="seconds from a recovery to the next kill, LO:HI, uniform (1:8)")
    p.add_argument("--burst", type=parse_pair(int), default=(1, 8), help="jobs per submit burst, LO:HI")
    p.add_argument("--cancel-prob", type=float, default=0.5,
                   help="chance of a cancel burst after a submit burst")
    p.add_argument("--cancel-fraction", type=parse_pair(float), default=(0.1, 0.5),
                   help="part of the jobs not yet final that a cancel burst cancels, LO:HI")
    p.add_argument("--stop-grace", type=float, default=20.0, help="the service's --stop-grace")
    p.add_argument("--max-retries", type=int, default=3, help="the service's --max-retries")
    p.add_argument("--timeout", type=float, default=180.0, help="per wait or call, seconds")
    p.add_argument("--request-timeout", type=float, default=20.0, help="per API request, seconds")
    p.add_argument("--drain-timeout", type=float, default=1800.0,
                   help="seconds after the load for every job to end")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (state, logs, seen files)")
    args = p.parse_args(argv)
    if args.quick:
        # The smoke test's size. Its time is mostly the server's start, a restart per kill and the
        # drain. Gaps of 0.5-2 s (1-4 s before) still kill after each recovery while jobs launch,
        # as before (each kill stopped 3-4 orphans). With seed 0 the cancels leave 4 of the 12
        # jobs to drain (bursts of 5, 4 and 3, none final before its cancel burst: 5 - 2, 7 - 3,
        # 7 - 3 left), so they train in one wave on the 4 slots; a fraction of 0.2-0.4 left 5, and
        # the fifth job ran alone afterwards (about 12 s more).
        args.kills, args.jobs = min(args.kills, 3), min(args.jobs, 12)
        args.gap, args.burst, args.epochs = (0.5, 2.0), (3, 5), (2, 3)
        args.cancel_prob, args.cancel_fraction = 1.0, (0.3, 0.5)
        args.drain_timeout = min(args.drain_timeout, 90.0)
    if min(args.jobs, args.nodes, args.gpus_per_node, args.max_replicas) < 1 or args.kills < 0:
        p.error("--jobs, --nodes, --gpus-per-node and --max-replicas must be at least 1, --kills at least 0")
    os.environ.update(RAY_ENV)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-up of the finally blocks
    work = Path(tempfile.mkdtemp(prefix="pollux-chaos-"))
    out: dict[str, Any] = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "cores": os.cpu_count(),
                           "commit": read_commit(), "seed": args.seed, "quick": args.quick,
                           "kills_asked": args.kills, "jobs_asked": args.jobs,
                           "setup": {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
                                     "policy": "pollux", "interval_s": args.interval,
                                     "max_replicas": args.max_replicas,
                                     "epochs": list(args.epochs), "examples": EXAMPLES, "batch": BATCH,
                                     "step_s": args.step_s, "gap_s": list(args.gap),
                                     "burst": list(args.burst)}}
    started = time.perf_counter()
    run = Chaos(args, work, out)
    code = 0
    try:
        run.run()
    except BaseException as exc:     # report what was measured, and why it broke
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"the run broke: {out['error']}")
        code = 1
        if not isinstance(exc, Exception):
            code = 143
    finally:
        run.outage.halt.set()
        from pollux.cluster import server
        t = time.perf_counter()
        try:
            out["server_stop"] = server.stop(run.state, timeout_s=120, progress=log)
        except Exception as exc:
            out["server_stop"] = {"error": f"{type(exc).__name__}: {exc}"}
        out["server_stop_s"] = round(time.perf_counter() - t, 1)
        watcher = getattr(run, "watcher", None)
        leftovers = sweep(work, {r["id"] for r in run.subs.values() if r["id"]}, watcher)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out["left_alive_after_stop"] = len(leftovers)
        if leftovers:
            log(f"{len(leftovers)} process(es) left alive after server stop, killed: {leftovers[:20]}")
        if watcher is not None:
            watcher.halt.set()
        for c in run._clients:
            c.close()
        kills = run.kills
        rec = [k["recovery_s"] for k in kills if k["recovery_s"] is not None]
        out["kills"] = {"done": len(kills), "recovery_s": stats_s(rec),
                        "api_s": stats_s([k["api_s"] for k in kills if k["api_s"] is not None]),
                        "not_recovered": sum(k["recovery_s"] is None for k in kills), "per_kill": kills}
        out["errors"] = run.errors[:20]
        out["wall_s"] = round(time.perf_counter() - started, 1)
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if code == 0:
        p99 = out["kills"]["recovery_s"]["p99"]
        out["targets"] = {"kills": args.kills, "lost": 0, "run_twice": 0, "recovery_p99_s": 10.0}
        out["targets_met"] = bool(out["kills"]["done"] == args.kills and out["lost"] == 0
                                  and out["run_twice"] == 0 and out["every_job_final"]
                                  and out["kills"]["not_recovered"] == 0
                                  and (p99 is None or p99 <= 10.0) and out["left_alive_after_stop"] == 0)
        log(f"{out['kills']['done']} kill(s), recovery p50 {out['kills']['recovery_s']['p50']} s "
            f"p99 {p99} s; {out['jobs']['submitted']} job(s) submitted, lost {out['lost']}, run twice "
            f"{out['run_twice']}, final {out['jobs']['final_states']}; wall {out['wall_s']} s")
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
