"""SCAR on running Litz jobs: the fault-tolerance controller (:mod:`.controller`), each PS shard's
running copy (:mod:`.running`) and the atomic on-disk running checkpoint (:mod:`.store`)."""
