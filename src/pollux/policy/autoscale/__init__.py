"""Cloud autoscaling: how many nodes a cluster should hold, from its jobs' models (issue 36).

Statistical efficiency rises during training, so a job's best goodput per GPU grows with it: it pays
to start small and add nodes when larger batches have become useful (thesis §3.5.4, SPEC §10). The
rules here are pure and seeded like the scheduling policies: they read :class:`JobView` s and what
the fleet holds (:class:`Fleet`) and answer a node count (:class:`ScaleDecision`) and a JSON state.

Modules: :mod:`.api` (the records and the :class:`Autoscaler` protocol), :mod:`.utility` (the
cluster's utility for every size: the jobs' speedup curves shared out greedily),
:mod:`.rules` (the goodput rule, Or et al.'s throughput rule, a fixed size) and :mod:`.registry`.
A cloud of several GPU types at their prices (:class:`NodePool`, ``Fleet.pools``) is sized per type
by the same rules: :mod:`.typed_utility` (the utility of a node vector and the path that adds the
best utility per price first) and :mod:`.typed_rule`.
"""

from pollux.policy.autoscale.api import Autoscaler, Fleet, NodePool, PoolNodes, ScaleDecision
from pollux.policy.autoscale.registry import AUTOSCALERS, autoscaler_names, make_autoscaler

__all__ = ["AUTOSCALERS", "Autoscaler", "Fleet", "NodePool", "PoolNodes", "ScaleDecision", "autoscaler_names",
           "make_autoscaler"]
