"""Scheduling policies as pure, seeded functions (SPEC §5–6): Pollux, Tiresias, Optimus, FIFO.

Every policy implements :class:`pollux.policy.base.Policy`; the simulator and the live service
call ``decide`` the same way. :func:`make_policy` builds one by name.
"""

from pollux.policy.base import (
    Allocation,
    Cluster,
    JobView,
    Oracle,
    Policy,
    PolicyState,
    check_allocation,
    decode_state,
    encode_state,
    from_matrix,
    place_spread,
    to_matrix,
)
from pollux.policy.registry import POLICY_NAMES, make_policy

__all__ = [
    "POLICY_NAMES",
    "Allocation",
    "Cluster",
    "JobView",
    "Oracle",
    "Policy",
    "PolicyState",
    "check_allocation",
    "decode_state",
    "encode_state",
    "from_matrix",
    "make_policy",
    "place_spread",
    "to_matrix",
]
