"""The HTTP side of the service: the application (:mod:`.app`), its OpenAPI document
(:mod:`.schema`) and the limits every request body is held to (:mod:`.limits`). The Python client
of this API, :mod:`pollux.cluster.client`, sits beside the rooms with the other entry points."""
