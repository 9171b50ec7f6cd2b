"""A Litz job under the Pollux service: the master follows the allocation the service gives it.

The service launches an elastic job (spec ``kind: elastic``) as one process, this master, with the
usual ``POLLUX_*`` variables and ``POLLUX_RAY_ADDRESS``. The master joins that Ray cluster, reads its
allocation (``GET /v1/jobs/{id}/allocation``: ``{node: GPUs}`` and a version), starts one Litz worker
per allocated GPU on those nodes (pinned by the node's ``pollux-node-<name>`` resource), and then polls
the allocation, and reports hints (:func:`litz_hints`) so that a goodput policy can size the job. A
new version moves the workers in place (:meth:`LitzRuntime.resize` with the new
nodes) and, once the move is done, is acknowledged (``PUT`` with the version); the service then takes
the new placement as the run's own. Nothing here decides allocations: the service stays their one
source of truth, and a master that crashed or never acknowledged is handled by the service (stop,
relaunch from the latest checkpoint).

SIGTERM (the service preempting the job, or re-allocating it the ordinary way after the master missed
the resize limit) stops the run after its in-flight micro-tasks, with a checkpoint when a checkpoint
folder is set, and exits with :data:`pollux.contract.PREEMPTED_EXIT_CODE`.

The loop is :class:`ServiceMaster`, over three small seams — the service (:class:`AllocationSource`),
the node names (:class:`NodeDirectory`) and the run (:class:`ElasticRun`) — so that its transitions
are unit-tested against the service's real API and a fake run, without Ray
(``tests/test_litz_service_master.py``); :func:`run_under_service` joins them to Ray and HTTP.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pollux import contract as ct
from pollux import raylink
from pollux.hints import build_hints
from pollux.litz.placement import NodeDirectory, RayNodeDirectory, slot_node_ids
from pollux.litz.service_link import Allocation, AllocationSource, ServiceError, ServiceLink

__all__ = ["ElasticRun", "ServiceMaster", "litz_hints", "run_under_service"]

logger = logging.getLogger("pollux.litz")

#: Seconds between reads of the allocation while the job runs.
POLL_S = 0.5


def litz_hints(num_executors: int, task_s: float, workers: int, sync_s: float = 0.002) -> dict[str, Any]:
    """Hints (without ``current``) that let a goodput policy size a Litz job: its global "batch" is one
    micro-task per executor, fixed (no batch-size scaling, so statistical efficiency is 1), and a
    worker running ``E / W`` of them takes ``task_s`` each — so the job speeds up with workers until
    each has one executor. ``task_s`` is measured by the master (wall time per task per worker)."""
    executors = max(int(num_executors), 1)
    throughput = {"alpha_grad": 1e-3, "beta_grad": max(float(task_s), 1e-6), "alpha_local": float(sync_s),
                  "beta_local": 0.0, "alpha_node": float(sync_s), "beta_node": 0.0, "gamma": 1.0}
    return build_hints(throughput, {"sqr": 1.0, "var": 0.0}, init_batch_size=executors,
                       max_batch_size=executors, local_bsz_bounds=[1, executors], accumulation=False,
                       max_replicas_seen=max(int(workers), 1), progress=0.0, epoch=0)


class ElasticRun(Protocol):
    """What the master asks of the running job (:class:`pollux.litz.runtime.LitzRuntime`)."""

    @property
    def num_workers(self) -> int: ...

    def run(self) -> Any:
        """Run to the end (in the master's worker thread); the summary has ``to_dict()``."""
        ...

    def status(self) -> dict[str, Any]: ...

    def resize(self, num_workers: int | None = None, num_shards: int | None = None,
               node_ids: list[str] | None = None) -> None: ...

    def stop(self, checkpoint: bool = False) -> None: ...


class ServiceMaster:
    """The master's loop (see the module docstring): start on the allocation read first, then
    follow each newer version — move the workers, acknowledge once moved — report hints, and stop
    on :meth:`preempt`.

    ``make_run(node_ids)`` builds the run with one worker per entry; ``checkpoint`` says whether a
    preempted run saves a checkpoint as it stops (a checkpoint folder is set).
    """

    def __init__(self, link: AllocationSource, nodes: NodeDirectory,
                 make_run: Callable[[list[str]], ElasticRun], *, num_executors: int, checkpoint: bool,
                 poll_s: float = POLL_S, hints_every_s: float = 5.0) -> None:
        self.link = link
        self.nodes = nodes
        self.make_run = make_run
        self.num_executors = num_executors
        self.checkpoint = checkpoint
        self.poll_s = poll_s
        self.hints_every_s = hints_every_s
        self.preempted = threading.Event()
        self.elastic_run: ElasticRun | None = None
        self.applied: list[dict[str, float]] = []

    def preempt(self) -> None:
        """Stop the run after its in-flight micro-tasks (SIGTERM's handler; safe before the start)."""
        self.preempted.set()
        if self.elastic_run is not None:
            self.elastic_run.stop(checkpoint=self.checkpoint)

    def run(self) -> dict[str, Any]:
        """Run the job to its end; its summary as a dict, with ``resizes_applied`` (version, seconds
        from reading it to acknowledging it) and ``preempted``."""
        alloc = self.link.get()
        slots = slot_node_ids(alloc, self.nodes.node_ids())
        run = self.make_run(slots)
        self.elastic_run = run
        if self.preempted.is_set():
            run.stop(checkpoint=self.checkpoint)
        out: dict[str, Any] = {}
        failed: list[BaseException] = []

        def body() -> None:
            try:
                out.update(run.run().to_dict())
            except BaseException as exc:   # reported by the calling thread
                failed.append(exc)

        thread = threading.Thread(target=body, name="litz-master", daemon=True)
        thread.start()
        self.link.ack(alloc.version)
        logger.info("litz master: %d worker(s) on %s (allocation version %d)", len(slots), alloc.allocation,
                    alloc.version)
        self._follow(run, thread, alloc.version)
        if failed:
            raise failed[0]
        out["resizes_applied"] = self.applied
        out["preempted"] = self.preempted.is_set()
        return out

    def _follow(self, run: ElasticRun, thread: threading.Thread, current: int) -> None:
        """Until the run ends: report hints now and then, and apply each newer allocation."""
        started, hinted = time.monotonic(), 0.0
        while thread.is_alive():
            thread.join(self.poll_s)
            if self.preempted.is_set() or not thread.is_alive():
                continue
            if time.monotonic() - hinted >= self.hints_every_s and self._report_hints(run, started):
                hinted = time.monotonic()
            try:
                now = self.link.get()
            except ServiceError as exc:
                logger.warning("litz master: %s (will retry)", exc)
                continue
            if now.version > current and now.allocation and self._apply(run, thread, now):
                current = now.version

    def _report_hints(self, run: ElasticRun, started: float) -> bool:
        """Hints from what ran so far; False while no task has completed (nothing to measure)."""
        status = run.status()
        done = int(status.get("tasks_completed", 0))
        if done <= 0:
            return False
        workers = max(int(status.get("workers", 1)), 1)
        # Seconds per micro-task per worker, from what ran so far (resizes blur it a little).
        task_s = (time.monotonic() - started) * workers / done
        try:
            self.link.put_hints(litz_hints(self.num_executors, task_s, workers))
        except ServiceError as exc:
            logger.warning("litz master: hints not accepted: %s", exc)
        return True

    def _apply(self, run: ElasticRun, thread: threading.Thread, now: Allocation) -> bool:
        """Move the workers onto `now` and acknowledge it; False (to retry at the next poll) if a
        node it names is not known yet."""
        t0 = time.monotonic()
        try:
            target = slot_node_ids(now, self.nodes.node_ids())
        except ServiceError as exc:
            logger.warning("litz master: %s", exc)
            return False
        run.resize(node_ids=target)
        while thread.is_alive() and (run.status().get("resizing") or run.num_workers != len(target)):
            time.sleep(0.05)
        try:
            self.link.ack(now.version)
        except ServiceError as exc:
            logger.warning("litz master: could not acknowledge version %d: %s", now.version, exc)
        seconds = time.monotonic() - t0
        self.applied.append({"version": now.version, "seconds": seconds})
        logger.info("litz master: moved to %s in %.2f s (allocation version %d)", now.allocation, seconds,
                    now.version)
        return True


def run_under_service(app: Any, runtime_config: Any, *, env: Mapping[str, str] | None = None,
                      poll_s: float = POLL_S, hints_every_s: float = 5.0) -> dict[str, Any]:
    """Run ``app`` as the master of a service job (see the module docstring); returns the run summary
    as a dict, with ``resizes_applied`` (version, seconds from reading it to acknowledging it).

    ``runtime_config`` is a :class:`pollux.litz.records.RuntimeConfig` whose workers are replaced by
    the allocation's (one per GPU); its checkpoint folder defaults to ``$POLLUX_CHECKPOINT_DIR``.
    """
    from pollux.litz.runtime import LitzRuntime

    env = dict(os.environ if env is None else env)
    job_id = env[ct.ENV_JOB_ID]
    link = ServiceLink(env[ct.ENV_SCHEDULER_URL], job_id, env.get(ct.ENV_JOB_TOKEN))
    raylink.connect(env[ct.ENV_RAY_ADDRESS], namespace=f"pollux-litz-{job_id}")
    ckpt = runtime_config.checkpoint_dir or env.get(ct.ENV_CHECKPOINT_DIR)

    def make_run(slots: list[str]) -> LitzRuntime:
        # A relaunched job (preempted, or moved the ordinary way) goes on from its latest checkpoint.
        cfg = dataclasses.replace(runtime_config, num_workers=len(slots), node_ids=slots, checkpoint_dir=ckpt,
                                  resume=ckpt is not None)
        return LitzRuntime(app, cfg)

    master = ServiceMaster(link, RayNodeDirectory(), make_run, num_executors=runtime_config.num_executors,
                           checkpoint=ckpt is not None, poll_s=poll_s, hints_every_s=hints_every_s)
    signal.signal(signal.SIGTERM, lambda *_: master.preempt())
    return master.run()
