"""The control loop: the scheduler that runs a policy over the store's jobs each round, the
controller that makes the backend's replicas match the allocations, and the runners that say how a
job of each kind follows a new allocation (stop and relaunch, or resize in place)."""
