"""The one interface every scheduling policy implements (SPEC §5), shared by simulator and service.

A policy is a pure function of what the caller tells it: the jobs (``JobView``, whose ``allocation`` is
the one source of the current allocation), the cluster, the policy's own state from the previous round,
the time and a seeded random generator. It returns the new allocation and its new state. It never
reads clocks, files or globals, so the simulator and the live service run the very same code, and a
replayed round gives the same answer.

``Allocation`` is ``{job id: {node id: GPUs}}``; jobs absent from it (or with an empty mapping)
hold no GPUs. Dense matrices are an internal detail of a policy. Policy state is opaque to callers and
JSON-able as it is: ``json.dumps`` accepts what ``decide`` returns, and ``decide`` accepts it back after
``json.loads``. A policy that keeps numpy arrays encodes them itself with :func:`encode_state` and reads
its state back with :func:`decode_state` (harmless on plain JSON).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from pollux.goodput import BatchLimits, GoodputModel

Allocation = dict[str, dict[str, int]]
PolicyState = dict[str, Any]


#: The GPU type of every node of a cluster built without types (a homogeneous cluster).
DEFAULT_GPU_TYPE = "gpu"


@dataclass(frozen=True, slots=True)
class Cluster:
    """Nodes with stable string ids, their GPU counts and their GPU types (SPEC §10).

    ``types[i]`` is node i's GPU type (a short name such as ``"aws"`` or ``"a100"``); an empty
    ``types`` means every node has :data:`DEFAULT_GPU_TYPE`, the homogeneous case, which behaves
    exactly as before types existed. Every node of one type is taken to have the same GPU model;
    nodes of a type may still differ in GPU count.
    """

    nodes: tuple[str, ...]
    gpus: tuple[int, ...]
    types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.gpus):
            raise ValueError(f"gpus: {len(self.gpus)} entries for {len(self.nodes)} nodes")
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError("nodes: node ids must be unique")
        if any(g < 0 for g in self.gpus):
            raise ValueError("gpus: GPU counts must be >= 0")
        if self.types and len(self.types) != len(self.nodes):
            raise ValueError(f"types: {len(self.types)} entries for {len(self.nodes)} nodes")
        if any(not isinstance(t, str) or not t for t in self.types):
            raise ValueError("types: GPU types must be non-empty strings")

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int, prefix: str = "node",
                gpu_type: str | None = None) -> Cluster:
        """``num_nodes`` nodes of ``gpus_per_node`` GPUs (of ``gpu_type``; None: untyped)."""
        width = len(str(max(num_nodes - 1, 0)))
        return cls(tuple(f"{prefix}-{i:0{width}d}" for i in range(num_nodes)),
                   (int(gpus_per_node),) * num_nodes,
                   () if gpu_type is None else (str(gpu_type),) * num_nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return int(sum(self.gpus))

    def capacity(self) -> np.ndarray:
        return np.asarray(self.gpus, dtype=np.int64)

    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.nodes)}

    @property
    def node_types(self) -> tuple[str, ...]:
        """The GPU type of every node (:data:`DEFAULT_GPU_TYPE` for an untyped cluster)."""
        return self.types if self.types else (DEFAULT_GPU_TYPE,) * len(self.nodes)

    @property
    def type_names(self) -> tuple[str, ...]:
        """The GPU types present, in order of first appearance."""
        return tuple(dict.fromkeys(self.node_types))

    @property
    def heterogeneous(self) -> bool:
        """More than one GPU type."""
        return len(self.type_names) > 1

    def type_index(self) -> np.ndarray:
        """Per node, the position of its type in :attr:`type_names` (an int array)."""
        pos = {t: i for i, t in enumerate(self.type_names)}
        return np.fromiter((pos[t] for t in self.node_types), dtype=np.int64, count=len(self.nodes))

    def type_capacity(self) -> dict[str, int]:
        """Total GPUs per type, in :attr:`type_names` order."""
        out = dict.fromkeys(self.type_names, 0)
        for t, g in zip(self.node_types, self.gpus, strict=True):
            out[t] += int(g)
        return out

    def nodes_of_type(self, gpu_type: str) -> np.ndarray:
        """Indices of the nodes of ``gpu_type`` (empty if there are none)."""
        return np.flatnonzero(np.asarray(self.node_types, dtype=object) == gpu_type)


@dataclass(frozen=True, slots=True)
class Oracle:
    """Knowledge only a simulator has (used by Optimus+Oracle).

    ``step_time[r]`` is the true seconds per optimiser step on ``r`` replicas packed 4 per node
    (with accumulation where the fixed batch does not fit), ``inf`` where infeasible; index 0 is
    unused. ``remaining_iterations`` is the steps left to the completion epoch at the job's batch.
    """

    remaining_iterations: float
    step_time: np.ndarray


@dataclass(frozen=True, slots=True)
class JobView:
    """What a policy may know about one job.

    ``restarts`` counts re-allocations so far (R_j of the re-allocation penalty; a first start is not
    one). ``attained_service`` is GPU-seconds held so far. ``allocation`` is the job's current
    GPUs per node. ``model``/``limits`` are the job's *fitted* goodput model and batch limits (None
    until the job has reported one). ``max_replicas_seen`` feeds the exploration cap. ``fixed`` is
    (replicas, batch size) for rigid jobs (baseline policies). ``oracle`` is simulator-only.
    ``type_models``/``type_limits`` hold them per GPU type for type-aware policies
    (:meth:`model_for`, :meth:`limits_for`).
    """

    id: str
    submit_time: float
    age_s: float = 0.0
    restarts: int = 0
    attained_service: float = 0.0
    allocation: Mapping[str, int] = field(default_factory=dict)
    min_replicas: int = 0
    max_replicas: int = 64
    preemptible: bool = True
    model: GoodputModel | None = None
    limits: BatchLimits | None = None
    max_replicas_seen: int = 0
    fixed: tuple[int, int] | None = None
    oracle: Oracle | None = None
    application: str | None = None
    #: Per GPU type, the job's goodput model on that type (throughput fitted from what it ran there,
    #: bootstrapped from a short 1-GPU profile; the gradient statistics are the job's) and its batch
    #: limits there (memory differs by type). Given to type-aware policies only; None: ``model`` and
    #: ``limits`` hold for every type (a homogeneous cluster or a type-unaware policy).
    type_models: Mapping[str, GoodputModel] | None = None
    type_limits: Mapping[str, BatchLimits] | None = None

    @property
    def num_replicas(self) -> int:
        return int(sum(self.allocation.values()))

    @property
    def running(self) -> bool:
        return self.num_replicas > 0

    def model_for(self, gpu_type: str) -> GoodputModel | None:
        """The goodput model on ``gpu_type``: ``type_models[gpu_type]`` when given, else ``model``."""
        if self.type_models is not None and gpu_type in self.type_models:
            return self.type_models[gpu_type]
        return self.model

    def limits_for(self, gpu_type: str) -> BatchLimits | None:
        """The batch limits on ``gpu_type``: ``type_limits[gpu_type]`` when given, else ``limits``."""
        if self.type_limits is not None and gpu_type in self.type_limits:
            return self.type_limits[gpu_type]
        return self.limits


class Policy(Protocol):
    """A scheduling policy; ``name`` is its name in :mod:`pollux.policy.registry`.

    ``decide`` reads each job's current GPUs from ``JobView.allocation`` (build views with
    :func:`with_allocation` when the allocation is held apart), and returns the new allocation and a
    JSON-able state to pass back next round. A policy that maximises a number puts its value for the
    allocation it chose in the state under ``"objective"`` (:func:`state_objective`), for people to
    follow round by round.
    """

    name: str

    def decide(
        self,
        jobs: Sequence[JobView],
        cluster: Cluster,
        state: PolicyState | None,
        now: float,
        rng: np.random.Generator,
    ) -> tuple[Allocation, PolicyState]: ...


def fixed_shape(replicas: int, batch_size: int) -> tuple[int, int]:
    """``JobView.fixed`` of a job: the (replicas, batch size) the user asked for, replicas at least 1.

    The one rule by which the simulator (a workload's replicas and batch) and the service (a spec's
    ``min_replicas`` and ``init_batch_size``) fill ``fixed``. Rigid policies run a job on exactly these
    replicas; policies that choose replicas themselves ignore it.
    """
    return max(int(replicas), 1), min(int(batch_size), 2**62)


def restart_factors(jobs: Sequence[JobView], delta: float) -> np.ndarray:
    """SPEC §5 re-allocation factor of each job, ``(T_j − R_j·δ)/(T_j + δ)`` clipped to [0, 1]
    (T_j its age, R_j its re-allocations so far, δ the restart penalty in seconds); 1 where
    ``T_j + δ`` is not positive. The one formula the policies that penalise restarts share."""
    t = np.fromiter((max(float(j.age_s), 0.0) for j in jobs), dtype=np.float64, count=len(jobs))
    r = np.fromiter((max(float(j.restarts), 0.0) for j in jobs), dtype=np.float64, count=len(jobs))
    d = float(delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(t + d > 0.0, (t - r * d) / (t + d), 1.0)
    return np.clip(f, 0.0, 1.0)


def allocation_of(jobs: Sequence[JobView]) -> Allocation:
    """The current allocation the views hold (``JobView.allocation``; jobs without GPUs omitted)."""
    out: Allocation = {}
    for job in jobs:
        row = {str(n): int(g) for n, g in job.allocation.items() if g > 0}
        if row:
            out[job.id] = row
    return out


def with_allocation(jobs: Sequence[JobView], allocation: Mapping[str, Mapping[str, int]]) -> list[JobView]:
    """The views, each job that ``allocation`` names holding that row instead of its own.

    For callers that keep the current allocation apart from the views (tests, benchmarks).
    """
    return [replace(job, allocation=dict(allocation[job.id])) if job.id in allocation else job
            for job in jobs]


# --------------------------------------------------------------------------------------------
# Helpers shared by policies
# --------------------------------------------------------------------------------------------


def to_matrix(allocation: Mapping[str, Mapping[str, int]], job_ids: Sequence[str],
              cluster: Cluster) -> np.ndarray:
    """Dense (jobs × nodes) int matrix of an allocation; unknown nodes are dropped."""
    idx = cluster.index()
    mat = np.zeros((len(job_ids), cluster.num_nodes), dtype=np.int64)
    for j, jid in enumerate(job_ids):
        for node, gpus in allocation.get(jid, {}).items():
            if node in idx and gpus > 0:
                mat[j, idx[node]] = int(gpus)
    return mat


def from_matrix(matrix: np.ndarray, job_ids: Sequence[str], cluster: Cluster) -> Allocation:
    """Allocation of a dense (jobs × nodes) matrix; jobs without GPUs are omitted."""
    out: Allocation = {}
    for j, jid in enumerate(job_ids):
        row = matrix[j]
        nz = np.flatnonzero(row)
        if nz.size:
            out[jid] = {cluster.nodes[n]: int(row[n]) for n in nz}
    return out


def check_allocation(allocation: Allocation, cluster: Cluster) -> None:
    """Raise ``ValueError`` if an allocation exceeds any node's capacity or names unknown nodes."""
    idx = cluster.index()
    used = np.zeros(cluster.num_nodes, dtype=np.int64)
    for jid, row in allocation.items():
        for node, gpus in row.items():
            if node not in idx:
                raise ValueError(f"allocation[{jid!r}]: unknown node {node!r}")
            if gpus < 0:
                raise ValueError(f"allocation[{jid!r}][{node!r}]: negative GPU count {gpus}")
            used[idx[node]] += gpus
    over = np.flatnonzero(used > cluster.capacity())
    if over.size:
        n = int(over[0])
        raise ValueError(f"node {cluster.nodes[n]!r}: {int(used[n])} GPUs allocated, "
                         f"capacity {cluster.gpus[n]}")


def state_objective(state: PolicyState | None) -> float | None:
    """The objective a policy's round reached, from the state it returned (see :class:`Policy`);
    None for a policy that keeps none (the baselines order jobs; they maximise nothing)."""
    value = None if state is None else state.get("objective")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def encode_state(state: PolicyState) -> dict[str, Any]:
    """JSON-safe copy of a policy state: numpy arrays become tagged base64 blobs."""
    def enc(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            arr = np.ascontiguousarray(v)
            return {"__ndarray__": base64.b64encode(arr.tobytes()).decode("ascii"),
                    "dtype": str(arr.dtype), "shape": list(arr.shape)}
        if isinstance(v, dict):
            return {str(k): enc(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [enc(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        return v
    return enc(state)


def decode_state(data: dict[str, Any]) -> PolicyState:
    """Inverse of :func:`encode_state`."""
    def dec(v: Any) -> Any:
        if isinstance(v, dict):
            if "__ndarray__" in v:
                raw = base64.b64decode(v["__ndarray__"])
                return np.frombuffer(raw, dtype=np.dtype(v["dtype"])).reshape(v["shape"]).copy()
            return {k: dec(x) for k, x in v.items()}
        if isinstance(v, list):
            return [dec(x) for x in v]
        return v
    return dec(data)
