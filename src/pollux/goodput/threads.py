"""BLAS limited to one thread for the core's small-matrix numerics (issue 11, item 8).

The fits, speedup tables and policy rounds work on arrays of a few thousand elements at most. With
BLAS's default threading each small call wakes a pool of threads that spin for cores a training
process is already using: measured with a busy loop on both cores of a 2-core machine, a fit of the
goodput benchmark took 36–66 ms instead of 9–15 ms; with one BLAS thread, 3–9 ms.

:func:`one_blas_thread` (a decorator; :func:`limit_blas_threads` is the same as a call) sets every
loaded BLAS library to one thread, by :mod:`threadpoolctl`, before the function runs, and **keeps** it
so for the rest of the process rather than restoring it after. Restoring is not dependable: OpenBLAS
ignores ``openblas_set_num_threads`` from any other thread once the main thread has called it
(measured with numpy's and scipy's OpenBLAS 0.3.30/0.3.31), so a limit set and lifted by the training
loop's batch-size optimisation (main thread) would leave the agent's refit thread, a moment later,
unable to limit anything. Every BLAS call of a Pollux process is small-matrix work of this kind; the
big arithmetic of a training process is torch's, whose own pools (OpenMP) are left as they are.

The controller (which lists the loaded libraries, about 5 ms) is made once, on first use; after that a
call reads each BLAS library's thread count (a few µs) and sets it again only if something else raised
it. (``threadpool_limits`` as a context manager costs about 0.8 ms a call: too much per evaluation.)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

# Loaded before the controller lists the BLAS libraries (numpy and scipy each bring their own).
import numpy  # noqa: F401
import scipy.linalg  # noqa: F401
from threadpoolctl import ThreadpoolController

__all__ = ["limit_blas_threads", "one_blas_thread"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_lock = threading.Lock()
_blas: ThreadpoolController | None = None


def limit_blas_threads() -> None:
    """Set every loaded BLAS library to one thread, for the rest of the process (module docstring)."""
    global _blas
    blas = _blas
    if blas is None:
        with _lock:
            if _blas is None:
                _blas = ThreadpoolController().select(user_api="blas")
            blas = _blas
    if any(lib.num_threads != 1 for lib in blas.lib_controllers):
        blas.limit(limits=1)     # the limiter is dropped: the limit is kept, not restored


def one_blas_thread(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorator: ``fn`` runs with BLAS limited to one thread (:func:`limit_blas_threads`)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        limit_blas_threads()
        return fn(*args, **kwargs)

    return wrapper
