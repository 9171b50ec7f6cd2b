"""Where replicas run: the backend protocol (:mod:`.api`) and its Ray implementation, the launcher
that turns a job and a placement into replica launches, GPU types on nodes, and the embedded Ray
host started by ``pollux server start``."""
