"""The environment contract between the agent and whoever launched it (SPEC §8).

A training script runs alone, under ``torchrun``, or as a replica started by the Pollux service. The
service sets the ``POLLUX_*`` variables; torchrun sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``LOCAL_WORLD_SIZE`` (and ``LOCAL_RANK``, ``GROUP_RANK``). Each ``POLLUX_*`` variable
takes precedence over its torchrun counterpart, one variable at a time; with neither set the job is a
single process. The ``POLLUX_*`` names are those of :mod:`pollux.contract`, which the service's launcher
sets from the same constants. This module only parses: it imports neither torch nor anything that talks
to a network.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pollux.contract import (
    ENV_CHECKPOINT_DIR,
    ENV_GPU_TYPE,
    ENV_JOB_ID,
    ENV_JOB_TOKEN,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NODE_RANK,
    ENV_NUM_NODES,
    ENV_NUM_REPLICAS,
    ENV_RANK,
    ENV_RESTARTS,
    ENV_SCHEDULER_URL,
    ENV_TENSORBOARD_DIR,
    POLLUX_VARS,
)

#: Rendezvous used when a distributed run names no master address or port.
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500

__all__ = ["DEFAULT_MASTER_ADDR", "DEFAULT_MASTER_PORT", "POLLUX_VARS", "TORCHRUN_VARS", "AgentEnv",
           "read_env"]   # POLLUX_VARS: re-exported from pollux.contract, where the service reads it too
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "LOCAL_RANK",
                 "GROUP_RANK")


@dataclass(frozen=True, slots=True)
class AgentEnv:
    """Where this process sits in its job, and the job's connections to the outside.

    ``source`` says which variables described the job: ``"pollux"`` (the service's), ``"torchrun"``
    or ``"single"`` (none: one process). ``local_rank`` picks the CUDA device: ``LOCAL_RANK`` when set,
    else 0 (the service gives each replica its own ``CUDA_VISIBLE_DEVICES``).
    """

    rank: int = 0
    num_replicas: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    local_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    job_id: str | None = None
    checkpoint_dir: str | None = None
    restarts: int = 0
    scheduler_url: str | None = None
    job_token: str | None = None
    source: str = "single"
    #: The GPU type of this replica's node (``POLLUX_GPU_TYPE``; None on an untyped cluster).
    gpu_type: str | None = None
    #: Where rank 0 writes the agent's TensorBoard scalars (``POLLUX_TENSORBOARD_DIR``; None: nowhere).
    tensorboard_dir: str | None = None

    @property
    def distributed(self) -> bool:
        """More than one replica: a real rendezvous is needed."""
        return self.num_replicas > 1

    @property
    def checkpointing(self) -> bool:
        """Whether state is saved and restored (a checkpoint directory is configured)."""
        return self.checkpoint_dir is not None

    @property
    def init_method(self) -> str:
        """The ``tcp://`` rendezvous URL of the process group."""
        host = self.master_addr
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6 literal
        return f"tcp://{host}:{self.master_port}"


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _int(environ: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = _get(environ, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _first(*values: int | None, default: int) -> int:
    """The first value that is set (variables in order of precedence), else ``default``."""
    for value in values:
        if value is not None:
            return value
    return default


def read_env(environ: Mapping[str, str] | None = None) -> AgentEnv:
    """Parse the environment (``os.environ`` by default) into an :class:`AgentEnv`.

    Precedence per variable: ``POLLUX_X``, then torchrun's counterpart, then the single-process
    default. Under torchrun the node count is ``WORLD_SIZE / LOCAL_WORLD_SIZE`` (rounded up) and the
    node rank ``GROUP_RANK`` (else ``RANK // LOCAL_WORLD_SIZE``). Raises ``ValueError`` naming the
    variable for a malformed or inconsistent value (a rank outside the world, more nodes than
    replicas, a port outside 1..65535).
    """
    env = os.environ if environ is None else environ
    p_rank = _int(env, ENV_RANK, minimum=0)
    p_replicas = _int(env, ENV_NUM_REPLICAS, minimum=1)
    p_node_rank = _int(env, ENV_NODE_RANK, minimum=0)
    p_nodes = _int(env, ENV_NUM_NODES, minimum=1)
    p_port = _int(env, ENV_MASTER_PORT, minimum=1)
    t_rank = _int(env, "RANK", minimum=0)
    t_world = _int(env, "WORLD_SIZE", minimum=1)
    t_port = _int(env, "MASTER_PORT", minimum=1)
    t_local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
    t_local_rank = _int(env, "LOCAL_RANK", minimum=0)
    t_group_rank = _int(env, "GROUP_RANK", minimum=0)

    if p_rank is not None or p_replicas is not None:
        source = "pollux"
    elif t_rank is not None or t_world is not None:
        source = "torchrun"
    else:
        source = "single"

    rank = _first(p_rank, t_rank, default=0)
    replicas = _first(p_replicas, t_world, default=1)
    rank_var = ENV_RANK if p_rank is not None else "RANK"
    if rank >= replicas:
        raise ValueError(f"{rank_var}: rank {rank} is outside a world of {replicas} replicas")

    torchrun_nodes = None
    torchrun_node_rank = t_group_rank
    if t_local_world is not None:
        torchrun_nodes = max(-(-replicas // t_local_world), 1)
        if torchrun_node_rank is None:
            torchrun_node_rank = rank // t_local_world
    nodes = _first(p_nodes, torchrun_nodes, default=1)
    node_rank = _first(p_node_rank, torchrun_node_rank, default=0)
    nodes_var = ENV_NUM_NODES if p_nodes is not None else "WORLD_SIZE/LOCAL_WORLD_SIZE"
    if nodes > replicas:
        raise ValueError(f"{nodes_var}: {nodes} nodes for only {replicas} replicas")
    if node_rank >= nodes:
        var = ENV_NODE_RANK if p_node_rank is not None else "GROUP_RANK"
        raise ValueError(f"{var}: node rank {node_rank} is outside {nodes} nodes")

    port = _first(p_port, t_port, default=DEFAULT_MASTER_PORT)
    if port > 65535:
        var = ENV_MASTER_PORT if p_port is not None else "MASTER_PORT"
        raise ValueError(f"{var}: port {port} is outside 1..65535")
    addr = _get(env, ENV_MASTER_ADDR) or _get(env, "MASTER_ADDR") or DEFAULT_MASTER_ADDR
    restarts = _int(env, ENV_RESTARTS, minimum=0) or 0

    return AgentEnv(
        rank=rank,
        num_replicas=replicas,
        node_rank=node_rank,
        num_nodes=nodes,
        local_rank=t_local_rank if t_local_rank is not None else 0,
        master_addr=addr,
        master_port=port,
        job_id=_get(env, ENV_JOB_ID),
        checkpoint_dir=_get(env, ENV_CHECKPOINT_DIR),
        restarts=restarts,
        scheduler_url=_get(env, ENV_SCHEDULER_URL),
        job_token=_get(env, ENV_JOB_TOKEN),
        source=source,
        gpu_type=_get(env, ENV_GPU_TYPE),
        tensorboard_dir=_get(env, ENV_TENSORBOARD_DIR),
    )
