"""Lifecycle of a Pollux server with real processes: `pollux server start|stop|status` as subprocesses,
a real embedded Ray cluster (one node, two GPU slots), a real service and real replicas.

* two concurrent starts on one folder: exactly one succeeds; one Ray host, one service; a service
  started by hand on the folder refuses to run; `stop` leaves no process behind (by PID);
* a damaged job store (emptied, half-truncated, garbage) is refused before anything starts, and a
  start that fails after launching its Ray host stops it;
* SIGKILL of the Ray host is noticed by `server status` and by the service, which says why it stopped
  and leaves the job pending; the next start resumes it;
* (as root) replicas run as `nobody` with `--run-as nobody`: the job cannot read the admin token, the
  API refuses its own token for listing jobs, Ray refuses a client without the cluster's token, and
  the job can still write its checkpoint folder.

Every test stops what it started and checks, by PID, that no process mentioning its state folder is
left.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from pollux.cluster.client import PolluxClient
from pollux.cluster.state.folder import check_store, mark_store
from pollux.cluster.state.store import JobStore

#: Long (half a minute or more): `pytest -m "not slow"` leaves it out.
pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "pollux.cli"]
SMALL = ["--local-nodes", "1", "--gpus-per-node", "2", "--interval", "2", "--stop-grace", "5"]


def state_processes(state: Path) -> list[int]:
    """Live processes whose command line or environment mentions ``state`` (the Ray host, its
    cluster's processes through the Ray token path, the service, replicas through their checkpoint
    folder)."""
    needle = str(state).encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            text = Path(f"/proc/{entry}/cmdline").read_bytes() + Path(f"/proc/{entry}/environ").read_bytes()
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        if needle in text and not zombie:
            out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def session_members(sid: int) -> list[int]:
    """Live processes of the session ``sid`` (the Ray host leads its own session)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) == sid and alive(int(entry)):
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def running(state: Path, module: str) -> list[int]:
    """PIDs of ``python -m <module>`` processes of ``state``."""
    out = []
    for pid in state_processes(state):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in cmd:
            out.append(pid)
    return out


def pollux(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


def assert_nothing_left(state: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while state_processes(state) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = state_processes(state)
    details = []
    for pid in left:
        try:
            details.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
        except OSError:
            pass
    assert not left, "processes left: " + "; ".join(details)


@pytest.fixture
def state(tmp_path):
    """A state folder; whatever runs from it is stopped at the end, even if the test failed."""
    folder = tmp_path / "state"
    yield folder
    if folder.exists():
        pollux("server", "stop", "--state-dir", str(folder), "--timeout", "20", timeout=120)
    for pid in state_processes(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_for(predicate, timeout_s: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


# ------------------------------------------------------------------------------ one service per folder


def test_two_concurrent_starts_give_one_service_and_stop_stops_everything(state):
    argv = [*CLI, "server", "start", "--state-dir", str(state), *SMALL, "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 1], outs
    out, _ = outs[codes.index(0)]
    _, err = outs[codes.index(1)]
    assert err.startswith("pollux: error: ") and "Traceback" not in err
    assert "another `pollux server start`" in err or "already runs" in err, err
    info = json.loads(out)

    services = running(state, "pollux.cluster.service")
    hosts = running(state, "pollux.cluster.backends.rayhost")
    session = session_members(info["rayhost_pid"])
    assert services == [info["service_pid"]] and hosts == [info["rayhost_pid"]]
    assert (state / "state.json").exists()                    # the folder now has had a store

    # a service started by hand on the folder refuses to run, before it touches Ray or the store
    t0 = time.monotonic()
    other = subprocess.run([sys.executable, "-m", "pollux.cluster.service", "--state-dir", str(state),
                            "--ray-address", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert other.returncode == 1 and "already runs" in other.stderr, other.stderr
    assert time.monotonic() - t0 < 30
    assert running(state, "pollux.cluster.service") == [info["service_pid"]]

    # and so does a third start, starting nothing
    again = pollux("server", "start", "--state-dir", str(state), *SMALL)
    assert again.returncode == 1 and "already runs" in again.stderr
    assert running(state, "pollux.cluster.backends.rayhost") == [info["rayhost_pid"]]

    st = json.loads(pollux("server", "status", "--state-dir", str(state), "--json").stdout)
    assert st["service_alive"] and st["healthy"] and st["ray_healthy"] is True, st
    assert st["service_pid"] == info["service_pid"]

    # even with server.json lost (the second start overwrote it), the service is found
    (state / "server.json").unlink()
    st = json.loads(pollux("server", "status", "--state-dir", str(state), "--json").stdout)
    assert st["service_alive"] and st["service_pid"] == info["service_pid"], st

    stop = pollux("server", "stop", "--state-dir", str(state), "--json")
    assert stop.returncode == 0, stop.stderr
    report = json.loads(stop.stdout)
    assert report["service_pids"] == [info["service_pid"]] and report["rayhost_pid"] == info["rayhost_pid"]
    assert_nothing_left(state)
    assert not [p for p in session if alive(p)]
    st = pollux("server", "status", "--state-dir", str(state))
    assert st.returncode == 1 and "no Pollux service runs" in st.stdout


# --------------------------------------------------------------------------------- a damaged job store


def _folder_with_jobs(state: Path, n: int = 10) -> None:
    """A folder as a service leaves it: a store with ``n`` jobs, the marker, the admin token."""
    state.mkdir(parents=True)
    with JobStore(state / "jobs.db") as store:
        for i in range(n):
            store.submit({"entrypoint": "/bin/true", "init_batch_size": 8}, name=f"job-{i}")
    mark_store(state)
    (state / "admin-token").write_text("t\n")


@pytest.mark.parametrize("damage", ["empty", "half", "garbage"])
def test_damaged_store_is_refused_before_anything_starts(state, damage):
    _folder_with_jobs(state)
    db = state / "jobs.db"
    data = db.read_bytes()
    db.write_bytes({"empty": b"", "half": data[:len(data) // 2],
                    "garbage": os.urandom(len(data))}[damage])
    t0 = time.monotonic()
    res = pollux("server", "start", "--state-dir", str(state), *SMALL, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.startswith(f"pollux: error: {db}: ") and "Traceback" not in res.stderr
    assert "restore it from a backup" in res.stderr or "restore " + str(db) in res.stderr
    assert "nothing was started" in res.stderr
    assert not (state / "rayhost.log").exists() and not (state / "server.json").exists()
    assert time.monotonic() - t0 < 30
    assert_nothing_left(state, timeout_s=1)
    assert db.stat().st_size == len({"empty": b"", "half": data[:len(data) // 2], "garbage": data}[damage])


def test_store_check_lets_a_new_folder_start_empty(tmp_path):
    check_store(tmp_path)                                   # no store yet: a new folder
    (tmp_path / "jobs.db").write_bytes(b"")
    check_store(tmp_path)                                   # `touch jobs.db` in a new folder
    mark_store(tmp_path)
    with pytest.raises(RuntimeError, match="empty"):
        check_store(tmp_path)
    (tmp_path / "jobs.db").unlink()
    with pytest.raises(RuntimeError, match="missing"):
        check_store(tmp_path)
    (tmp_path / "jobs.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 84)
    with pytest.raises(RuntimeError, match="damaged"):
        check_store(tmp_path)
    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE t (x)")
    shutil.copy(tmp_path / "other.db", tmp_path / "jobs.db")
    with pytest.raises(RuntimeError, match="no jobs table"):
        check_store(tmp_path)


def test_start_that_fails_after_launching_its_ray_host_stops_it(state):
    with socket.socket() as busy:                           # the service cannot listen on this port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = pollux("server", "start", "--state-dir", str(state), *SMALL, "--port", str(port))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "cannot listen on 127.0.0.1" in res.stderr and "Traceback" not in res.stderr
    assert "stopped the Ray host this start had launched (PID " in res.stderr
    host = int(res.stderr.split("had launched (PID ")[1].split(")")[0])
    assert_nothing_left(state, timeout_s=5)
    assert not alive(host) and not session_members(host)
    assert not (state / "server.json").exists()


# ------------------------------------------------------------------------------------ Ray host death

JOB = """\
import os, time
ckpt = os.environ["POLLUX_CHECKPOINT_DIR"]
os.makedirs(ckpt, exist_ok=True)
print("run", os.environ["POLLUX_RESTARTS"], flush=True)
while True:
    time.sleep(0.2)
"""


def _job_state(state: Path, job_id: str) -> dict:
    with PolluxClient.from_state_dir(state) as client:
        return client.job(job_id)


def test_ray_host_death_is_noticed_and_the_next_start_resumes_the_job(state, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    res = pollux("server", "start", "--state-dir", str(state), *SMALL, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    sub = pollux("submit", "--state-dir", str(state), "--json", "--batch-size", "8", "--working-dir",
                 str(work), "job.py", timeout=30)
    assert sub.returncode == 0, sub.stderr
    job_id = json.loads(sub.stdout)["id"]
    wait_for(lambda: _job_state(state, job_id)["state"] == "running", 60, "the job to run")

    session = session_members(info["rayhost_pid"])         # Ray's agents too, which carry no state path
    assert len(session) > 3
    os.kill(info["rayhost_pid"], signal.SIGKILL)
    t0 = time.monotonic()
    st = pollux("server", "status", "--state-dir", str(state), timeout=30)
    assert st.returncode == 1 and "healthy" not in st.stdout.splitlines()[0], st.stdout
    assert f"PID {info['rayhost_pid']}" in st.stdout and "not running" in st.stdout, st.stdout
    st = json.loads(pollux("server", "status", "--state-dir", str(state), "--json", timeout=30).stdout)
    assert st["rayhost_alive"] is False and st["ray_healthy"] is False and st["healthy"] is False
    assert "not running" in st["ray_error"]

    log = state / "service.log"
    wait_for(lambda: "pollux service stopped: its Ray cluster was lost" in log.read_text(), 15,
             "the service to say why it stopped")
    text = log.read_text()
    assert f"Ray host lost (the Ray host process (PID {info['rayhost_pid']}) is gone); stopping" in text
    wait_for(lambda: not running(state, "pollux.cluster.service"), 10, "the service to exit")
    assert time.monotonic() - t0 < 20
    with JobStore(state / "jobs.db") as store:
        job = store.get_job(job_id)
        assert job.state == "pending" and job.restarts == 1
        assert all(r.exit_code is not None for r in store.replicas(job_id))

    res = pollux("server", "start", "--state-dir", str(state), *SMALL, "--json")
    assert res.returncode == 0, res.stderr
    assert not [p for p in session if alive(p)], "the killed Ray host's processes were left running"

    def resumed() -> dict | None:
        j = _job_state(state, job_id)
        return j if j["state"] == "running" and j["replicas"][-1]["restart"] == 1 else None

    job = wait_for(resumed, 60, "the job to resume")
    assert job["restarts"] == 1
    assert pollux("server", "stop", "--state-dir", str(state)).returncode == 0
    assert_nothing_left(state)


# ----------------------------------------------------------------------------------------- --run-as

HOSTILE_JOB = """\
#!/bin/bash
# What a hostile job tries: read the service's secrets, list every job with its own token.
ckpt="$POLLUX_CHECKPOINT_DIR"
state="$(dirname "$(dirname "$ckpt")")"
echo "uid $(id -u)"
cat "$state/admin-token"
cat "$state/jobs.db" > /dev/null
cat "$state/ray-token"
ls "$state"
url="${POLLUX_SCHEDULER_URL#http://}"
exec 3<>"/dev/tcp/${url%%:*}/${url##*:}"
printf 'GET /v1/jobs HTTP/1.0\\r\\nAuthorization: Bearer %s\\r\\n\\r\\n' "$POLLUX_JOB_TOKEN" >&3
echo "list jobs: $(head -1 <&3)"
mkdir -p "$ckpt" && echo ok > "$ckpt/ckpt.txt" && echo "checkpoint written"
"""


def test_run_as_refuses_an_unknown_user_root_and_a_service_not_running_as_root(tmp_path):
    folder = tmp_path / "state"
    res = pollux("server", "start", "--state-dir", str(folder), "--run-as", "no-such-user-pollux", timeout=60)
    assert res.returncode == 1 and "--run-as no-such-user-pollux: no such user" in res.stderr, res.stderr
    assert not folder.exists()                              # refused before anything, the folder included
    if os.geteuid() == 0:
        res = pollux("server", "start", "--state-dir", str(folder), "--run-as", "root", timeout=60)
        assert res.returncode == 1 and "that is root" in res.stderr
        src = Path(__file__).resolve().parents[1] / "src"
        reachable = all(d.stat().st_mode & 0o005 == 0o005 for d in (src, *src.parents))
        if shutil.which("runuser") and Path("/usr/bin/python3").exists() and reachable:  # as another user
            code = (f"import sys; sys.path.insert(0, {str(src)!r}); from pollux.cluster.state.folder import "
                    "check_run_as; check_run_as('nobody')")
            res = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", code], cwd="/",
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 1 and "only a service running as root" in res.stderr, res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="running replicas as another user needs root")
def test_run_as_nobody_keeps_the_job_away_from_the_admin_token_the_api_and_ray():
    """The job is a shell script (this machine's Python lives under /root, which nobody may not
    enter); Ray's token is checked from here: without it the cluster refuses a client."""
    from pollux.cluster.backends.rayhost import probe

    base = Path(tempfile.mkdtemp(prefix="pollux-run-as-", dir="/tmp"))
    os.chmod(base, 0o755)                    # nobody must reach the checkpoint folder and the script
    state = base / "state"
    nobody = pwd.getpwnam("nobody").pw_uid
    try:
        work = base / "work"
        work.mkdir(mode=0o755)
        (work / "job.sh").write_text(HOSTILE_JOB)
        os.chmod(work / "job.sh", 0o755)
        res = pollux("server", "start", "--state-dir", str(state), *SMALL, "--run-as", "nobody", "--json")
        assert res.returncode == 0, res.stderr
        info = json.loads(res.stdout)
        assert info["run_as"] == "nobody"
        assert state.stat().st_mode & 0o777 == 0o711
        for name in ("admin-token", "jobs.db", "ray-token", "service.log", "logs"):
            assert (state / name).stat().st_mode & 0o077 == 0, name
        sub = pollux("submit", "--state-dir", str(state), "--json", "--batch-size", "8", "--working-dir",
                     str(work), "job.sh", timeout=30)
        assert sub.returncode == 0, sub.stderr
        job_id = json.loads(sub.stdout)["id"]
        job = wait_for(lambda: (j := _job_state(state, job_id))["state"] in ("succeeded", "failed") and j, 90,
                       "the job to end")
        out = pollux("logs", "--state-dir", str(state), job_id, timeout=30).stdout
        assert job["state"] == "succeeded", (job.get("failure_reason"), out)
        assert f"uid {nobody}\n" in out, out
        for name in ("admin-token", "jobs.db", "ray-token"):
            assert f"{state / name}: Permission denied" in out, out
        assert f"ls: cannot open directory '{state}': Permission denied" in out, out
        assert "list jobs: HTTP/1.1 401" in out or "list jobs: HTTP/1.1 403" in out, out
        assert "checkpoint written" in out
        ckpt = state / "checkpoints" / job_id / "ckpt.txt"
        assert ckpt.read_text() == "ok\n" and ckpt.stat().st_uid == nobody

        # Ray: the cluster answers a client with the folder's token and refuses one without it
        token_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(state / "ray-token")}
        assert probe(info["ray_address"], token_env)["healthy"] is True
        (base / "wrong-token").write_text("0" * 64 + "\n")
        refused = probe(info["ray_address"], {"RAY_AUTH_MODE": "token",
                                              "RAY_AUTH_TOKEN_PATH": str(base / "wrong-token")})
        assert refused["healthy"] is False and "Authentication" in refused["error"], refused
        assert "Authentication" in probe(info["ray_address"], {})["error"]

        assert pollux("server", "stop", "--state-dir", str(state)).returncode == 0
        assert_nothing_left(state)
    finally:
        pollux("server", "stop", "--state-dir", str(state), "--timeout", "20", timeout=120)
        for pid in state_processes(state):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
