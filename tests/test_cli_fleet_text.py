"""``pollux nodes`` of an autoscaled service (issue 36): the nodes coming and going, and the decision."""

from __future__ import annotations

from pollux.cli.fleet_text import fleet_lines, fleet_nodes

CLUSTER = {
    "nodes": [{"name": "node-0", "gpus": 2, "address": "127.0.0.1", "gpu_type": None}],
    "fleet": {"autoscale": True, "provider": "embedded", "rule": "goodput", "min_nodes": 0, "max_nodes": 4,
              "gpus_per_node": 2, "decided_at": 1795978164.7, "target": 3,
              "reason": "utility per GPU 0.80 > 0.67", "efficiency": 0.8, "ready": ["node-0"],
              "pending": 2, "draining": ["node-1"], "leaving": ["node-2"]},
}


def test_json_lists_every_node_with_its_state_pending_ones_without_a_name():
    nodes = fleet_nodes(CLUSTER)
    assert [(n["name"], n["state"]) for n in nodes] == [("node-0", "ready"), ("node-1", "draining"),
                                                        ("node-2", "leaving"), (None, "pending"),
                                                        (None, "pending")]
    assert all(n["gpus"] == 2 for n in nodes)


def test_text_shows_moving_nodes_counts_bounds_and_the_last_decision():
    text = "\n".join(fleet_lines(CLUSTER))
    assert "node-1" in text and "draining" in text and "node-2" in text and "leaving" in text
    assert text.count("pending") >= 2   # two rows, and the count line
    assert "autoscaling 0..4 node(s) of 2 GPU(s), rule goodput, through embedded" in text
    # held = ready + pending + draining (a leaving node is no longer paid for by the rule's count)
    assert "requested 4: 1 ready, 2 pending, 1 draining; 1 leaving" in text
    assert ": 3 node(s) (utility per GPU 0.80 > 0.67, utility per GPU 0.80)" in text


def test_a_fixed_cluster_has_no_fleet_lines_and_its_json_stays_the_plain_list():
    fixed = {"nodes": CLUSTER["nodes"], "fleet": None}
    assert fleet_lines(fixed) == []
    assert fleet_nodes(fixed) == [{**CLUSTER["nodes"][0], "state": "ready"}]


def test_a_fleet_before_its_first_decision_prints_no_decision_line():
    fresh = {"nodes": [], "fleet": {**CLUSTER["fleet"], "target": None, "decided_at": None, "reason": None,
                                    "efficiency": None, "ready": [], "pending": 0, "draining": [],
                                    "leaving": []}}
    lines = fleet_lines(fresh)
    assert lines[-1] == "requested 0: 0 ready, 0 pending, 0 draining; 0 leaving"
