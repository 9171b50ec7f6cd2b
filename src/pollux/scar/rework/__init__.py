"""SCAR's rework-cost experiments (thesis §5.5): the pure-numpy models (:mod:`.models`), the seeded
trials (:mod:`.experiment`), the sweep and its checks (:mod:`.sweep`), the theorems' numerical checks
(:mod:`.theory`) and the figures (:mod:`.plots`)."""
