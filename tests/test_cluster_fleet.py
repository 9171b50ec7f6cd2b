"""The live service's autoscaled fleet (issue 36): the CLI parsers, the embedded cluster's node
provider (:class:`EmbeddedNodes`), the scaler's bookkeeping (:class:`FleetScaler`, driven by a scripted
rule and a fake provider so that only the bookkeeping is under test), its parity with the simulator's
:class:`CloudFleet`, and the controller carrying out a drain on the in-memory fake backend.

No Ray, no process, no sleep: the tests take a fraction of a second (the imports take the rest).
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fake_backend import FakeBackend, FakeClock
from pollux.cluster.backends.embedded_nodes import EmbeddedNodes, read_wanted
from pollux.cluster.backends.nodes_api import NodeProvider, ProviderError
from pollux.cluster.backends.ray_autoscaler_nodes import RayAutoscalerNodes
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.fleet import (
    AutoscaleConfig,
    FleetEntry,
    FleetScaler,
    parse_bounds,
    parse_options,
    read_record,
)
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.lifecycle import JobState
from pollux.cluster.state.store import JobStore
from pollux.policy.autoscale import Fleet, ScaleDecision
from pollux.policy.base import Cluster, JobView
from pollux.sim.fleet import CloudConfig, CloudFleet

NODES = [f"node-{i}" for i in range(4)]


# ------------------------------------------------------------------------------------------- helpers


class Scripted:
    """An autoscaling rule answering ``target`` (the test sets it) and noting every fleet it saw."""

    name = "scripted"

    def __init__(self, target: int = 0) -> None:
        self.target = target
        self.seen: list[Fleet] = []

    def decide(self, jobs: Sequence[JobView], fleet: Fleet, state: dict[str, Any] | None,
               now: float) -> tuple[ScaleDecision, dict[str, Any]]:
        self.seen.append(fleet)
        return ScaleDecision(self.target, f"scripted {self.target}", 0.5), {"calls": len(self.seen)}


@dataclass(frozen=True)
class Hold:
    """One ``hold`` call as the fake provider received it (names sorted)."""

    keep: list[str]
    new: int
    alive: list[str]


class FakeProvider:
    """A :class:`NodeProvider` that names nodes ``node-<i>`` (lowest free index, as EmbeddedNodes
    does) and records every ``hold``. ``wanted`` is what it holds: the kept nodes and those asked for.
    Nothing happens by itself: the test says which nodes are alive (``coming`` lists the asked ones
    not alive yet)."""

    kind = "fake"

    def __init__(self, gpus_per_node: int = 4, wanted: Sequence[str] = ()) -> None:
        self.gpus_per_node = gpus_per_node
        self.wanted: list[str] = list(wanted)
        self.holds: list[Hold] = []

    def hold(self, keep: Sequence[str], new: int, *, alive: Sequence[str] = ()) -> None:
        self.holds.append(Hold(sorted(keep), int(new), sorted(alive)))
        up, kept = set(alive), list(keep)
        # What was asked for and has not come is kept first: one request never makes two nodes.
        coming = [n for n in self.wanted if n not in kept and n not in up][:max(new, 0)]
        taken = set(kept) | set(coming) | up
        fresh = (f"node-{i}" for i in itertools.count() if f"node-{i}" not in taken)
        self.wanted = kept + coming + [next(fresh) for _ in range(max(new, 0) - len(coming))]

    def pending(self, alive: Sequence[str]) -> int:
        return len(self.coming(alive))

    def coming(self, alive: Sequence[str]) -> list[str]:
        up = set(alive)
        return [n for n in self.wanted if n not in up]

    def close(self) -> None:
        pass


def make_scaler(provider: FakeProvider, rule: Scripted, *, min_nodes: int = 0, max_nodes: int = 4,
                gpus_per_node: int = 4, record: Path | None = None) -> FleetScaler:
    config = AutoscaleConfig(min_nodes=min_nodes, max_nodes=max_nodes, gpus_per_node=gpus_per_node,
                             rule="fixed")
    return FleetScaler(provider, rule, config, record=record)


def fleet(ready: int, pending: int, *, max_nodes: int = 4) -> Fleet:
    return Fleet(ready=ready, pending=pending, min_nodes=0, max_nodes=max_nodes, gpus_per_node=4)


# ------------------------------------------------------------------------------------- CLI parsers


@pytest.mark.parametrize(("text", "bounds"), [("1:8", (1, 8)), ("0:4", (0, 4)), ("2:2", (2, 2)),
                                              (" 1 : 3 ", (1, 3))])
def test_parse_bounds_reads_min_and_max(text, bounds):
    assert parse_bounds(text) == bounds


@pytest.mark.parametrize("text", ["3", "a:b", "4:2", "0:0", "-1:2", "1:2:3", "", ":4", "1.5:4"])
def test_parse_bounds_refuses_bad_text_naming_the_option(text):
    with pytest.raises(ValueError, match=r"^--autoscale: expected ") as info:
        parse_bounds(text)
    assert repr(text) in str(info.value)
    with pytest.raises(ValueError, match=r"^--nodes: "):
        parse_bounds(text, where="--nodes")


def test_parse_options_reads_numbers_whole_ones_as_ints():
    got = parse_options(["cooldown_s=300", "grow_to=0.4", " nodes = 3.0", "shrink_below=1e-1"])
    assert got == {"cooldown_s": 300, "grow_to": 0.4, "nodes": 3, "shrink_below": 0.1}
    assert type(got["cooldown_s"]) is int and type(got["nodes"]) is int and type(got["grow_to"]) is float
    assert parse_options([]) == {}
    assert parse_options(["nodes=2", "nodes=5"]) == {"nodes": 5}        # the last one counts


@pytest.mark.parametrize("item", ["x=", "=1", "k=abc", "k", " =2", "k=1=2"])
def test_parse_options_refuses_bad_items_naming_the_option(item):
    with pytest.raises(ValueError, match=r"^--autoscale-option: expected KEY=NUMBER") as info:
        parse_options(["cooldown_s=300", item])
    assert repr(item) in str(info.value)


@pytest.mark.parametrize("item", ["nodes=nan", "nodes=inf", "cooldown_s=1e400"])
def test_parse_options_refuses_numbers_that_are_not_finite(item):
    with pytest.raises(ValueError, match="--autoscale-option"):
        parse_options([item])


# ---------------------------------------------------------------------------------- EmbeddedNodes


def wanted_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_embedded_nodes_asks_for_node_i_and_writes_names_and_gpus(tmp_path):
    path = tmp_path / "nodes-wanted.json"
    nodes = EmbeddedNodes(path, 4)
    assert nodes.wanted == [] and not path.exists() and nodes.pending([]) == 0
    nodes.hold([], 2)
    assert wanted_file(path) == {"nodes": ["node-0", "node-1"], "gpus_per_node": 4}
    assert read_wanted(path) == ["node-0", "node-1"]
    assert nodes.pending([]) == 2 and nodes.pending(["node-0"]) == 1
    assert nodes.pending(["node-1", "node-0"]) == 0
    assert nodes.pending(["node-7"]) == 2                      # a node it never asked for counts nothing


def test_embedded_nodes_takes_the_lowest_free_index_and_keeps_the_file_in_index_order(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"nodes": ["node-0", "node-2", "node-10"], "gpus_per_node": 2}))
    nodes = EmbeddedNodes(path, 2)
    alive = ["node-10", "node-2", "node-0"]
    nodes.hold(alive, 2, alive=alive)
    assert wanted_file(path)["nodes"] == ["node-0", "node-1", "node-2", "node-3", "node-10"]


def test_embedded_nodes_asked_again_before_arrival_keeps_the_same_names(tmp_path):
    path = tmp_path / "w.json"
    nodes = EmbeddedNodes(path, 4)
    nodes.hold([], 2)
    nodes.hold([], 2, alive=[])                                 # not here yet: no second pair
    assert read_wanted(path) == ["node-0", "node-1"]
    nodes.hold(["node-0"], 1, alive=["node-0"])                 # one came: the other is still the one
    assert read_wanted(path) == ["node-0", "node-1"]
    nodes.hold(["node-0"], 3, alive=["node-0"])                 # two more on top of node-1
    assert read_wanted(path) == ["node-0", "node-1", "node-2", "node-3"]
    nodes.hold(["node-0"], 1, alive=["node-0"])                 # fewer: the newest asks are cancelled
    assert read_wanted(path) == ["node-0", "node-1"] and nodes.pending(["node-0"]) == 1


def test_embedded_nodes_keeps_a_node_on_its_way_even_when_a_lower_name_is_free(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"nodes": ["node-0", "node-3"], "gpus_per_node": 4}))
    nodes = EmbeddedNodes(path, 4)
    nodes.hold(["node-0"], 1, alive=["node-0"])                 # node-3 is still coming: not node-1
    assert read_wanted(path) == ["node-0", "node-3"]


def test_embedded_nodes_let_go_node_leaves_the_file_and_its_name_waits_until_it_is_gone(tmp_path):
    path = tmp_path / "w.json"
    nodes = EmbeddedNodes(path, 4)
    nodes.hold([], 2)
    both = ["node-0", "node-1"]
    nodes.hold(["node-0"], 1, alive=both)        # node-1 let go (still alive) and one new node wanted
    assert read_wanted(path) == ["node-0", "node-2"]            # not node-1 again: it is still there
    assert nodes.pending(both) == 1
    nodes.hold(["node-0"], 1, alive=["node-0"])                 # node-1 gone; node-2 still on its way
    assert read_wanted(path) == ["node-0", "node-2"]
    nodes.hold(["node-0", "node-2"], 1, alive=["node-0", "node-2"])
    assert read_wanted(path) == ["node-0", "node-1", "node-2"]  # now its name is free again


def test_embedded_nodes_rewrites_a_removed_file_and_a_new_instance_reads_what_was_wanted(tmp_path):
    path = tmp_path / "w.json"
    first = EmbeddedNodes(path, 4)
    first.hold([], 3)
    again = EmbeddedNodes(path, 4)                              # a restarted service
    assert again.wanted == ["node-0", "node-1", "node-2"] and again.pending(["node-1"]) == 2
    again.hold(["node-1"], 2, alive=["node-1"])
    assert read_wanted(path) == ["node-0", "node-1", "node-2"]  # nothing new asked for
    path.unlink()
    again.hold(["node-1"], 2, alive=["node-1"])                 # same list, file gone: written again
    assert wanted_file(path) == {"nodes": ["node-0", "node-1", "node-2"], "gpus_per_node": 4}


@pytest.mark.parametrize("text", ["{", "[]", '{"nodes": "node-0"}', '{"nodes": [1]}', '{"nodes": [""]}',
                                  '{"gpus_per_node": 4}'])
def test_read_wanted_refuses_a_bad_file_naming_it(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        read_wanted(path)
    with pytest.raises(ProviderError, match=str(path)):        # the service refuses to start on it
        EmbeddedNodes(path, 4)


def test_read_wanted_of_a_missing_file_is_none(tmp_path):
    assert read_wanted(tmp_path / "none.json") is None


def test_embedded_nodes_unwritable_path_raises_provider_error_and_bad_gpus_are_refused(tmp_path):
    path = tmp_path / "missing-folder" / "w.json"
    nodes = EmbeddedNodes(path, 2)
    with pytest.raises(ProviderError, match="cannot write the wanted nodes"):
        nodes.hold([], 1)
    with pytest.raises(ValueError, match="gpus_per_node"):
        EmbeddedNodes(tmp_path / "w.json", 0)


@pytest.mark.parametrize("where", ["folder", "under-a-file"])
def test_embedded_nodes_on_a_path_it_cannot_read_raises_provider_error(tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    path = tmp_path if where == "folder" else tmp_path / "a-file" / "w.json"
    with pytest.raises(ProviderError, match=str(path)):
        EmbeddedNodes(path, 2)


def test_embedded_nodes_and_the_test_fake_are_node_providers(tmp_path):
    assert isinstance(EmbeddedNodes(tmp_path / "w.json", 1), NodeProvider)
    assert isinstance(FakeProvider(), NodeProvider)


# ---------------------------------------------------------------------------------- FleetScaler


def test_scaler_grows_from_zero_asks_once_counts_pending_until_the_nodes_arrive():
    provider, rule = FakeProvider(), Scripted(3)
    scaler = make_scaler(provider, rule)
    entry = scaler.after_round([], [], {}, 0.0)
    assert provider.holds == [Hold([], 3, [])]
    assert (entry.ready, entry.pending, entry.held, entry.target) == ([], 3, 3, 3)
    assert rule.seen == [fleet(0, 0)] and scaler.unsettled
    entry = scaler.after_round([], [], {}, 10.0)                # none here yet: the same three
    assert rule.seen[-1] == fleet(0, 3) and provider.holds[-1] == Hold([], 3, [])
    assert provider.wanted == ["node-0", "node-1", "node-2"] and entry.pending == 3
    alive = ["node-0", "node-1"]                                # two came
    entry = scaler.after_round([], alive, {}, 20.0)
    assert rule.seen[-1] == fleet(2, 1)
    assert (entry.ready, entry.pending) == (alive, 1) and provider.holds[-1] == Hold(alive, 1, alive)
    alive = ["node-0", "node-1", "node-2"]
    entry = scaler.after_round([], alive, {}, 30.0)
    assert rule.seen[-1] == fleet(3, 0) and (entry.ready, entry.pending, entry.held) == (alive, 0, 3)
    assert scaler.offered(alive) == alive and not scaler.unsettled
    assert provider.wanted == alive


def test_scaler_shrink_cancels_pending_nodes_before_draining_ready_ones():
    provider, rule = FakeProvider(), Scripted(4)
    scaler = make_scaler(provider, rule)
    scaler.after_round([], [], {}, 0.0)
    alive = ["node-0"]
    rule.target = 2
    entry = scaler.after_round([], alive, {"node-0": 0}, 1.0)   # 1 ready + 3 coming → 2: cancel 2
    assert rule.seen[-1] == fleet(1, 3)
    assert (entry.ready, entry.pending, entry.draining, entry.leaving) == (alive, 1, [], [])
    assert provider.holds[-1] == Hold(alive, 1, alive) and provider.wanted == ["node-0", "node-1"]
    rule.target = 0
    entry = scaler.after_round([], alive, {"node-0": 0}, 2.0)   # the last asked one first, then node-0
    assert rule.seen[-1] == fleet(1, 1)
    assert (entry.ready, entry.pending, entry.leaving) == ([], 0, ["node-0"])
    assert provider.holds[-1] == Hold([], 0, alive) and provider.wanted == []


def test_scaler_shrink_lets_the_least_busy_node_go_first_and_the_newest_on_a_tie():
    provider, rule = FakeProvider(wanted=NODES), Scripted(3)
    scaler = make_scaler(provider, rule)
    busy = {"node-0": 4, "node-1": 0, "node-2": 1, "node-3": 0}
    entry = scaler.after_round([], NODES, busy, 0.0)
    # node-1 and node-3 are both empty: node-3 (the highest index) goes, at once (nothing to move).
    assert (entry.leaving, entry.draining, entry.ready) == (["node-3"], [], NODES[:3])
    assert scaler.offered(NODES) == NODES[:3]
    assert provider.holds[-1] == Hold(NODES[:3], 0, NODES)      # not kept: let go
    rule.target = 2                                             # node-3 is still alive, leaving
    entry = scaler.after_round([], NODES, busy, 1.0)
    assert rule.seen[-1] == fleet(3, 0)                         # a leaving node is not counted
    assert (entry.leaving, entry.ready) == (["node-1", "node-3"], ["node-0", "node-2"])
    assert provider.holds[-1] == Hold(["node-0", "node-2"], 0, NODES)


def test_scaler_drains_a_busy_node_and_lets_it_go_only_once_it_is_empty():
    both = ["node-0", "node-1"]
    provider, rule = FakeProvider(wanted=both), Scripted(1)
    scaler = make_scaler(provider, rule)
    busy = {"node-0": 4, "node-1": 2}
    entry = scaler.after_round([], both, busy, 0.0)
    assert (entry.ready, entry.draining, entry.leaving, entry.held) == (["node-0"], ["node-1"], [], 2)
    assert scaler.offered(both) == ["node-0"] and scaler.unsettled
    assert provider.holds[-1] == Hold(both, 0, both)            # kept while it holds replicas
    entry = scaler.after_round([], both, busy, 1.0)             # its job has not moved yet
    assert rule.seen[-1] == fleet(1, 0) and entry.draining == ["node-1"]
    assert provider.holds[-1] == Hold(both, 0, both)
    calls = len(provider.holds)
    assert scaler.release_empty(both, busy) is False and len(provider.holds) == calls
    assert scaler.release_empty(both, {"node-0": 4}) is True    # its last replica stopped
    assert (scaler.draining, scaler.leaving) == (set(), {"node-1"})
    assert provider.holds[-1].keep == ["node-0"] and scaler.offered(both) == ["node-0"]
    entry = scaler.after_round([], ["node-0"], {"node-0": 4}, 2.0)   # and now it is gone
    assert (scaler.draining, scaler.leaving) == (set(), set()) and not scaler.unsettled
    assert (entry.ready, entry.pending, entry.held) == (["node-0"], 0, 1)


def test_scaler_release_empty_asks_for_no_new_node():
    both = ["node-0", "node-1"]
    provider, rule = FakeProvider(wanted=both), Scripted(1)
    scaler = make_scaler(provider, rule)
    scaler.after_round([], both, {"node-0": 4, "node-1": 2}, 0.0)
    assert scaler.release_empty(both, {"node-0": 4}) is True
    assert provider.holds[-1] == Hold(["node-0"], 0, both)
    assert provider.wanted == ["node-0"]


def test_scaler_shows_the_rule_no_pending_node_when_a_drained_node_empties():
    provider, rule = FakeProvider(wanted=NODES[:3]), Scripted(2)
    scaler = make_scaler(provider, rule)
    scaler.after_round([], NODES[:3], {"node-0": 4, "node-1": 4, "node-2": 1}, 0.0)
    assert scaler.draining == {"node-2"}
    scaler.after_round([], NODES[:3], {"node-0": 4, "node-1": 4}, 1.0)      # node-2 emptied
    assert rule.seen[-1] == fleet(2, 0)


def test_scaler_grow_takes_draining_nodes_back_before_asking_for_new_ones():
    both = ["node-0", "node-1"]
    provider, rule = FakeProvider(wanted=both), Scripted(1)
    scaler = make_scaler(provider, rule)
    busy = {"node-0": 4, "node-1": 2}
    scaler.after_round([], both, busy, 0.0)
    assert scaler.draining == {"node-1"}
    rule.target = 2
    entry = scaler.after_round([], both, busy, 1.0)
    assert rule.seen[-1] == fleet(1, 0)
    assert (entry.ready, entry.draining, entry.pending) == (both, [], 0)
    assert provider.holds[-1] == Hold(both, 0, both) and provider.wanted == both     # no new node
    rule.target = 1
    scaler.after_round([], both, busy, 2.0)
    rule.target = 3                                             # back one, and one more asked for
    entry = scaler.after_round([], both, busy, 3.0)
    assert (entry.ready, entry.draining, entry.pending, entry.held) == (both, [], 1, 3)
    assert provider.holds[-1] == Hold(both, 1, both) and provider.wanted == [*both, "node-2"]


def test_scaler_forgets_draining_and_leaving_nodes_that_disappear():
    provider, rule = FakeProvider(wanted=NODES), Scripted(2)
    scaler = make_scaler(provider, rule)
    entry = scaler.after_round([], NODES, {"node-0": 4, "node-1": 3, "node-2": 0, "node-3": 1}, 0.0)
    assert (entry.leaving, entry.draining) == (["node-2"], ["node-3"])
    alive = ["node-0", "node-1"]                                # both gone (node-3 died while draining)
    entry = scaler.after_round([], alive, {"node-0": 4, "node-1": 3}, 1.0)
    assert (scaler.draining, scaler.leaving) == (set(), set())
    assert (entry.ready, entry.draining, entry.leaving, entry.pending) == (alive, [], [], 0)
    assert scaler.release_empty(alive, {}) is False
    assert scaler.status(NODES)["leaving"] == [] and scaler.status(NODES)["draining"] == []


def test_scaler_record_has_one_line_per_change_and_read_record_skips_a_torn_line(tmp_path):
    record = tmp_path / "fleet.jsonl"
    provider, rule = FakeProvider(), Scripted(2)
    scaler = make_scaler(provider, rule, record=record)
    assert read_record(record) == []
    scaler.after_round([], [], {}, 5.0)
    scaler.after_round([], [], {}, 6.0)                         # the same decision: no line
    assert len(record.read_text().splitlines()) == 1
    scaler.after_round([], ["node-0", "node-1"], {}, 7.0)       # they came: a change
    scaler.after_round([], ["node-0", "node-1"], {}, 8.0)
    entries = read_record(record)
    core = ("time", "target", "reason", "efficiency", "ready", "pending", "draining", "leaving", "held")
    assert [{k: e[k] for k in core} for e in entries] == [
        {"time": 5.0, "target": 2, "reason": "scripted 2", "efficiency": 0.5, "ready": [], "pending": 2,
         "draining": [], "leaving": [], "held": 2},
        {"time": 7.0, "target": 2, "reason": "scripted 2", "efficiency": 0.5, "ready": ["node-0", "node-1"],
         "pending": 0, "draining": [], "leaving": [], "held": 2},
    ]
    with record.open("a") as f:
        f.write('{"time": 9.0, "targ')                          # a writer killed mid-line
    assert read_record(record) == entries
    assert FleetEntry(**{k: v for k, v in entries[1].items() if k != "held"}).to_dict() == entries[1]


def test_scaler_record_that_cannot_be_written_does_not_stop_the_scaler(tmp_path):
    provider, rule = FakeProvider(), Scripted(1)
    scaler = make_scaler(provider, rule, record=tmp_path / "missing-folder" / "fleet.jsonl")
    entry = scaler.after_round([], [], {}, 0.0)
    assert entry.pending == 1 and provider.holds == [Hold([], 1, [])]


def test_scaler_status_reports_bounds_rule_last_decision_and_nodes():
    nodes = NODES[:3]
    provider, rule = FakeProvider(wanted=nodes), Scripted(1)
    scaler = make_scaler(provider, rule, min_nodes=1, max_nodes=6)
    assert scaler.status(nodes) == {
        "autoscale": True, "provider": "fake", "rule": "scripted", "min_nodes": 1, "max_nodes": 6,
        "gpus_per_node": 4, "decided_at": None, "target": None, "reason": None, "efficiency": None,
        "ready": nodes, "pending": 0, "draining": [], "leaving": []}
    scaler.after_round([], nodes, {"node-0": 4, "node-1": 0, "node-2": 1}, 7.0)
    assert scaler.status(nodes) == {
        "autoscale": True, "provider": "fake", "rule": "scripted", "min_nodes": 1, "max_nodes": 6,
        "gpus_per_node": 4, "decided_at": 7.0, "target": 1, "reason": "scripted 1", "efficiency": 0.5,
        "ready": ["node-0"], "pending": 0, "draining": ["node-2"], "leaving": ["node-1"]}
    # node-1 is gone (not alive any more): no longer leaving; a node asked for shows as pending.
    provider.wanted.append("node-3")
    status = scaler.status(["node-0", "node-2"])
    assert (status["ready"], status["pending"], status["draining"], status["leaving"]) == (
        ["node-0"], 1, ["node-2"], [])


# ------------------------------------------------------------------------------ parity with CloudFleet

# Each round: (the rule's target, GPUs in use per node after the round's allocation).
B_FULL = {"node-0": 4, "node-1": 2, "node-3": 1}
PARITY_SCRIPT: list[tuple[int, dict[str, int]]] = [
    (3, {}),                                   # 0: grow from nothing: three asked for
    (3, {}),                                   # 1: they are here
    (4, {"node-0": 4, "node-1": 2}),           # 2: one more
    (4, B_FULL),                               # 3: here; hold
    (2, B_FULL),                               # 4: shrink: empty node-2 goes, busy node-3 drains
    (3, B_FULL),                               # 5: grow while node-3 drains: it comes back, no new node
    (2, B_FULL),                               # 6: shrink again: node-3 (fewest busy) drains
    (2, B_FULL),                               # 7: its job has not moved: it stays, draining
    (2, {"node-0": 4, "node-1": 2}),           # 8: it is empty: it goes
    (0, {"node-0": 4, "node-1": 2}),           # 9: shrink to 0: both drain
    (0, {}),                                   # 10: both empty: both go
]
#: (ready, held) after each round of PARITY_SCRIPT, by hand.
PARITY_COUNTS = [(0, 3), (3, 3), (3, 4), (4, 4), (2, 3), (3, 3), (2, 3), (2, 3), (2, 2), (0, 2), (0, 0)]

Run = list[tuple[int, int, list[str], list[str]]]


def run_cloud(script: Sequence[tuple[int, dict[str, int]]]) -> tuple[Run, list[Fleet]]:
    rule = Scripted()
    cloud = CloudFleet(CloudConfig(min_nodes=0, max_nodes=4, gpus_per_node=4, provision_delay_s=0.0,
                                   initial_nodes=0), rule)
    names = cloud.full.nodes
    out: Run = []
    for k, (target, busy) in enumerate(script):
        now = 60.0 * k
        cloud.offered(now)                      # nodes asked for at the last round are ready now
        rule.target = target
        cloud.after_round([], np.array([busy.get(n, 0) for n in names]), now)
        ready = [names[i] for i, s in enumerate(cloud.status) if s == CloudFleet.READY]
        draining = [names[i] for i, s in enumerate(cloud.status) if s == CloudFleet.DRAINING]
        out.append((cloud.report.ready[-1], cloud.report.held[-1], ready, draining))
    return out, rule.seen


def run_live(script: Sequence[tuple[int, dict[str, int]]]) -> tuple[Run, list[Fleet]]:
    provider, rule = FakeProvider(), Scripted()
    scaler = make_scaler(provider, rule)
    out: Run = []
    for k, (target, busy) in enumerate(script):
        # As CloudFleet with no provisioning delay: what the provider holds after the last round is
        # what is alive now: the nodes asked for came, the nodes let go are gone.
        alive = sorted(provider.wanted)
        rule.target = target
        entry = scaler.after_round([], alive, {n: b for n, b in busy.items() if n in alive}, 60.0 * k)
        out.append((len(entry.ready), entry.held, entry.ready, entry.draining))
    return out, rule.seen


def test_cloud_config_names_nodes_as_the_embedded_cluster_does():
    # Up to 10 nodes; from 11 on Cluster.uniform pads the index ("node-00"), the live names do not.
    assert CloudConfig(max_nodes=4).cluster().nodes == tuple(NODES)
    assert Cluster.uniform(4, 4).nodes == tuple(NODES)


def test_scaler_matches_cloud_fleet_round_by_round():
    """The same rule targets and the same GPUs in use per node, round by round, through CloudFleet
    (``provision_delay_s=0``: a node asked for at one round is ready at the next round's
    ``offered(now)``) and through FleetScaler (the fake provider's asked nodes are alive at the next
    round, its let-go nodes gone). Compared after each round: the ready and held counts (held: ready,
    on their way and draining) and which nodes are ready and which drain. FleetScaler only learns of
    an arrival from ``alive``, so the provider's asked nodes are made alive exactly where CloudFleet's
    ``offered(now)`` makes its pending nodes ready: before the next round's decision."""
    cloud, _ = run_cloud(PARITY_SCRIPT)
    live, _ = run_live(PARITY_SCRIPT)
    assert [(r, h) for r, h, _, _ in cloud] == PARITY_COUNTS
    assert [(r, h) for r, h, _, _ in live] == PARITY_COUNTS
    assert live == cloud


def test_scaler_shows_the_rule_the_same_fleet_as_cloud_fleet():
    _, cloud_seen = run_cloud(PARITY_SCRIPT)
    _, live_seen = run_live(PARITY_SCRIPT)
    assert live_seen == cloud_seen


def test_scaler_matches_cloud_fleet_when_growing_as_one_drained_node_empties():
    script = [(4, {}), (4, {}),
              (2, {"node-0": 4, "node-1": 4, "node-2": 1, "node-3": 2}),     # node-2 and node-3 drain
              (3, {"node-0": 4, "node-1": 4, "node-3": 2})]                  # node-2 empty; grow by one
    cloud, _ = run_cloud(script)
    assert [(r, h) for r, h, _, _ in cloud] == [(0, 4), (4, 4), (2, 4), (3, 3)]
    live, _ = run_live(script)
    assert live == cloud


def test_scaler_takes_drained_nodes_back_in_index_order_as_cloud_fleet_does():
    names = [f"node-{i}" for i in range(11)]
    used = np.array([1 if i in (2, 10) else 4 for i in range(11)])
    cloud_rule = Scripted(9)
    cloud = CloudFleet(CloudConfig(min_nodes=0, max_nodes=11, initial_nodes=11, provision_delay_s=0.0),
                       cloud_rule)
    cloud.after_round([], used, 0.0)                            # index 10 and index 2 drain
    cloud_rule.target = 10
    cloud.after_round([], used, 1.0)                            # one comes back: index 2
    assert cloud.status[2] == CloudFleet.READY and cloud.status[10] == CloudFleet.DRAINING
    rule = Scripted(9)
    scaler = make_scaler(FakeProvider(wanted=names), rule, max_nodes=11)
    busy = {n: int(u) for n, u in zip(names, used, strict=True)}
    scaler.after_round([], names, busy, 0.0)
    assert scaler.draining == {"node-2", "node-10"}
    rule.target = 10
    scaler.after_round([], names, busy, 1.0)
    assert scaler.draining == {"node-10"}


def test_scaler_takes_back_a_leaving_node_that_is_still_alive_when_it_grows():
    calls: list[int] = []
    provider = RayAutoscalerNodes(4, request=lambda **kw: calls.append(len(kw["bundles"])))
    rule = Scripted(2)
    scaler = FleetScaler(provider, rule, AutoscaleConfig(min_nodes=0, max_nodes=4, gpus_per_node=4))
    alive, busy = NODES[:3], {"node-0": 4, "node-1": 4}
    scaler.after_round([], alive, busy, 0.0)                    # node-2 (empty) let go: floor 2
    assert scaler.leaving == {"node-2"} and calls == [2]
    rule.target = 3                                             # grow before Ray removed node-2
    for t in (1.0, 2.0):
        scaler.after_round([], alive, busy, t)
    assert calls[-1] == 3                                       # the floor: node-2 now stays
    assert scaler.offered(alive) == alive                       # ... so it should be used again


# ------------------------------------------------------------------------------ with the controller


class StayOrMove:
    """A scheduling policy: each job in ``plan`` (job → (node, GPUs)) gets its node while that node is
    offered and has room, else the first offered node with room."""

    name = "stay-or-move"

    def __init__(self, plan: dict[str, tuple[str, int]]) -> None:
        self.plan = plan

    def decide(self, jobs: Sequence[JobView], cluster: Cluster, state: Any, now: float,
               rng: np.random.Generator) -> tuple[dict[str, dict[str, int]], None]:
        free = dict(zip(cluster.nodes, cluster.gpus, strict=True))
        out: dict[str, dict[str, int]] = {}
        for view in sorted(jobs, key=lambda v: v.id):
            if view.id not in self.plan:
                continue
            node, gpus = self.plan[view.id]
            if free.get(node, 0) < gpus:
                node = next((n for n in cluster.nodes if free[n] >= gpus), "")
            if node:
                free[node] -= gpus
                out[view.id] = {node: gpus}
        return out, None


class BackendProvider(FakeProvider):
    """The fake provider over the fake backend: let-go nodes leave the backend at once; asked ones
    join it when the test calls :meth:`arrive`."""

    def __init__(self, backend: FakeBackend, gpus_per_node: int) -> None:
        super().__init__(gpus_per_node, wanted=sorted(backend.listed))
        self.backend = backend

    def hold(self, keep: Sequence[str], new: int, *, alive: Sequence[str] = ()) -> None:
        super().hold(keep, new, alive=alive)
        for name in list(self.backend.listed):
            if name not in self.wanted:
                self.backend.drop_node(name)

    def arrive(self) -> None:
        for name in self.coming(list(self.backend.listed)):
            self.backend.add_node(name, self.gpus_per_node)


class FleetRig:
    """Two nodes of two GPUs on the fake backend, a fake clock, a store, the StayOrMove policy and a
    controller whose fleet is a FleetScaler over :class:`BackendProvider` with a scripted rule."""

    def __init__(self, tmp_path: Path, plan: dict[str, tuple[str, int]]) -> None:
        self.clock = FakeClock()
        self.backend = FakeBackend({"node-0": 2, "node-1": 2})
        self.store = JobStore(tmp_path / "jobs.db")
        scheduler = Scheduler(self.store, policy_name="fifo")
        scheduler.policy = StayOrMove(plan)
        self.provider = BackendProvider(self.backend, 2)
        self.rule = Scripted(2)
        self.fleet = FleetScaler(self.provider, self.rule,
                                 AutoscaleConfig(min_nodes=0, max_nodes=3, gpus_per_node=2))
        config = ControllerConfig(state_dir=tmp_path, interval_s=3600.0, stop_grace_s=30.0,
                                  launch_timeout_s=20.0, node_hold_s=120.0)
        self.controller = Controller(self.store, self.backend, scheduler, config, clock=self.clock,
                                     monotonic=self.clock, fleet=self.fleet)
        for job_id in plan:
            self.store.submit({"entrypoint": "train.py", "init_batch_size": 8}, job_id=job_id,
                              now=self.clock())
        self.controller.request_round()

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(0.5)
            self.controller.tick()

    def until(self, cond, what: str, limit: int = 100) -> None:
        for _ in range(limit):
            if cond():
                return
            self.tick()
        raise AssertionError(f"never {what}: {[(j.id, j.state) for j in self.store.list_jobs()]}")

    def running_on(self, job_id: str, node: str) -> bool:
        group = self.controller.groups.get(job_id)
        return (self.store.get_job(job_id).state == JobState.RUNNING and group is not None
                and not group.stopping and group.placement == {node: 1})


@pytest.fixture
def fleet_rig(tmp_path):
    made: list[FleetRig] = []

    def make(plan: dict[str, tuple[str, int]]) -> FleetRig:
        folder = tmp_path / f"rig{len(made)}"
        folder.mkdir()
        made.append(FleetRig(folder, plan))
        return made[-1]

    yield make
    for rig in made:
        rig.store.close()


def test_controller_drains_a_busy_node_moves_its_job_and_lets_the_node_go_once_empty(fleet_rig):
    r = fleet_rig({"a": ("node-0", 1), "b": ("node-1", 1)})
    r.until(lambda: r.running_on("a", "node-0") and r.running_on("b", "node-1"), "both running")
    assert r.controller.cluster.nodes == ("node-0", "node-1") and not r.fleet.draining
    r.backend.ignore_term.add("b")              # b's replica takes its time to checkpoint and exit

    # Shrink to one node: node-0 and node-1 hold one GPU each; the tie goes to node-1 (the newest).
    r.rule.target = 1
    r.controller.request_round()
    r.tick()
    assert r.fleet.draining == {"node-1"}
    assert r.controller._next_round == 0.0      # the drained node's job is moved now, not in an hour
    assert r.provider.holds[-1].keep == ["node-0", "node-1"]    # not let go: b still runs there

    # (a) the draining node is left out of the cluster given to the policy, but is still alive.
    r.controller.refresh_nodes()
    assert r.controller.cluster.nodes == ("node-0",) and "node-1" in r.controller.alive

    # (b) the requested round moves b to node-0; the next tick asks b's run to stop.
    r.tick(2)
    assert r.store.get_job("b").allocation == {"node-0": 1}
    assert r.store.get_job("b").state == JobState.RESCALING
    (replica,) = r.backend.of("b")
    assert replica.node == "node-1" and replica.signals == [signal.SIGTERM]
    assert r.running_on("a", "node-0")          # a was not touched

    # (c) while b's replica still runs on node-1, the node stays held, whatever the fleet checks.
    r.tick(10)
    assert r.fleet.draining == {"node-1"} and "node-1" in r.backend.listed
    assert all("node-1" in h.keep for h in r.provider.holds)

    # b's replica exits (checkpointed): node-1 is let go and b runs on node-0.
    r.backend.exit("b", code=143)
    r.until(lambda: "node-1" not in r.backend.listed, "node-1 let go")
    assert r.provider.holds[-1].keep == ["node-0"] and r.fleet.leaving == {"node-1"}
    r.until(lambda: r.running_on("b", "node-0"), "b running on node-0")
    assert r.store.get_job("b").failures == 0
    # node-1 is gone from the backend; the scaler forgets it at the next round.
    r.controller.request_round()
    r.tick()
    assert not r.fleet.leaving and not r.fleet.draining and not r.fleet.unsettled
    assert r.controller.cluster.nodes == ("node-0",)


def test_controller_grows_and_a_new_node_is_offered_once_it_arrives(fleet_rig):
    r = fleet_rig({"a": ("node-0", 1)})
    r.until(lambda: r.running_on("a", "node-0"), "a running")
    r.rule.target = 3
    r.controller.request_round()
    r.tick()
    assert r.provider.holds[-1] == Hold(["node-0", "node-1"], 1, ["node-0", "node-1"])
    assert r.fleet.last is not None and r.fleet.last.pending == 1 and r.fleet.unsettled
    rounds = r.controller.rounds
    r.tick()
    assert r.controller.rounds == rounds        # nothing new: no round before the interval
    r.provider.arrive()
    r.until(lambda: r.controller.rounds > rounds, "a round after the node came", limit=10)
    assert r.controller.cluster.nodes == ("node-0", "node-1", "node-2")
    assert r.fleet.last.pending == 0 and not r.fleet.unsettled


def test_controller_without_a_fleet_offers_every_alive_node(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    try:
        backend = FakeBackend({"node-0": 2, "node-1": 2})
        clock = FakeClock()
        controller = Controller(store, backend, Scheduler(store, policy_name="fifo"),
                                ControllerConfig(state_dir=tmp_path), clock=clock, monotonic=clock)
        controller.refresh_nodes()
        controller.scale(1.0)                   # no fleet: nothing to do
        assert controller.cluster.nodes == ("node-0", "node-1") and controller.alive == ["node-0", "node-1"]
    finally:
        store.close()
