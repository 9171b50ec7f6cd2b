"""Start training scripts as a group of gloo replicas on loopback, the way the Pollux service would
(with the variables of :mod:`pollux.contract`).

Used by the multi-process tests: every process is started here, recorded by PID and stopped by PID
(or, in the files whose runs are mostly start-up, forked by :mod:`forkserver` with the same
variables and handled through the same :class:`ReplicaGroup`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pollux import contract as C

WORKERS = Path(__file__).resolve().parent
SRC = WORKERS.parents[1] / "src"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("POLLUX_") and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                      "LOCAL_WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class ReplicaGroup:
    """The processes of one run of a job (one per replica)."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        try:
            for p in self.procs:
                codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"replicas did not finish in {timeout} s\n{self.output()}") from None
        return codes

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        for r, p in enumerate(self.procs):
            if (ranks is None or r in ranks) and p.poll() is None:
                os.kill(p.pid, sig)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass

    def output(self) -> str:
        parts = []
        for r, log in enumerate(self.logs):
            text = log.read_text(errors="replace") if log.exists() else ""
            parts.append(f"----- rank {r} ({log}) -----\n{text[-6000:]}")
        return "\n".join(parts)


def replica_env(rank: int, replicas: int, port: int, *, nodes: int = 1, checkpoint_dir: Path | None = None,
                env: dict[str, str] | None = None) -> dict[str, str]:
    """The POLLUX_* contract of replica ``rank`` (replicas spread evenly over ``nodes``), then ``env``."""
    per_node = -(-replicas // nodes)
    extra = {
        C.ENV_JOB_ID: "test-job",
        C.ENV_RANK: str(rank),
        C.ENV_NUM_REPLICAS: str(replicas),
        C.ENV_NODE_RANK: str(rank // per_node),
        C.ENV_NUM_NODES: str(nodes),
        C.ENV_MASTER_ADDR: "127.0.0.1",
        C.ENV_MASTER_PORT: str(port),
    }
    if checkpoint_dir is not None:
        extra[C.ENV_CHECKPOINT_DIR] = str(checkpoint_dir)
    extra.update(env or {})
    return extra


def launch(script: str | Path, replicas: int, workdir: Path, *, args: list[str] | None = None,
           env: dict[str, str] | None = None, checkpoint_dir: Path | None = None, tag: str = "run",
           nodes: int = 1, rank_env: dict[int, dict[str, str]] | None = None) -> ReplicaGroup:
    """Start ``replicas`` processes of ``script`` with the POLLUX_* contract on a fresh port."""
    port = free_port()
    group = ReplicaGroup()
    workdir.mkdir(parents=True, exist_ok=True)
    for rank in range(replicas):
        extra = replica_env(rank, replicas, port, nodes=nodes, checkpoint_dir=checkpoint_dir, env=env)
        extra.update((rank_env or {}).get(rank, {}))
        log = workdir / f"{tag}-rank{rank}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(script), *(args or [])], env=base_env(extra),
                                    stdout=out, stderr=subprocess.STDOUT, cwd=str(workdir))
        group.procs.append(proc)
        group.logs.append(log)
    return group
