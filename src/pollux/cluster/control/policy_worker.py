"""The scheduling policy in a process of its own, for rounds with many jobs (issue 38).

The service is one Python process: its API handlers, the control loop and the scheduling round share
one interpreter lock. A Pollux round over 1,200 jobs on 4,096 GPUs keeps the interpreter busy for
most of a second, and every API call that arrives meanwhile waits for it (the service at size,
``benchmarks/service_scale.py``: calls' p99 near 300 ms, nearly all of it waiting). Policies are pure
functions of their inputs — the jobs' views, the cluster, the carried state, the time and a seeded
generator — so the decision can be made in another process, on another core, and the API keeps its
interpreter: :class:`PolicyWorker` sends the inputs to a child process that holds the policy (and its
memos, which persist there from round to round), and gets back the allocation, the new state and the
generator as the decision left it. Same inputs, same decision, in either process.

The child is started on the first large round (a small service never starts it), with the ``spawn``
method (a fresh interpreter: the service's threads and Ray are not copied into it). It ends when the
worker is closed, when the service's end of the pipe closes (the service stopped or was killed), or
when it finds that its parent has changed. A decision the child cannot make (it died, or the inputs
would not pickle) raises :class:`PolicyWorkerError`; the caller then decides in its own process, so
a broken child costs a round its speed, never the round.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from pollux.policy.base import Allocation, Cluster, JobView, PolicyState

logger = logging.getLogger("pollux.cluster")

__all__ = ["PROCESS_MIN_JOBS", "PolicyWorker", "PolicyWorkerError"]

#: Rounds with at least this many jobs are decided in the worker process; below it, pickling the
#: inputs would cost more than the interpreter time it frees.
PROCESS_MIN_JOBS = 256
#: How often (seconds) an idle child checks that its parent still runs.
_PARENT_CHECK_S = 5.0


class PolicyWorkerError(RuntimeError):
    """The worker process could not make the decision (it is gone, or the inputs did not travel)."""


def _serve(conn: Connection, policy_name: str, options: dict[str, Any], parent: int) -> None:
    """The child's loop: one decision per message until told to stop or orphaned."""
    from pollux.policy.registry import make_policy

    policy = make_policy(policy_name, **options)
    while True:
        try:
            if not conn.poll(_PARENT_CHECK_S):
                if os.getppid() != parent:
                    return
                continue
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        views, cluster, state, now, rng = message
        try:
            allocation, new_state = policy.decide(views, cluster, state, now, rng)
            reply: tuple[Any, ...] = ("ok", allocation, new_state, rng.bit_generator.state)
        except Exception as exc:           # the caller re-raises it: isolation needs the failure
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


class PolicyWorker:
    """A child process that makes ``policy_name``'s decisions (see the module docstring)."""

    def __init__(self, policy_name: str, options: dict[str, Any] | None = None) -> None:
        self.policy_name = policy_name
        self.options = dict(options or {})
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs, else None."""
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def _start(self) -> Connection:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, name=f"pollux-policy-{self.policy_name}",
                                  args=(theirs, self.policy_name, self.options, os.getpid()), daemon=True)
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        logger.info("policy %s: deciding large rounds in process %d", self.policy_name, process.pid)
        return ours

    def decide(self, views: Sequence[JobView], cluster: Cluster, state: PolicyState | None, now: float,
               rng: np.random.Generator) -> tuple[Allocation, PolicyState]:
        """The policy's decision, made in the child; ``rng`` advances as the decision advanced it.

        RuntimeError with the policy's own message if the policy raised there;
        :class:`PolicyWorkerError` if the child could not answer (it is then stopped, and started
        again at the next call).
        """
        with self._lock:
            conn = self._conn if self._conn is not None else self._start()
            try:
                conn.send((list(views), cluster, state, float(now), rng))
                reply = conn.recv()
            except Exception as exc:
                self._stop()
                raise PolicyWorkerError(f"policy worker: {type(exc).__name__}: {exc}") from exc
        if reply[0] == "error":
            raise RuntimeError(reply[1])
        _, allocation, new_state, rng_state = reply
        rng.bit_generator.state = rng_state
        return allocation, new_state

    def _stop(self) -> None:
        conn, process = self._conn, self._process
        self._conn = self._process = None
        if conn is not None:
            try:
                conn.send(None)
            except (EOFError, OSError):
                pass
            conn.close()
        if process is not None:
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)

    def close(self) -> None:
        """Stop the child (if it was started); the next decision starts a new one."""
        with self._lock:
            self._stop()


class OffloadedPolicy:
    """``policy`` with its rounds of at least ``min_jobs`` jobs decided by ``worker`` (which runs a
    policy made the same way); smaller ones, and any round the worker cannot answer, in this
    process. Every other attribute is the policy's own."""

    def __init__(self, policy: Any, worker: PolicyWorker, min_jobs: int) -> None:
        self.policy = policy
        self.worker = worker
        self.min_jobs = int(min_jobs)
        self.name = policy.name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.policy, attribute)

    def decide(self, jobs: Sequence[JobView], cluster: Cluster, state: PolicyState | None, now: float,
               rng: np.random.Generator) -> tuple[Allocation, PolicyState]:
        if len(jobs) >= self.min_jobs:
            try:
                return self.worker.decide(jobs, cluster, state, now, rng)
            except PolicyWorkerError as exc:
                logger.warning("%s; deciding this round in the service's process", exc)
        return self.policy.decide(jobs, cluster, state, now, rng)
