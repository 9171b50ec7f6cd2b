"""The live-service commands of ``pollux``: ``server start|stop|status``, ``submit``, ``ls``,
``describe``, ``logs`` and ``cancel`` (documented in ``docs/cli.md``).

They talk to the service's REST API with the admin token of its state folder. Errors are one line on
stderr (``pollux: error: ...``, exit 1); what came from the service is escaped before it reaches the
terminal (:mod:`pollux.cli_text`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pollux.cli_text import (
    LogFollower,
    alloc,
    describe_text,
    duration,
    escape,
    escape_lines,
    escape_log,
    num,
    runtime,
    table,
)

#: Job states of the live service (the same as ``pollux.cluster.store.JOB_STATES``, kept here so that
#: building the parser imports nothing heavy).
JOB_STATES = ("pending", "starting", "running", "rescaling", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
LIVE_POLICIES = ("pollux", "tiresias", "fifo")


def _error(message: str) -> None:
    print(f"pollux: error: {escape_lines(message)}", file=sys.stderr)


def _say(message: str) -> None:
    """A progress line on stderr."""
    print(escape_lines(message), file=sys.stderr, flush=True)


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


# -- pollux server ...

def cmd_server_start(args: argparse.Namespace) -> int:
    from pollux.cluster import server

    info = server.start(Path(args.state_dir), ray_address=args.ray_address, local_nodes=args.local_nodes,
                        gpus_per_node=args.gpus_per_node, policy=args.policy, interval_s=args.interval,
                        port=args.port, stop_grace_s=args.stop_grace, max_retries=args.max_retries,
                        seed=args.seed, timeout_s=args.timeout, run_as=args.run_as, progress=_say)
    if args.json:
        _print_json(info.to_dict())
        return 0
    print(f"Pollux service running at {escape(info.url)}")
    print(f"  service PID   {info.service_pid}")
    if info.rayhost_pid is not None and args.ray_address is None:
        print(f"  Ray           embedded cluster at {escape(info.ray_address)} (host PID {info.rayhost_pid})")
    else:
        print(f"  Ray           cluster at {escape(info.ray_address)}")
    print(f"  state dir     {escape(info.state_dir)}")
    print(f"  admin token   {escape(Path(info.state_dir) / 'admin-token')}")
    if info.run_as:
        print(f"  replicas run  as {escape(info.run_as)}")
    return 0


def cmd_server_stop(args: argparse.Namespace) -> int:
    from pollux.cluster import server

    state = Path(args.state_dir).resolve()
    report = server.stop(state, timeout_s=args.timeout, progress=None if args.json else _say)
    if args.json:
        _print_json({"state_dir": str(state), **report})
        return 0
    if not report["was_running"]:
        print(f"no Pollux service runs from {escape(state)}; nothing to stop")
        return 0
    how = " (killed: it did not stop in time)" if report["service_killed"] else ""
    for pid in report["service_pids"]:
        print(f"stopped the service (PID {pid}){how}")
    if report["rayhost_pid"]:
        how = " (killed: it did not stop in time)" if report["rayhost_killed"] else ""
        print(f"stopped the embedded Ray cluster (PID {report['rayhost_pid']}){how}")
    if report["ray_processes_killed"]:
        print(f"killed {report['ray_processes_killed']} leftover process(es) of the embedded Ray cluster")
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
    ray_down = st["ray_healthy"] is False
    if not st["service_alive"]:
        print(f"no Pollux service runs from {escape(st['state_dir'])}")
        if st["rayhost_alive"]:
            health = f"; Ray is DOWN: {escape(st['ray_error'])}" if ray_down else ""
            print(f"  (its Ray host still runs, PID {st['rayhost_pid']}{health}; `pollux server start` "
                  "reuses it or replaces it)")
        elif ray_down and st["rayhost_pid"]:
            print(f"  (its Ray host, PID {st['rayhost_pid']}, is not running either)")
        return 1
    if not st["api_ok"]:
        health = "NOT answering"
    elif ray_down:
        health = "DEGRADED: its Ray cluster is down"
    else:
        health = "healthy"
    print(f"Pollux service: running, {health}")
    print(f"  URL           {escape(st['url'] or '-')}")
    print(f"  service PID   {st['service_pid']}")
    address = escape(st.get("ray_address") or "-")
    if st.get("rayhost_pid"):
        alive = "alive" if st["rayhost_alive"] else "NOT running"
        print(f"  Ray           {address} (host PID {st['rayhost_pid']}, {alive})")
    else:
        print(f"  Ray           {address}")
    if ray_down:
        print(f"  Ray health    DOWN: {escape(st['ray_error'])}")
    elif st["ray_healthy"]:
        print(f"  Ray health    ok ({st.get('ray_nodes', '?')} node(s) alive)")
    if st.get("run_as"):
        print(f"  replicas run  as {escape(st['run_as'])}")
    print(f"  state dir     {escape(st['state_dir'])}")
    if "error" in st:
        print(f"  error         {escape(st['error'])}")
    cluster = st.get("cluster")
    if isinstance(cluster, dict) and "nodes" in cluster:
        nodes = cluster["nodes"]
        total = cluster.get("total_gpus", sum(n.get("gpus", 0) for n in nodes))
        print(f"  nodes         {len(nodes)} node(s), {escape(total)} GPU slot(s): "
              + (", ".join(f"{escape(n.get('name'))}:{escape(n.get('gpus'))}" for n in nodes) or "-"))
        every = escape(num(cluster.get("interval_s")))
        print(f"  policy        {escape(cluster.get('policy'))}, rounds every {every} s, "
              f"{escape(cluster.get('rounds'))} round(s) run")
    jobs = st.get("jobs")
    if isinstance(jobs, dict):
        counts = [f"{escape(jobs[s])} {s}" for s in JOB_STATES if jobs.get(s)]
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
        print(f"submitted {escape(job['id'])} ({escape(job['name'])})")
    else:
        print(f"submitted {escape(job['id'])}")
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
    rows = [[j["id"], j["name"], j["state"], sum(j["allocation"].values()), alloc(j["allocation"]),
             j["restarts"], duration(now - j["submit_time"]), duration(runtime(j, now))] for j in jobs]
    print(table(["ID", "NAME", "STATE", "GPUS", "ALLOCATION", "RESTARTS", "AGE", "RUNTIME"], rows,
                right=(3, 5)))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
    if args.json:
        _print_json(job)
    else:
        print(describe_text(job))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    escaping = sys.stdout.isatty() and not args.raw

    def write(s: str) -> None:
        sys.stdout.write(escape_log(s) if escaping else s)
        sys.stdout.flush()

    with _client(args) as client:
        if not args.follow:
            text = client.logs(args.job, restart=args.restart, rank=args.rank)
            write(text)
            if not text:
                print(f"({escape(args.job)}: no logs yet)", file=sys.stderr)
            return 0
        follower = LogFollower(write)
        while True:
            state = client.job(args.job)["state"]   # before the logs: once terminal, these are final
            final = state in TERMINAL_STATES
            follower.feed(client.logs(args.job, restart=args.restart, rank=args.rank), final)
            if final:
                print(f"({escape(args.job)} {escape(state)})", file=sys.stderr)
                return 0
            time.sleep(args.interval)


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.cancel(args.job)
    if args.json:
        _print_json(job)
    else:
        print(f"{escape(job['id'])}: {escape(job['state'])}")
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


def add_cluster_commands(sub: Any) -> None:
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
    s.add_argument("--run-as", metavar="USER",
                   help="run the replicas as this unprivileged OS user (the service must run as root)")
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
    p.add_argument("--raw", action="store_true",
                   help="print control characters as they are even on a terminal (default there: "
                        "escaped, e.g. \\x1b)")
    p.set_defaults(func=_cluster_command(cmd_logs))

    p = sub.add_parser("cancel", parents=[common, as_json], help="cancel a job",
                       description="Cancel a job (its replicas are stopped); an error if it has "
                                   "already ended.")
    p.add_argument("job", metavar="JOB", help="job id")
    p.set_defaults(func=_cluster_command(cmd_cancel))


