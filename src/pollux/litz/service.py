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
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pollux import contract as ct
from pollux import raylink
from pollux.hints import build_hints, hints_path

logger = logging.getLogger("pollux.litz")

#: Seconds between reads of the allocation while the job runs.
POLL_S = 0.5


class ServiceError(RuntimeError):
    """The service could not be reached or refused the master's request (the message says which)."""


@dataclass(frozen=True)
class Allocation:
    """The service's answer: the current allocation, its version, and the newest version applied."""

    version: int
    allocation: dict[str, int]
    applied: int
    state: str

    def slots(self) -> list[str]:
        """One node name per allocated GPU, nodes in name order (worker i on slot i)."""
        return [n for n, g in sorted(self.allocation.items()) for _ in range(int(g))]


class ServiceLink:
    """The master's calls to the service, over HTTP with the job's own token (standard library)."""

    def __init__(self, url: str, job_id: str, token: str | None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        quoted = urllib.parse.quote(job_id, safe="")
        self.path = ct.ALLOCATION_ENDPOINT.format(job_id=quoted)
        self.hints_path = hints_path(job_id)
        self.token = token
        self.timeout_s = timeout_s
        # Loopback needs no proxy; a proxy from the environment must not see the job's token.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One call with the job's token; the JSON answer, or ``ServiceError`` naming the call."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise ServiceError(f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServiceError(f"{method} {path}: {exc}") from exc

    def _allocation(self, method: str, body: Mapping[str, Any] | None = None) -> Allocation:
        got = self._request(method, self.path, body)
        try:
            return Allocation(int(got["version"]), {str(k): int(v) for k, v in got["allocation"].items()},
                              int(got["applied"]), str(got["state"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ServiceError(f"{method} {self.path}: unexpected answer {got!r:.300}") from exc

    def get(self) -> Allocation:
        return self._allocation("GET")

    def ack(self, version: int) -> Allocation:
        return self._allocation("PUT", {"version": int(version)})

    def put_hints(self, body: Mapping[str, Any]) -> None:
        """``PUT /v1/jobs/{id}/hints`` (the scheduler's model of the job); ``ServiceError`` if refused."""
        self._request("PUT", self.hints_path, body)


def litz_hints(num_executors: int, task_s: float, workers: int, sync_s: float = 0.002) -> dict[str, Any]:
    """Hints (schema v2) that let a goodput policy size a Litz job: its global "batch" is one
    micro-task per executor, fixed (no batch-size scaling, so statistical efficiency is 1), and a
    worker running ``E / W`` of them takes ``task_s`` each — so the job speeds up with workers until
    each has one executor. ``task_s`` is measured by the master (wall time per task per worker)."""
    executors = max(int(num_executors), 1)
    throughput = {"alpha_grad": 1e-3, "beta_grad": max(float(task_s), 1e-6), "alpha_local": float(sync_s),
                  "beta_local": 0.0, "alpha_node": float(sync_s), "beta_node": 0.0, "gamma": 1.0}
    return build_hints(throughput, {"sqr": 1.0, "var": 0.0}, init_batch_size=executors,
                       max_batch_size=executors, local_bsz_bounds=[1, executors], accumulation=False,
                       max_replicas_seen=max(int(workers), 1), progress=0.0, epoch=0)


def node_ids_by_name() -> dict[str, str]:
    """``{service node name: Ray node id}`` of the alive Ray nodes that carry a ``pollux-node-`` name."""
    import ray

    out: dict[str, str] = {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        for key in n.get("Resources", {}):
            if key.startswith(ct.NODE_RESOURCE_PREFIX):
                out[key[len(ct.NODE_RESOURCE_PREFIX):]] = n["NodeID"]
    return out


def slot_node_ids(alloc: Allocation, ids: Mapping[str, str]) -> list[str]:
    """Ray node id per allocated GPU; ``ServiceError`` naming a node Ray does not know."""
    missing = sorted({n for n in alloc.slots() if n not in ids})
    if missing:
        raise ServiceError(f"allocation version {alloc.version} names node(s) {missing} that no alive "
                           f"Ray node carries ({ct.NODE_RESOURCE_PREFIX}<name>)")
    return [ids[n] for n in alloc.slots()]


def run_under_service(app: Any, runtime_config: Any, *, env: Mapping[str, str] | None = None,
                      poll_s: float = POLL_S, hints_every_s: float = 5.0) -> dict[str, Any]:
    """Run ``app`` as the master of a service job (see the module docstring); returns the run summary
    as a dict, with ``resizes_applied`` (version, seconds from reading it to acknowledging it).

    ``runtime_config`` is a :class:`pollux.litz.records.RuntimeConfig` whose workers are replaced by
    the allocation's (one per GPU); its checkpoint folder defaults to ``$POLLUX_CHECKPOINT_DIR``.
    """
    import dataclasses

    from pollux.litz.runtime import LitzRuntime

    env = dict(os.environ if env is None else env)
    job_id = env[ct.ENV_JOB_ID]
    link = ServiceLink(env[ct.ENV_SCHEDULER_URL], job_id, env.get(ct.ENV_JOB_TOKEN))
    raylink.connect(env[ct.ENV_RAY_ADDRESS], namespace=f"pollux-litz-{job_id}")
    alloc = link.get()
    ids = node_ids_by_name()
    slots = slot_node_ids(alloc, ids)
    ckpt = runtime_config.checkpoint_dir or env.get(ct.ENV_CHECKPOINT_DIR)
    # A relaunched job (preempted, or moved the ordinary way) goes on from its latest checkpoint.
    cfg = dataclasses.replace(runtime_config, num_workers=len(slots), node_ids=slots, checkpoint_dir=ckpt,
                              resume=ckpt is not None)
    rt = LitzRuntime(app, cfg)
    out: dict[str, Any] = {}
    failed: list[BaseException] = []

    def body() -> None:
        try:
            out.update(rt.run().to_dict())
        except BaseException as exc:   # reported by the main thread
            failed.append(exc)

    preempted = threading.Event()

    def on_term(*_: Any) -> None:
        preempted.set()
        rt.stop(checkpoint=ckpt is not None)

    signal.signal(signal.SIGTERM, on_term)
    thread = threading.Thread(target=body, name="litz-master", daemon=True)
    thread.start()
    link.ack(alloc.version)
    logger.info("litz master: %d worker(s) on %s (allocation version %d)", len(slots), alloc.allocation,
                alloc.version)
    applied: list[dict[str, float]] = []
    current = alloc.version
    started, hinted = time.monotonic(), 0.0
    while thread.is_alive():
        thread.join(poll_s)
        if preempted.is_set() or not thread.is_alive():
            continue
        st = rt.status()
        if time.monotonic() - hinted >= hints_every_s and st.get("tasks_completed", 0) > 0:
            # Seconds per micro-task per worker, from what ran so far (resizes blur it a little).
            task_s = (time.monotonic() - started) * max(int(st.get("workers", 1)), 1) / st["tasks_completed"]
            try:
                link.put_hints(litz_hints(cfg.num_executors, task_s, int(st.get("workers", 1))))
            except ServiceError as exc:
                logger.warning("litz master: hints not accepted: %s", exc)
            hinted = time.monotonic()
        try:
            now = link.get()
        except ServiceError as exc:
            logger.warning("litz master: %s (will retry)", exc)
            continue
        if now.version <= current or not now.allocation:
            continue
        t0 = time.monotonic()
        try:
            target = slot_node_ids(now, node_ids_by_name())
        except ServiceError as exc:
            logger.warning("litz master: %s", exc)
            continue
        rt.resize(node_ids=target)
        while thread.is_alive() and (rt.status().get("resizing") or rt.num_workers != len(target)):
            time.sleep(0.05)
        current = now.version
        try:
            link.ack(now.version)
        except ServiceError as exc:
            logger.warning("litz master: could not acknowledge version %d: %s", now.version, exc)
        applied.append({"version": now.version, "seconds": time.monotonic() - t0})
        logger.info("litz master: moved to %s in %.2f s (allocation version %d)", now.allocation,
                    time.monotonic() - t0, now.version)
    if failed:
        raise failed[0]
    out["resizes_applied"] = applied
    out["preempted"] = preempted.is_set()
    return out
