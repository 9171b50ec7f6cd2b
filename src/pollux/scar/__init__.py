"""SCAR (thesis ch. 5): partial recovery and prioritised partial checkpoints for parameter servers.

``pollux.scar.api`` holds the few shared records and the block selection; ``pollux.scar.models`` the
pure-numpy models of the rework-cost experiments; the live fault-tolerance controller runs on
``pollux.litz``.
"""
