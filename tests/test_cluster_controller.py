"""The control loop against a real local Ray cluster: launch failures, asynchronous launches,
fast cancels, replica process trees and replicas running as another OS user (issue 10).

One embedded Ray cluster (2 virtual nodes x 2 GPU slots, in its own host process) serves the
module; this test process is its driver. Each test builds its own store and controller in a temporary
folder and drives the controller by calling ``tick()``; allocations are written to the store by the
test (the policy is not the subject here), so placements are exact.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pollux.cluster import server
from pollux.cluster.backends import processes
from pollux.cluster.backends.processes import descendants
from pollux.cluster.backends.ray_backend import RayBackend
from pollux.cluster.control.controller import Controller, ControllerConfig
from pollux.cluster.control.scheduler import Scheduler
from pollux.cluster.state.store import JobStore

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")

#: Variables of the Ray host's environment (hence of its workers) that must never reach a replica.
#: (Ray's own auth variables would switch its authentication on: a harmless RAY_ name stands for them.)
SECRETS = {"POLLUX_ADMIN_TOKEN": "admin-secret-1", "RAY_POLLUX_TEST_SECRET": "ray-secret-2",
           "SERVICE_API_KEY": "key-secret-3", "MY_PASSWORD": "pw-secret-4", "CI_JOB_TOKEN": "tk-secret-5"}


@pytest.fixture(scope="module")
def ray_backend(tmp_path_factory):
    state = tmp_path_factory.mktemp("ray")
    saved = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)
    try:
        host, address = server.spawn_rayhost(state, 2, 2, timeout_s=180)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    backend = None
    try:
        backend = RayBackend(address)
        yield backend
    finally:
        if backend is not None:
            backend.shutdown()
        processes.stop_pid(host.pid, 60)


class Harness:
    """A store and a controller on a temporary state folder; allocations are set by hand."""

    def __init__(self, backend: RayBackend, state: Path, **config) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.store = JobStore(state / "jobs.db")
        self.config = ControllerConfig(state_dir=state, interval_s=3600.0, tick_s=0.1, **config)
        self.controller = Controller(self.store, backend, Scheduler(self.store), self.config)
        self.controller.run_round = self._round  # type: ignore[method-assign]
        self.controller.refresh_nodes()
        self.placements: dict[str, dict[str, int]] = {}
        self.tick_times: list[float] = []

    def submit(self, entrypoint: str, placement: dict[str, int], **spec) -> str:
        job = self.store.submit({"entrypoint": entrypoint, "init_batch_size": 8, **spec})
        self.placements[job.id] = placement
        self._round(time.time())
        return job.id

    def _round(self, now: float) -> None:
        """Stands in for the policy: a pending job gets its fixed placement back."""
        self.controller.refresh_nodes()
        for jid, placement in self.placements.items():
            if self.store.get_job(jid).state == "pending":
                self.store.transition(jid, "starting", now=now)
                self.store.set_allocation(jid, placement, now=now)

    def tick(self) -> None:
        t = time.perf_counter()
        self.controller.tick()
        self.tick_times.append(time.perf_counter() - t)

    def run_until(self, cond, timeout: float, what: str) -> float:
        start = time.monotonic()
        while not cond():
            if time.monotonic() - start > timeout:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; jobs: "
                                     f"{[(j.id, j.state, j.failure_reason) for j in self.store.list_jobs()]}")
            self.tick()
            time.sleep(0.05)
        return time.monotonic() - start

    def job(self, job_id: str):
        return self.store.get_job(job_id)

    def close(self) -> None:
        self.controller.shutdown(grace_s=5)
        self.store.close()


@pytest.fixture
def harness(ray_backend, tmp_path):
    made: list[Harness] = []

    def make(state: Path | None = None, **config) -> Harness:
        h = Harness(ray_backend, state or tmp_path / f"state{len(made)}", **config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
    assert not ray_backend.actor_names(), "replica actors left behind"


def script(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def marked(job_id: str) -> list[int]:
    """Live processes whose environment carries ``POLLUX_JOB_ID=<job_id>`` (zombies included)."""
    out = []
    marker = f"POLLUX_JOB_ID={job_id}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    out.append(int(entry))
            except OSError:
                continue
    return out


def gone(pids) -> bool:
    return not any(processes.pid_alive(p) for p in pids)


def test_entrypoint_that_cannot_exec_fails_after_bounded_retries_with_backoff(harness, tmp_path):
    h = harness(max_retries=2, retry_backoff_s=0.5)
    bad = tmp_path / "train.sh"
    bad.write_text("#!/bin/sh\necho never\n")
    bad.chmod(0o644)                                  # not executable: Popen raises in the actor
    jid = h.submit(str(bad), {"node-0": 1})
    took = h.run_until(lambda: h.job(jid).terminal, 90, "the job to fail")
    job = h.job(jid)
    assert job.state == "failed" and job.failures == 3, job
    assert "Permission denied" in job.failure_reason and "retries exhausted" in job.failure_reason
    assert job.restarts == 3 and not h.store.replicas(jid)       # three launches, no process ever ran
    assert took >= 0.5 + 1.0                                    # backoff 0.5 s then 1 s between them
    # A tick never waited on Ray for a launch.
    assert max(h.tick_times) < 2.0, max(h.tick_times)


def test_allocation_forming_no_replica_fails_fast_and_gpus_per_replica_groups_slots(harness, tmp_path):
    h = harness(max_retries=1, retry_backoff_s=0.1)
    out = tmp_path / "env.txt"
    two = h.submit(script(tmp_path, "two.sh", f'echo "$POLLUX_RANK/$POLLUX_NUM_REPLICAS" >> {out}\n'),
                   {"node-1": 2}, resources={"GPU": 2})
    three = h.submit(script(tmp_path, "three.sh", "exit 0\n"), {"node-0": 2}, resources={"GPU": 3})
    h.run_until(lambda: h.job(two).terminal and h.job(three).terminal, 90, "both jobs to end")
    assert h.job(two).state == "succeeded" and out.read_text().split() == ["0/1"]
    job = h.job(three)
    assert job.state == "failed" and job.failures == 2
    assert "forms no replica" in job.failure_reason and "3 GPU slots" in job.failure_reason


@pytest.fixture
def node1_held(ray_backend):
    """node-1's two GPU slots held by an actor outside Pollux: Ray cannot place a replica there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    node1 = next(n for n in ray_backend.nodes() if n.name == "node-1")
    holder = ray.remote(num_gpus=2, num_cpus=0)(type("Holder", (), {"ping": lambda self: 1})).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node1.node_id, soft=False)).remote()
    try:
        ray.get(holder.ping.remote(), timeout=60)
        yield
    finally:
        ray.kill(holder)


def test_replica_that_cannot_get_its_slot_fails_its_launch_without_blocking_others(
        harness, node1_held, tmp_path):
    h = harness(max_retries=0, launch_timeout_s=3.0)
    stuck = h.submit(script(tmp_path, "a.sh", "exit 0\n"), {"node-1": 1})
    fine = h.submit(script(tmp_path, "b.sh", "exit 0\n"), {"node-0": 1})
    h.run_until(lambda: h.job(stuck).terminal and h.job(fine).terminal, 60, "both jobs to end")
    assert h.job(fine).state == "succeeded"
    job = h.job(stuck)
    assert job.state == "failed" and job.failures == 1
    assert "was not placed within 3 s" in job.failure_reason
    assert max(h.tick_times) < 2.0, max(h.tick_times)


def test_cancel_while_a_replica_waits_for_its_slot_stops_those_started(harness, node1_held, tmp_path):
    h = harness(launch_timeout_s=120.0, cancel_grace_s=1.0)
    deaf = script(tmp_path, "deaf.sh", "trap '' TERM\nwhile :; do sleep 1; done\n")
    jid = h.submit(deaf, {"node-0": 1, "node-1": 1})
    h.run_until(lambda: marked(jid), 60, "rank 0 to start")          # rank 1 waits for node-1
    assert jid in h.controller.launching and h.job(jid).state == "starting"
    t0 = time.monotonic()
    h.store.transition(jid, "cancelled", reason="cancelled by user")
    h.run_until(lambda: not marked(jid) and not h.controller.groups and not h.controller.launching, 30,
                "the started replica to stop")
    assert time.monotonic() - t0 < 5.0
    job = h.job(jid)
    assert job.state == "cancelled" and job.failures == 0
    assert [r.rank for r in h.store.replicas(jid)] == [0]


def test_job_cancelled_while_launching_is_released_and_never_started(harness, tmp_path):
    h = harness()
    flag = tmp_path / "ran"
    jid = h.submit(script(tmp_path, "a.sh", f"touch {flag}\nsleep 300\n"), {"node-0": 2})
    h.tick()
    assert jid in h.controller.launching                 # actors created; the tick did not wait
    h.store.transition(jid, "cancelled", reason="cancelled by user")
    h.tick()
    assert jid not in h.controller.launching and jid not in h.controller.groups
    time.sleep(1.0)
    assert not flag.exists() and not h.store.replicas(jid) and not marked(jid)


def test_cancel_burst_stops_every_replica_within_seconds(harness, tmp_path):
    h = harness(stop_grace_s=60.0, cancel_grace_s=1.0)
    deaf = script(tmp_path, "deaf.sh", "trap '' TERM\nwhile :; do sleep 1; done\n")   # ignores SIGTERM
    placements = [{"node-0": 1}, {"node-0": 1}, {"node-1": 1}, {"node-1": 1}]
    ids = [h.submit(deaf, p) for p in placements]
    h.run_until(lambda: all(h.job(j).state == "running" for j in ids), 90, "four jobs running")
    queued = [h.submit(deaf, {"node-0": 1}) for _ in range(4)]    # wait for slots: never launched
    pids = [r.pid for j in ids for r in h.store.replicas(j)]
    assert len(pids) == 4 and not gone(pids)
    t0 = time.monotonic()
    for j in ids + queued:
        h.store.transition(j, "cancelled", reason="cancelled by user")
    h.run_until(lambda: gone(pids) and not h.controller.groups, 30, "the replicas to stop")
    took = time.monotonic() - t0
    assert took < 5.0, took                            # not stop_grace_s: a cancel needs no checkpoint
    assert all(h.job(j).state == "cancelled" for j in ids + queued)
    assert not any(h.store.replicas(j) for j in queued)


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_replica_children_do_not_outlive_it(harness, tmp_path, end):
    h = harness(max_retries=0)
    body = ("(sleep 300; echo never) &\n"          # a child shell
            "sleep 301 | cat &\n"                  # a cat
            "setsid sleep 302 &\n"                 # one that left the process group
            "echo started\n")
    body += "sleep 3\nexit 0\n" if end == "exit" else "sleep 300\n"
    jid = h.submit(script(tmp_path, "kids.sh", body), {"node-0": 1})
    h.run_until(lambda: len(marked(jid)) >= 5 and h.store.replicas(jid), 60, "the replica and its children")
    if end == "sigkill":
        main = h.store.replicas(jid)[0].pid
        os.kill(main, signal.SIGKILL)
    h.run_until(lambda: h.job(jid).terminal, 60, "the job to end")
    assert h.job(jid).state == ("succeeded" if end == "exit" else "failed")
    deadline = time.monotonic() + 5
    while marked(jid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked(jid), [Path(f"/proc/{p}/cmdline").read_bytes() for p in marked(jid)]


def test_descendants_walks_the_whole_tree(tmp_path):
    import subprocess
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & (sleep 31 & wait) & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(descendants(proc.pid)) == 3             # sleep 30, the subshell and its sleep 31
        assert proc.pid in descendants(os.getpid())
    finally:
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def _can_run_as_nobody() -> bool:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return os.geteuid() == 0 and sys.platform.startswith("linux")


@pytest.mark.skipif(not _can_run_as_nobody(), reason="needs root and a 'nobody' user")
def test_replica_runs_as_another_user_and_cannot_read_the_admin_token(harness):
    base = Path(tempfile.mkdtemp(prefix="pollux-runas-"))
    try:
        base.chmod(0o755)
        state = base / "state"
        state.mkdir(mode=0o700)
        token = state / "admin-token"
        token.write_text("the-admin-token\n")
        token.chmod(0o600)
        jobs = base / "jobs"
        jobs.mkdir()
        jobs.chmod(0o755)
        body = ('id -u\n'
                'cat "$(dirname "$(dirname "$POLLUX_CHECKPOINT_DIR")")/admin-token" && echo READ-TOKEN\n'
                'ls "$(dirname "$POLLUX_CHECKPOINT_DIR")" && echo LISTED-CHECKPOINTS\n'
                'cat "$(dirname "$(dirname "$POLLUX_CHECKPOINT_DIR")")/jobs.db" > /dev/null && echo READ-DB\n'
                'echo ckpt > "$POLLUX_CHECKPOINT_DIR/ckpt" && echo WROTE-CHECKPOINT\n'
                'echo "HOME=$HOME USER=$USER"\n'
                'env\n')
        h = harness(state=state, run_as="nobody")
        jid = h.submit(script(jobs, "who.sh", body), {"node-0": 1})
        h.run_until(lambda: h.job(jid).terminal, 60, "the job to end")
        assert h.job(jid).state == "succeeded", h.job(jid).failure_reason
        log = Path(h.store.replicas(jid)[0].log_path).read_text()
        nobody = pwd.getpwnam("nobody")
        assert log.splitlines()[0] == str(nobody.pw_uid)
        assert "READ-TOKEN" not in log and "the-admin-token" not in log and "Permission denied" in log
        assert "LISTED-CHECKPOINTS" not in log and "READ-DB" not in log
        assert "WROTE-CHECKPOINT" in log and f"HOME={nobody.pw_dir} USER=nobody" in log
        for value in SECRETS.values():
            assert value not in log
        assert "POLLUX_JOB_TOKEN=" in log
        ckpt = state / "checkpoints" / jid
        assert ckpt.stat().st_uid == nobody.pw_uid and stat.S_IMODE(ckpt.stat().st_mode) == 0o700
        assert (ckpt / "ckpt").read_text() == "ckpt\n"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)


def test_replica_environment_has_no_service_secret_without_run_as(harness, tmp_path):
    h = harness()
    jid = h.submit(script(tmp_path, "env.sh", "env\n"), {"node-1": 1})
    h.run_until(lambda: h.job(jid).terminal, 60, "the job to end")
    log = Path(h.store.replicas(jid)[0].log_path).read_text()
    assert f"POLLUX_JOB_ID={jid}" in log and "POLLUX_JOB_TOKEN=" in log
    for value in SECRETS.values():
        assert value not in log
