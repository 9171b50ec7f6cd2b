"""Load-balanced batches across replicas (LB-BSP): per-replica batch shares, the balancers that size
them so that every replica finishes its compute together, and the speed predictors they use.

A subsystem of its own beside the goodput core: it sizes each replica's *share* of a global batch
the goodput model has already chosen, and never changes that batch. The agent balances with it
(:mod:`pollux.torch.shares`) and the simulator models the same thing (:mod:`pollux.sim.balance`).
Pure numpy (scikit-learn inside the NARX predictor); it imports only the BLAS thread limit of the
core.
"""
