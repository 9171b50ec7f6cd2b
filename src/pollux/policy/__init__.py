"""Scheduling policies as pure, seeded functions (SPEC §5–6): Pollux, Tiresias, Optimus, FIFO.

Every policy implements :class:`pollux.policy.base.Policy`; the simulator and the live service
call ``decide`` the same way. :func:`make_policy` builds one by name from the registry
(:mod:`pollux.policy.registry`).
"""

from pollux.policy.base import (
    Allocation,
    Cluster,
    JobView,
    Oracle,
    Policy,
    PolicyState,
    allocation_of,
    check_allocation,
    decode_state,
    encode_state,
    fixed_shape,
    from_matrix,
    to_matrix,
    with_allocation,
)
from pollux.policy.placement import place_packed, place_spread
from pollux.policy.registry import POLICY_NAMES, make_policy

__all__ = [
    "POLICY_NAMES",
    "Allocation",
    "Cluster",
    "JobView",
    "Oracle",
    "Policy",
    "PolicyState",
    "allocation_of",
    "check_allocation",
    "decode_state",
    "encode_state",
    "fixed_shape",
    "from_matrix",
    "make_policy",
    "place_packed",
    "place_spread",
    "to_matrix",
    "with_allocation",
]
