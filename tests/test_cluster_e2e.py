"""End-to-end tests of the live service on a real local Ray cluster, real SQLite and real training.

One embedded Ray cluster (3 virtual nodes x 2 GPU slots, owned by its own host process) is shared
by the tests of this module; each test runs its own service (own state directory and job store)
against it, submits the digits example through the REST API, and stops everything it started.
At the end, every process the services recorded and every Ray process that appeared during the
module must be gone (checked by PID); under pytest-xdist, the Ray processes of the other workers'
tests are told apart by the worker named in their environment.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray")
pytest.importorskip("sklearn")

from pollux.cluster import server
from pollux.cluster.backends import processes
from pollux.cluster.state.store import JobStore
from pollux.raylink import LOOPBACK_ENV

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "train.py"
EPOCH_LINE = re.compile(r" digits INFO epoch (\d+): ")


#: Hints for a digits job (initial batch 16) under which two replicas pay.
DIGITS_HINTS = {"version": 1, "throughput": {"alpha_grad": 0.1, "beta_grad": 0.01, "alpha_local": 0.1,
                                             "beta_local": 0.001, "alpha_node": 0.1, "beta_node": 0.001,
                                             "gamma": 1.5},
                "grad": {"sqr": 1.0, "var": 2.0}, "init_batch_size": 16, "max_batch_size": 256,
                "local_bsz_bounds": [8, 128], "accumulation": False, "max_replicas_seen": 1,
                "progress": 1.0, "epoch": 0}

#: The pytest-xdist worker running this module ("" when the suite runs in one process).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def xdist_worker_of(pid: int) -> str | None:
    """The pytest-xdist worker named in ``pid``'s environment, or None if it names none."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"PYTEST_XDIST_WORKER="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


def of_another_worker(pid: int) -> bool:
    """Whether ``pid`` belongs to a Ray cluster that another pytest-xdist worker started, which may
    come and go while this module runs. Ray's agents and workers write their titles over their
    environment, so the parent's and the session leader's environment count as theirs too."""
    if not XDIST_WORKER:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        leader = os.getsid(pid)
    except (OSError, IndexError, ValueError):
        return False
    workers = {xdist_worker_of(p) for p in (pid, parent, leader)} - {None}
    return bool(workers - {XDIST_WORKER})


def ray_pids() -> set[int]:
    """PIDs of Ray's processes (GCS, raylets, workers and agents) on this machine, but for those of
    another pytest-xdist worker's tests."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("ray::") or "/ray/core/src/ray/" in cmd or "ray/_private/workers" in cmd \
                or "ray/dashboard" in cmd or "ray/autoscaler" in cmd or "ray/_private/log_monitor" in cmd:
            if not of_another_worker(int(entry)):
                out.add(int(entry))
    return out


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    before = ray_pids()
    state = tmp_path_factory.mktemp("rayhost")
    info = state / "ray.json"
    log = state / "rayhost.log"
    env = {**os.environ, **LOOPBACK_ENV}
    with open(log, "wb") as out:
        host = subprocess.Popen([sys.executable, "-m", "pollux.cluster.backends.rayhost", "--info", str(info),
                                 "--nodes", "3", "--gpus-per-node", "2"], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not info.exists():
            assert host.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the Ray host did not start:\n" + log.read_text()
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        seen |= ray_pids() - before
        yield {"address": address, "seen": seen, "before": before}
    finally:
        seen |= ray_pids() - before
        host.send_signal(signal.SIGTERM)
        try:
            host.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(processes.pid_alive(p) for p in seen):
            time.sleep(0.2)
    left = sorted(p for p in seen if processes.pid_alive(p))
    assert not left, f"Ray processes left running: {left}"
    assert not (ray_pids() - before), f"new Ray processes left running: {sorted(ray_pids() - before)}"


class Service:
    """One service process under test, with helpers to talk to it."""

    def __init__(self, state: Path, address: str, **options) -> None:
        self.state = state
        self.address = address
        self.options = {"interval_s": 3.0, "stop_grace_s": 30.0, **options}
        self.info = self.start()

    def start(self) -> server.ServerInfo:
        self.info = server.start(self.state, ray_address=self.address, timeout_s=120, **self.options)
        self.client = httpx.Client(base_url=self.info.url, timeout=30,
                                   headers={"Authorization": f"Bearer {self.info.token}"})
        return self.info

    def submit(self, epochs: int, name: str, **spec) -> str:
        body = {"name": name, "spec": {"entrypoint": str(DIGITS), "args": ["--epochs", str(epochs)],
                                       "working_dir": str(ROOT), "init_batch_size": 16, "max_batch_size": 256,
                                       "local_bsz_bounds": [8, 128], **spec}}
        r = self.client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def job(self, job_id: str) -> dict:
        r = self.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, job_ids, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(predicate(self.job(j)) for j in job_ids):
                return
            time.sleep(0.5)
        states = {j: (self.job(j)["state"], self.job(j)["failure_reason"]) for j in job_ids}
        raise AssertionError(f"timed out waiting for {what}: {states}\n{self.tail()}")

    def tail(self) -> str:
        try:
            return "\n".join((self.state / "service.log").read_text().splitlines()[-30:])
        except FileNotFoundError:
            return ""

    def epochs_logged(self, job_id: str) -> list[int]:
        text = self.client.get(f"/v1/jobs/{job_id}/logs", params={"rank": 0}).text
        return [int(m.group(1)) for m in EPOCH_LINE.finditer(text)]

    def kill_service(self) -> None:
        pid = self.info.service_pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while processes.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes.pid_alive(pid)
        self.client.close()

    def stop(self) -> None:
        self.client.close()
        server.stop(self.state)

    def recorded_pids(self) -> list[int]:
        with JobStore(self.state / "jobs.db") as store:
            return [r.pid for j in store.list_jobs() for r in store.replicas(j.id) if r.pid]


@pytest.fixture
def service(ray_cluster, tmp_path):
    made: list[Service] = []

    def make(**options) -> Service:
        svc = Service(tmp_path / f"state{len(made)}", ray_cluster["address"], **options)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop()
        assert not processes.pid_alive(svc.info.service_pid)
        pids = svc.recorded_pids()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(processes.pid_alive(p) for p in pids):
            time.sleep(0.2)
        assert not [p for p in pids if processes.pid_alive(p)], "replica processes left running"
    ray_cluster["seen"].update(ray_pids() - ray_cluster["before"])


def test_api_rejects_missing_token_malformed_spec_and_nan_hints(service):
    svc = service()
    bare = httpx.Client(base_url=svc.info.url, timeout=10)
    assert bare.get("/v1/jobs").status_code == 401
    r = bare.post("/v1/jobs", json={"spec": {"entrypoint": "x.py", "init_batch_size": 1}})
    assert r.status_code == 401
    r = svc.client.post("/v1/jobs", json={"spec": {"entrypoint": "x.py", "init_batch_size": "many"}})
    assert r.status_code == 422 and r.json()["field"] == "spec.init_batch_size"
    job = svc.client.post("/v1/jobs", json={"spec": {"entrypoint": str(DIGITS), "init_batch_size": 16,
                                                     "args": ["--epochs", "1"]}}).json()
    hints = DIGITS_HINTS
    text = json.dumps(hints).replace('"sqr": 1.0', '"sqr": NaN')
    r = bare.put(f"/v1/jobs/{job['id']}/hints", content=text,
                 headers={"Authorization": f"Bearer {job['token']}", "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "grad.sqr", r.text
    assert bare.get("/openapi.json").json()["paths"]["/v1/jobs"]
    bare.close()
    cluster = svc.client.get("/v1/cluster").json()
    assert cluster["total_gpus"] == 6 and len(cluster["nodes"]) == 3 and cluster["policy"] == "pollux"
    svc.wait([job["id"]], lambda j: j["state"] == "succeeded", 120, "the one-epoch job")


def test_service_sigkill_and_restart_mid_run_loses_no_job_and_repeats_no_epoch(service):
    svc = service()
    epochs = {"a": 30, "b": 24}
    ids = {name: svc.submit(e, name) for name, e in epochs.items()}
    svc.wait(ids.values(), lambda j: j["state"] == "running", 120, "both jobs running")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(svc.epochs_logged(j) for j in ids.values()):
        time.sleep(0.3)
    svc.kill_service()                        # a crash: the replicas keep training
    time.sleep(2.0)
    svc.start()                               # adopts the running replicas
    svc.wait(ids.values(), lambda j: j["state"] in ("succeeded", "failed"), 240, "both jobs finished")
    for name, jid in ids.items():
        job = svc.job(jid)
        assert job["state"] == "succeeded", job["failure_reason"]
        logged = svc.epochs_logged(jid)
        assert sorted(logged) == list(range(epochs[name])), f"{name}: epochs logged {logged}"
        assert len(set(logged)) == len(logged)
    # The second life of the service adopted the running replicas instead of restarting them.
    assert (svc.state / "service.log").read_text().count("adopted restart") >= 1
    assert all(svc.job(j)["failures"] == 0 for j in ids.values())


def test_replica_sigkill_restarts_the_job_from_its_checkpoint(service):
    svc = service()
    jid = svc.submit(40, "victim", min_replicas=2, max_replicas=2)
    svc.wait([jid], lambda j: j["state"] == "running", 120, "the job running")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(svc.epochs_logged(jid)) < 2:
        time.sleep(0.2)
    assert len(svc.epochs_logged(jid)) >= 2, svc.tail()
    victim = next(r for r in svc.job(jid)["replicas"] if r["restart"] == 0 and r["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    svc.wait([jid], lambda j: j["state"] in ("succeeded", "failed"), 240, "the job finished")
    job = svc.job(jid)
    assert job["state"] == "succeeded", job["failure_reason"]
    assert job["failures"] == 1 and job["restarts"] >= 1
    killed = next(r for r in job["replicas"] if r["restart"] == 0 and r["rank"] == 1)
    assert killed["exit_code"] == -signal.SIGKILL
    later = svc.client.get(f"/v1/jobs/{jid}/logs", params={"restart": 1, "rank": 0}).text
    m = re.search(r"resumed at epoch (\d+)", later)
    assert m and int(m.group(1)) >= 1, later[-2000:]
    final = json.loads([ln for ln in later.splitlines() if ln.startswith("{")][-1])
    assert final["epochs"] == 40 and final["runs"] >= 2 and final["test_accuracy"] > 0.8


def test_failing_job_fails_after_bounded_retries_with_the_reason(service, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    svc = service(max_retries=1)
    r = svc.client.post("/v1/jobs", json={"spec": {"entrypoint": str(script), "init_batch_size": 8}})
    jid = r.json()["id"]
    svc.wait([jid], lambda j: j["state"] in ("succeeded", "failed"), 120, "the crashing job to fail")
    job = svc.job(jid)
    assert job["state"] == "failed" and job["failures"] == 2
    assert "exited with code 3" in job["failure_reason"] and "retries exhausted" in job["failure_reason"]
    assert {r["restart"] for r in job["replicas"]} == {0, 1}
    assert "about to fail" in svc.client.get(f"/v1/jobs/{jid}/logs").text


def test_cancel_stops_replicas_and_graceful_stop_preempts_to_pending(service):
    svc = service()
    keep = svc.submit(200, "keep")
    drop = svc.submit(200, "drop")
    svc.wait([keep, drop], lambda j: j["state"] == "running", 120, "both jobs running")
    pids = [r["pid"] for r in svc.job(drop)["replicas"]]
    assert svc.client.post(f"/v1/jobs/{drop}/cancel").json()["state"] == "cancelled"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(processes.pid_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(processes.pid_alive(p) for p in pids)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not svc.epochs_logged(keep):
        time.sleep(0.2)
    running = [r["pid"] for r in svc.job(keep)["replicas"] if r["exit_code"] is None]
    pollux = [sys.executable, "-m", "pollux.cli"]
    status = subprocess.run([*pollux, "server", "status", "--json", "--state-dir", str(svc.state)],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["jobs"] == {"running": 1, "cancelled": 1}
    svc.client.close()
    stopped = subprocess.run([*pollux, "server", "stop", "--state-dir", str(svc.state)],
                             capture_output=True, text=True, timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(processes.pid_alive(p) for p in running)   # graceful: the job checkpointed and exited
    assert not processes.pid_alive(svc.info.service_pid)
    with JobStore(svc.state / "jobs.db") as store:
        job = store.get_job(keep)
        assert job.state == "pending" and job.allocation == {}
        assert {r.exit_code for r in store.replicas(keep)} == {143}
        assert store.get_job(drop).state == "cancelled"
    assert any(p.name.startswith("checkpoint-") for p in (svc.state / "checkpoints" / keep).iterdir())
    assert math.isfinite(job.attained_service) and job.attained_service > 0


def test_lost_node_leaves_the_next_round_and_its_job_carries_on(ray_cluster, tmp_path):
    """A node leaving the Ray cluster: its replica dies, its GPUs leave the next round, and the job
    restarts from its checkpoint on what is left and goes on training."""
    before = ray_pids()
    host, address = server.spawn_rayhost(tmp_path, 2, 1, timeout_s=120)
    svc = None
    try:
        svc = Service(tmp_path / "state", address)
        body = {"name": "survivor", "spec": {"entrypoint": str(DIGITS), "args": ["--epochs", "5000"],
                                             "working_dir": str(ROOT), "init_batch_size": 16,
                                             "max_batch_size": 256, "local_bsz_bounds": [8, 128],
                                             "min_replicas": 1, "max_replicas": 2}}
        r = svc.client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        jid, token = r.json()["id"], r.json()["token"]
        # Hints under which two replicas pay (the job may also run on one GPU: min_replicas is 1).
        hints = DIGITS_HINTS
        r = svc.client.put(f"/v1/jobs/{jid}/hints", json=hints, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        svc.wait([jid], lambda j: j["state"] == "running" and j["allocation"] == {"node-0": 1, "node-1": 1},
                 120, "the job on both nodes")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(svc.epochs_logged(jid)) < 2:
            time.sleep(0.2)
        assert len(svc.epochs_logged(jid)) >= 2, svc.tail()      # a checkpoint to restart from
        os.kill(host.pid, signal.SIGUSR1)                          # node-1 leaves the cluster
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and svc.client.get("/v1/cluster").json()["total_gpus"] != 1:
            time.sleep(0.5)
        cluster = svc.client.get("/v1/cluster").json()
        assert cluster["total_gpus"] == 1 and [n["name"] for n in cluster["nodes"]] == ["node-0"], cluster
        svc.wait([jid], lambda j: j["failures"] >= 1, 60, "the lost replica to be noticed")
        lost = [r for r in svc.job(jid)["replicas"] if r["node"] == "node-1"]
        assert lost and all(r["exit_code"] not in (None, 0) for r in lost), lost
        # The next round gives the job the GPU that is left; it restarts there from its checkpoint.
        first = max(r["restart"] for r in lost)

        def restarted(j):
            now = [r for r in j["replicas"] if r["restart"] == j["restarts"]]
            return (j["state"] == "running" and j["restarts"] > first and j["allocation"] == {"node-0": 1}
                    and len(now) == 1 and now[0]["node"] == "node-0" and now[0]["exit_code"] is None)
        svc.wait([jid], restarted, 120, "the job to restart on the node that is left")
        job = svc.job(jid)
        # One loss, one failure: no relaunch on the lost node before Ray marks it dead (issue 11).
        assert job["failures"] == 1, job["transitions"]
        params = {"restart": job["restarts"], "rank": 0}
        deadline = time.monotonic() + 90
        log = ""
        while time.monotonic() < deadline:
            log = svc.client.get(f"/v1/jobs/{jid}/logs", params=params).text
            m = re.search(r"resumed at epoch (\d+)", log)
            if m and [e for e in map(int, EPOCH_LINE.findall(log)) if e >= int(m.group(1))]:
                break
            time.sleep(0.5)
        m = re.search(r"resumed at epoch (\d+)", log)
        assert m and int(m.group(1)) >= 1, log[-2000:]                     # from its checkpoint
        assert [e for e in map(int, EPOCH_LINE.findall(log)) if e >= int(m.group(1))], log[-2000:]
        assert svc.job(jid)["state"] == "running"                          # and it carries on
    finally:
        if svc is not None:
            svc.stop()
        processes.stop_pid(host.pid, 60)
    pids = svc.recorded_pids()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (ray_pids() - before or any(processes.pid_alive(p) for p in pids)):
        time.sleep(0.2)
    assert not [p for p in pids if processes.pid_alive(p)], "replica processes left running"
    assert not (ray_pids() - before)
