"""The goodput core: efficiency, throughput and goodput models, fitting, batch-size optimisation.

This is the only place goodput math lives; the agent, the simulator, the policies and the live
service all call into it. See ``docs/goodput.md`` for the model and the public API.
"""

from pollux.goodput.efficiency import (
    LEGW,
    AdaScale,
    GradNoiseState,
    Linear,
    ScalingRule,
    SquareRoot,
    combine_groups,
    efficiency,
    estimate_differenced,
    estimate_from_grads,
    estimate_from_norms,
    estimate_unequal,
    gain,
    pgns,
    scaling_rule_for,
)
from pollux.goodput.model import (
    BatchLimits,
    BatchPlan,
    GoodputModel,
    exploration_cap,
    fair_share,
    optimize,
    should_switch,
    speedup_table,
)
from pollux.goodput.records import GradStats, ThroughputParams
from pollux.goodput.throughput import (
    t_grad,
    t_iter,
    t_sync,
    throughput,
)
from pollux.goodput.throughput_fit import (
    ThroughputFit,
    exploration_priors,
    fit_throughput,
)

__all__ = [
    "LEGW",
    "AdaScale",
    "BatchLimits",
    "BatchPlan",
    "GoodputModel",
    "GradNoiseState",
    "GradStats",
    "Linear",
    "ScalingRule",
    "SquareRoot",
    "ThroughputFit",
    "ThroughputParams",
    "combine_groups",
    "efficiency",
    "estimate_differenced",
    "estimate_from_grads",
    "estimate_from_norms",
    "estimate_unequal",
    "exploration_cap",
    "exploration_priors",
    "fair_share",
    "fit_throughput",
    "gain",
    "optimize",
    "pgns",
    "scaling_rule_for",
    "should_switch",
    "speedup_table",
    "t_grad",
    "t_iter",
    "t_sync",
    "throughput",
]
