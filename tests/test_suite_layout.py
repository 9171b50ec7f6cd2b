"""The suite's own layout: every test file that starts Ray, the live service or a Litz runtime runs
in the ``live`` group of ``make test`` (``pytest -n 2 --dist loadgroup``, see ``tests/conftest.py``).

Some live tests check that no *new* Ray process is left anywhere on the machine; a Ray started by a
test on the other worker at the same moment would fail them for no bug of theirs. This check keeps a
new live test file from landing outside the group."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import LIVE_PREFIXES

TESTS = Path(__file__).resolve().parent
#: What starting Ray or the live service looks like in a test file (directly or through the helpers).
STARTS_RAY = re.compile(r"ray\.init\(|local_ray\(|litz_helpers|pollux\.cluster\.rayhost|server\.start\("
                        r"|cluster_utils|--local-nodes|\"server\", \"start\"")


def test_every_file_that_starts_ray_is_in_the_live_group():
    starters = sorted(p.name for p in TESTS.glob("test_*.py")
                      if p.name != Path(__file__).name and STARTS_RAY.search(p.read_text()))
    assert len(starters) >= 10, starters          # the pattern still finds the known live files
    outside = [name for name in starters if not name.startswith(LIVE_PREFIXES)]
    assert outside == [], (f"{outside} start Ray or the live service but are not in the 'live' xdist group: "
                           "add their prefix to LIVE_PREFIXES in tests/conftest.py")
