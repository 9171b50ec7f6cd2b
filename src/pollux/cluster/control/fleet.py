"""The live service's autoscaler: after each round, how many nodes to hold, and which ones may go.

The live counterpart of the simulator's :class:`pollux.sim.fleet.CloudFleet`, so that the two
behave alike for the same inputs. After every scheduling round the controller hands
:meth:`FleetScaler.after_round` the round's job views and which nodes hold replicas; the scaler asks
its rule (:mod:`pollux.policy.autoscale`) for a node count and carries it out through a
:class:`~pollux.cluster.backends.nodes_api.NodeProvider`:

* **grow**: nodes being drained come back first (they are paid for and still hold jobs), then
  nodes let go and still here; then the provider is asked for the rest;
* **shrink**: nodes asked for and not yet here are cancelled first; then the ready nodes holding
  the fewest GPUs in use (the newest of equals) are *drained*: the controller leaves them out of
  the cluster it gives the policy, so the next round (asked for at once) moves their jobs
  elsewhere, by checkpoint and restart or by an elastic job's resize in place. A drained node is
  let go (*leaving*) only once no replica runs there; an empty node is let go at once. Nothing is
  lost: a node goes only when it is empty.

Between rounds :meth:`FleetScaler.release_empty` lets drained nodes go as soon as their last
replica has stopped, rather than a whole round interval later. Each change of the fleet is
appended to a JSON-lines record (one object per round whose decision or inputs changed,
``FleetEntry``): the sizes over time, and the rule's inputs, so that the simulator's fleet can be
driven by the same inputs (``benchmarks/autoscale_live.py``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pollux.cluster.backends.nodes_api import NodeProvider, ProviderError
from pollux.policy.autoscale.api import Autoscaler, AutoscaleState, Fleet, ScaleDecision
from pollux.policy.base import JobView

__all__ = ["FLEET_RECORD", "AutoscaleConfig", "FleetEntry", "FleetScaler", "parse_bounds", "parse_options",
           "read_record"]

logger = logging.getLogger("pollux.cluster")


#: The fleet's record in the state folder: one JSON object per change (:class:`FleetEntry`).
FLEET_RECORD = "fleet.jsonl"


def parse_options(items: Sequence[str], where: str = "--autoscale-option") -> dict[str, float | int]:
    """``{"cooldown_s": 300, "grow_to": 0.4}`` from ``["cooldown_s=300", "grow_to=0.4"]``: the rules'
    options are numbers (whole ones as ints, as ``fixed``'s ``nodes`` needs)."""
    out: dict[str, float | int] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            out[key.strip()] = int(number) if number.is_integer() else number
        except ValueError:
            raise ValueError(f"{where}: expected KEY=NUMBER such as cooldown_s=300, got {item!r}") from None
    return out


def parse_bounds(text: str, where: str = "--autoscale") -> tuple[int, int]:
    """``(MIN, MAX)`` from ``"MIN:MAX"``; ValueError naming ``where`` otherwise."""
    low, sep, high = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        bounds = int(low), int(high)
    except ValueError:
        raise ValueError(f"{where}: expected MIN:MAX node counts such as 1:8, got {text!r}") from None
    if not 0 <= bounds[0] <= bounds[1] or bounds[1] < 1:
        raise ValueError(f"{where}: expected 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return bounds


@dataclass(frozen=True)
class AutoscaleConfig:
    """The live fleet's bounds and rule: ``min_nodes``..``max_nodes`` nodes of ``gpus_per_node``
    GPUs; ``rule`` and ``options`` name the rule in :func:`pollux.policy.autoscale.make_autoscaler`;
    ``provision_delay_s`` is how long a node takes to come (the rule is told)."""

    min_nodes: int
    max_nodes: int
    gpus_per_node: int
    rule: str = "goodput"
    options: Mapping[str, Any] = field(default_factory=dict)
    provision_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_nodes <= self.max_nodes or self.max_nodes < 1:
            raise ValueError(f"autoscale: expected 0 <= MIN <= MAX and MAX >= 1, "
                             f"got {self.min_nodes}:{self.max_nodes}")
        if self.gpus_per_node < 1:
            raise ValueError(f"autoscale: gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if not (math.isfinite(self.provision_delay_s) and self.provision_delay_s >= 0):
            raise ValueError(f"autoscale: provision_delay_s must be >= 0, got {self.provision_delay_s}")


@dataclass(frozen=True)
class FleetEntry:
    """One decision of the live fleet, as recorded: when, the rule's target and why, and the nodes
    ready (schedulable), pending (asked for, not here yet), draining (jobs being moved off) and
    leaving (empty, let go, not gone yet) after it was carried out."""

    time: float
    target: int
    reason: str
    efficiency: float | None
    ready: list[str]
    pending: int
    draining: list[str]
    leaving: list[str]
    #: The rule's inputs, for a replay in the simulator: the jobs it saw, the GPUs in use per node,
    #: and its utility per GPU at every size (None for a rule that reads none).
    jobs: int = 0
    busy: dict[str, int] = field(default_factory=dict)
    utility: list[float] | None = None

    @property
    def held(self) -> int:
        """Nodes paid for: ready, on their way and being drained."""
        return len(self.ready) + self.pending + len(self.draining)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "held": self.held}


class FleetScaler:
    """Sizes the live cluster after each round (see the module docstring)."""

    def __init__(self, provider: NodeProvider, autoscaler: Autoscaler, config: AutoscaleConfig,
                 *, record: Path | None = None) -> None:
        self.provider = provider
        self.autoscaler = autoscaler
        self.config = config
        self.record = record
        #: Nodes whose jobs are being moved off: not offered to the policy.
        self.draining: set[str] = set()
        #: Empty nodes let go and not gone yet: not offered, not counted.
        self.leaving: set[str] = set()
        self.state: AutoscaleState | None = None
        self.last: FleetEntry | None = None
        #: When each alive node was first seen (a counter): of nodes equally busy, the newest goes.
        self.seen: dict[str, int] = {}
        self._arrivals = 0

    @property
    def unsettled(self) -> bool:
        """Nodes are on their way, being drained or leaving: worth watching between rounds."""
        return bool(self.draining or self.leaving or (self.last is not None and self.last.pending))

    def offered(self, names: Sequence[str]) -> list[str]:
        """The alive nodes the policy may use: neither draining nor leaving."""
        return [n for n in names if n not in self.draining and n not in self.leaving]

    def _settle(self, alive: Sequence[str], busy: Mapping[str, int]) -> list[str]:
        """Forget nodes that are gone, let drained empty nodes go; returns the nodes kept."""
        up = set(alive)
        self.leaving &= up
        self.draining &= up
        self.seen = {n: k for n, k in self.seen.items() if n in up}
        for name in sorted(up - set(self.seen), key=_index):
            self.seen[name] = self._arrivals
            self._arrivals += 1
        for name in sorted(self.draining):
            if busy.get(name, 0) <= 0:
                self.draining.discard(name)
                self.leaving.add(name)
                logger.info("autoscale: node %s is empty: letting it go", name)
        return [n for n in alive if n not in self.leaving]

    def release_empty(self, alive: Sequence[str], busy: Mapping[str, int]) -> bool:
        """Between rounds: let drained nodes that emptied go now. True if one did."""
        self.leaving &= set(alive)   # gone: nothing to watch
        if not any(busy.get(n, 0) <= 0 for n in self.draining):
            return False
        keep = self._settle(alive, busy)
        self._hold(keep, self.provider.pending(alive), alive)
        return True

    def after_round(self, views: Sequence[JobView], alive: Sequence[str], busy: Mapping[str, int],
                    now: float) -> FleetEntry:
        """Ask the rule for a size given the round's ``views``, the ``alive`` nodes and the GPUs in
        use on each (``busy``), and carry it out. Returns what was decided."""
        keep = self._settle(alive, busy)
        ready = [n for n in keep if n not in self.draining]
        pending = self.provider.pending(alive)
        fleet = Fleet(ready=len(ready), pending=pending, min_nodes=self.config.min_nodes,
                      max_nodes=self.config.max_nodes, gpus_per_node=self.config.gpus_per_node,
                      provision_delay_s=self.config.provision_delay_s)
        decision, self.state = self.autoscaler.decide(views, fleet, self.state, now)
        new = self._carry_out(decision, ready, pending, busy)
        keep = [n for n in alive if n not in self.leaving]
        self._hold(keep, new, alive)
        utility = None if decision.utility is None else [round(float(x), 6) for x in decision.utility]
        entry = FleetEntry(time=float(now), target=int(decision.target), reason=decision.reason,
                           efficiency=decision.efficiency,
                           ready=[n for n in keep if n not in self.draining], pending=new,
                           draining=sorted(self.draining), leaving=sorted(self.leaving), jobs=len(views),
                           busy={n: int(g) for n, g in sorted(busy.items()) if int(g) > 0}, utility=utility)
        self._write(entry)
        self.last = entry
        return entry

    def _carry_out(self, decision: ScaleDecision, ready: list[str], pending: int,
                   busy: Mapping[str, int]) -> int:
        """Drain or bring back nodes for ``decision``; returns how many nodes should be on their way."""
        held = len(ready) + pending
        if decision.target > held:
            grow = decision.target - held
            # Nodes still here come back first, in index order: draining ones (they hold jobs), then
            # empty ones let go and not gone yet (a provider may keep one to meet the new count).
            for name in sorted(self.draining, key=_index)[:grow]:
                self.draining.discard(name)
                grow -= 1
                logger.info("autoscale: node %s is wanted again: no longer draining", name)
            for name in sorted(self.leaving, key=_index)[:grow]:
                self.leaving.discard(name)
                grow -= 1
                logger.info("autoscale: node %s is wanted again: no longer leaving", name)
            return pending + grow
        if decision.target < held:
            shrink = held - decision.target
            cancel = min(pending, shrink)
            shrink -= cancel
            # The fewest GPUs in use first; of those, the node that came last (a name with an index
            # says which where nodes came together; Ray's autoscaler names its nodes by id).
            order = sorted(ready, key=lambda n: (busy.get(n, 0), -self.seen.get(n, -1), -_index(n), n))
            for name in order[:shrink]:
                if busy.get(name, 0) > 0:
                    self.draining.add(name)
                    logger.info("autoscale: draining node %s (%s)", name, decision.reason)
                else:
                    self.leaving.add(name)
                    logger.info("autoscale: letting empty node %s go (%s)", name, decision.reason)
            return pending - cancel
        return pending

    def _hold(self, keep: list[str], new: int, alive: Sequence[str]) -> None:
        try:
            self.provider.hold(keep, new, alive=list(alive))
        except ProviderError as exc:
            logger.error("autoscale: the %s provider failed: %s", self.provider.kind, exc)

    def _write(self, entry: FleetEntry) -> None:
        last = self.last
        same = last is not None and {**last.to_dict(), "time": 0} == {**entry.to_dict(), "time": 0}
        if self.record is None or same:
            return
        try:
            with self.record.open("a") as f:
                f.write(json.dumps(entry.to_dict()) + "\n")
        except OSError as exc:
            logger.warning("autoscale: cannot append to %s (%s)", self.record, exc.strerror or exc)

    def status(self, alive: Sequence[str]) -> dict[str, Any]:
        """What ``GET /v1/nodes`` answers, given the alive nodes: the bounds, the rule, the last
        decision, and the nodes ready, pending (asked for, not here yet), draining and leaving."""
        last = self.last
        keep = [n for n in alive if n not in self.leaving]
        return {"autoscale": True, "provider": self.provider.kind, "rule": self.autoscaler.name,
                "min_nodes": self.config.min_nodes, "max_nodes": self.config.max_nodes,
                "gpus_per_node": self.config.gpus_per_node,
                "decided_at": None if last is None else last.time,
                "target": None if last is None else last.target,
                "reason": None if last is None else last.reason,
                "efficiency": None if last is None else last.efficiency,
                "ready": [n for n in keep if n not in self.draining],
                "pending": self.provider.pending(alive),
                "draining": sorted(self.draining), "leaving": sorted(self.leaving & set(alive))}


def _index(name: str) -> int:
    """The number at the end of a node name (``node-3`` → 3), -1 without one: the newest goes first."""
    _, _, tail = name.rpartition("-")
    return int(tail) if tail.isdigit() else -1


def read_record(path: Path) -> list[dict[str, Any]]:
    """The entries of a fleet record, oldest first (a torn last line is skipped)."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
