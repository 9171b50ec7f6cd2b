"""Fixtures shared by the test files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: Test files that start processes (Ray clusters, the service, training scripts, browsers,
#: torch.distributed groups) or time a live system. Under pytest-xdist (``make test`` runs
#: ``-n 2 --dist loadgroup``) they form one group, run one after another on one worker: two Ray
#: clusters or services at once would compete for the CPU they are timed on, for session directories
#: and for the checks that no process is left behind, while the other worker runs the tests that only
#: compute. ``tests/test_test_groups.py`` checks that a file which starts processes is listed here.
LIVE_FILES = frozenset({
    "test_bench_autoscale.py", "test_bench_core_speeds.py", "test_bench_hpo.py", "test_bench_lbbsp.py",
    "test_bench_litz.py", "test_bench_service_load.py", "test_bench_sim_profile.py", "test_cli.py",
    "test_cli_cluster.py", "test_cli_litz.py", "test_cluster_autoscale_live.py",
    "test_cluster_backend.py", "test_cluster_controller.py", "test_cluster_e2e.py",
    "test_cluster_prometheus.py", "test_cluster_server.py", "test_cluster_sia_live.py",
    "test_cluster_store.py", "test_cluster_types.py", "test_cluster_web_browser.py",
    "test_examples.py", "test_examples_more.py", "test_hints.py", "test_hpo_live.py",
    "test_litz_checkpoint.py", "test_litz_elastic.py", "test_litz_live.py", "test_litz_local.py",
    "test_litz_runtime.py", "test_litz_worker_unit.py", "test_ray_autoscaler_nodes.py",
    "test_scar_cli.py", "test_scar_live.py", "test_scar_live_lda.py", "test_scar_store.py",
    "test_torch_checkpoint.py", "test_torch_tensorboard.py",
})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``: the live files' tests as one unit of work, every other test on its
    own. (xdist's own loadgroup reads ``xdist_group`` marks by renaming the tests' ids, which pytest
    9.2 no longer lets it do; a scheduler that splits ids by file needs no renaming.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LiveGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "live" if Path(path).name in LIVE_FILES else nodeid

    return LiveGroupScheduling(config, log)


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
