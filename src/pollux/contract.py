"""The agent–service contract in one light module (SPEC §8): names, exit statuses and job-log events.

The agent (``pollux.torch``) and the service (``pollux.cluster``) never import each other; what one
side writes and the other reads is spelled here once, so a rename cannot break one side silently:

* the ``POLLUX_*`` environment variables the service sets for every replica and the agent parses;
* the exit status of a preempted replica (the service reads any other non-zero one as a failure);
* the job-log line format, and *events*: one line of JSON per fact the service or a tool needs from a
  replica's log (for example the first optimizer step after a restart), written by
  :func:`format_event` and read back by :func:`parse_events` instead of matching free text.

The hints body (``PUT /v1/jobs/{id}/hints``) has its own schema in :mod:`pollux.hints`. This module
imports only the standard library: the service, the CLI and the agent all load it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------
# Environment variables (set by the service's launcher, parsed by pollux.torch.env)
# --------------------------------------------------------------------------------------------

#: The job's id in the service's store.
ENV_JOB_ID = "POLLUX_JOB_ID"
#: This replica's rank, 0 … POLLUX_NUM_REPLICAS − 1.
ENV_RANK = "POLLUX_RANK"
#: Replicas (one per GPU) in this launch.
ENV_NUM_REPLICAS = "POLLUX_NUM_REPLICAS"
#: Index of this replica's node among the launch's nodes, and how many nodes the launch spans.
ENV_NODE_RANK = "POLLUX_NODE_RANK"
ENV_NUM_NODES = "POLLUX_NUM_NODES"
#: Rendezvous of the launch (rank 0's node and a port free there).
ENV_MASTER_ADDR = "POLLUX_MASTER_ADDR"
ENV_MASTER_PORT = "POLLUX_MASTER_PORT"
#: Folder the agent checkpoints into and restores from.
ENV_CHECKPOINT_DIR = "POLLUX_CHECKPOINT_DIR"
#: Folder where rank 0 of the agent writes its scalars as TensorBoard event files (unset: none).
ENV_TENSORBOARD_DIR = "POLLUX_TENSORBOARD_DIR"
#: How many times the job has been (re)started before this launch (0 on the first).
ENV_RESTARTS = "POLLUX_RESTARTS"
#: Base URL of the service's REST API, where the agent sends hints.
ENV_SCHEDULER_URL = "POLLUX_SCHEDULER_URL"
#: Bearer token of this launch, valid for the job's own hints only.
ENV_JOB_TOKEN = "POLLUX_JOB_TOKEN"

#: Per-replica batch balancing the job asked for (``pollux submit --balance``): ``auto``, ``gpu``,
#: ``cpu`` or ``off``; the agent's default when the script does not call ``balance_batches``.
ENV_BALANCE = "POLLUX_BALANCE"
#: The balance modes ENV_BALANCE may hold.
BALANCE_MODES: tuple[str, ...] = ("auto", "gpu", "cpu", "off")
#: The GPU type of the node this replica runs on (issue 13), e.g. ``aws`` or ``a100``; unset on an
#: untyped cluster. The agent reports it in its hints (``gpu_type``, hints schema v2).
ENV_GPU_TYPE = "POLLUX_GPU_TYPE"

#: The Ray cluster an *elastic* job's master joins to create its workers (issue 14); unset otherwise.
ENV_RAY_ADDRESS = "POLLUX_RAY_ADDRESS"

#: Every variable of the contract, in the order the docs list them.
POLLUX_VARS: tuple[str, ...] = (
    ENV_JOB_ID, ENV_RANK, ENV_NUM_REPLICAS, ENV_NODE_RANK, ENV_NUM_NODES, ENV_MASTER_ADDR,
    ENV_MASTER_PORT, ENV_CHECKPOINT_DIR, ENV_TENSORBOARD_DIR, ENV_RESTARTS, ENV_SCHEDULER_URL,
    ENV_JOB_TOKEN, ENV_BALANCE, ENV_GPU_TYPE, ENV_RAY_ADDRESS,
)

# --------------------------------------------------------------------------------------------
# Job kinds and the elastic hand-off (issue 14)
# --------------------------------------------------------------------------------------------

#: How a job follows a new allocation. ``restart``: the service stops its replicas (they checkpoint
#: and exit 143) and relaunches them on the new placement. ``elastic``: the service launches one
#: process, the job's *master*, which places its own workers (a Litz job) on the allocation's nodes
#: and, when the allocation changes, moves them while it runs — no restart.
JOB_KINDS: tuple[str, ...] = ("restart", "elastic")
#: ``GET`` (the job's token or admin): ``{"version": n, "allocation": {node: GPUs}, "applied": m}`` —
#: the allocation the master must follow; ``version`` grows with every change. ``PUT`` with
#: ``{"version": n}``: the master has applied version n (its workers run on that placement). An
#: allocation not acknowledged within the service's resize limit is applied the ordinary way: stop
#: (SIGTERM, checkpoint, exit 143) and relaunch.
ALLOCATION_ENDPOINT = "/v1/jobs/{job_id}/allocation"
#: The custom resource that names a Ray node the service schedules on (``pollux-node-<name>``): an
#: elastic master asks a small amount of it to pin each worker to an allocated node.
NODE_RESOURCE_PREFIX = "pollux-node-"

# --------------------------------------------------------------------------------------------
# Exit statuses
# --------------------------------------------------------------------------------------------

#: A replica that checkpointed after SIGTERM exits with this: "preempted, resume me". The service
#: reads it as a completed rescale step, never as a failure (128 + SIGTERM, what a shell reports).
PREEMPTED_EXIT_CODE = 143

# --------------------------------------------------------------------------------------------
# Job logs and events
# --------------------------------------------------------------------------------------------

#: ``logging`` format of the service's own log and of the example scripts; a replica's stdout and
#: stderr go to ``<log dir>/<job>/restart-<n>/rank-<r>.log``.
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
#: Every event line starts with this marker, then one JSON object.
EVENT_PREFIX = "POLLUX_EVENT "
#: The first optimizer step of this process finished (fields: ``rank``, ``replicas``, ``restarts``).
EVENT_FIRST_STEP = "first_step"


@dataclass(frozen=True, slots=True)
class Event:
    """One structured fact a replica wrote to its log: its kind, wall-clock time and fields."""

    kind: str
    time: float
    fields: Mapping[str, Any] = field(default_factory=dict)


def format_event(kind: str, time: float, **fields: Any) -> str:
    """The log line (without newline) of one event; ``fields`` must be JSON values."""
    if not kind or not kind.replace("_", "").isalnum():
        raise ValueError(f"event kind {kind!r}: use letters, digits and underscores")
    if not math.isfinite(time):
        raise ValueError(f"event time {time!r} is not finite")
    body = {"event": kind, "time": float(time), **fields}
    return EVENT_PREFIX + json.dumps(body, sort_keys=True, allow_nan=False)


def parse_events(lines: str | Iterable[str], kind: str | None = None) -> list[Event]:
    """Every well-formed event in ``lines`` (a text or its lines), optionally of one ``kind`` only.

    Anything else in a log (user output, tracebacks, a line cut short by a kill) is skipped: a log is
    free text with events in it, never a file that has to parse.
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: list[Event] = []
    for line in lines:
        at = line.find(EVENT_PREFIX)
        if at < 0:
            continue
        try:
            body = json.loads(line[at + len(EVENT_PREFIX):])
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        k, t = body.pop("event", None), body.pop("time", None)
        if not isinstance(k, str) or not isinstance(t, int | float) or isinstance(t, bool):
            continue
        if kind is None or k == kind:
            out.append(Event(k, float(t), body))
    return out
