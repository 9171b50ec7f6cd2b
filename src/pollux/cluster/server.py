"""Starting, stopping and inspecting a Pollux server: the service process and its Ray host (SPEC §9).

``pollux server start`` creates the state directory (mode 0700) and the admin token file (0600),
starts the embedded Ray cluster in its own host process (:mod:`pollux.cluster.rayhost`) unless
``--ray-address`` points at an existing cluster, then starts the service process
(:mod:`pollux.cluster.service`). Both run in their own sessions, detached from the terminal, with
their output in ``DIR/rayhost.log`` and ``DIR/service.log``; their PIDs go to ``DIR/server.json``.
Starting again while the Ray host lives but the service does not (it crashed) restarts only the
service, which adopts the replicas still running.

``pollux server stop`` stops the service (it preempts every running job, which checkpoints and waits
as pending for the next start), then the Ray host, then any replica process the store recorded that
is somehow still alive, each by PID.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.cluster.backend import ray_env

__all__ = ["ServerError", "ServerInfo", "connect", "default_state_dir", "pid_alive", "spawn_rayhost", "start",
           "status", "stop", "stop_pid"]

#: Where the server keeps its state unless told otherwise (``--state-dir`` or ``$POLLUX_STATE_DIR``).
STATE_ENV = "POLLUX_STATE_DIR"


class ServerError(RuntimeError):
    """A server could not be started or reached; the message says why and where to look."""


@dataclass(frozen=True)
class ServerInfo:
    state_dir: Path
    url: str
    token: str
    service_pid: int
    rayhost_pid: int | None
    ray_address: str

    def to_dict(self) -> dict[str, Any]:
        return {"state_dir": str(self.state_dir), "url": self.url, "service_pid": self.service_pid,
                "rayhost_pid": self.rayhost_pid, "ray_address": self.ray_address}


def default_state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    return Path(env) if env else Path.home() / ".pollux"


def pid_alive(pid: int | None) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def stop_pid(pid: int | None, timeout_s: float, *, group: bool = False) -> bool:
    """SIGTERM ``pid`` (its process group if ``group``), wait up to ``timeout_s``, then SIGKILL.

    Returns True if it had to be killed.
    """
    if not pid_alive(pid):
        return False
    assert pid is not None

    def send(sig: int) -> None:
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return False
        time.sleep(0.1)
    send(signal.SIGKILL)
    for _ in range(50):
        _reap(pid)
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _ensure_token(state: Path) -> str:
    path = state / "admin-token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    os.chmod(path, 0o600)
    return path.read_text().strip()


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, close_fds=True)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float, what: str, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = _read_json(path)
        if data is not None and data.get("pid") == proc.pid:
            return data
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with code {proc.returncode} while starting; "
                              f"last lines of {log}:\n{_tail(log)}")
        time.sleep(0.1)
    stop_pid(proc.pid, 10)
    raise ServerError(f"{what} did not start within {timeout_s:.0f} s; last lines of {log}:\n{_tail(log)}")


def spawn_rayhost(state_dir: Path, nodes: int, gpus_per_node: int, timeout_s: float = 180.0,
                  on_spawn: Any = None) -> tuple[subprocess.Popen, str]:
    """Start an embedded Ray cluster's host process; returns it and the cluster's address.

    Its output goes to ``state_dir/rayhost.log`` and its address to ``state_dir/ray.json``; stop it
    with :func:`stop_pid` (SIGTERM shuts the cluster down).
    """
    state = Path(state_dir)
    (state / "ray.json").unlink(missing_ok=True)
    log = state / "rayhost.log"
    host = _spawn([sys.executable, "-m", "pollux.cluster.rayhost", "--info", str(state / "ray.json"),
                   "--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node)], log,
                  {**os.environ, **ray_env()})
    if on_spawn is not None:
        on_spawn(host.pid)
    return host, _wait_for(state / "ray.json", host, timeout_s, "the Ray host", log)["address"]


def start(state_dir: Path, *, ray_address: str | None = None, local_nodes: int = 4, gpus_per_node: int = 2,
          policy: str = "pollux", interval_s: float = 60.0, port: int = 0, stop_grace_s: float = 60.0,
          max_retries: int = 3, seed: int = 0, timeout_s: float = 180.0,
          progress: Any = None) -> ServerInfo:
    """Start the server (or only its service, if the Ray host is still up); returns where it listens."""
    say = progress or (lambda msg: None)
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    token = _ensure_token(state)
    info = _read_json(state / "server.json") or {}
    if pid_alive(info.get("service_pid")):
        raise ServerError(f"a Pollux service already runs from {state} (PID {info['service_pid']}, "
                          f"{info.get('url')}); stop it first with `pollux server stop`")
    env = {**os.environ, **ray_env()}
    rayhost_pid = info.get("rayhost_pid") if pid_alive(info.get("rayhost_pid")) else None
    address = ray_address
    if address is None and rayhost_pid is not None:
        ray_info = _read_json(state / "ray.json")
        address = None if ray_info is None else ray_info.get("address")
        if address is not None:
            say(f"reusing the embedded Ray cluster at {address} (host PID {rayhost_pid})")
    if address is None:
        if rayhost_pid is not None:
            stop_pid(rayhost_pid, 30)
        (state / "ray.json").unlink(missing_ok=True)
        say(f"starting an embedded Ray cluster: {local_nodes} node(s) x {gpus_per_node} GPU slot(s)")
        host, address = spawn_rayhost(state, local_nodes, gpus_per_node, timeout_s,
                                      on_spawn=lambda pid: _write_server_json(
                                          state, {"rayhost_pid": pid, "embedded": True}))
        rayhost_pid = host.pid
    (state / "service.json").unlink(missing_ok=True)
    say(f"starting the service (policy {policy}, rounds every {interval_s:g} s)")
    log = state / "service.log"
    service = _spawn([sys.executable, "-m", "pollux.cluster.service", "--state-dir", str(state),
                      "--ray-address", address, "--policy", policy, "--interval", str(interval_s),
                      "--port", str(port), "--stop-grace", str(stop_grace_s),
                      "--max-retries", str(max_retries),
                      "--seed", str(seed)], log, env)
    _write_server_json(state, {"rayhost_pid": rayhost_pid, "embedded": ray_address is None,
                               "service_pid": service.pid, "ray_address": address})
    svc = _wait_for(state / "service.json", service, timeout_s, "the service", log)
    _write_server_json(state, {"rayhost_pid": rayhost_pid, "embedded": ray_address is None,
                               "service_pid": service.pid, "ray_address": address, "url": svc["url"]})
    return ServerInfo(state, svc["url"], token, service.pid, rayhost_pid, address)


def _write_server_json(state: Path, data: dict[str, Any]) -> None:
    from pollux.cluster.rayhost import write_json_atomic
    write_json_atomic(state / "server.json", data)


def connect(state_dir: Path) -> ServerInfo:
    """The running server of ``state_dir``; raises :class:`ServerError` if none runs there."""
    state = Path(state_dir).resolve()
    info = _read_json(state / "server.json")
    if not info or not pid_alive(info.get("service_pid")) or not info.get("url"):
        raise ServerError(f"no Pollux service runs from {state}; start one with `pollux server start`")
    try:
        token = (state / "admin-token").read_text().strip()
    except FileNotFoundError as exc:
        raise ServerError(f"{state / 'admin-token'}: admin token file not found") from exc
    return ServerInfo(state, info["url"], token, int(info["service_pid"]), info.get("rayhost_pid"),
                      info.get("ray_address", ""))


def stop(state_dir: Path, *, timeout_s: float = 120.0, progress: Any = None) -> dict[str, Any]:
    """Stop the service, the embedded Ray host, and any recorded replica still alive (by PID)."""
    say = progress or (lambda msg: None)
    state = Path(state_dir).resolve()
    info = _read_json(state / "server.json") or {}
    report: dict[str, Any] = {"service_killed": False, "rayhost_killed": False, "replicas_killed": 0}
    if pid_alive(info.get("service_pid")):
        say(f"stopping the service (PID {info['service_pid']}); running jobs are preempted")
        report["service_killed"] = stop_pid(info["service_pid"], timeout_s)
    if info.get("embedded", True) and pid_alive(info.get("rayhost_pid")):
        say(f"stopping the embedded Ray cluster (PID {info['rayhost_pid']})")
        report["rayhost_killed"] = stop_pid(info["rayhost_pid"], 60)
    report["replicas_killed"] = _stop_recorded_replicas(state)
    (state / "server.json").unlink(missing_ok=True)
    (state / "service.json").unlink(missing_ok=True)
    return report


def _stop_recorded_replicas(state: Path) -> int:
    db = state / "jobs.db"
    if not db.exists():
        return 0
    from pollux.cluster.store import JobStore
    killed = 0
    with JobStore(db) as store:
        for job in store.list_jobs():
            for rep in store.replicas(job.id):
                if rep.end_time is None and rep.pid and pid_alive(rep.pid) and _is_replica(rep.pid, job.id):
                    stop_pid(rep.pid, 10, group=True)
                    killed += 1
    return killed


def _is_replica(pid: int, job_id: str) -> bool:
    """Guard against PID reuse: the process must carry the job's POLLUX_JOB_ID."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"POLLUX_JOB_ID={job_id}".encode() in environ


def status(state_dir: Path) -> dict[str, Any]:
    """What runs from ``state_dir``: PIDs and liveness, the API's health, the cluster and job counts."""
    import httpx
    state = Path(state_dir).resolve()
    info = _read_json(state / "server.json") or {}
    out: dict[str, Any] = {"state_dir": str(state), "url": info.get("url"),
                           "service_pid": info.get("service_pid"),
                           "service_alive": pid_alive(info.get("service_pid")),
                           "rayhost_pid": info.get("rayhost_pid"),
                           "rayhost_alive": pid_alive(info.get("rayhost_pid")),
                           "ray_address": info.get("ray_address"), "healthy": False}
    if out["service_alive"] and info.get("url"):
        try:
            token = (state / "admin-token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=info["url"], headers=headers, timeout=5.0) as client:
                out["healthy"] = client.get("/v1/health").json().get("status") == "ok"
                out["cluster"] = client.get("/v1/cluster").json()
                counts: dict[str, int] = {}
                for job in client.get("/v1/jobs").json():
                    counts[job["state"]] = counts.get(job["state"], 0) + 1
                out["jobs"] = counts
        except (httpx.HTTPError, OSError, ValueError) as exc:
            out["error"] = str(exc)
    return out
