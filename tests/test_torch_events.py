"""The agent's side of the job-log events of :mod:`pollux.contract`.

The first optimizer step of a run is written once per process, on every rank, as a structured
``EVENT_FIRST_STEP`` line on stderr (a replica's log under the service), whatever the script did with
``logging``: the re-allocation benchmark and the service read it with ``parse_events`` instead of
matching a sentence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pollux.torch as ptorch
from pollux.contract import EVENT_FIRST_STEP, parse_events
from torch_workers.launch import WORKERS, launch

WORKER = WORKERS / "train_worker.py"


def test_the_first_step_is_one_event_on_stderr(agent, capsys: pytest.CaptureFixture[str]) -> None:
    agent.setenv("POLLUX_RESTARTS", "3")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ptorch.init_process_group("gloo")
    adp = ptorch.AdaptiveDataParallel(model, opt)
    x, y = torch.randn(32, 2), torch.randn(32)
    capsys.readouterr()
    for i in range(4):                          # four updates: one event, after the first
        opt.zero_grad()
        torch.nn.functional.mse_loss(adp(x[8 * i:8 * i + 8]).squeeze(1), y[8 * i:8 * i + 8]).backward()
        opt.step()
        if i == 0:
            after_first = capsys.readouterr()
    rest = capsys.readouterr()
    assert adp.steps == 4
    events = parse_events(after_first.err, EVENT_FIRST_STEP)
    assert len(events) == 1
    assert dict(events[0].fields) == {"rank": 0, "replicas": 1, "restarts": 3}
    assert events[0].time > 0
    assert parse_events(rest.err + rest.out, EVENT_FIRST_STEP) == []
    assert parse_events(after_first.out) == []  # stderr only: stdout belongs to the script


def test_every_rank_writes_one_first_step_event(tmp_path: Path) -> None:
    """Two gloo replicas whose script logs with a bare "%(message)s" format: one event per rank."""
    out = tmp_path / "job"
    out.mkdir()
    env = {"TEST_OUT_DIR": str(out), "TEST_TAG": "job", "TEST_N": "48", "TEST_M0": "8", "TEST_EPOCHS": "2",
           "POLLUX_RESTARTS": "2", "POLLUX_REFIT_INTERVAL_S": "1000"}
    group = launch(WORKER, 2, out, env=env, tag="job")
    try:
        assert group.wait(120) == [0, 0], group.output()
    finally:
        group.kill()
    for rank, log in enumerate(group.logs):
        events = parse_events(log.read_text(errors="replace"), EVENT_FIRST_STEP)
        assert len(events) == 1, group.output()
        assert dict(events[0].fields) == {"rank": rank, "replicas": 2, "restarts": 2}
