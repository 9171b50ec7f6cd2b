"""``pollux nodes`` of an autoscaled service: the nodes asked for, coming and going, and the last decision.

The service's ``GET /v1/cluster`` holds ``fleet`` when it was started with ``--autoscale``
(:meth:`pollux.cluster.control.fleet.FleetScaler.status`); a fixed cluster has ``fleet`` null.
"""

from __future__ import annotations

from typing import Any

from pollux.cli.formatting import escape, table, when

__all__ = ["fleet_lines", "fleet_nodes"]


def fleet_nodes(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of ``pollux nodes --json``: the alive ones (``state`` ready), then those draining or
    leaving, then one entry per node asked for and not here yet (``state`` pending, no name)."""
    fleet = cluster.get("fleet") or {}
    nodes = [{**n, "state": "ready"} for n in cluster.get("nodes") or []]
    per_node = fleet.get("gpus_per_node")
    for state in ("draining", "leaving"):
        nodes += [{"name": name, "gpus": per_node, "state": state} for name in fleet.get(state) or []]
    pending = int(fleet.get("pending") or 0)
    nodes += [{"name": None, "gpus": per_node, "state": "pending"} for _ in range(pending)]
    return nodes


def fleet_lines(cluster: dict[str, Any], terminal: bool = False) -> list[str]:
    """The autoscaler's part of ``pollux nodes``: nodes draining, leaving and pending, the counts, the
    bounds and rule, and its last decision (nothing for a fixed cluster)."""
    fleet = cluster.get("fleet")
    if not fleet:
        return []
    rows = [[escape(n["name"] or "(on its way)"), n["gpus"], n["state"]]
            for n in fleet_nodes(cluster) if n["state"] != "ready"]
    out = []
    if rows:
        out.append(table(["NODE", "GPUS", "STATE"], rows, right=(1,), terminal=terminal))
    held = len(fleet["ready"]) + int(fleet["pending"]) + len(fleet["draining"])
    out.append(f"autoscaling {fleet['min_nodes']}..{fleet['max_nodes']} node(s) of {fleet['gpus_per_node']} "
               f"GPU(s), rule {escape(fleet['rule'])}, through {escape(fleet['provider'])}")
    out.append(f"requested {held}: {len(fleet['ready'])} ready, {fleet['pending']} pending, "
               f"{len(fleet['draining'])} draining; {len(fleet['leaving'])} leaving")
    if fleet.get("target") is not None:
        eff = fleet.get("efficiency")
        utility = "" if eff is None else f", utility per GPU {eff:.2f}"
        out.append(f"last decision {when(fleet['decided_at'])}: {fleet['target']} node(s) "
                   f"({escape(fleet['reason'])}{utility})")
    return out
