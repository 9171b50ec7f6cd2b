"""The live-service commands of ``pollux``: ``server start|stop|status``, ``submit``, ``ls``,
``nodes``, ``describe``, ``logs`` and ``cancel`` (documented in ``docs/cli.md``).

They talk to the service's REST API with the admin token of its state folder. Their errors (the
service's :class:`~pollux.cluster.client.ClientError` and :class:`~pollux.cluster.server.ServerError`,
an unreadable file) are reported by :func:`pollux.cli.entry.main` like every command's; what came from
the service is escaped before it reaches the terminal (:mod:`pollux.cli.formatting`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pollux.cli.errors import CliError
from pollux.cli.fleet_text import fleet_lines, fleet_nodes
from pollux.cli.formatting import (
    JOB_STATES,
    TERMINAL_STATES,
    LogFollower,
    alloc,
    describe_text,
    duration,
    escape,
    escape_lines,
    escape_log,
    nodes_text,
    runtime,
    status_text,
    table,
)
from pollux.cli.parser import (
    add_policy_option,
    command,
    nonnegative_float,
    nonnegative_int,
    port,
    positive_float,
    positive_int,
)
from pollux.cli.service_access import client_of, json_option, service_options
from pollux.cli.terminal import StatusLine, is_terminal
from pollux.contract import BALANCE_MODES, JOB_KINDS

if TYPE_CHECKING:
    from pollux.cluster.client import PolluxClient

__all__ = ["JOB_STATES", "TERMINAL_STATES", "add_cluster_commands"]


def _say(message: str) -> None:
    """A progress line on stderr."""
    print(escape_lines(message), file=sys.stderr, flush=True)


def _client(args: argparse.Namespace) -> PolluxClient:
    return client_of(args)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


# -- pollux server ...

def cmd_server_start(args: argparse.Namespace) -> int:
    from pollux.cluster import server

    if isinstance(args.local_nodes, str) and args.ray_address is not None:
        raise CliError("--local-nodes: typed nodes describe the embedded cluster; leave it out with "
                       "--ray-address (a Ray cluster's nodes report their own GPU type)")
    info = server.start(Path(args.state_dir), ray_address=args.ray_address, local_nodes=args.local_nodes,
                        gpus_per_node=args.gpus_per_node, policy=args.policy, interval_s=args.interval,
                        port=args.port, stop_grace_s=args.stop_grace, max_retries=args.max_retries,
                        seed=args.seed, timeout_s=args.timeout, run_as=args.run_as, progress=_say,
                        autoscale=autoscale_of(args))
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


def autoscale_of(args: argparse.Namespace) -> Any:
    """The :class:`pollux.cluster.server.Autoscale` that ``--autoscale`` asks for, or None."""
    from pollux.cluster import server

    if args.autoscale is None:
        return None
    if isinstance(args.local_nodes, str):
        raise CliError("--autoscale adds untyped nodes of --gpus-per-node GPUs: leave typed "
                       "--local-nodes out (autoscaling per GPU type is simulator-only for now)")
    autoscale = server.Autoscale(bounds=args.autoscale, rule=args.autoscale_rule,
                                 options=tuple(args.autoscale_option), provision_delay_s=args.provision_delay)
    try:
        autoscale.check()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return autoscale


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
    print(status_text(st))
    return 0 if ok else 1


# -- pollux submit / ls / describe / logs / cancel

def env_of(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` (repeatable) as the spec's ``env``; the service checks the names."""
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--env: expected NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def script_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The job spec of ``pollux submit``'s script and sizing options (its working folder and script
    checked here, so that a typo is named before anything reaches the service); shared with
    ``pollux hpo run``, whose trials are such jobs."""
    workdir = Path(os.path.abspath(args.working_dir or os.getcwd()))
    if not workdir.is_dir():
        raise CliError(f"--working-dir {workdir}: no such folder")
    script = Path(os.path.abspath(workdir / args.script))
    if not script.is_file():
        raise CliError(f"script {args.script}: no such file ({script})")
    spec: dict[str, Any] = {"entrypoint": str(script), "args": list(args.args), "working_dir": str(workdir),
                            "init_batch_size": args.batch_size,
                            "resources": {"GPU": args.gpus_per_replica}}
    optional = {"max_batch_size": args.max_batch_size, "min_replicas": args.min_replicas,
                "max_replicas": args.max_replicas}
    spec.update({k: v for k, v in optional.items() if v is not None})
    if args.local_bsz_bounds is not None:
        spec["local_bsz_bounds"] = list(args.local_bsz_bounds)
    if args.env:
        spec["env"] = env_of(args.env)
    return spec


def cmd_submit(args: argparse.Namespace) -> int:
    spec = script_spec(args)
    spec["preemptible"] = not args.no_preempt
    if args.balance is not None:
        spec["balance"] = args.balance
    if args.kind is not None:
        spec["kind"] = args.kind
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
    headers = ["ID", "NAME", "STATE", "GPUS", "ALLOCATION", "RESTARTS", "AGE", "RUNTIME"]
    if any(j.get("gpu_types") for j in jobs):   # a typed cluster: which GPU type(s) each job holds
        headers.insert(4, "TYPE")
        for row, j in zip(rows, jobs, strict=True):
            row.insert(4, ",".join(j.get("gpu_types") or []) or "-")
    right = (3, 6) if len(headers) > 8 else (3, 5)
    print(table(headers, rows, right=right, terminal=is_terminal(sys.stdout)))
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    with _client(args) as client:
        cluster = client.cluster()
    if args.json:
        _print_json(fleet_nodes(cluster) if cluster.get("fleet") else cluster.get("nodes") or [])
        return 0
    terminal = is_terminal(sys.stdout)
    print("\n".join([nodes_text(cluster, terminal=terminal), *fleet_lines(cluster, terminal=terminal)]))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
    if args.json:
        _print_json(job)
    else:
        print(describe_text(job, terminal=is_terminal(sys.stdout)))
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
        # On a terminal, a status line on stderr under the logs says what is being waited for; it
        # is taken away while log text is written to the same screen, so the two never mix.
        status = StatusLine(sys.stderr, shares_screen=is_terminal(sys.stdout))
        new: list[str] = []
        follower = LogFollower(new.append)
        with status:
            while True:
                state = client.job(args.job)["state"]   # before the logs: once terminal, these are final
                final = state in TERMINAL_STATES
                status.update(f"{escape(args.job)}: {escape(state)}, following its logs (Ctrl-C stops)")
                follower.feed(client.logs(args.job, restart=args.restart, rank=args.rank), final)
                if new:
                    with status.cleared():
                        write("".join(new))
                    new.clear()
                if final:
                    break
                status.wait(args.interval)
        print(f"({escape(args.job)} {escape(state)})", file=sys.stderr)
        return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.cancel(args.job)
    if args.json:
        _print_json(job)
    else:
        print(f"{escape(job['id'])}: {escape(job['state'])}")
    return 0


def local_nodes(text: str) -> int | str:
    """``--local-nodes``: a node count, or a typed cluster string (checked here, kept as given)."""
    if text.strip().isdigit():
        return positive_int(text)
    from pollux.policy.clusterspec import parse_cluster

    try:
        parse_cluster(text, where="--local-nodes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def add_cluster_commands(sub: Any) -> None:
    """Add ``server start|stop|status``, ``submit``, ``ls``, ``describe``, ``logs``, ``cancel`` to ``sub``."""
    common = service_options()
    as_json = json_option()

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
    s.add_argument("--local-nodes", type=local_nodes, default=4, metavar="N|SPEC",
                   help="nodes of the embedded Ray cluster: a count of untyped nodes (default 4), or "
                        "typed nodes TYPE:NODESxGPUS,... e.g. t4:2x2,a100:1x2 (replaces --gpus-per-node)")
    s.add_argument("--gpus-per-node", type=positive_int, default=2, metavar="G",
                   help="GPU slots per embedded node (default 2)")
    add_policy_option(s, live=True, default="pollux", help="scheduling policy (default pollux)")
    s.add_argument("--interval", type=positive_float, default=60.0, metavar="S",
                   help="seconds between scheduling rounds (default 60)")
    s.add_argument("--port", type=port, default=0, help="API port on 127.0.0.1 (default 0: any free)")
    s.add_argument("--stop-grace", type=nonnegative_float, default=60.0, metavar="S",
                   help="seconds a replica gets to checkpoint after SIGTERM (default 60)")
    s.add_argument("--max-retries", type=nonnegative_int, default=3, metavar="N",
                   help="failed runs a job may retry before it fails (default 3)")
    s.add_argument("--seed", type=int, default=0, help="random seed of the policy (default 0)")
    s.add_argument("--timeout", type=positive_float, default=180.0, metavar="S",
                   help="give up if the service does not answer within S seconds (default 180)")
    s.add_argument("--run-as", metavar="USER",
                   help="run the replicas as this unprivileged OS user (the service must run as root)")
    s.add_argument("--autoscale", metavar="MIN:MAX",
                   help="size the cluster between MIN and MAX nodes of --gpus-per-node GPUs with an "
                        "autoscaling rule (embedded: virtual nodes come and go; with --ray-address: "
                        "Ray's autoscaler is asked); see docs/autoscaling.md")
    s.add_argument("--autoscale-rule", default="goodput", metavar="RULE",
                   help="goodput (default), throughput or fixed")
    s.add_argument("--autoscale-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the rule, e.g. cooldown_s=300 (repeatable)")
    s.add_argument("--provision-delay", type=nonnegative_float, default=0.0, metavar="S",
                   help="seconds a new node takes to come, as the rule is told (default 0)")
    command(s, cmd_server_start)

    s = ssub.add_parser("stop", parents=[common, as_json], help="stop the service",
                        description="Stop the service (running jobs are preempted: they checkpoint and "
                                    "wait as pending for the next start), the embedded Ray cluster, and "
                                    "any replica process still alive.")
    s.add_argument("--timeout", type=positive_float, default=120.0, metavar="S",
                   help="seconds to wait for the service before killing it (default 120)")
    command(s, cmd_server_stop)

    s = ssub.add_parser("status", parents=[common, as_json], help="is the service up? nodes, jobs",
                        description="PIDs, URL, health, nodes and GPU slots, and job counts by state. "
                                    "Exits 1 unless the service runs and answers.")
    command(s, cmd_server_status)

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
    p.add_argument("--gpus-per-replica", type=positive_int, default=1, metavar="G",
                   help="GPUs per replica (default 1)")
    p.add_argument("--no-preempt", action="store_true",
                   help="never take GPUs away from the job once it runs")
    p.add_argument("--balance", choices=BALANCE_MODES, metavar="MODE",
                   help="LB-BSP balancing of the replicas' local batches: "
                        f"{', '.join(BALANCE_MODES)} (default off; passed as POLLUX_BALANCE)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable of every replica (repeatable; POLLUX_* and RAY_* are "
                        "the service's)")
    p.add_argument("--kind", choices=JOB_KINDS, metavar="KIND",
                   help="how the job follows a new allocation: restart (checkpoint, stop, relaunch; "
                        "default) or elastic (a Litz job: its master moves its workers in place)")
    p.add_argument("--name", help="a name for the job (default: its id)")
    p.add_argument("--working-dir", metavar="DIR",
                   help="folder the replicas run in (default: the current folder)")
    p.add_argument("script", metavar="SCRIPT", help="training script (a .py file runs with Python)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments of the script")
    command(p, cmd_submit)

    p = sub.add_parser("ls", parents=[common, as_json], help="list jobs",
                       description="List jobs in submission order: id, name, state, GPUs held and "
                                   "where, restarts, age (since submission) and runtime (since it "
                                   "first started).")
    p.add_argument("--state", nargs="+", action="extend", choices=JOB_STATES, metavar="STATE",
                   help=f"only jobs in these states (repeatable): {', '.join(JOB_STATES)}")
    command(p, cmd_ls)

    p = sub.add_parser("nodes", parents=[common, as_json], help="list the cluster's nodes and GPU types",
                       description="The alive nodes the service schedules on: name, GPU type ('-' if "
                                   "untyped), GPU slots and address, then GPUs per type. With "
                                   "`server start --autoscale`, also the nodes pending (asked for, not "
                                   "here yet), draining (jobs being moved off) and leaving (empty, let "
                                   "go), and the autoscaler's last decision; --json then gives each "
                                   "node a state.")
    command(p, cmd_nodes)

    p = sub.add_parser("describe", parents=[common, as_json], help="show one job in detail",
                       description="A job's spec, state, times, allocation history, transitions, "
                                   "replica processes and latest hints.")
    p.add_argument("job", metavar="JOB", help="job id")
    command(p, cmd_describe)

    p = sub.add_parser("logs", parents=[common], help="print a job's logs",
                       description="Print the logs of a job's replicas, each after a header line "
                                   "'==> restart R rank K (node N) <=='.")
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--restart", type=int, metavar="R", help="only this restart of the job")
    p.add_argument("--rank", type=int, metavar="K", help="only this replica rank")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the job succeeds, fails or is cancelled")
    p.add_argument("--interval", type=positive_float, default=1.0, metavar="S",
                   help="seconds between polls with --follow (default 1)")
    p.add_argument("--raw", action="store_true",
                   help="print control characters as they are even on a terminal (default there: "
                        "escaped, e.g. \\x1b)")
    command(p, cmd_logs)

    p = sub.add_parser("cancel", parents=[common, as_json], help="cancel a job",
                       description="Cancel a job (its replicas are stopped); an error if it has "
                                   "already ended.")
    p.add_argument("job", metavar="JOB", help="job id")
    command(p, cmd_cancel)


