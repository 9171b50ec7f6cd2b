"""The live demo's own logic (``pollux.cluster.demo``) without a cluster: progress, counts, giving up.

The demo itself runs in CI as ``make demo`` (``.ci/run``); these tests pin what it reads and says.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pollux.cluster import demo


def test_last_epoch_line_reads_the_newest_of_several_runs():
    log = "\n".join([
        "==> restart 0 rank 0 (node 0) <==",
        json.dumps({"event": "epoch", "epoch": 3, "batch_size": 16}),
        "2026-11-29 digits INFO epoch 4: ...",
        "==> restart 1 rank 0 (node 1) <==",
        json.dumps({"event": "epoch", "epoch": 7, "batch_size": 32}),
        json.dumps({"test_accuracy": 0.98, "batch_sizes": [16, 32]}),
    ])
    assert demo.last_epoch_line(log) == {"event": "epoch", "epoch": 7, "batch_size": 32}
    assert demo.last_epoch_line("no json here") is None


def test_batch_size_changes_and_sequences():
    assert demo.batch_size_changes({"batch_sizes": [16, 32, 24]}) == 2
    assert demo.batch_size_changes({"batch_sizes": [16]}) == 0
    assert demo.batch_size_changes(None) == 0
    assert demo._sequence([1, 1, 4, 4, 2]) == "1>4>2"
    assert demo._sequence([]) == "-"
    history = [{"allocation": {"n0": 1}}, {"allocation": {"n0": 2, "n1": 2}}, {"allocation": {"n1": 4}},
               {"allocation": {}}]
    assert demo.rescales(history) == 1


class StuckClient:
    """A service whose one job runs and never gets past epoch 2."""

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []

    def submit(self, spec: dict[str, Any], name: str) -> dict[str, Any]:
        self.submitted.append(spec)
        return {"id": "j1"}

    def jobs(self) -> list[dict[str, Any]]:
        return [{"id": "j1", "state": "running", "allocation": {"n0": 2}}]

    def logs(self, job_id: str, rank: int | None = None) -> str:
        return json.dumps({"event": "epoch", "epoch": 1, "batch_size": 24})


def test_a_stalled_demo_gives_up_saying_what_still_runs_and_how_far(monkeypatch):
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(demo.time, "monotonic", lambda: float(next(clock)))
    client = StuckClient()
    job = demo.DemoJob("digits-a", 0.0, 20, 16)
    said: list[str] = []
    with pytest.raises(demo.DemoStalled) as err:
        demo._follow(client, [job], demo.Path("train.py"), said.append,  # type: ignore[arg-type]
                     timeout_s=1e9, stall_timeout_s=100.0)
    message = str(err.value)
    assert "no job advanced for" in message
    assert "digits-a (j1) running on 2 GPU(s), epoch 2/20" in message
    assert "--json-epochs" in client.submitted[0]["args"]
    assert any("digits-a running 2g ep 2/20 bs 24" in line for line in said)


def test_a_progressing_demo_is_not_stopped_by_the_stall_limit(monkeypatch):
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(demo.time, "monotonic", lambda: float(next(clock)))
    epochs = iter(range(100))

    class Progressing(StuckClient):
        def jobs(self) -> list[dict[str, Any]]:
            self.epoch = next(epochs)
            state = "succeeded" if self.epoch >= 30 else "running"
            return [{"id": "j1", "state": state, "allocation": {} if state == "succeeded" else {"n0": 1}}]

        def logs(self, job_id: str, rank: int | None = None) -> str:
            return json.dumps({"event": "epoch", "epoch": self.epoch, "batch_size": 16})

    job = demo.DemoJob("digits-a", 0.0, 40, 16)
    demo._follow(Progressing(), [job], demo.Path("train.py"), lambda _: None,  # type: ignore[arg-type]
                 timeout_s=1e9, stall_timeout_s=25.0)


def test_each_demo_starts_from_an_empty_state_folder_of_its_own(tmp_path):
    state = tmp_path / "demo-state"
    demo.fresh_state_dir(state)                       # new: created and marked
    assert (state / demo.DEMO_MARK).is_file()
    for name in ("jobs.db", "state.json", "logs/job-1/restart-0/rank-0.log"):   # what a run leaves
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        (state / name).write_text("x")
    demo.fresh_state_dir(state)                       # the next demo: cleared whole, marked again
    assert sorted(p.name for p in state.iterdir()) == [demo.DEMO_MARK]
    other = tmp_path / "someone-elses"
    other.mkdir()
    (other / "jobs.db").write_text("precious")
    with pytest.raises(demo.DemoStateError, match="not an earlier demo's folder"):
        demo.fresh_state_dir(other)
    assert (other / "jobs.db").read_text() == "precious"


def test_an_ended_job_is_not_read_again(monkeypatch):
    class Counting(StuckClient):
        reads = 0

        def logs(self, job_id: str, rank: int | None = None) -> str:
            Counting.reads += 1
            return super().logs(job_id, rank)

    client = Counting()
    job = demo.DemoJob("digits-a", 0.0, 20, 16, id="j1")
    listed = {"j1": {"id": "j1", "state": "succeeded", "allocation": {}}}
    first = demo._view(client, job, listed, None)  # type: ignore[arg-type]
    assert (first.state, first.epoch, first.batch_size) == ("succeeded", 2, 24) and Counting.reads == 1
    assert demo._view(client, job, listed, first) is first and Counting.reads == 1  # type: ignore[arg-type]
