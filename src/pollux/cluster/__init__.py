"""The live cluster (SPEC §9): the scheduler service, its persistent job store and its backends."""
