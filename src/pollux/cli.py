"""The ``pollux`` command."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)
GPUS_PER_NODE = 4


def _goodput_rows(job, phase: str) -> list[dict[str, float]]:
    """Best batch per GPU count (packed 4 per node), with speedup over one GPU."""
    model = job.model(phase)
    replicas = np.array(GPU_COUNTS)
    nodes = np.array([math.ceil(k / GPUS_PER_NODE) for k in GPU_COUNTS])
    plan = model.optimize(nodes, replicas, job.limits)
    base = float(plan.goodput[0])
    return [
        {"gpus": int(k), "nodes": int(n), "batch_size": int(plan.batch_size[i]),
         "local_bsz": int(plan.local_bsz[i]), "accum_steps": int(plan.accum_steps[i]),
         "efficiency": float(plan.efficiency[i]), "goodput": float(plan.goodput[i]),
         "speedup": float(plan.goodput[i] / base) if base > 0 else 0.0}
        for i, (k, n) in enumerate(zip(replicas, nodes, strict=True))
    ]


def cmd_goodput(args: argparse.Namespace) -> int:
    from pollux.goodput.examples import load_example_jobs

    jobs = load_example_jobs()
    names = args.job or sorted(jobs)
    unknown = [n for n in names if n not in jobs]
    if unknown:
        print(f"error: --job: unknown example job(s) {', '.join(unknown)}; "
              f"choose from {', '.join(sorted(jobs))}", file=sys.stderr)
        return 2
    out = {}
    for name in names:
        job = jobs[name]
        out[name] = {phase: {"epoch": job.grad[phase][0], "pgns": job.grad[phase][1].pgns(
            job.limits.init_batch_size), "rows": _goodput_rows(job, phase)} for phase in job.grad}
    if args.json:
        print(json.dumps(out))
        return 0
    for name in names:
        job = jobs[name]
        lim = job.limits
        print(f"\n== {name}: {job.description}")
        print(f"   M0={lim.init_batch_size:g}  max batch={lim.max_batch_size:g}  local batch "
              f"{lim.min_local_bsz:g}..{lim.max_local_bsz:g}  accumulation on")
        print(f"   source: {job.provenance}")
        for phase, res in out[name].items():
            print(f"\n   {phase} in training (epoch {res['epoch']}, gradient noise scale "
                  f"{res['pgns']:.0f}):")
            print(f"   {'GPUs':>5} {'nodes':>5} {'batch M':>8} {'local m':>8} {'accum s':>8} "
                  f"{'efficiency':>10} {'goodput/s':>10} {'speedup':>8}")
            for r in res["rows"]:
                print(f"   {r['gpus']:>5} {r['nodes']:>5} {r['batch_size']:>8} {r['local_bsz']:>8} "
                      f"{r['accum_steps']:>8} {r['efficiency']:>10.3f} {r['goodput']:>10.1f} "
                      f"{r['speedup']:>7.2f}x")
    print("\nEarly in training the true gradient is large next to its noise (a small noise scale):"
          "\nbig batches waste examples, so the best batch stays small and extra GPUs barely help."
          "\nLate in training the noise scale has grown, large batches are efficient and more GPUs"
          "\npay off. Pollux re-tunes every job, and re-allocates the cluster, as this happens.")
    return 0


def _workload_files(arg: str) -> list[Path]:
    path = Path(arg)
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise ValueError(f"--workload {arg}: folder holds no .csv workload")
        return files
    if not path.is_file():
        raise ValueError(f"--workload {arg}: no such file or folder")
    return [path]


def cmd_simulate(args: argparse.Namespace) -> int:
    from pollux.policy.registry import POLICY_NAMES
    from pollux.sim import defaults
    from pollux.sim.engine import SimConfig
    from pollux.sim.report import finish_time_fairness, format_table, to_json, write_plots
    from pollux.sim.runner import RunSpec, _profiles, run_many

    try:
        profiles_dir = Path(args.profiles) if args.profiles else defaults.profiles_dir()
        if not profiles_dir.is_dir():
            raise ValueError(f"--profiles {profiles_dir}: no such folder")
        workloads = _workload_files(args.workload) if args.workload else [defaults.workload_file()]
        policies = args.policy or ["pollux", "tiresias", "optimus"]
        for name in policies:
            if name not in POLICY_NAMES:
                raise ValueError(f"--policy: unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
        config = SimConfig(interval=args.interval, interference=args.interference, seed=args.seed)
        profiles = _profiles(profiles_dir)
        from pollux.sim.workload import read_workload
        for w in workloads:                      # validate every file before any long run starts
            read_workload(w, applications=profiles)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    specs = [RunSpec(w, name, config) for w in workloads for name in policies]
    print(f"simulating {len(workloads)} workload(s) x {len(policies)} policy(ies) "
          f"({len(specs)} runs) on {config.num_nodes} x {config.gpus_per_node} GPUs ...", file=sys.stderr)
    results = run_many(specs, profiles_dir, processes=args.processes, progress=not args.quiet)
    total = config.num_nodes * config.gpus_per_node
    for res in results:
        finish_time_fairness(res, profiles, total)
    print(format_table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(to_json(results), indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plots:
        for path in write_plots(results, Path(args.plots)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_workload(args: argparse.Namespace) -> int:
    from collections import Counter

    from pollux.sim import defaults
    from pollux.sim.profiles import load_profiles
    from pollux.sim.workload import write_workload
    from pollux.sim.workload_gen import generate_workload

    try:
        profiles_dir = Path(args.profiles) if args.profiles else defaults.profiles_dir()
        if not profiles_dir.is_dir():
            raise ValueError(f"--profiles {profiles_dir}: no such folder")
        if args.jobs < 1:
            raise ValueError(f"--jobs: must be >= 1, got {args.jobs}")
        jobs = generate_workload(Path(args.trace), load_profiles(profiles_dir), num_jobs=args.jobs,
                                 seed=args.seed)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_workload(out, jobs)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    apps = Counter(j.application for j in jobs)
    print(f"wrote {len(jobs)} jobs over {max(j.submit_time for j in jobs) / 3600:.2f} h to {out} "
          f"({', '.join(f'{a} {n}' for a, n in sorted(apps.items()))})", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------ the live service

#: Job states of the live service (the same as ``pollux.cluster.store.JOB_STATES``, kept here so that
#: building the parser imports nothing heavy).
JOB_STATES = ("pending", "starting", "running", "rescaling", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
LIVE_POLICIES = ("pollux", "tiresias", "fifo")


def _error(message: str) -> None:
    print(f"pollux: error: {message}", file=sys.stderr)


def _cluster_command(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a cluster command: user errors become one line on stderr and exit 1, Ctrl-C exits 130."""

    def run(args: argparse.Namespace) -> int:
        from pollux.cluster.client import ClientError
        from pollux.cluster.server import ServerError

        try:
            return func(args)
        except (ClientError, ServerError) as exc:
            _error(str(exc))
            return 1
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130
        except BrokenPipeError:                 # `pollux logs JOB | head`: stop quietly
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            return 1
        except OSError as exc:                  # unreadable state dir, token file, ...
            _error(str(exc))
            return 1

    run.__name__ = func.__name__
    run.__doc__ = func.__doc__
    return run


def _client(args: argparse.Namespace):
    from pollux.cluster.client import PolluxClient

    return PolluxClient.from_state_dir(args.state_dir)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Plain aligned columns, two spaces apart; columns in ``right`` are right-aligned."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                           strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _alloc(allocation: dict[str, int] | None) -> str:
    if not allocation:
        return "-"
    return ",".join(f"{node}:{gpus}" for node, gpus in sorted(allocation.items()))


def _runtime(job: dict[str, Any], now: float) -> float | None:
    if job.get("start_time") is None:
        return None
    end = job.get("end_time")
    return (end if end is not None else now) - job["start_time"]


def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


# -- pollux server ...

def cmd_server_start(args: argparse.Namespace) -> int:
    from pollux.cluster import server

    info = server.start(Path(args.state_dir), ray_address=args.ray_address, local_nodes=args.local_nodes,
                        gpus_per_node=args.gpus_per_node, policy=args.policy, interval_s=args.interval,
                        port=args.port, stop_grace_s=args.stop_grace, max_retries=args.max_retries,
                        seed=args.seed, timeout_s=args.timeout,
                        progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.json:
        _print_json(info.to_dict())
        return 0
    print(f"Pollux service running at {info.url}")
    print(f"  service PID   {info.service_pid}")
    if info.rayhost_pid is not None and args.ray_address is None:
        print(f"  Ray           embedded cluster at {info.ray_address} (host PID {info.rayhost_pid})")
    else:
        print(f"  Ray           cluster at {info.ray_address}")
    print(f"  state dir     {info.state_dir}")
    print(f"  admin token   {Path(info.state_dir) / 'admin-token'}")
    return 0


def cmd_server_stop(args: argparse.Namespace) -> int:
    from pollux.cluster import server

    before = server.status(Path(args.state_dir))
    say = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = server.stop(Path(args.state_dir), timeout_s=args.timeout, progress=say)
    ran = bool(before["service_alive"] or before["rayhost_alive"] or report["replicas_killed"])
    if args.json:
        _print_json({"state_dir": before["state_dir"], "was_running": ran,
                     "service_pid": before["service_pid"] if before["service_alive"] else None,
                     "rayhost_pid": before["rayhost_pid"] if before["rayhost_alive"] else None, **report})
        return 0
    if not ran:
        print(f"no Pollux service runs from {before['state_dir']}; nothing to stop")
        return 0
    if before["service_alive"]:
        how = " (killed: it did not stop in time)" if report["service_killed"] else ""
        print(f"stopped the service (PID {before['service_pid']}){how}")
    if before["rayhost_alive"]:
        if server.pid_alive(before["rayhost_pid"]):
            print(f"left the Ray cluster running (PID {before['rayhost_pid']}; not started by Pollux)")
        else:
            how = " (killed: it did not stop in time)" if report["rayhost_killed"] else ""
            print(f"stopped the embedded Ray cluster (PID {before['rayhost_pid']}){how}")
    if report["replicas_killed"]:
        print(f"stopped {report['replicas_killed']} leftover replica process(es)")
    return 0


def cmd_server_status(args: argparse.Namespace) -> int:
    from pollux.cluster import server

    st = server.status(Path(args.state_dir))
    ok = bool(st["service_alive"] and st["healthy"])
    if args.json:
        _print_json(st)
        return 0 if ok else 1
    if not st["service_alive"]:
        print(f"no Pollux service runs from {st['state_dir']}")
        if st["rayhost_alive"]:
            print(f"  (its Ray host still runs, PID {st['rayhost_pid']}; `pollux server start` reuses it)")
        return 1
    print(f"Pollux service: running, {'healthy' if st['healthy'] else 'NOT answering'}")
    print(f"  URL           {st['url']}")
    print(f"  service PID   {st['service_pid']}")
    if st.get("rayhost_pid"):
        alive = "alive" if st["rayhost_alive"] else "NOT running"
        print(f"  Ray           {st.get('ray_address') or '-'} (host PID {st['rayhost_pid']}, {alive})")
    else:
        print(f"  Ray           {st.get('ray_address') or '-'}")
    print(f"  state dir     {st['state_dir']}")
    if "error" in st:
        print(f"  error         {st['error']}")
    cluster = st.get("cluster")
    if isinstance(cluster, dict) and "nodes" in cluster:
        nodes = cluster["nodes"]
        total = cluster.get("total_gpus", sum(n.get("gpus", 0) for n in nodes))
        print(f"  nodes         {len(nodes)} node(s), {total} GPU slot(s): "
              + (", ".join(f"{n['name']}:{n['gpus']}" for n in nodes) or "-"))
        print(f"  policy        {cluster.get('policy')}, rounds every {_num(cluster.get('interval_s'))} s, "
              f"{cluster.get('rounds')} round(s) run")
    jobs = st.get("jobs")
    if isinstance(jobs, dict):
        counts = [f"{jobs[s]} {s}" for s in JOB_STATES if jobs.get(s)]
        print(f"  jobs          {', '.join(counts) if counts else 'none'}")
    return 0 if ok else 1


# -- pollux submit / ls / describe / logs / cancel

def cmd_submit(args: argparse.Namespace) -> int:
    workdir = Path(os.path.abspath(args.working_dir or os.getcwd()))
    if not workdir.is_dir():
        _error(f"--working-dir {workdir}: no such folder")
        return 1
    script = Path(os.path.abspath(workdir / args.script))
    if not script.is_file():
        _error(f"script {args.script}: no such file ({script})")
        return 1
    spec: dict[str, Any] = {"entrypoint": str(script), "args": list(args.args), "working_dir": str(workdir),
                            "init_batch_size": args.batch_size, "preemptible": not args.no_preempt,
                            "resources": {"GPU": args.gpus_per_replica}}
    if args.max_batch_size is not None:
        spec["max_batch_size"] = args.max_batch_size
    if args.local_bsz_bounds is not None:
        spec["local_bsz_bounds"] = list(args.local_bsz_bounds)
    if args.min_replicas is not None:
        spec["min_replicas"] = args.min_replicas
    if args.max_replicas is not None:
        spec["max_replicas"] = args.max_replicas
    with _client(args) as client:
        job = client.submit(spec, name=args.name)
    job.pop("token", None)
    if args.json:
        _print_json(job)
    elif job.get("name") and job["name"] != job["id"]:
        print(f"submitted {job['id']} ({job['name']})")
    else:
        print(f"submitted {job['id']}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with _client(args) as client:
        jobs = client.jobs(args.state)
    if args.json:
        _print_json(jobs)
        return 0
    if not jobs:
        print("no jobs" + (f" in state {', '.join(args.state)}" if args.state else ""))
        return 0
    now = time.time()
    rows = [[j["id"], j["name"], j["state"], sum(j["allocation"].values()), _alloc(j["allocation"]),
             j["restarts"], _duration(now - j["submit_time"]), _duration(_runtime(j, now))] for j in jobs]
    print(_table(["ID", "NAME", "STATE", "GPUS", "ALLOCATION", "RESTARTS", "AGE", "RUNTIME"], rows,
                 right=(3, 5)))
    return 0


def _describe_text(job: dict[str, Any]) -> str:
    now = time.time()
    spec = job["spec"]
    out = [f"{job['id']} ({job['name']})"]

    def kv(key: str, value: Any) -> None:
        out.append(f"  {key:<14}{value}")

    kv("state", job["state"])
    kv("submitted", f"{_when(job['submit_time'])} ({_duration(now - job['submit_time'])} ago)")
    kv("started", _when(job["start_time"]))
    kv("ended", _when(job["end_time"]))
    kv("runtime", _duration(_runtime(job, now)))
    kv("restarts", f"{job['restarts']} ({job.get('failures', 0)} failed run(s))")
    kv("service", f"{job['attained_service']:.1f} GPU-seconds")
    gpus = sum(job["allocation"].values())
    kv("allocation", f"{_alloc(job['allocation'])} ({gpus} GPU(s))" if gpus else "-")
    if job.get("failure_reason"):
        kv("failure", job["failure_reason"])

    out.append("spec")
    kv("entrypoint", spec["entrypoint"])
    kv("args", " ".join(spec.get("args") or []) or "-")
    kv("working dir", spec.get("working_dir") or "-")
    max_bsz = spec.get("max_batch_size")
    kv("batch size", f"{spec['init_batch_size']}" + (f" (max {max_bsz})" if max_bsz else " (fixed)"))
    bounds = spec.get("local_bsz_bounds")
    if bounds:
        lo, hi = bounds
        kv("local batch", f"{lo if lo is not None else 1}..{hi if hi is not None else 'unbounded'}")
    max_r = spec.get("max_replicas")
    kv("replicas", f"{spec.get('min_replicas', 0)}..{max_r if max_r is not None else 'any'}")
    res = spec.get("resources") or {}
    kv("per replica", ", ".join(f"{k}={_num(v)}" for k, v in res.items()) or "-")
    kv("preemptible", "yes" if spec.get("preemptible", True) else "no")

    transitions = job.get("transitions") or []
    if transitions:
        out.append("transitions")
        rows = [[_when(t["time"]), t["from_state"] or "-", t["to_state"], t["reason"] or ""]
                for t in transitions]
        out += ["  " + line for line in _table(["TIME", "FROM", "TO", "REASON"], rows).splitlines()]
    history = job.get("allocation_history") or []
    if history:
        out.append("allocation history")
        rows = [[_when(a["time"]), sum(a["allocation"].values()), _alloc(a["allocation"])] for a in history]
        out += ["  " + line for line in _table(["TIME", "GPUS", "ALLOCATION"], rows, right=(1,)).splitlines()]
    replicas = job.get("replicas") or []
    if replicas:
        out.append("replicas")
        rows = [[r["restart"], r["rank"], r["node"], r["pid"] if r["pid"] is not None else "-",
                 _when(r["start_time"]), r["exit_code"] if r["exit_code"] is not None else "-"]
                for r in replicas]
        out += ["  " + line for line in _table(["RESTART", "RANK", "NODE", "PID", "STARTED", "EXIT"], rows,
                                               right=(0, 1, 3, 5)).splitlines()]
    hints = job.get("hints")
    out.append("hints" + ("" if hints else "          (none received yet)"))
    if hints:
        grad = hints.get("grad") or {}
        init = hints.get("init_batch_size")
        if grad.get("sqr") and init:
            kv("noise scale", f"{grad['var'] * init / grad['sqr']:.1f} (gradient noise scale at M0={init})")
        kv("progress", f"epoch {hints.get('epoch')}, {_num(hints.get('progress'))} examples at M0")
        lo, hi = hints.get("local_bsz_bounds") or (None, None)
        kv("batch limits", f"{init}..{hints.get('max_batch_size')}, local {lo}..{hi}, accumulation "
                           f"{'on' if hints.get('accumulation') else 'off'}")
        kv("replicas seen", hints.get("max_replicas_seen"))
        tp = hints.get("throughput") or {}
        if tp:
            kv("throughput", ", ".join(f"{k}={_num(v)}" for k, v in tp.items()))
    return "\n".join(out)


def cmd_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
    if args.json:
        _print_json(job)
    else:
        print(_describe_text(job))
    return 0


_LOG_HEADER = re.compile(r"^==> restart (\d+) rank (\d+) \(node .*\) <==$")


def _log_sections(text: str) -> dict[tuple[int, int], tuple[str, str]]:
    """``{(restart, rank): (header line, log text)}`` of the logs endpoint's answer, in its order."""
    sections: dict[tuple[int, int], tuple[str, list[str]]] = {}
    key = None
    for line in text.splitlines(keepends=True):
        match = _LOG_HEADER.match(line.rstrip("\n"))
        if match:
            key = (int(match[1]), int(match[2]))
            sections[key] = (line if line.endswith("\n") else line + "\n", [])
        elif key is not None:
            sections[key][1].append(line)
    return {k: (header, "".join(lines)) for k, (header, lines) in sections.items()}


class _LogFollower:
    """Prints what is new in each replica's log at every poll, like ``tail -f`` over several files.

    The service ends a log that does not end with a newline with one, so a line still being written
    cannot be told from a finished one: while following, the last line of a log is held back until a
    later line arrives or it is the same at the next poll (or the job ends). A line printed so and
    then continued has its continuation printed on a line of its own; nothing is lost or repeated.
    """

    def __init__(self, write: Callable[[str], Any]) -> None:
        self.write = write
        self.done: dict[tuple[int, int], int] = {}     # characters of the log printed
        self.last: dict[tuple[int, int], str] = {}     # the last line printed
        self.held: dict[tuple[int, int], str] = {}     # the last line seen but not printed
        self.current: tuple[int, int] | None = None

    def feed(self, text: str, final: bool) -> None:
        for key, (header, body) in _log_sections(text).items():
            start = self.done.get(key, 0)
            last = self.last.get(key, "")
            if last and not body.startswith(last, start - len(last)):
                if body.startswith(last[:-1], start - len(last)):
                    start -= 1          # that line was unfinished: its newline came from the service
                else:
                    start = 0           # the file was replaced: print it again
            lines = body[start:].splitlines(keepends=True)
            if not lines:
                continue
            emit = lines
            if not final:
                if len(lines) == 1 and self.held.get(key) == lines[0]:
                    del self.held[key]
                else:
                    self.held[key] = lines[-1]
                    emit = lines[:-1]
            if not emit:
                continue
            chunk = "".join(emit)
            if self.current != key:
                self.write(header)
                self.current = key
            self.write(chunk)
            self.done[key] = start + len(chunk)
            self.last[key] = emit[-1]


def cmd_logs(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if not args.follow:
            text = client.logs(args.job, restart=args.restart, rank=args.rank)
            sys.stdout.write(text)
            if not text:
                print(f"({args.job}: no logs yet)", file=sys.stderr)
            return 0

        def write(s: str) -> None:
            sys.stdout.write(s)
            sys.stdout.flush()

        follower = _LogFollower(write)
        while True:
            state = client.job(args.job)["state"]   # before the logs: once terminal, these are final
            final = state in TERMINAL_STATES
            follower.feed(client.logs(args.job, restart=args.restart, rank=args.rank), final)
            if final:
                print(f"({args.job} {state})", file=sys.stderr)
                return 0
            time.sleep(args.interval)


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.cancel(args.job)
    if args.json:
        _print_json(job)
    else:
        print(f"{job['id']}: {job['state']}")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0..65535, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


# argparse names the type in its error message ("invalid _positive_int value")
for _f, _name in ((_positive_int, "positive integer"), (_nonnegative_int, "non-negative integer"),
                  (_port, "port"), (_positive_float, "positive number"),
                  (_nonnegative_float, "non-negative number")):
    _f.__name__ = _name


def _add_cluster_commands(sub: Any) -> None:
    from pollux.cluster.server import default_state_dir

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", metavar="DIR", type=Path, default=default_state_dir(),
                        help="the server's state folder (default: $POLLUX_STATE_DIR or ~/.pollux; now "
                             "%(default)s)")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("server", help="start, stop or inspect the live scheduler service",
                       description="The live scheduler service: the REST API, the scheduling loop and "
                                   "(unless --ray-address) an embedded Ray cluster, all detached from "
                                   "the terminal, with their state in --state-dir.")
    ssub = p.add_subparsers(dest="server_command", required=True)
    s = ssub.add_parser("start", parents=[common, as_json], help="start the service",
                        description="Start the service (and an embedded Ray cluster of --local-nodes "
                                    "simulated nodes unless --ray-address is given); returns once the "
                                    "API answers.")
    s.add_argument("--ray-address", metavar="ADDR", help="use this Ray cluster (host:port) instead of "
                                                         "starting an embedded one")
    s.add_argument("--local-nodes", type=_positive_int, default=4, metavar="N",
                   help="nodes of the embedded Ray cluster (default 4)")
    s.add_argument("--gpus-per-node", type=_positive_int, default=2, metavar="G",
                   help="GPU slots per embedded node (default 2)")
    s.add_argument("--policy", choices=LIVE_POLICIES, default="pollux", help="scheduling policy "
                                                                              "(default pollux)")
    s.add_argument("--interval", type=_positive_float, default=60.0, metavar="S",
                   help="seconds between scheduling rounds (default 60)")
    s.add_argument("--port", type=_port, default=0, help="API port on 127.0.0.1 (default 0: any free)")
    s.add_argument("--stop-grace", type=_nonnegative_float, default=60.0, metavar="S",
                   help="seconds a replica gets to checkpoint after SIGTERM (default 60)")
    s.add_argument("--max-retries", type=_nonnegative_int, default=3, metavar="N",
                   help="failed runs a job may retry before it fails (default 3)")
    s.add_argument("--seed", type=int, default=0, help="random seed of the policy (default 0)")
    s.add_argument("--timeout", type=_positive_float, default=180.0, metavar="S",
                   help="give up if the service does not answer within S seconds (default 180)")
    s.set_defaults(func=_cluster_command(cmd_server_start))

    s = ssub.add_parser("stop", parents=[common, as_json], help="stop the service",
                        description="Stop the service (running jobs are preempted: they checkpoint and "
                                    "wait as pending for the next start), the embedded Ray cluster, and "
                                    "any replica process still alive.")
    s.add_argument("--timeout", type=_positive_float, default=120.0, metavar="S",
                   help="seconds to wait for the service before killing it (default 120)")
    s.set_defaults(func=_cluster_command(cmd_server_stop))

    s = ssub.add_parser("status", parents=[common, as_json], help="is the service up? nodes, jobs",
                        description="PIDs, URL, health, nodes and GPU slots, and job counts by state. "
                                    "Exits 1 unless the service runs and answers.")
    s.set_defaults(func=_cluster_command(cmd_server_status))

    p = sub.add_parser("submit", parents=[common, as_json], help="submit a training job",
                       usage="pollux submit [options] SCRIPT [ARGS ...]",
                       description="Submit SCRIPT (a path, relative to --working-dir) to the service. "
                                   "Options of pollux come before SCRIPT; everything after SCRIPT is "
                                   "passed to the script.")
    p.add_argument("--batch-size", type=int, required=True, metavar="M0",
                   help="initial (and minimum) global batch size (required)")
    p.add_argument("--max-batch-size", type=int, metavar="M",
                   help="largest global batch the job may use (default: M0, a fixed batch)")
    p.add_argument("--local-bsz-bounds", type=int, nargs=2, metavar=("LO", "HI"),
                   help="bounds of the per-GPU batch size")
    p.add_argument("--min-replicas", type=int, metavar="N", help="fewest replicas to run with (default 0)")
    p.add_argument("--max-replicas", type=int, metavar="N", help="most replicas (default: no limit)")
    p.add_argument("--gpus-per-replica", type=_positive_int, default=1, metavar="G",
                   help="GPUs per replica (default 1)")
    p.add_argument("--no-preempt", action="store_true",
                   help="never take GPUs away from the job once it runs")
    p.add_argument("--name", help="a name for the job (default: its id)")
    p.add_argument("--working-dir", metavar="DIR",
                   help="folder the replicas run in (default: the current folder)")
    p.add_argument("script", metavar="SCRIPT", help="training script (a .py file runs with Python)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments of the script")
    p.set_defaults(func=_cluster_command(cmd_submit))

    p = sub.add_parser("ls", parents=[common, as_json], help="list jobs",
                       description="List jobs in submission order: id, name, state, GPUs held and "
                                   "where, restarts, age (since submission) and runtime (since it "
                                   "first started).")
    p.add_argument("--state", nargs="+", action="extend", choices=JOB_STATES, metavar="STATE",
                   help=f"only jobs in these states (repeatable): {', '.join(JOB_STATES)}")
    p.set_defaults(func=_cluster_command(cmd_ls))

    p = sub.add_parser("describe", parents=[common, as_json], help="show one job in detail",
                       description="A job's spec, state, times, allocation history, transitions, "
                                   "replica processes and latest hints.")
    p.add_argument("job", metavar="JOB", help="job id")
    p.set_defaults(func=_cluster_command(cmd_describe))

    p = sub.add_parser("logs", parents=[common], help="print a job's logs",
                       description="Print the logs of a job's replicas, each after a header line "
                                   "'==> restart R rank K (node N) <=='.")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--restart", type=int, metavar="R", help="only this restart of the job")
    p.add_argument("--rank", type=int, metavar="K", help="only this replica rank")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the job succeeds, fails or is cancelled")
    p.add_argument("--interval", type=_positive_float, default=1.0, metavar="S",
                   help="seconds between polls with --follow (default 1)")
    p.set_defaults(func=_cluster_command(cmd_logs))

    p = sub.add_parser("cancel", parents=[common, as_json], help="cancel a job",
                       description="Cancel a job (its replicas are stopped); an error if it has "
                                   "already ended.")
    p.add_argument("job", metavar="JOB", help="job id")
    p.set_defaults(func=_cluster_command(cmd_cancel))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pollux", description="Goodput-optimised, co-adaptive scheduling for deep learning.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("goodput", help="walk through the goodput model of the example jobs",
                       description="Best batch size, accumulation, efficiency and speedup per GPU "
                                   "count, early and late in training, for the example jobs.")
    p.add_argument("--job", action="append", help="example job name (repeatable; default: all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=cmd_goodput)

    p = sub.add_parser("simulate", help="simulate workloads under scheduling policies",
                       description="Trace-driven simulation of a GPU cluster (16 x 4 GPUs) running "
                                   "workloads under one or more policies, on measured job profiles.")
    p.add_argument("--profiles", metavar="DIR",
                   help="application profiles in the Pollux OSDI'21 format (default: built-in)")
    p.add_argument("--workload", metavar="FILE_OR_DIR",
                   help="workload CSV, or a folder of them (default: built-in demo workload)")
    p.add_argument("--policy", action="append", metavar="NAME",
                   help="pollux, tiresias, optimus or fifo (repeatable; default: the first three)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--interval", type=float, default=60.0, help="scheduling interval, s (default 60)")
    p.add_argument("--interference", type=float, default=0.0,
                   help="slowdown of distributed jobs sharing a node, 0..1 (default 0)")
    p.add_argument("--processes", type=int, default=None,
                   help="parallel processes (default: one per run, at most the CPU count)")
    p.add_argument("--json", metavar="OUT", help="write results as JSON to OUT")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("workload", help="generate workloads from a job trace",
                       description="Workload tools (SPEC §7 format: name,time,application,num_replicas,"
                                   "batch_size).")
    wsub = p.add_subparsers(dest="workload_command", required=True)
    g = wsub.add_parser("generate", help="sample a workload from a Philly-format trace",
                        description="Sample jobs submitted 02:00-10:00 from a Philly-format trace "
                                    "(timestamp,duration,num_gpus,gpu_time), map them to applications by "
                                    "GPU time and give each a TunedJobs (replicas, batch) configuration.")
    g.add_argument("--trace", required=True, metavar="FILE", help="Philly-format trace CSV")
    g.add_argument("--jobs", type=int, default=160, help="number of jobs (default 160)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--profiles", metavar="DIR",
                   help="application profiles for the TunedJobs configurations (default: built-in)")
    g.add_argument("--out", required=True, metavar="FILE", help="workload CSV to write")
    g.set_defaults(func=cmd_workload)

    _add_cluster_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
