"""What the control loop needs to launch one run of a job (SPEC §9), apart from the loop itself.

* :func:`build_launches` turns a job's allocation ``{node: GPU slots}`` into one
  :class:`~pollux.cluster.backends.ray_backend.ReplicaLaunch` per replica. A replica holds ``resources.GPU``
  slots (one by default; the value is rounded up to a whole number of slots), so ``n`` slots on a
  node form ``n // G`` replicas there and any remainder stays idle. An allocation that forms no
  replica at all (say one slot for a job asking two GPUs per replica) cannot start: it is a launch
  failure with that reason, counted like a failed run.
* :func:`never_fits` says why a launch can never be placed on its nodes (a replica needs more of a
  resource than the node has in total), so it fails at once instead of waiting for Ray.
* :func:`busy_reason` says why it cannot be placed *now*: other runs the controller holds (still
  stopping, or launching) use the slots or resources it needs. The controller then waits without
  creating actors and without counting a failure; the launch timeout only starts once the actors
  exist, so it measures Ray, not the wait for another job's checkpoint.
* :class:`Launch` is one launch in flight: its actors exist, and the controller polls its rendezvous
  and start results each tick without waiting for them.
* :func:`prepare_run_as` and :func:`prepare_checkpoint_dir` set up the state folder when replicas
  run as another OS user (see ``docs/cluster.md``, trust model).
* :func:`job_tensorboard_dir` is where a job's replicas write TensorBoard event files
  (``POLLUX_TENSORBOARD_DIR``): beside its checkpoint folder, ``tensorboard/<job>`` of the state
  folder, set up with the same owner and modes.
"""

from __future__ import annotations

import math
import os
import pwd
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux import raylink
from pollux.cluster.backends.api import NodeInfo, ReplicaHandle, ReplicaLaunch
from pollux.cluster.backends.gputypes import with_type_resources
from pollux.cluster.state.spec import JobSpec
from pollux.contract import (
    ENV_BALANCE,
    ENV_CHECKPOINT_DIR,
    ENV_NODE_RANK,
    ENV_NUM_NODES,
    ENV_NUM_REPLICAS,
    ENV_RANK,
    ENV_TENSORBOARD_DIR,
)

__all__ = ["TENSORBOARD_FOLDER", "Launch", "LaunchError", "backoff_s", "build_launches", "busy_reason",
           "gpus_per_replica", "job_tensorboard_dir", "launch_usage", "lookup_user", "never_fits",
           "prepare_checkpoint_dir", "prepare_run_as", "rank_nodes", "replica_command", "replicas_of",
           "usage_of"]

#: Slack when comparing float resource amounts.
_EPS = 1e-9
#: The state folder's folder of per-job TensorBoard folders, beside ``checkpoints/``.
TENSORBOARD_FOLDER = "tensorboard"

Usage = dict[str, dict[str, float]]


class LaunchError(RuntimeError):
    """A launch that cannot succeed as asked; the message is the job's failure reason."""


@dataclass
class Launch:
    """One run of a job being launched: actors created, rendezvous and starts answered later.

    ``starts`` is None while waiting for rank 0's actor to be placed (its rendezvous port), then the
    references to every replica's start result. ``deadline`` (monotonic) bounds the whole launch.
    """

    job_id: str
    restart: int
    placement: dict[str, int]
    launches: list[ReplicaLaunch]
    handles: list[ReplicaHandle]
    deadline: float
    rendezvous: Any
    starts: list[Any] | None = None

    @property
    def pending_refs(self) -> list[Any]:
        return [self.rendezvous] if self.starts is None else list(self.starts)


def replica_command(spec: JobSpec, python: str) -> list[str]:
    """The command of a replica: ``python script args...`` for a ``.py`` entrypoint, else as given."""
    if spec.entrypoint.endswith(".py"):
        return [python, spec.entrypoint, *spec.args]
    return [spec.entrypoint, *spec.args]


def gpus_per_replica(spec: JobSpec) -> int:
    """GPU slots one replica holds: ``resources.GPU`` rounded up, at least 1 (0 or absent: 1 slot
    of the allocation, as before GPUs per replica were configurable), at most 2**16. Never raises:
    a stored spec read leniently may hold anything. The scheduling round asks the policy for at
    least this many slots per job, and the launcher forms ``slots // this`` replicas."""
    try:
        g = float(spec.resources.get("GPU", 1.0))
    except (TypeError, ValueError):
        return 1
    if not math.isfinite(g) or g <= 1:
        return 1
    return int(min(math.ceil(g - _EPS), 2**16))


def rank_nodes(placement: Mapping[str, int], per_replica: int = 1) -> list[str]:
    """Node of each rank: ``slots // per_replica`` replicas per node, nodes in name order (rank 0 on
    the first node with a replica)."""
    return [node for node, slots in sorted(placement.items()) for _ in range(int(slots) // per_replica)]


def build_launches(spec: JobSpec, placement: Mapping[str, int], *, command: list[str],
                   base_env: Mapping[str, str], log_root: Path, user: str | None = None,
                   nodes: Mapping[str, NodeInfo] | None = None) -> list[ReplicaLaunch]:
    """One launch per replica of a run on ``placement``; raises LaunchError if it forms no replica.

    With ``nodes`` (the alive nodes by name), a replica on a node with a GPU type also asks for that
    type's resource (:func:`pollux.cluster.backends.gputypes.type_resource`), so that the backend can place it
    only on a node of the type the allocation was made for.

    A spec whose ``balance`` is not ``"off"`` sets ``POLLUX_BALANCE`` (the agent's default balance
    mode) in every replica's environment; an off one leaves it unset, as before the field existed.
    A ``base_env`` with a checkpoint folder gets ``POLLUX_TENSORBOARD_DIR`` beside it
    (:func:`job_tensorboard_dir`) unless it names one already.
    """
    per = gpus_per_replica(spec)
    if ENV_CHECKPOINT_DIR in base_env and ENV_TENSORBOARD_DIR not in base_env:
        base_env = {**base_env,
                    ENV_TENSORBOARD_DIR: str(job_tensorboard_dir(Path(base_env[ENV_CHECKPOINT_DIR])))}
    if spec.kind == "elastic":
        return _elastic_launch(spec, placement, command=command, base_env=base_env, log_root=log_root,
                               user=user)
    ranks = rank_nodes(placement, per)
    if not ranks:
        raise LaunchError(f"the allocation {dict(sorted(placement.items()))} forms no replica: each "
                          f"replica needs {per} GPU slots on one node")
    node_order = list(dict.fromkeys(ranks))
    resources = dict(spec.resources)
    env = {**spec.env, **base_env, ENV_NUM_REPLICAS: str(len(ranks)), ENV_NUM_NODES: str(len(node_order))}
    if spec.balance != "off":
        env[ENV_BALANCE] = spec.balance
    launches = [ReplicaLaunch(rank=r, node=n, command=list(command), cwd=spec.working_dir,
                              env={**env, ENV_RANK: str(r), ENV_NODE_RANK: str(node_order.index(n))},
                              log_path=str(log_root / f"rank-{r}.log"), resources=resources, user=user)
                for r, n in enumerate(ranks)]
    return launches if nodes is None else with_type_resources(launches, nodes)


def _elastic_launch(spec: JobSpec, placement: Mapping[str, int], *, command: list[str],
                    base_env: Mapping[str, str], log_root: Path, user: str | None) -> list[ReplicaLaunch]:
    """An elastic job's run: one process, its master, on the first node of the placement. It holds
    no GPU slot itself — the workers it places on the allocated nodes do — and it reads the whole
    placement from the service (``GET /v1/jobs/{id}/allocation``), not from its environment."""
    nodes = sorted(n for n, g in placement.items() if int(g) > 0)
    if not nodes:
        raise LaunchError(f"the allocation {dict(sorted(placement.items()))} holds no GPU")
    env = {**spec.env, **base_env, ENV_NUM_REPLICAS: "1", ENV_NUM_NODES: "1", ENV_RANK: "0",
           ENV_NODE_RANK: "0"}
    resources = {k: v for k, v in spec.resources.items() if k not in ("GPU",)}
    return [ReplicaLaunch(rank=0, node=nodes[0], command=list(command), cwd=spec.working_dir, env=env,
                          log_path=str(log_root / "rank-0.log"), resources={**resources, "GPU": 0.0},
                          user=user)]


def elastic_env(spec: JobSpec, ray_address: str | None) -> dict[str, str]:
    """What an elastic job's master gets beyond the usual variables: where the Ray cluster is, and
    the settings to join it (a replica's environment otherwise carries nothing ``RAY_*``)."""
    if spec.kind != "elastic":
        return {}
    return raylink.join_env(ray_address)


def usage_of(placement: Mapping[str, int],
             replicas: Iterable[tuple[str, Mapping[str, float]]]) -> Usage:
    """Per node, what a run holds: its allocated GPU slots, and the other resources of its replicas
    (``replicas``: each replica's node and resources)."""
    out: Usage = {node: {"GPU": float(slots)} for node, slots in placement.items() if slots}
    for node, resources in replicas:
        row = out.setdefault(node, {"GPU": 0.0})
        for key, amount in resources.items():
            if key != "GPU":
                row[key] = row.get(key, 0.0) + float(amount)
    return out


def _fmt(x: float) -> str:
    return f"{x:g}"


def never_fits(usage: Usage, nodes: Mapping[str, NodeInfo]) -> str | None:
    """Why a run with this usage can never be placed (a node has less of a resource in total)."""
    for node, row in sorted(usage.items()):
        info = nodes.get(node)
        if info is None:
            return f"node {node!r} is not an alive node of the Ray cluster"
        total = dict(info.resources) or {"GPU": float(info.gpus)}
        for key, amount in sorted(row.items()):
            if amount > total.get(key, 0.0) + _EPS:
                return (f"node {node} has {_fmt(total.get(key, 0.0))} {key} in total; the job's replicas "
                        f"there need {_fmt(amount)}")
    return None


def busy_reason(usage: Usage, others: Iterable[Usage], nodes: Mapping[str, NodeInfo]) -> str | None:
    """Why a run cannot be placed now: ``others`` (runs still held) use what it needs."""
    held: Usage = {}
    for u in others:
        for node, row in u.items():
            acc = held.setdefault(node, {})
            for key, amount in row.items():
                acc[key] = acc.get(key, 0.0) + amount
    for node, row in sorted(usage.items()):
        total = dict(nodes[node].resources) or {"GPU": float(nodes[node].gpus)}
        for key, amount in sorted(row.items()):
            used = held.get(node, {}).get(key, 0.0)
            if used + amount > total.get(key, 0.0) + _EPS:
                return (f"node {node}: {_fmt(used)} of {_fmt(total.get(key, 0.0))} {key} still held by "
                        f"other runs")
    return None


def backoff_s(failures: int, base_s: float, max_s: float) -> float:
    """Delay before relaunching a job after its ``failures``-th failure: ``base * 2**(failures-1)``."""
    if base_s <= 0:
        return 0.0
    return float(min(base_s * 2.0 ** min(max(failures - 1, 0), 30), max_s))


# ------------------------------------------------------------------------------- running as a user


def _searchable_by(path: Path, account: pwd.struct_passwd) -> bool:
    st = path.stat()
    if account.pw_uid == 0:
        return True
    if st.st_uid == account.pw_uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == account.pw_gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def lookup_user(user: str) -> pwd.struct_passwd:
    """The account of ``user`` (a name); ValueError naming ``run_as`` if there is none."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"run_as: no such user {user!r}") from None


def prepare_run_as(state_dir: Path, user: str) -> None:
    """Check that replicas can run as ``user`` and close the state folder to them.

    The service must run as root (or as that user). The state folder becomes mode 0711: the user may
    pass through it to ``checkpoints/`` and ``tensorboard/`` (also 0711: no listing of other jobs) but
    not list it, and every other entry of the folder (the admin token, the job store, the logs, ...)
    loses all group and other permissions. Every folder above the state folder must be searchable by
    the user, or its checkpoints could not be reached: ValueError says which is not.
    """
    account = lookup_user(user)
    if os.geteuid() != 0 and account.pw_uid != os.geteuid():
        raise ValueError(f"run_as: running replicas as {user!r} needs the service to run as root "
                         f"(it runs as uid {os.geteuid()})")
    state = Path(state_dir).resolve()
    (state / "checkpoints").mkdir(parents=True, exist_ok=True)
    (state / TENSORBOARD_FOLDER).mkdir(parents=True, exist_ok=True)
    (state / "logs").mkdir(parents=True, exist_ok=True)
    for parent in reversed(state.parents):
        if not _searchable_by(parent, account):
            raise ValueError(f"run_as: user {user!r} cannot reach the state folder {state}: {parent} is not "
                             f"searchable by it (mode {stat.S_IMODE(parent.stat().st_mode):04o}); choose a "
                             f"--state-dir under a folder others may pass through")
    os.chmod(state, 0o711)
    for entry in state.iterdir():
        if entry.name in ("checkpoints", TENSORBOARD_FOLDER) or entry.is_symlink():
            continue
        os.chmod(entry, stat.S_IMODE(entry.stat().st_mode) & 0o700)
    os.chmod(state / "checkpoints", 0o711)
    os.chmod(state / TENSORBOARD_FOLDER, 0o711)


def job_tensorboard_dir(checkpoint_dir: Path) -> Path:
    """The TensorBoard folder of the job whose checkpoint folder is ``checkpoint_dir``, beside it:
    ``<state>/checkpoints/<job>`` → ``<state>/tensorboard/<job>``."""
    return checkpoint_dir.parent.parent / TENSORBOARD_FOLDER / checkpoint_dir.name


def prepare_checkpoint_dir(path: Path, user: str | None) -> None:
    """Create a job's checkpoint folder and its TensorBoard folder beside it (:func:`job_tensorboard_dir`).

    With ``user``, both are owned by that user (and group), mode 0700, in a ``tensorboard/`` of mode
    0711 as ``checkpoints/`` is (without, ``tensorboard/`` is 0700, as ``checkpoints/`` is then). A
    folder that an earlier run left owned by someone else is handed over with its contents, never
    following symbolic links; one the user owns already is left alone (its contents are the job's).
    """
    board = job_tensorboard_dir(path)
    board.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(board.parent, 0o711 if user is not None else 0o700)
    _prepare_job_dir(path, user)
    _prepare_job_dir(board, user)


def _prepare_job_dir(path: Path, user: str | None) -> None:
    """One folder of a job: created; with ``user``, handed to that user (see prepare_checkpoint_dir)."""
    path.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    account = lookup_user(user)
    uid, gid = account.pw_uid, account.pw_gid
    if path.lstat().st_uid != uid:
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
        os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, 0o700)


def replicas_of(nodes: Iterable[str]) -> dict[str, int]:
    """``{node: replicas}`` from the node of each replica."""
    out: dict[str, int] = {}
    for n in nodes:
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def launch_usage(placement: Mapping[str, int], launches: Sequence[ReplicaLaunch]) -> Usage:
    """:func:`usage_of` a run about to be launched."""
    return usage_of(placement, [(s.node, s.resources) for s in launches])
