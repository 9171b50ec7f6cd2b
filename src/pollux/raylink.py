"""How every Pollux process reaches Ray: the loopback environment, and one way to join or start a
cluster.

The service's backend, the embedded Ray host, an elastic job's Litz master and the ``pollux litz``
command all start or join a local Ray cluster. Each must keep Ray on loopback and send no usage
statistics, and each must apply that before Ray reads it: Ray reads
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when first imported, and a process that imported it
earlier would rewrite a loopback address to the machine's outside one and never reach the cluster.
This module is the one place that knows this; it sits below ``cluster``, ``litz`` and ``cli`` (it
imports no other Pollux part) so that all three can use it without an arrow between them.

Ray itself is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import ModuleType

__all__ = ["AUTH_VARIABLES", "LOOPBACK_ENV", "connect", "join_env", "loopback_env", "start_local"]

#: Set in the environment of any process that starts or joins a local Ray cluster.
LOOPBACK_ENV: Mapping[str, str] = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
#: Ray's token authentication: a process that joins a cluster started with it needs both.
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def loopback_env() -> dict[str, str]:
    """A fresh copy of :data:`LOOPBACK_ENV`, to merge into a child process's environment."""
    return dict(LOOPBACK_ENV)


def join_env(address: str | None, inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a child process needs to join the cluster at ``address``: the loopback settings, Ray's
    authentication variables where ``inherited`` (default: this process's environment) has them,
    and the address as ``POLLUX_RAY_ADDRESS`` (the name lives in :mod:`pollux.contract`)."""
    from pollux.contract import ENV_RAY_ADDRESS

    source = os.environ if inherited is None else inherited
    env = loopback_env()
    env.update({name: source[name] for name in AUTH_VARIABLES if name in source})
    if address:
        env[ENV_RAY_ADDRESS] = address
    return env


def _apply_loopback() -> ModuleType:
    """Set the loopback variables in this process and make an already imported Ray see them."""
    os.environ.update(LOOPBACK_ENV)
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] != "0"
    return ray


def connect(address: str, *, namespace: str, logging_level: int = logging.WARNING) -> ModuleType:
    """Join the running cluster at ``address`` as a driver in ``namespace`` (once per process: a
    process already connected keeps its connection) and return the ``ray`` module."""
    ray = _apply_loopback()
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, logging_level=logging_level, log_to_driver=False,
                 include_dashboard=False)
    return ray


def start_local(num_cpus: int, *, logging_level: int = logging.ERROR) -> ModuleType:
    """Start a one-node cluster on 127.0.0.1 owned by this process (it stops with
    ``ray.shutdown()`` or with the process) and return the ``ray`` module."""
    ray = _apply_loopback()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging_level,
             log_to_driver=False, _node_ip_address="127.0.0.1")
    return ray
