"""Fixtures shared by the test files."""

from __future__ import annotations

import pytest


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


#: Test files that start Ray, the live service or a Litz runtime, or run a benchmark as a
#: subprocess. Under ``pytest -n 2 --dist loadgroup`` (``make test``) they all run on one worker,
#: one after another: some check that no *new* Ray process is left anywhere on the machine, which
#: another worker's Ray would break, and their timeouts were set for one such test at a time. The
#: other worker meanwhile runs the rest (numerics, policies, the simulator, torch agent tests).
LIVE_PREFIXES = ("test_cluster_", "test_litz_", "test_scar_live", "test_bench_", "test_cli_litz",
                 "test_cli_cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith(LIVE_PREFIXES):
            item.add_marker(pytest.mark.xdist_group("live"))
