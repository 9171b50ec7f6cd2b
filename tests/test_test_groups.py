"""The suite's own bookkeeping: every test file that starts processes runs in the live group.

``make test`` runs the suite on two pytest-xdist workers; ``tests/conftest.py`` keeps the files that
start Ray clusters, the service, subprocesses or a browser on one worker, one after another. A new
such file left out of that list would run beside another live test and could fail only under CI's
timing, so the list is checked against what the files do.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import LIVE_FILES

TESTS = Path(__file__).resolve().parent

#: What starting a process or a cluster looks like in a test file.
STARTS_PROCESSES = re.compile(
    r"ray\.init|local_ray|cluster_utils|import ray\b|Popen|subprocess\.|sys\.executable|rayhost|"
    r"--ray-address|run_fake_cluster|multiprocessing|mp\.spawn|playwright|chromium|litz_service"
)


def test_every_file_that_starts_processes_is_in_the_live_group():
    missing = sorted(
        path.name for path in TESTS.glob("test_*.py")
        if path.name != Path(__file__).name
        and STARTS_PROCESSES.search(path.read_text(encoding="utf-8"))
        and path.name not in LIVE_FILES
    )
    assert not missing, f"add to LIVE_FILES in tests/conftest.py: {missing}"


def test_the_live_group_names_only_existing_files():
    assert sorted(name for name in LIVE_FILES if not (TESTS / name).exists()) == []
