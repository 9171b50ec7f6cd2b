"""Fixtures shared by the test files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from torch_workers.forkserver import ForkServer


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch):
    """A fresh agent in a process with none of the launcher variables set (service, torchrun, faults).

    Yields ``monkeypatch`` so a test can set the variables it is about; the agent's process-wide
    context is reset before and after.
    """
    from pollux.contract import POLLUX_VARS
    from pollux.torch.context import ENV_FAULT_OOM_ABOVE, ENV_REFIT_INTERVAL, reset_context
    from pollux.torch.env import TORCHRUN_VARS

    for name in (*POLLUX_VARS, *TORCHRUN_VARS, ENV_FAULT_OOM_ABOVE, ENV_REFIT_INTERVAL):
        monkeypatch.delenv(name, raising=False)
    reset_context()
    yield monkeypatch
    reset_context()


@pytest.fixture(scope="module")
def forks() -> Iterator[ForkServer]:
    """Replicas forked from one process that has imported torch, for the files whose runs are mostly
    start-up (:mod:`torch_workers.forkserver`); one server per test file, stopped after it."""
    from torch_workers.forkserver import ForkServer

    server = ForkServer()
    yield server
    server.close()
