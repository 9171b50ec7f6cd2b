"""The master's end of each worker's direct channel: connecting, watching, reading results back.

Batches travel to the workers and back over each worker's direct channel
(:mod:`pollux.litz.channel`), or as Ray calls where there is none. This module holds what the master
needs for the channel side: the token that lets only this master drive its workers, the connection
to each worker (made on first use, with a fallback to Ray calls and a warning where it cannot be
had), a Ray watch on each connected worker (a lost node need not close its socket), and the results
read from the channels but not yet handled. It also waits for the batches in flight, over channels
and Ray calls alike, and turns a worker's error answer into the exception the Ray path would raise.

The dispatch and completion logic stays in :class:`~pollux.litz.master.Master`; :class:`WorkerLinks`
sees it only as a :class:`LinkOwner`, so this module does not import the master.
"""

from __future__ import annotations

import secrets
import time
import warnings
from typing import Any, Protocol

import ray

from pollux.litz.api import LitzError
from pollux.litz.channel import ChannelClient, ChannelClosed, readable
from pollux.litz.dispatch_queue import DispatchQueue
from pollux.litz.records import RunSummary, unpack

__all__ = ["ActorLost", "LinkOwner", "WorkerLinks", "raise_batch_error"]


class ActorLost(LitzError):
    """A worker or shard actor died (or a call to it failed inside Ray); recovery may follow."""


class LinkOwner(Protocol):
    """What the links read from the master."""

    #: The micro-tasks and the batches in flight.
    queue: DispatchQueue
    summary: RunSummary

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """``ray.get`` with actor deaths turned into :class:`ActorLost`."""
        ...


class WorkerLinks:
    """Each worker's direct channel as the master sees it; see the module docstring."""

    def __init__(self, owner: LinkOwner) -> None:
        self.owner = owner
        self.token = secrets.token_bytes(32)
        self.channels: dict[int, ChannelClient] = {}
        #: worker → the reference of its ``open_channel`` call: the (host, port) it listens on.
        self.channel_refs: dict[int, Any] = {}
        #: worker → its actor, from ``open`` (watched once its channel connects).
        self.handles: dict[int, Any] = {}
        #: the reference of a worker's ``watch`` call → the worker; it returns when the worker dies.
        self.sentinels: dict[Any, int] = {}
        #: Results read from a channel and not yet handled, by batch id.
        self.arrived: dict[int, dict[str, Any]] = {}

    def open(self, wid: int, handle: Any, overlap: bool) -> None:
        """Ask a new worker to listen for its channel; the master connects on first use."""
        self.handles[wid] = handle
        self.channel_refs[wid] = handle.open_channel.remote(self.token, overlap)

    def channel(self, wid: int) -> ChannelClient | None:
        """Worker ``wid``'s channel, connected on first use (its actor has started by then); None
        where it cannot be had (e.g. a firewall between the nodes): that worker's batches then
        go as Ray calls, with a warning, counted in ``RunSummary.channel_fallbacks``."""
        ch = self.channels.get(wid)
        if ch is None and wid in self.channel_refs:
            try:
                host, port = self.owner.get(self.channel_refs.pop(wid))
                ch = ChannelClient((host, int(port)), self.token)
            except ActorLost:
                raise
            except (OSError, LitzError) as err:  # cannot connect, or the worker cannot listen
                msg = f"Litz worker {wid}: no direct channel ({err}); its batches go as Ray calls"
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                self.owner.summary.channel_fallbacks += 1
                return None
            self.channels[wid] = ch
            self.sentinels[self.handles[wid].watch.remote()] = wid  # watched once it runs
        return ch

    def forget(self, wid: int) -> None:
        """Close worker ``wid``'s channel and stop watching it (before its actor is killed)."""
        if (ch := self.channels.pop(wid, None)) is not None:
            ch.close()
        self.channel_refs.pop(wid, None)
        self.handles.pop(wid, None)
        for ref in [r for r, w in self.sentinels.items() if w == wid]:
            del self.sentinels[ref]

    def ready_results(self, timeout: float) -> list[tuple[int, Any]]:
        """(batch id, in-flight key) of every batch back within ``timeout``: a channel's result is
        then in :attr:`arrived` (read, not yet handled), a Ray call's is fetched by the caller."""
        inflight = self.owner.queue.inflight
        refs = [k for k in inflight if not isinstance(k, int)]
        chans = {self.channels[i.worker_id] for k, i in inflight.items() if isinstance(k, int)}
        if not chans and not self.arrived:
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
            if not ready:
                return []
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            return [(inflight[r].batch_id, r) for r in ready]
        deadline = time.monotonic() + timeout
        while True:
            left = 0.0 if self.arrived else deadline - time.monotonic()
            # with Ray calls in flight as well (rare: a batch carrying a new layout), poll both
            self.read(chans, min(left, 0.002) if refs else left)
            out: list[tuple[int, Any]] = [(b, b) for b in self.arrived]
            if refs:
                got, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                out += [(inflight[r].batch_id, r) for r in got]
            if out or left <= 0:
                return out

    def read(self, chans: set[ChannelClient], timeout: float, closed: set[int] | None = None) -> None:
        """Read every result waiting on ``chans`` (after at most ``timeout``) into :attr:`arrived`;
        results of batches a recovery gave up are dropped. A closed channel raises
        :class:`ActorLost`, or with ``closed`` adds its worker there (and Ray's view of dead workers
        is not asked)."""
        ready = readable(chans, timeout)
        if not ready and not self.arrived and closed is None:
            self.check_sentinels()
        while ready:
            for ch in ready:
                try:
                    res = unpack(ch.receive())
                except ChannelClosed as err:
                    wid = next(w for w, c in self.channels.items() if c is ch)
                    if closed is None:
                        raise ActorLost(f"worker {wid}: {err}") from err
                    closed.add(wid)
                    chans = chans - {ch}
                    continue
                bid = int(res["batch_id"])
                if bid in self.owner.queue.inflight:
                    self.arrived[bid] = res
            ready = readable(chans, 0.0)  # whatever else is already here

    def check_sentinels(self) -> None:
        """Raise :class:`ActorLost` if Ray reports a worker dead (a lost node need not close its
        socket)."""
        if self.sentinels:
            gone, _ = ray.wait(list(self.sentinels), num_returns=1, timeout=0)
            if gone:
                wid = self.sentinels.pop(gone[0])
                self.owner.get(gone[0])  # raises for a dead actor
                raise ActorLost(f"worker {wid}: its watch returned")

    def await_inflight(self, timeout: float) -> None:
        """Wait at most ``timeout`` until every in-flight batch is back or failed, handling none of
        them (a recovery then queues their tasks again; results that come later are dropped)."""
        deadline = time.monotonic() + timeout
        inflight = self.owner.queue.inflight
        refs = [k for k in inflight if not isinstance(k, int)]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        lost: set[int] = set()  # workers whose channel closed: nothing more comes from them
        while time.monotonic() < deadline:
            waiting = [
                i.worker_id
                for k, i in inflight.items()
                if isinstance(k, int) and k not in self.arrived and i.worker_id not in lost
            ]
            if not waiting:
                return
            self.read({self.channels[w] for w in waiting}, deadline - time.monotonic(), lost)


def raise_batch_error(app_name: str, res: dict[str, Any], wid: int) -> None:
    """A worker's answer that its batch failed, raised as the Ray-call path would."""
    msg = f"worker {wid}, batch {res['batch_id']}: {res['message']}"
    if res["error"] == "lost":
        raise ActorLost(msg)
    if res["error"] == "litz":
        raise LitzError(msg)
    raise LitzError(f"{app_name}: a Litz actor failed: {msg}")
