#!/usr/bin/env python3
"""The live service at size (issue 38, step 4): 5,000 jobs stored, ~1,000 running on 4,096 GPUs.

The service is the real one but for where replicas run: the real SQLite store (``jobs.db`` in a
fresh state folder), the real scheduler with the real ``pollux`` policy, the real control loop
(:class:`~pollux.cluster.control.controller.Controller`: ticks, launches, exits, rescales, rounds)
and the real API (FastAPI under uvicorn on 127.0.0.1, with the web view and ``/metrics``), assembled
as :mod:`pollux.cluster.service` assembles them — in a **child process** of this benchmark (this
same file run with ``--serve``), so that the clients' threads do not share its interpreter, and its
memory is its own. Only the backend is simulated: :class:`SimulatedBackend` (in this file) "runs"
replicas as records on ``--nodes`` nodes of ``--gpus-per-node`` GPUs; a replica starts at once and
runs until it is signalled (SIGTERM: it exits 143, as the agent does after its checkpoint).

Before the service starts, the store is filled through :class:`JobStore`'s own calls:

* ``--jobs - --running - --queued`` *ended* jobs (succeeded, failed, cancelled; each with its
  transitions, an allocation and a few hints, as a job that ran has);
* ``--running + --queued`` *scheduled* jobs, pending, each with ``--history`` hints already
  reported (as by an earlier run of the job): :func:`pollux.hints.build_hints`, the body the agent
  builds (``pollux.torch.tuner``), with throughput parameters and gradient statistics drawn around
  a real job's. Each asks for at least ``floor(GPUs / --running)`` GPUs (``min_replicas``), so that
  at most about ``--running`` of them fit: the service's rounds start those (pending → starting →
  running on the simulated backend) and the rest stay queued.

Once the running jobs are up, for ``--duration`` seconds, with rounds every ``--interval`` seconds
(and at the next tick after any submit or cancel, as in the service):

* the *agents*: one thread sends ``PUT /v1/jobs/{id}/hints`` for every running job once per
  ``--hints-period`` seconds (the agent's ~30 s), with the job's own token (the one the controller
  issued to its run) and a ``current`` configuration, as ``pollux.torch.reporting`` does;
* the *users*: ``--clients`` of them, each calling in turn, with ``--pause`` seconds between calls:
  list every job (``GET /v1/jobs``, what ``pollux ls`` asks), list the running ones, describe a
  random job (``GET /v1/jobs/{id}``), submit a job, cancel one this benchmark submitted, and the
  nodes view (``GET /v1/cluster``, ``pollux nodes``).

The agents and each user run in a process of their own (``spawn``), as agents and people call a
service; ``--client-threads`` runs them as threads of this process instead, as before 2026-11-30 —
then one client's parsing of a full listing (~50 ms of ``json.loads``, holding that interpreter's
lock) delays the timing of the others' calls, which the service did not cause.

Reported (``--json``: one object on stdout; progress on stderr):

* ``round_s``: every scheduling round's wall time in the service (``Controller.run_round``: read
  the nodes, the policy's decision, the outlook, and the round's write to the store), p50/p99/max,
  and ``policy_s``, the part the service itself times and logs (``RoundResult.duration_s``: read
  the jobs and their hints, the views, the policy's ``decide``; stored in the ``rounds`` table);
  ``tick_s``: the control loop's ticks without a round (reconciling every active job);
* ``latency_ms``: p50/p99/max per call, all calls, and the calls sent while a round ran: from
  sending the request to holding the whole answer (before 2026-11-30 it also held the client's
  parsing of the answer's JSON, now ``client_parse_ms``, apart);
  ``errors`` (no answer, 5xx) and ``refused`` (4xx: e.g. hints from a run whose job was cancelled
  or restarted since the agents' last listing) per call;
* ``running_at_start``, ``running_at_end``, ``queued_at_end``: jobs running when the measuring
  starts and when the clients stop, and jobs waiting then; ``holding_at_end`` counts the jobs that
  hold GPUs when the clients stop (starting, running or rescaling), ``states_at_end`` by state;
* ``store``: the SQLite files' sizes (``jobs.db``, ``-wal``, ``-shm``) at the end, rows per table;
* ``worker_rss_mib``, ``worker_cpu_s_per_s``: the same of the service's child processes, its policy
  worker (rounds of 256 jobs or more are decided there; its CPU is over its whole life, per second
  measured);
* ``service_rss_mib``: the service process's resident memory (``/proc/<pid>/status``: ``VmHWM``, its
  peak, and ``VmRSS`` sampled every 0.5 s) — the *child* process, not this one;
* the acceptance targets (round p99 ≤ 1 s, every call's p99 ≤ 200 ms) and whether they were met.

Usage::

    .venv/bin/python benchmarks/service_scale.py --json            # 5,000 jobs, 1,000 running, 1024 x 4 GPUs
    .venv/bin/python benchmarks/service_scale.py --json --quick    # a smoke size, < 60 s
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pollux.cluster.backends.api import (
    NodeInfo,
    ReplicaExit,
    ReplicaHandle,
    ReplicaLaunch,
    actor_name,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import commit_id  # the script beside this one

ROOT = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "service-scale-admin-token"
#: Files the service child writes in its state folder for the benchmark.
ROUNDS_LOG = "bench-rounds.jsonl"
TOKENS_LOG = "bench-tokens.jsonl"
#: The acceptance of issue 38's service leg.
TARGET_ROUND_S = 1.0
TARGET_P99_MS = 200.0
#: The user calls measured, in the order each client thread makes them.
CALLS = ("ls", "ls_running", "describe", "submit", "cancel", "nodes")


def log(msg: str) -> None:
    print(f"[service scale] {msg}", file=sys.stderr, flush=True)


def stats(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> dict[str, Any]:
    """Count, p50, p99 and max of ``values`` times ``scale``."""
    xs = np.asarray(values, dtype=float) * scale
    if xs.size == 0:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": int(xs.size), "p50": round(float(np.percentile(xs, 50)), digits),
            "p99": round(float(np.percentile(xs, 99)), digits), "max": round(float(xs.max()), digits)}


# ----------------------------------------------------------------------------------- the backend


class SimulatedBackend:
    """A :class:`~pollux.cluster.backends.api.Backend` whose replicas are records: nodes of ``gpus``
    GPU slots; a replica is placed at once (Ray would only where its resources are free: the
    controller waits for a stopping run before it launches over it, so the benchmark trusts it),
    starts at once, and runs until signalled (SIGTERM: exit 143; SIGKILL: -9). References are
    ``(kind, actor name)`` tuples. Every run's job token is appended to ``tokens_log`` (JSON lines)
    so that the benchmark's agents can report hints as the job's own replicas would."""

    def __init__(self, nodes: int, gpus: int, tokens_log: Path | None = None) -> None:
        self.listed = [NodeInfo(name=f"node-{i:04d}", node_id=f"id-{i:04d}", address="127.0.0.1", gpus=gpus,
                                resources={"GPU": float(gpus), "CPU": 8.0 * gpus})
                       for i in range(nodes)]
        self.exit_codes: dict[str, int | None] = {}      # live replicas by name: None while running
        self._pids = itertools.count(100_000)
        self._tokens = None if tokens_log is None else open(tokens_log, "a")
        self.lock = threading.Lock()

    def nodes(self) -> list[NodeInfo]:
        return list(self.listed)

    def create_actors(self, job_id: str, restart: int, launches: Sequence[ReplicaLaunch],
                      nodes: Sequence[NodeInfo] | None = None) -> list[ReplicaHandle]:
        handles = []
        with self.lock:
            for s in launches:
                name = actor_name(job_id, restart, s.rank)
                self.exit_codes[name] = None
                handles.append(ReplicaHandle(job_id, restart, s.rank, s.node, name))
        token = launches[0].env.get("POLLUX_JOB_TOKEN") if launches else None
        if self._tokens is not None and token:
            self._tokens.write(json.dumps({"job": job_id, "restart": restart, "token": token}) + "\n")
            self._tokens.flush()
        return handles

    def rendezvous_async(self, handle: ReplicaHandle) -> Any:
        return ("rendezvous", handle.actor)

    def start_async(self, handles: Sequence[ReplicaHandle], launches: Sequence[ReplicaLaunch]) -> list[Any]:
        return [("start", h.actor) for h in handles]

    def exit_futures(self, handles: Sequence[ReplicaHandle]) -> list[Any]:
        return [("exit", h.actor) for h in handles]

    def ready(self, refs: Sequence[Any], timeout_s: float = 0.0) -> set[Any]:
        codes = self.exit_codes
        return {r for r in refs if r[0] != "exit" or codes.get(r[1], -9) is not None}

    def result(self, ref: Any, timeout_s: float = 10.0) -> Any:
        if ref[1] not in self.exit_codes:
            raise RuntimeError(f"actor {ref[1]} died")
        return ("127.0.0.1", 29_500) if ref[0] == "rendezvous" else {"pid": next(self._pids)}

    def exit_status(self, ref: Any) -> ReplicaExit:
        code = self.exit_codes.get(ref[1])
        return ReplicaExit(-9, lost=True) if code is None else ReplicaExit(code)

    def signal(self, handles: Sequence[ReplicaHandle], signum: int, timeout_s: float | None = None) -> None:
        with self.lock:
            for h in handles:
                if h.actor in self.exit_codes and self.exit_codes[h.actor] is None:
                    self.exit_codes[h.actor] = 143 if signum == signal.SIGTERM else -int(signum)

    def release(self, handles: Sequence[ReplicaHandle]) -> None:
        with self.lock:
            for h in handles:
                self.exit_codes.pop(h.actor, None)

    def find(self, job_id: str, restart: int, ranks: Sequence[int],
             nodes: Sequence[str]) -> list[ReplicaHandle]:
        return [ReplicaHandle(job_id, restart, rank, node, actor_name(job_id, restart, rank))
                for rank, node in zip(ranks, nodes, strict=True)
                if actor_name(job_id, restart, rank) in self.exit_codes]

    def actor_names(self) -> list[str]:
        return sorted(self.exit_codes)

    def kill_by_names(self, names: Sequence[str], grace_s: float = 5.0) -> None:
        self.release([ReplicaHandle("", 0, 0, "", n) for n in names])

    def shutdown(self) -> None:
        if self._tokens is not None:
            self._tokens.close()


# ----------------------------------------------------------------------------------- the service (child)


def serve(args: argparse.Namespace) -> int:
    """The service as :mod:`pollux.cluster.service` assembles it, on :class:`SimulatedBackend`;
    writes each round's and tick's time to ``ROUNDS_LOG``; stops on SIGTERM."""
    import uvicorn

    from pollux.cluster.api.app import create_app
    from pollux.cluster.api.listener import api_socket
    from pollux.cluster.control.controller import Controller, ControllerConfig
    from pollux.cluster.control.scheduler import Scheduler
    from pollux.cluster.state.store import JobStore
    from pollux.contract import LOG_FORMAT

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=LOG_FORMAT)
    state = Path(args.serve).resolve()
    store = JobStore(state / "jobs.db")
    sock = api_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    backend = SimulatedBackend(args.nodes, args.gpus_per_node, state / TOKENS_LOG)
    scheduler = Scheduler(store, policy_name=args.policy, interval_s=args.interval, seed=args.seed)
    config = ControllerConfig(state_dir=state, scheduler_url=url, interval_s=args.interval, tick_s=args.tick,
                              stop_grace_s=args.stop_grace)
    records = open(state / ROUNDS_LOG, "a")   # closed at the end

    class TimedController(Controller):
        """The controller, its rounds and ticks timed into ``ROUNDS_LOG``."""

        in_round = False

        def run_round(self, now: float) -> None:
            start, t = time.time(), time.perf_counter()
            self.in_round = True
            try:
                super().run_round(now)
            finally:
                self.in_round = False
            last = self.scheduler.last_result
            records.write(json.dumps({"kind": "round", "start": start, "s": time.perf_counter() - t,
                                      "policy_s": None if last is None else last.duration_s,
                                      "jobs": None if last is None else last.num_jobs,
                                      "changed": None if last is None else len(last.changed)}) + "\n")
            records.flush()

        def tick(self, now: float | None = None) -> None:
            before, start, t = self.rounds, time.time(), time.perf_counter()
            super().tick(now)
            records.write(json.dumps({"kind": "tick", "start": start, "s": time.perf_counter() - t,
                                      "round": self.rounds != before, "groups": len(self.groups),
                                      "launching": len(self.launching)}) + "\n")
            records.flush()

    controller = TimedController(store, backend, scheduler, config)
    controller.recover()

    def cluster_info() -> dict[str, Any]:   # as the service answers GET /v1/cluster
        return {"nodes": [{"name": n.name, "gpus": n.gpus, "address": n.address, "gpu_type": n.gpu_type}
                          for n in controller.nodes],
                "total_gpus": sum(n.gpus for n in controller.nodes), "policy": scheduler.policy_name,
                "interval_s": args.interval, "rounds": controller.rounds, "ray_address": None,
                "running_jobs": len(controller.groups), "run_as": None, "fleet": None}

    app = create_app(store, ADMIN_TOKEN, log_dir=config.log_dir, on_change=controller.request_round,
                     cluster_info=cluster_info, node_types=dict,
                     node_resources=lambda: [dict(n.resources) for n in controller.nodes],
                     state_dir=state, wait_for_round=controller.round_gate.wait_quiet)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    api = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="api", daemon=True)
    api.start()
    while not server.started:
        if not api.is_alive():
            return 1
        time.sleep(0.05)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    loop = threading.Thread(target=controller.run, args=(stop,), name="control", daemon=True)
    loop.start()
    tmp = state / "service.json.tmp"
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    tmp.replace(state / "service.json")
    stop.wait()
    loop.join(timeout=120)
    server.should_exit = True
    api.join(timeout=30)
    controller.shutdown(grace_s=5.0)
    backend.shutdown()
    records.close()
    store.close()
    return 0


# ----------------------------------------------------------------------------------- the store's filling


class Agents:
    """What the jobs' agents report: hints built by :func:`pollux.hints.build_hints` from throughput
    parameters and gradient statistics drawn once per job around a real job's (the profile of
    ``benchmarks/views_load.py``), moving a little from one report to the next as training goes."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.jobs: dict[str, dict[str, Any]] = {}

    def hints(self, job_id: str, current: dict[str, Any] | None = None) -> dict[str, Any]:
        from pollux.goodput import GradStats, ThroughputParams
        from pollux.hints import build_hints

        rng = self.rng
        j = self.jobs.get(job_id)
        if j is None:
            scale = float(rng.uniform(0.5, 2.0))
            j = self.jobs[job_id] = {
                "params": ThroughputParams(0.0177 * scale, 0.000697 * scale, 0.0342, 0.00165, 0.128, 0.0026,
                                           2.23),
                "sqr": float(rng.uniform(1, 20)), "var": float(rng.uniform(1, 40)),
                "init": int(rng.choice([64, 128, 256])), "progress": 0.0, "epoch": 0, "seen": 1}
        j["progress"] += float(rng.uniform(1e3, 1e4))
        j["epoch"] += int(rng.random() < 0.2)
        grad = GradStats(sqr=j["sqr"] * float(rng.uniform(0.9, 1.1)),
                         var=j["var"] * float(rng.uniform(0.9, 1.1)) * (1 + j["epoch"] / 10))
        if current is not None:
            j["seen"] = max(j["seen"], int(current["replicas"]))
        return build_hints(params=j["params"], grad=grad, init_batch_size=j["init"], max_batch_size=4096,
                           local_bsz_bounds=(16, 512), accumulation=True, max_replicas_seen=j["seen"],
                           progress=j["progress"], epoch=j["epoch"], current=current)


def job_spec(entrypoint: Path, min_gpus: int, init_batch_size: int = 128) -> dict[str, Any]:
    return {"entrypoint": str(entrypoint), "args": ["--epochs", "90"], "init_batch_size": init_batch_size,
            "max_batch_size": 4096, "min_replicas": min_gpus, "max_replicas": max(4 * min_gpus, 16)}


def fill(store: Any, args: argparse.Namespace, entrypoint: Path, agents: Agents,
         min_gpus: int) -> dict[str, int]:
    """The store's jobs (see the module doc); returns how many of each kind."""
    ended = max(args.jobs - args.running - args.queued, 0)
    scheduled = args.jobs - ended
    t = time.time() - 86_400.0 * 7       # a week of history
    step = 86_400.0 * 6 / max(args.jobs, 1)
    endings = ("succeeded", "succeeded", "succeeded", "failed", "cancelled")
    done = 0
    for i in range(args.jobs):
        owner = f"user{i % 20}" if i % 4 else None
        job = store.submit(job_spec(entrypoint, min_gpus if i >= ended else 1), owner=owner,
                           name=f"train-{i:05d}", now=t)
        t += step
        if i < ended:      # a job that ran and ended
            node = f"node-{i % args.nodes:04d}"
            store.transition(job.id, "starting", now=t, allocation={node: 1 + i % args.gpus_per_node})
            store.transition(job.id, "running", now=t + 30)
            for k in range(2):
                store.put_hints(job.id, agents.hints(job.id), now=t + 60 + 30 * k)
            store.transition(job.id, endings[i % len(endings)], now=t + 3600)
            agents.jobs.pop(job.id, None)
        else:              # scheduled: pending, with the hints an earlier run reported
            for k in range(args.history):
                store.put_hints(job.id, agents.hints(job.id), now=t + 30 * k)
        done += 1
        if done % 1000 == 0:
            log(f"filled {done}/{args.jobs} job(s)")
    return {"ended": ended, "scheduled": scheduled}


def store_files(state: Path) -> dict[str, int]:
    """Sizes in bytes of the SQLite files."""
    return {p.name: p.stat().st_size for p in sorted(state.glob("jobs.db*")) if p.is_file()}


def table_rows(db: Path) -> dict[str, int]:
    """Rows per table of the store (read-only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%'")]
        return {n: int(conn.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0]) for n in sorted(names)}
    finally:
        conn.close()


# ----------------------------------------------------------------------------------- measuring


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (KiB) of a process, empty when it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (Linux ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except (OSError, ValueError):
        pass
    return out


class Sampler(threading.Thread):
    """The service process's memory every ``period_s``, and its children's (the policy worker,
    which holds the policy and its memos once large rounds run there): their resident sizes summed,
    and each child's peak, last seen."""

    def __init__(self, pid: int, period_s: float = 0.5) -> None:
        super().__init__(name="sampler", daemon=True)
        self.pid, self.period_s = pid, period_s
        self.rss_kib: list[int] = []
        self.hwm_kib = 0
        self.children_rss_kib: list[int] = []
        self.children_hwm_kib: dict[int, int] = {}
        self.children_cpu_s: dict[int, float] = {}
        self.halt = threading.Event()

    def sample(self) -> None:
        st = proc_status(self.pid)
        if "VmRSS" in st:
            self.rss_kib.append(st["VmRSS"])
        self.hwm_kib = max(self.hwm_kib, st.get("VmHWM", 0))
        total = 0
        for child in child_pids(self.pid):
            cst = proc_status(child)
            total += cst.get("VmRSS", 0)
            self.children_hwm_kib[child] = max(self.children_hwm_kib.get(child, 0), cst.get("VmHWM", 0))
            cpu = proc_cpu_s(child)
            if cpu is not None:
                self.children_cpu_s[child] = cpu
        self.children_rss_kib.append(total)

    def run(self) -> None:
        while not self.halt.wait(self.period_s):
            self.sample()


class Calls:
    """Timed API calls of every thread: ``(name, sent wall time, seconds, HTTP status)``, the seconds
    from sending the request to holding the whole answer; and apart, ``(name, seconds)`` the client
    then spent parsing the answer's JSON (its own work, not the API's: 2.9 MB for a full listing)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, int]] = []
        self.parse: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        import httpx

        sent, t = time.time(), time.perf_counter()
        body, status = None, 0
        try:
            response = fn()         # the whole body is read before this returns (no streaming)
            answered = time.perf_counter()
            status = response.status_code
            if response.is_success:
                body = response.json()
        except httpx.HTTPError:
            status = 0
            answered = time.perf_counter()
        parsed = time.perf_counter()
        with self.lock:
            self.rows.append((name, sent, answered - t, status))
            self.parse.append((name, parsed - answered))
        return body


class User(threading.Thread):
    """One user's client: the calls of ``CALLS`` in turn, ``pause_s`` between calls."""

    def __init__(self, index: int, url: str, calls: Calls, spec: dict[str, Any], job_ids: list[str],
                 pause_s: float, halt: Any, seed: int) -> None:
        super().__init__(name=f"user-{index}", daemon=True)
        self.index, self.url, self.calls, self.spec = index, url, calls, spec
        self.job_ids, self.pause_s, self.halt = job_ids, pause_s, halt
        self.rng = random.Random(seed)
        self.mine: list[str] = []     # submitted by this user, not cancelled yet
        self.submitted = self.cancelled = 0

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=120,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            http.get("/v1/health")                 # connected before anything is timed
            for n in itertools.count():
                if self.halt.is_set():
                    return
                name = CALLS[(n + self.index) % len(CALLS)]
                if name == "ls":
                    self.calls.timed(name, lambda: http.get("/v1/jobs"))
                elif name == "ls_running":
                    self.calls.timed(name, lambda: http.get("/v1/jobs", params={"state": "running"}))
                elif name == "describe":
                    self.calls.timed(name, partial(http.get, f"/v1/jobs/{self.rng.choice(self.job_ids)}"))
                elif name == "submit":
                    body = {"spec": self.spec, "name": f"scale-{self.index}-{n}"}
                    job = self.calls.timed(name, partial(http.post, "/v1/jobs", json=body))
                    if job is not None:
                        self.mine.append(job["id"])
                        self.submitted += 1
                elif name == "cancel" and self.mine:
                    cancel = partial(http.post, f"/v1/jobs/{self.mine.pop(0)}/cancel")
                    if self.calls.timed(name, cancel) is not None:
                        self.cancelled += 1
                elif name == "nodes":
                    self.calls.timed(name, lambda: http.get("/v1/cluster"))
                self.halt.wait(self.pause_s)


class Reporter(threading.Thread):
    """The running jobs' agents: each job's hints once per ``period_s``, with its run's token."""

    def __init__(self, url: str, state: Path, calls: Calls, agents: Agents, period_s: float,
                 halt: Any) -> None:
        super().__init__(name="agents", daemon=True)
        self.url, self.state, self.calls, self.agents = url, state, calls, agents
        self.period_s, self.halt = period_s, halt
        self.tokens: dict[str, tuple[int, str]] = {}
        self._read = 0
        self.sent = self.refused = 0

    def read_tokens(self) -> None:
        try:
            with open(self.state / TOKENS_LOG) as f:
                f.seek(self._read)
                lines = f.readlines()
                self._read = f.tell()
        except OSError:
            return
        for line in lines:
            if line.endswith("\n"):
                rec = json.loads(line)
                if rec["restart"] >= self.tokens.get(rec["job"], (-1, ""))[0]:
                    self.tokens[rec["job"]] = (rec["restart"], rec["token"])

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=120,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            while not self.halt.is_set():
                started = time.monotonic()
                running = http.get("/v1/jobs", params={"state": "running"}).json()
                self.read_tokens()
                gap = self.period_s / max(len(running), 1)
                for i, job in enumerate(running):
                    if self.halt.is_set():
                        return
                    run = self.tokens.get(job["id"])
                    if run is None:
                        continue
                    replicas = sum(job["allocation"].values())
                    current = {"replicas": replicas, "local_bsz": 64, "accum_steps": 0,
                               "batch_size": 64 * replicas, "step_time": 0.25, "steps": 120}
                    body = self.agents.hints(job["id"], current)
                    headers = {"Authorization": f"Bearer {run[1]}"}
                    put = partial(http.put, f"/v1/jobs/{job['id']}/hints", json=body, headers=headers)
                    ok = self.calls.timed("hints", put)
                    self.sent += 1
                    self.refused += ok is None
                    self.halt.wait(max(started + (i + 1) * gap - time.monotonic(), 0.0))


def client_process(kind: str, options: dict[str, Any], go: Any, halt: Any, results: Any) -> None:
    """One client (a user, or the agents) in a process of its own, as people and agents call a
    service: with its own interpreter, parsing one answer (a full listing: ~50 ms of JSON, holding
    that interpreter's lock) cannot hold up another client's timing. Sends ``("ready",)``, waits for
    ``go``, runs until ``halt``, then sends its calls and counters."""
    results.put(("ready",))
    go.wait()
    calls = Calls()
    if kind == "agents":
        agents = Reporter(calls=calls, halt=halt, **options)
        agents.run()
        counters = {"sent": agents.sent, "refused": agents.refused}
    else:
        user = User(calls=calls, halt=halt, **options)
        user.run()
        counters = {"submitted": user.submitted, "cancelled": user.cancelled}
    results.put((kind, calls.rows, calls.parse, counters))


class ClientProcesses:
    """The agents and the users, each in a process of its own (:func:`client_process`)."""

    def __init__(self, agents: dict[str, Any], users: list[dict[str, Any]]) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.go, self.halt, self.results = context.Event(), context.Event(), context.Queue()
        # Daemons: whatever happens to this process, its clients do not outlive it.
        self.processes = [context.Process(target=client_process, name=f"client-{kind}-{i}", daemon=True,
                                          args=(kind, options, self.go, self.halt, self.results))
                          for i, (kind, options) in enumerate([("agents", agents)]
                                                              + [("user", u) for u in users])]
        self.counters: dict[str, int] = {"sent": 0, "refused": 0, "submitted": 0, "cancelled": 0}

    def start(self) -> None:
        """Start every client and return when all are ready to call (imports done)."""
        for process in self.processes:
            process.start()
        for _ in self.processes:
            self._next("start", timeout_s=120)
        self.go.set()

    def stop(self, calls: Calls) -> None:
        """Halt the clients; add their calls to ``calls`` and their counters to :attr:`counters`."""
        self.halt.set()
        try:
            for _ in self.processes:
                _, rows, parse, counters = self._next("report", timeout_s=180)
                calls.rows += rows
                calls.parse += parse
                for key, value in counters.items():
                    self.counters[key] += value
        finally:
            self.close()

    def close(self) -> None:
        """Stop every client still running (a no-op once they have ended)."""
        self.halt.set()
        for process in self.processes:
            if process.pid is None:
                continue                    # never started
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()

    def _next(self, what: str, timeout_s: float) -> Any:
        """The next message of a client; a clear error when a client died or did not answer."""
        import queue

        try:
            return self.results.get(timeout=timeout_s)
        except queue.Empty:
            dead = [f"{p.name} (exit {p.exitcode})" for p in self.processes if p.exitcode is not None]
            raise RuntimeError(f"client processes: no {what} message within {timeout_s:.0f} s; "
                               f"ended: {', '.join(dead) or 'none'}") from None


def overlapping(sent: float, seconds: float, rounds: list[tuple[float, float]]) -> bool:
    """Whether a call ``[sent, sent + seconds]`` overlapped one of the rounds ``(start, end)``."""
    return any(start < sent + seconds and sent < end for start, end in rounds)


# ----------------------------------------------------------------------------------- the benchmark


def read_records(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def wait_running(http: Any, want: int, timeout_s: float) -> tuple[int, float]:
    """Poll until ``want`` jobs run (or nothing changes for 20 s, or the timeout); (running, seconds)."""
    start = time.monotonic()
    last, last_change, running = -1, start, 0
    while time.monotonic() - start < timeout_s:
        running = len(http.get("/v1/jobs", params={"state": "running"}).json())
        if running != last:
            last, last_change = running, time.monotonic()
            log(f"{running} job(s) running after {time.monotonic() - start:.0f} s")
        if running >= want or time.monotonic() - last_change > 20.0:
            break
        time.sleep(1.0)
    return running, time.monotonic() - start


def run(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    import httpx

    from pollux.cluster.state.lifecycle import ACTIVE_STATES
    from pollux.cluster.state.store import JobStore

    state = work / "state"
    state.mkdir(mode=0o700)
    entrypoint = work / "train.py"
    entrypoint.write_text("# a stand-in training script: the simulated backend never runs it\n")
    total_gpus = args.nodes * args.gpus_per_node
    min_gpus = max(total_gpus // max(args.running, 1), 1)
    out["min_gpus_per_scheduled_job"] = min_gpus
    agents = Agents(args.seed)
    t = time.perf_counter()
    with JobStore(state / "jobs.db") as store:
        out["filled"] = fill(store, args, entrypoint, agents, min_gpus)
    out["fill_s"] = round(time.perf_counter() - t, 1)
    log(f"store filled in {out['fill_s']} s: {out['filled']}")

    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(state),
           "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
           "--interval", str(args.interval), "--tick", str(args.tick), "--policy", args.policy,
           "--seed", str(args.seed)]
    service = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)
    out["service_pid_note"] = "memory is the service child process's (/proc/<pid>/status)"
    sampler = Sampler(service.pid)
    halt = threading.Event()
    threads: list[threading.Thread] = []
    clients: ClientProcesses | None = None
    try:
        deadline = time.monotonic() + 120
        while not (state / "service.json").exists():
            if service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start (exit {service.poll()})")
            time.sleep(0.1)
        url = json.loads((state / "service.json").read_text())["url"]
        sampler.start()
        log(f"service (PID {service.pid}) at {url}; waiting for ~{args.running} running job(s)")
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=url, timeout=120, headers=admin) as http:
            running, warm_s = wait_running(http, min(args.running, total_gpus // min_gpus), args.timeout)
            out["running_at_start"] = running
            out["warmup_s"] = round(warm_s, 1)
            every = [j["id"] for j in http.get("/v1/jobs").json()]
            cpu0 = proc_cpu_s(service.pid)
            calls = Calls()
            spec = job_spec(entrypoint, min_gpus)
            agents_options = {"url": url, "state": state, "agents": agents, "period_s": args.hints_period}
            users_options = [{"index": i, "url": url, "spec": spec, "job_ids": every, "pause_s": args.pause,
                              "seed": args.seed + i} for i in range(args.clients)]
            clients = None if args.client_threads else ClientProcesses(agents_options, users_options)
            if clients is not None:
                clients.start()
            measure_start = time.time()
            if clients is None:
                reporter = Reporter(calls=calls, halt=halt, **agents_options)
                users = [User(calls=calls, halt=halt, **u) for u in users_options]
                threads += [reporter, *users]
                for th in threads:
                    th.start()
            log(f"measuring for {args.duration:.0f} s: {args.clients} user(s), agents' hints every "
                f"{args.hints_period:.0f} s per running job, rounds every {args.interval:g} s; clients in "
                f"{'threads of this process' if clients is None else 'processes of their own'}")
            halt.wait(args.duration)
            halt.set()
            if clients is not None:
                clients.stop(calls)
                counters = clients.counters
            else:
                for th in threads:
                    th.join(timeout=180)
                counters = {"sent": reporter.sent, "refused": reporter.refused,
                            "submitted": sum(u.submitted for u in users),
                            "cancelled": sum(u.cancelled for u in users)}
            measure_end = time.time()
            cpu1 = proc_cpu_s(service.pid)
            out["running_at_end"] = len(http.get("/v1/jobs", params={"state": "running"}).json())
            # a job being started or rescaled holds its GPUs too; a slow machine has more of them
            holding_states = sorted(ACTIVE_STATES)
            holding = http.get("/v1/jobs", params={"state": holding_states}).json()
            out["holding_at_end"] = len(holding)
            out["states_at_end"] = {s: sum(1 for j in holding if j["state"] == s) for s in holding_states}
            out["queued_at_end"] = len(http.get("/v1/jobs", params={"state": "pending"}).json())
            out["jobs_at_end"] = len(http.get("/v1/jobs").json())
        sampler.sample()
        out["store"] = {"bytes": store_files(state), "rows": table_rows(state / "jobs.db")}
        out["store"]["mib"] = round(sum(out["store"]["bytes"].values()) / 2**20, 1)
    finally:
        halt.set()
        if clients is not None:
            clients.close()
        sampler.halt.set()
        if service.poll() is None:
            service.send_signal(signal.SIGTERM)
            try:
                service.wait(timeout=180)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        out["service_exit"] = service.returncode

    window = [r for r in read_records(state / ROUNDS_LOG) if measure_start <= r["start"] <= measure_end]
    rounds = [r for r in window if r["kind"] == "round"]
    ticks = [r for r in window if r["kind"] == "tick"]
    spans = [(r["start"], r["start"] + r["s"]) for r in rounds]
    wall = measure_end - measure_start
    out["measured_s"] = round(wall, 1)
    out["rounds"] = len(rounds)
    out["round_s"] = stats([r["s"] for r in rounds], digits=3)
    out["policy_s"] = stats([r["policy_s"] for r in rounds if r["policy_s"] is not None], digits=3)
    out["round_jobs"] = stats([r["jobs"] for r in rounds if r["jobs"] is not None], digits=0)
    out["round_changed"] = stats([r["changed"] for r in rounds if r["changed"] is not None], digits=0)
    out["round_busy_fraction"] = round(sum(r["s"] for r in rounds) / wall, 3) if wall > 0 else None
    out["tick_s"] = stats([r["s"] for r in ticks], digits=3)
    out["tick_without_round_s"] = stats([r["s"] for r in ticks if not r["round"]], digits=3)
    names = ("hints", *CALLS)
    out["latency_ms"] = {n: stats([s for c, _, s, _ in calls.rows if c == n], 1000.0) for n in names}
    out["latency_ms"]["all"] = stats([s for _, _, s, _ in calls.rows], 1000.0)
    out["client_parse_ms"] = {n: stats([s for c, s in calls.parse if c == n], 1000.0) for n in names}
    out["latency_during_rounds_ms"] = {
        n: stats([s for c, sent, s, _ in calls.rows if c == n and overlapping(sent, s, spans)], 1000.0)
        for n in names}
    # errors: no answer or a 5xx; refused: a 4xx (an agent's token of a run replaced since, a job ended)
    out["errors"] = {n: sum(1 for c, _, _, st in calls.rows if c == n and (st == 0 or st >= 500))
                     for n in names}
    out["refused"] = {n: sum(1 for c, _, _, st in calls.rows if c == n and 400 <= st < 500) for n in names}
    out["calls_per_s"] = round(len(calls.rows) / wall, 1) if wall > 0 else None
    out["submitted"] = counters["submitted"]
    out["cancelled"] = counters["cancelled"]
    out["hints_sent"] = counters["sent"]
    out["service_cpu_s_per_s"] = (round((cpu1 - cpu0) / wall, 2)
                                  if cpu0 is not None and cpu1 is not None and wall > 0 else None)
    out["service_rss_mib"] = {"peak": round(sampler.hwm_kib / 1024, 1),
                              "sampled_max": round(max(sampler.rss_kib, default=0) / 1024, 1),
                              "sampled_p50": round(float(np.median(sampler.rss_kib)) / 1024, 1)
                              if sampler.rss_kib else None,
                              "of": "the service child process (VmHWM / VmRSS)"}
    out["worker_rss_mib"] = {"peak": round(max(sampler.children_hwm_kib.values(), default=0) / 1024, 1),
                             "sampled_max": round(max(sampler.children_rss_kib, default=0) / 1024, 1),
                             "processes": len(sampler.children_hwm_kib),
                             "of": "the service's child processes: its policy worker (VmHWM / VmRSS)"}
    out["worker_cpu_s_per_s"] = (round(sum(sampler.children_cpu_s.values()) / wall, 2)
                                 if sampler.children_cpu_s and wall > 0 else None)
    p99s = [v["p99"] for k, v in out["latency_ms"].items() if k != "all" and v["p99"] is not None]
    out["targets"] = {"round_p99_s": TARGET_ROUND_S, "api_p99_ms": TARGET_P99_MS}
    out["targets_met"] = {
        "round": out["round_s"]["p99"] is not None and out["round_s"]["p99"] <= TARGET_ROUND_S,
        "api": bool(p99s) and max(p99s) <= TARGET_P99_MS}


def commit() -> str | None:
    """The checked-out commit (:func:`commit_id.read_commit`)."""
    return commit_id.read_commit(ROOT)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quick", action="store_true", help="a smoke size (400 jobs, 40 running, 32 x 4 GPUs, "
                                                        "15 s), under a minute")
    p.add_argument("--jobs", type=int, default=5000, help="jobs in the store")
    p.add_argument("--running", type=int, default=1000, help="jobs that should run")
    p.add_argument("--queued", type=int, default=200, help="scheduled jobs beyond --running (they queue)")
    p.add_argument("--nodes", type=int, default=1024)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--history", type=int, default=5, help="hints already reported per scheduled job")
    p.add_argument("--duration", type=float, default=120.0, help="seconds measured")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between scheduling rounds")
    p.add_argument("--tick", type=float, default=0.5, help="the control loop's tick")
    p.add_argument("--clients", type=int, default=4, help="user client threads")
    p.add_argument("--pause", type=float, default=0.2, help="seconds between a user's calls")
    p.add_argument("--hints-period", type=float, default=30.0, help="seconds between an agent's hints")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the jobs to run")
    p.add_argument("--policy", default="pollux")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--client-threads", action="store_true",
                   help="run the users and the agents as threads of this process (before 2026-11-30: "
                        "one client's JSON parsing then delays the others' timings)")
    p.add_argument("--serve", metavar="STATE_DIR", help=argparse.SUPPRESS)   # the service child
    p.add_argument("--stop-grace", type=float, default=5.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args)
    if args.quick:
        args.jobs, args.running, args.queued, args.nodes, args.duration = 400, 40, 10, 32, 15.0
        args.timeout = min(args.timeout, 30.0)
    if min(args.jobs, args.running, args.nodes, args.gpus_per_node, args.clients) < 1:
        p.error("--jobs, --running, --nodes, --gpus-per-node and --clients must be at least 1")
    if args.running + args.queued > args.jobs:
        p.error("--running + --queued must not exceed --jobs")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the finally blocks (the service stops)
    work = Path(tempfile.mkdtemp(prefix="pollux-scale-"))
    out: dict[str, Any] = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "cores": os.cpu_count(),
                           "commit": commit(), "jobs": args.jobs, "running_target": args.running,
                           "queued_target": args.queued, "nodes": args.nodes,
                           "gpus_per_node": args.gpus_per_node, "gpus": args.nodes * args.gpus_per_node,
                           "policy": args.policy, "interval_s": args.interval, "clients": args.clients,
                           "pause_s": args.pause, "hints_period_s": args.hints_period, "quick": args.quick,
                           "clients_in": "threads" if args.client_threads else "processes"}
    started = time.perf_counter()
    code = 0
    try:
        run(args, work, out)
    except Exception as exc:     # report what was measured, and why it stopped
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"the run broke: {out['error']}")
        code = 1
    finally:
        out["wall_s"] = round(time.perf_counter() - started, 1)
        if args.keep:
            log(f"kept {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    if code == 0:
        log(f"rounds {out['rounds']}: p50 {out['round_s']['p50']} s, p99 {out['round_s']['p99']} s; "
            f"API p99 {out['latency_ms']['all']['p99']} ms; store {out['store']['mib']} MiB; "
            f"service peak RSS {out['service_rss_mib']['peak']} MiB; wall {out['wall_s']} s")
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
