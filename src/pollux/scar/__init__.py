"""SCAR (thesis ch. 5): partial recovery and prioritised partial checkpoints for parameter servers.

Two systems share one vocabulary (:mod:`pollux.scar.api`: blocks, the top-r selection):

* :mod:`pollux.scar.live` — the fault tolerance of running Litz jobs: the controller, each PS
  shard's in-memory running copy, and the atomic on-disk running checkpoint;
* :mod:`pollux.scar.rework` — the rework-cost experiments of the thesis (pure-numpy models, seeded
  trials, the sweep behind ``pollux scar experiment``, the theorems' checks and the plots).

The input data both use come from :mod:`pollux.datasets`.
"""
