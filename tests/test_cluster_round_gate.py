"""Rounds first (:mod:`pollux.cluster.control.round_gate`): the web view's pages and ``/metrics``
wait while a round runs, the rest of the API does not, and the controller holds the gate for the
whole round (the policy and the write)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from api_helpers import bearer, serve_on_loopback
from fake_backend import FakeBackend, FakeClock
from pollux.cluster.api.app import create_app
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.round_gate import RoundGate
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.store import JobStore

ADMIN = "gate-admin-token"
#: Long enough for a request that does not wait to be answered on a loaded machine.
SETTLE_S = 1.0


def test_an_idle_gate_never_waits():
    gate = RoundGate(max_wait_s=5)
    start = time.monotonic()
    assert gate.wait_quiet() is True and not gate.busy
    assert time.monotonic() - start < 1.0


def test_a_reader_waits_for_the_rounds_under_way_but_not_for_later_ones():
    gate = RoundGate(max_wait_s=30)
    done = threading.Event()
    first = gate.round()
    first.__enter__()
    reader = threading.Thread(target=lambda: (gate.wait_quiet(), done.set()))
    reader.start()
    assert not done.wait(0.3) and gate.busy
    with gate.round():           # a round starts while the first runs, then the first ends
        first.__exit__(None, None, None)
        assert done.wait(SETTLE_S * 5), "the reader waited for a round that began after it came"
    reader.join(5)
    assert not gate.busy


def test_the_wait_is_bounded():
    gate = RoundGate(max_wait_s=0.05)
    with gate.round():
        assert gate.wait_quiet() is False
    with pytest.raises(ValueError, match="max_wait_s"):
        RoundGate(max_wait_s=-1)


@pytest.mark.parametrize("path", ["/", "/metrics"])
def test_views_wait_for_the_round_and_the_api_does_not(tmp_path, path):
    gate = RoundGate()
    with JobStore(tmp_path / "jobs.db") as store:
        job = store.submit({"entrypoint": "train.py", "init_batch_size": 8})
        app = create_app(store, ADMIN, check_files=False, wait_for_round=gate.wait_quiet)
        with serve_on_loopback(app) as url, httpx.Client(base_url=url, headers=bearer(ADMIN)) as api:
            answers: list[httpx.Response] = []
            with gate.round():
                viewer = threading.Thread(target=lambda: answers.append(
                    httpx.get(url + path, headers=bearer(ADMIN), timeout=30)))
                viewer.start()
                assert api.get(f"/v1/jobs/{job.id}").status_code == 200   # the API goes on
                time.sleep(SETTLE_S)
                assert not answers, f"{path} was answered during the round"
            viewer.join(30)
    assert len(answers) == 1 and answers[0].status_code == 200
    assert job.id in answers[0].text


class RecordingPolicy:
    """A FIFO-like policy that notes whether the gate was held when the round asked it."""

    name = "recording"

    def __init__(self) -> None:
        self.gate: RoundGate | None = None
        self.seen: list[bool] = []

    def decide(self, jobs, *args, **kwargs):
        assert self.gate is not None
        self.seen.append(self.gate.busy)
        return {v.id: {"node-0": 1} for v in jobs[:1]}, None


def test_the_controller_holds_the_gate_through_the_policy_and_the_write(tmp_path, monkeypatch):
    clock = FakeClock()
    with JobStore(tmp_path / "jobs.db") as store:
        job = store.submit({"entrypoint": "train.py", "init_batch_size": 8}, now=clock())
        policy = RecordingPolicy()
        sched = Scheduler(store, policy_name="fifo")
        sched.policy = policy   # type: ignore[assignment]
        controller = Controller(store, FakeBackend(), sched, ControllerConfig(state_dir=tmp_path),
                                clock=clock, monotonic=clock)
        policy.gate = controller.round_gate
        writes: list[bool] = []
        apply_round = store.apply_round

        def recorded(*args, **kwargs):
            writes.append(controller.round_gate.busy)
            return apply_round(*args, **kwargs)

        monkeypatch.setattr(store, "apply_round", recorded)
        controller.run_round(clock())
        assert policy.seen == [True] and writes == [True]
        assert not controller.round_gate.busy
        assert store.get_job(job.id).allocation == {"node-0": 1}
