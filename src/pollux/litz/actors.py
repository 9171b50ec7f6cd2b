"""Creating and killing the run's Ray actors: the options each is created with, and waiting until
killed ones are gone (so that their resources are free before the next step counts on them)."""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from pollux.litz.records import RuntimeConfig

__all__ = ["actor_options", "wait_dead"]


def actor_options(cfg: RuntimeConfig, node: str | None) -> dict[str, Any]:
    """Ray options of a worker (a shard drops the custom resources), pinned to ``node`` when given."""
    opts: dict[str, Any] = {"num_cpus": cfg.worker_num_cpus, "max_concurrency": cfg.max_concurrency}
    if cfg.worker_resources:
        opts["resources"] = dict(cfg.worker_resources)
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return opts


def wait_dead(handles: list[Any], timeout: float = 30.0) -> None:
    """Block until every actor in `handles` answers a ping with an actor-died error."""
    deadline = time.monotonic() + timeout
    for h in handles:
        while time.monotonic() < deadline:
            try:
                ray.get(h.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except RayActorError:
                break
            except RayError:
                break
            time.sleep(0.02)
