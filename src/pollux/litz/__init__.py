"""Litz: an elastic parameter-server runtime on Ray (thesis ch. 4); see ``docs/litz.md``.

The public face. An application imports its building blocks from here (or from
:mod:`pollux.litz.api`); a program runs it with :class:`LitzRuntime` (on Ray), :func:`run_local`
(one process, the reference semantics) or :func:`run_under_service` (as the master of a Pollux
service job). Everything else in the package is the runtime's inside.

The runners are imported on first use, so that ``import pollux.litz`` (an application's module)
does not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pollux.litz.api import (
    Application,
    ApplicationError,
    Driver,
    DriverContext,
    Executor,
    LitzError,
    ParameterServer,
    TableSpec,
    TaskContext,
    TaskResult,
)
from pollux.litz.records import RunSummary, RuntimeConfig

if TYPE_CHECKING:
    from pollux.litz.local import run_local
    from pollux.litz.runtime import LitzRuntime
    from pollux.litz.service import run_under_service

__all__ = [
    "Application",
    "ApplicationError",
    "Driver",
    "DriverContext",
    "Executor",
    "LitzError",
    "LitzRuntime",
    "ParameterServer",
    "RunSummary",
    "RuntimeConfig",
    "TableSpec",
    "TaskContext",
    "TaskResult",
    "run_local",
    "run_under_service",
]

#: The runners, by name → the module that holds each (imported when first asked for).
_RUNNERS = {"LitzRuntime": "pollux.litz.runtime", "run_local": "pollux.litz.local",
            "run_under_service": "pollux.litz.service"}


def __getattr__(name: str) -> Any:
    if name in _RUNNERS:
        import importlib

        return getattr(importlib.import_module(_RUNNERS[name]), name)
    raise AttributeError(f"module 'pollux.litz' has no attribute {name!r}")
