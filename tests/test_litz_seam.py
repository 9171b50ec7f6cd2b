"""The typed fault-tolerance seam between Litz and SCAR (issue 34): each side has every member of its
protocol, so a hook renamed on one side fails here rather than as a silent no-op in a live run."""

from __future__ import annotations

import pytest

from pollux.litz.api import FaultTolerance, RunningJob

pytest.importorskip("ray")

from pollux.litz.running_job import MasterView
from pollux.scar.live.controller import ScarController


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


@pytest.mark.parametrize(("protocol", "implementation"),
                         [(FaultTolerance, ScarController), (RunningJob, MasterView)])
def test_each_side_of_the_seam_has_every_member_of_its_protocol(protocol, implementation):
    members = _members(protocol)
    assert len(members) >= 7
    missing = sorted(name for name in members if not hasattr(implementation, name))
    assert not missing, f"{implementation.__name__} lacks {missing} of {protocol.__name__}"
