"""What the service keeps: jobs and their specs, the lifecycle they move through, the SQLite store
and its schema, and the state folder on disk (locks, file modes, the store's check).

Nothing here starts a process or talks to Ray; the control loop and the HTTP side read and write
through :class:`pollux.cluster.state.store.JobStore`.
"""
