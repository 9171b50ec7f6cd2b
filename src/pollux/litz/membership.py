"""The run's workers: their actors, where each runs, what each knows, and which executors it hosts.

A worker is a Ray actor that hosts executors (thesis §4.2). The master creates workers at the start,
when a resize adds some (``pollux.litz.elastic``) and when a checkpoint is restored; it moves
executors between them while the job runs, and removes workers that leave. This module keeps that
bookkeeping in one place, so that the master's loop and the elasticity code ask for an operation
(create, place, move, remove) instead of editing several tables by hand:

* ``workers``: worker id → actor handle; ``pids`` (for tests and the service), ``nodes`` (the Ray
  node each was asked to run on, None for anywhere);
* ``layouts``: the PS layout id each worker last received (a batch carries a newer layout along);
* ``exec_worker``: executor → the worker that hosts it (the dispatch sends its tasks there);
* ``node_ids``: the job's nodes, on which new workers (and shards) go when no node is named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import ray

from pollux.litz.actors import actor_options, wait_dead
from pollux.litz.api import Application
from pollux.litz.records import Layout, RuntimeConfig, TableMeta
from pollux.litz.worker import LitzWorkerActor, SequentialWorkerActor
from pollux.litz.worker_links import WorkerLinks

__all__ = ["Membership"]


class Membership:
    """The workers of one run and the executors they host; see the module docstring."""

    def __init__(
        self,
        app: Application,
        cfg: RuntimeConfig,
        tables: dict[str, TableMeta],
        links: WorkerLinks,
        get: Callable[..., Any],
    ) -> None:
        self.app = app
        self.cfg = cfg
        self.tables = tables
        self.links = links
        self.get = get
        self.workers: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self.nodes: dict[int, str | None] = {}
        self.layouts: dict[int, int] = {}
        self.exec_worker: dict[int, int] = {}
        self.next_worker_id = 0
        self.node_ids = list(cfg.node_ids) if cfg.node_ids else None
        # with the direct channel a worker is an async actor: the batches it reads from its socket
        # and the Ray calls that move executors share its event loop (see `open_channel`)
        sequential = cfg.sequential_workers and not cfg.direct_channel
        self.worker_cls = ray.remote(SequentialWorkerActor if sequential else LitzWorkerActor)

    def default_node(self, index: int) -> str | None:
        """Node of the `index`-th worker when no node is asked for: `RuntimeConfig.node_ids` cycled."""
        return self.node_ids[index % len(self.node_ids)] if self.node_ids else None

    def make(self, node: str | None, layout: Layout) -> int:
        """Create a worker (on Ray node `node` when given) that knows `layout`; it hosts no
        executor yet."""
        wid = self.next_worker_id
        self.next_worker_id += 1
        self.nodes[wid] = node
        opts = actor_options(self.cfg, node)
        if self.cfg.sequential_workers and not self.cfg.direct_channel:
            opts["max_concurrency"] = 1  # one call at a time, in the order sent
        handle: Any = self.worker_cls.options(**opts).remote(
            wid,
            self.app,
            self.cfg.num_executors,
            self.tables,
            layout,
            self.cfg.task_floor_s,
            self.cfg.inline_update_bytes,
        )
        self.workers[wid] = handle
        self.layouts[wid] = layout.layout_id
        if self.cfg.direct_channel:
            self.links.open(wid, handle, overlap=not self.cfg.sequential_workers)
        return wid

    def place_executors(
        self, next_seq: dict[int, int], states: Mapping[int, tuple[Any, int]] | None = None
    ) -> None:
        """Spread all executors over the workers in contiguous balanced blocks, loading inputs;
        each executor's next sequence number (the master's, in `next_seq`) comes from `states`."""
        wids = sorted(self.workers)
        refs = []
        for wid, block in zip(
            wids, np.array_split(np.arange(self.cfg.num_executors), len(wids)), strict=True
        ):
            for e in block.tolist():
                state, seq = (states or {}).get(e, (None, 0))
                self.exec_worker[e] = wid
                next_seq[e] = seq
                refs.append(self.workers[wid].add_executor.remote(e, {"state": state, "next_seq": seq}))
        self.get(refs)
        self.pids = dict(zip(wids, self.get([self.workers[w].pid.remote() for w in wids]), strict=True))

    def executors_of(self, wids: list[int]) -> dict[int, list[int]]:
        """The executors each of `wids` hosts, in executor order."""
        out: dict[int, list[int]] = {w: [] for w in wids}
        for e, w in sorted(self.exec_worker.items()):
            if w in out:
                out[w].append(e)
        return out

    def move_executor(self, e: int, dst: int, seq: int, send_input: bool) -> Any:
        """Re-map executor `e` to worker `dst` at once (its later tasks go there) and start the
        move: the old worker releases it after the tasks it was sent (up to `seq`), and the package
        goes to `dst` through Ray's object store. Returns the reference of `dst`'s ``add_executor``."""
        src = self.exec_worker[e]
        package = self.workers[src].release_executor.remote(e, seq, send_input)
        self.exec_worker[e] = dst
        return self.workers[dst].add_executor.remote(e, package)

    def record_pids(self, wids: list[int], pids: list[int]) -> None:
        """The process ids new workers reported once running."""
        self.pids.update(zip(wids, pids, strict=True))

    def remove(self, wids: list[int], wait: bool = False) -> None:
        """Close the channels of `wids`, kill their actors and forget them; with `wait`, only once
        Ray reports each one gone (their process ids stay listed until then)."""
        for w in wids:
            self.links.forget(w)
        handles = [self.workers.pop(w) for w in wids]
        for h in handles:
            ray.kill(h, no_restart=True)
        if wait:
            wait_dead(handles)
        for w in wids:
            self.layouts.pop(w, None)
            self.pids.pop(w, None)
            self.nodes.pop(w, None)

    def forget_all(self) -> list[Any]:
        """Close every channel and forget every worker and executor placement, without killing
        (the caller kills the returned handles with the rest of the run's actors)."""
        for w in list(self.workers):
            self.links.forget(w)
        handles = list(self.workers.values())
        self.workers.clear()
        self.exec_worker.clear()
        return handles
