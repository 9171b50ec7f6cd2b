"""Starting, stopping and inspecting a Pollux server: the service process and its Ray host (SPEC §9).

``pollux server start`` creates the state directory and the admin token file (0600), starts the
embedded Ray cluster in its own host process (:mod:`pollux.cluster.backends.rayhost`) unless ``--ray-address``
points at an existing cluster, then starts the service process (:mod:`pollux.cluster.service`). Both
run in their own sessions, detached from the terminal, with their output in ``DIR/rayhost.log`` and
``DIR/service.log``; their PIDs go to ``DIR/server.json``. Starting again while the Ray host lives
but the service does not (it crashed) restarts only the service, which adopts the replicas still
running.

A start holds ``DIR/start.lock`` from beginning to end (a second start on the folder fails at once),
refuses a folder whose service lives (``DIR/service.lock`` is held) and a damaged job store, both
before it spawns anything, and stops the Ray host it launched if it fails after launching it (see
:mod:`pollux.cluster.state.folder`). The embedded cluster runs with Ray's token authentication.

``pollux server stop`` stops the service (it preempts every running job, which checkpoints and waits
as pending for the next start), then the Ray host, then whatever process of the embedded cluster is
still alive (found by the token path in its environment, so a Ray host killed earlier leaves nothing
behind either), then any replica process the store recorded that is somehow still alive, each by PID.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.cluster.backends.embedded_nodes import WANTED_FILE
from pollux.cluster.backends.processes import pid_alive, stop_pid
from pollux.cluster.backends.rayhost import sweep_cluster
from pollux.cluster.state.folder import (
    RAY_TOKEN,
    SERVICE_LOCK,
    START_LOCK,
    FolderLock,
    LockedError,
    StoreError,
    check_run_as,
    check_store,
    lock_holder,
    ray_auth_env,
    read_json,
    secure_state_dir,
)
from pollux.cluster.state.tokens import new_token
from pollux.policy.clusterspec import parse_cluster
from pollux.raylink import LOOPBACK_ENV

__all__ = ["Autoscale", "ServerError", "ServerInfo", "connect", "default_state_dir", "spawn_rayhost", "start",
           "status", "stop"]

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
    run_as: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state_dir": str(self.state_dir), "url": self.url, "service_pid": self.service_pid,
                "rayhost_pid": self.rayhost_pid, "ray_address": self.ray_address, "run_as": self.run_as}


@dataclass(frozen=True)
class Autoscale:
    """``pollux server start --autoscale``: the bounds ``"MIN:MAX"``, the rule and its options
    (``KEY=VALUE`` strings), and the seconds a node takes to come (told to the rule)."""

    bounds: str
    rule: str = "goodput"
    options: tuple[str, ...] = ()
    provision_delay_s: float = 0.0

    def check(self) -> None:
        """Raise ValueError naming the option that is wrong; the service would refuse it too."""
        from pollux.cluster.control.fleet import parse_bounds, parse_options
        from pollux.policy.autoscale import autoscaler_names

        parse_bounds(self.bounds)
        parse_options(self.options)
        if self.rule not in autoscaler_names():
            raise ValueError(f"--autoscale-rule: unknown rule {self.rule!r} "
                             f"(one of {', '.join(autoscaler_names())})")
        if not self.provision_delay_s >= 0:
            raise ValueError(f"--provision-delay: must be >= 0, got {self.provision_delay_s}")

    def service_args(self, gpus_per_node: int, wanted: Path | None) -> list[str]:
        """The service's command-line options for this autoscaling."""
        argv = ["--autoscale", self.bounds, "--autoscale-rule", self.rule, "--gpus-per-node",
                str(gpus_per_node), "--provision-delay", str(self.provision_delay_s)]
        for option in self.options:
            argv += ["--autoscale-option", option]
        if wanted is not None:
            argv += ["--nodes-wanted", str(wanted)]
        return argv


def default_state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    return Path(env) if env else Path.home() / ".pollux"


def _ensure_token(state: Path) -> str:
    path = state / "admin-token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_token() + "\n")
    os.chmod(path, 0o600)
    return path.read_text().strip()


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
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
        data = read_json(path)
        if data is not None and data.get("pid") == proc.pid:
            return data
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with code {proc.returncode} while starting; "
                              f"last lines of {log}:\n{_tail(log)}")
        time.sleep(0.1)
    stop_pid(proc.pid, 10)
    raise ServerError(f"{what} did not start within {timeout_s:.0f} s; last lines of {log}:\n{_tail(log)}")


def spawn_rayhost(state_dir: Path, nodes: int | str, gpus_per_node: int, timeout_s: float = 180.0,
                  on_spawn: Any = None, env: dict[str, str] | None = None,
                  wanted: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start an embedded Ray cluster's host process; returns it and the cluster's address.

    ``nodes`` is a count of untyped nodes of ``gpus_per_node`` slots, or a typed cluster string
    (``"t4:2x2,a100:1x2"``, whose GPU counts replace ``gpus_per_node``).

    Its output goes to ``state_dir/rayhost.log`` and its address to ``state_dir/ray.json``; ``env``
    is added to its environment (Ray's token authentication). With ``wanted`` (an autoscaled
    cluster) the worker nodes are the ones that file lists and ``nodes`` is ignored. Stop it with
    :func:`pollux.cluster.backends.processes.stop_pid` (SIGTERM
    shuts the cluster down).
    """
    state = Path(state_dir)
    (state / "ray.json").unlink(missing_ok=True)
    log = state / "rayhost.log"
    shape = ["--cluster", nodes] if isinstance(nodes, str) else ["--nodes", str(nodes)]
    if wanted is not None:
        shape = ["--wanted", str(wanted)]
    host = _spawn([sys.executable, "-m", "pollux.cluster.backends.rayhost", "--info", str(state / "ray.json"),
                   *shape, "--gpus-per-node", str(gpus_per_node)], log,
                  {**os.environ, **LOOPBACK_ENV, **(env or {})})
    if on_spawn is not None:
        on_spawn(host.pid)
    return host, _wait_for(state / "ray.json", host, timeout_s, "the Ray host", log)["address"]


def _write_server_json(state: Path, data: dict[str, Any]) -> None:
    from pollux.cluster.backends.rayhost import write_json_atomic
    write_json_atomic(state / "server.json", data)


def _running_service(state: Path) -> tuple[int, str | None] | None:
    """``(PID, URL)`` of the service running from ``state``: the holder of ``service.lock``, or (a
    service of an older version, which took no lock) the live PID that ``server.json`` records."""
    info = read_json(state / "server.json") or {}
    svc = read_json(state / "service.json") or {}
    holder = lock_holder(state / SERVICE_LOCK)
    if holder:
        url = svc.get("url") if svc.get("pid") == holder else None
        if url is None and info.get("service_pid") == holder:
            url = info.get("url")
        return holder, url
    if pid_alive(info.get("service_pid")):
        return int(info["service_pid"]), info.get("url")
    return None


def start(state_dir: Path, *, ray_address: str | None = None, local_nodes: int | str = 4,
          gpus_per_node: int = 2, policy: str = "pollux", interval_s: float = 60.0, port: int = 0,
          stop_grace_s: float = 60.0, max_retries: int = 3, seed: int = 0, timeout_s: float = 180.0,
          run_as: str | None = None, progress: Any = None, autoscale: Autoscale | None = None) -> ServerInfo:
    """Start the server (or only its service, if the Ray host is still up); returns where it listens.

    ``local_nodes`` is the embedded cluster's node count (untyped nodes of ``gpus_per_node`` slots)
    or a typed cluster string such as ``"t4:2x2,a100:1x2"`` (``parse_cluster``; a bad one raises
    :class:`ServerError` naming ``--local-nodes``). ``run_as`` runs the replicas as that OS user (the
    caller must be root). ``autoscale`` sizes the cluster with a rule (:class:`Autoscale`): the
    embedded cluster then starts with a head without GPUs and worker nodes of ``gpus_per_node``
    slots come and go as the service asks (``local_nodes`` is ignored); with ``ray_address`` the
    service asks Ray's own autoscaler. Raises :class:`ServerError`, having started nothing or stopped what it
    started, if the folder is busy (another start, a live service), its job store is damaged, or a
    process does not come up.
    """
    say = progress or (lambda msg: None)
    try:
        check_run_as(run_as)
        if isinstance(local_nodes, str):
            parse_cluster(local_nodes, where="--local-nodes")
            if autoscale is not None:
                raise ValueError("--autoscale adds untyped nodes of --gpus-per-node GPUs: leave typed "
                                 "--local-nodes out")
        if autoscale is not None:
            autoscale.check()
    except ValueError as exc:
        raise ServerError(str(exc)) from None
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o711 if run_as else 0o700)
    lock = FolderLock(state / START_LOCK)
    try:
        lock.acquire()
    except LockedError as exc:
        raise ServerError(f"another `pollux server start` or `stop`{f' (PID {exc.pid})' if exc.pid else ''} "
                          f"is working on {state}; this start did nothing") from None
    with lock:
        return _start_locked(state, ray_address=ray_address, local_nodes=local_nodes,
                             gpus_per_node=gpus_per_node, policy=policy, interval_s=interval_s, port=port,
                             stop_grace_s=stop_grace_s, max_retries=max_retries, seed=seed,
                             timeout_s=timeout_s, run_as=run_as, say=say, autoscale=autoscale)


def _start_locked(state: Path, *, ray_address: str | None, local_nodes: int | str, gpus_per_node: int,
                  policy: str, interval_s: float, port: int, stop_grace_s: float, max_retries: int, seed: int,
                  timeout_s: float, run_as: str | None, say: Any, autoscale: Autoscale | None) -> ServerInfo:
    running = _running_service(state)
    if running is not None:
        where = f", {running[1]}" if running[1] else ""
        raise ServerError(f"a Pollux service already runs from {state} (PID {running[0]}{where}); stop it "
                          "first with `pollux server stop`")
    try:
        check_store(state)
    except StoreError as exc:
        raise ServerError(f"{exc}; nothing was started") from None
    secure_state_dir(state, run_as)
    if run_as:
        from pollux.cluster.backends.launcher import prepare_run_as
        try:
            prepare_run_as(state, run_as)
        except ValueError as exc:
            raise ServerError(f"{exc}; nothing was started") from None
    token = _ensure_token(state)
    info = read_json(state / "server.json") or {}
    embedded = ray_address is None
    auth = ray_auth_env(state) if embedded else {}
    env = {**os.environ, **LOOPBACK_ENV, **auth}
    rayhost_pid = info.get("rayhost_pid")
    if info.get("embedded", True) and rayhost_pid and not pid_alive(rayhost_pid):
        sweep_cluster(state, rayhost_pid)            # what a Ray host killed earlier left behind
    if not (info.get("embedded", True) and pid_alive(rayhost_pid)):
        rayhost_pid = None
    address = ray_address
    if embedded and rayhost_pid is not None:
        ray_info = read_json(state / "ray.json") or {}
        same_shape = bool(ray_info.get("wanted")) == (autoscale is not None)   # fixed or autoscaled
        if ray_info.get("pid") == rayhost_pid and ray_info.get("address") and same_shape:
            from pollux.cluster.backends.rayhost import gcs_listening
            if gcs_listening(ray_info["address"]) is None:
                address = ray_info["address"]
                say(f"reusing the embedded Ray cluster at {address} (host PID {rayhost_pid})")
    spawned: int | None = None
    service: subprocess.Popen | None = None
    try:
        if rayhost_pid is not None and (address is None or not embedded):
            say(f"stopping the earlier embedded Ray cluster (PID {rayhost_pid})"
                + (": it does not answer or is not autoscaled as asked" if embedded else ""))
            stop_pid(rayhost_pid, 30)
            sweep_cluster(state, rayhost_pid)
            rayhost_pid = None
        if address is None:
            (state / "ray.json").unlink(missing_ok=True)
            shape = (f"{local_nodes} node(s) x {gpus_per_node} GPU slot(s)" if isinstance(local_nodes, int)
                     else f"typed nodes {local_nodes}")
            if autoscale is not None:
                shape = f"autoscaled, {autoscale.bounds} node(s) x {gpus_per_node} GPU slot(s)"
            say(f"starting an embedded Ray cluster: {shape}")

            def record(pid: int) -> None:
                nonlocal spawned
                spawned = pid
                _write_server_json(state, {"rayhost_pid": pid, "embedded": True})

            wanted = state / WANTED_FILE if autoscale is not None else None
            host, address = spawn_rayhost(state, local_nodes, gpus_per_node, timeout_s, on_spawn=record,
                                          env=auth, wanted=wanted)
            rayhost_pid = host.pid
        (state / "service.json").unlink(missing_ok=True)
        say(f"starting the service (policy {policy}, rounds every {interval_s:g} s"
            f"{f', replicas run as {run_as}' if run_as else ''})")
        log = state / "service.log"
        argv = [sys.executable, "-m", "pollux.cluster.service", "--state-dir", str(state),
                "--ray-address", address, "--policy", policy, "--interval", str(interval_s),
                "--port", str(port), "--stop-grace", str(stop_grace_s), "--max-retries", str(max_retries),
                "--seed", str(seed)]
        if run_as:
            argv += ["--run-as", run_as]
        if embedded and rayhost_pid is not None:
            argv += ["--rayhost-pid", str(rayhost_pid)]
        if autoscale is not None:
            argv += autoscale.service_args(gpus_per_node, state / WANTED_FILE if embedded else None)
        service = _spawn(argv, log, env)
        record_ = {"rayhost_pid": rayhost_pid, "embedded": embedded, "service_pid": service.pid,
                   "ray_address": address, "run_as": run_as}
        _write_server_json(state, record_)
        svc = _wait_for(state / "service.json", service, timeout_s, "the service", log)
        _write_server_json(state, {**record_, "url": svc["url"]})
    except BaseException as exc:
        note = _abort(state, service, spawned, rayhost_pid if spawned is None else None, address)
        if isinstance(exc, ServerError):
            raise ServerError(f"{exc}{note}") from None
        raise
    return ServerInfo(state, svc["url"], token, service.pid, rayhost_pid, address, run_as)


def _abort(state: Path, service: subprocess.Popen | None, spawned: int | None, kept_rayhost: int | None,
           address: str | None) -> str:
    """Undo a failed start: stop its service and the Ray host it launched; returns a note saying so."""
    notes = []
    if service is not None and pid_alive(service.pid):
        stop_pid(service.pid, 10)
    if spawned is not None:
        stop_pid(spawned, 30)
        sweep_cluster(state, spawned)
        notes.append(f"stopped the Ray host this start had launched (PID {spawned})")
        (state / "server.json").unlink(missing_ok=True)
    elif kept_rayhost is not None and pid_alive(kept_rayhost):
        _write_server_json(state, {"rayhost_pid": kept_rayhost, "embedded": True, "ray_address": address})
    else:
        (state / "server.json").unlink(missing_ok=True)
    return f"\n({'; '.join(notes)})" if notes else ""


def connect(state_dir: Path, token: str | None = None) -> ServerInfo:
    """The running server of ``state_dir``, to be called with ``token`` (a user's), else with the
    folder's admin token; raises :class:`ServerError` if none runs there."""
    state = Path(state_dir).resolve()
    info = read_json(state / "server.json") or {}
    running = _running_service(state)
    if running is None or not running[1]:
        raise ServerError(f"no Pollux service runs from {state}; start one with `pollux server start`")
    if token is None:
        try:
            token = (state / "admin-token").read_text().strip()
        except FileNotFoundError as exc:
            raise ServerError(f"{state / 'admin-token'}: admin token file not found (give a token with "
                              "--token or POLLUX_TOKEN)") from exc
        except PermissionError as exc:
            raise ServerError(f"{state / 'admin-token'}: not readable by you; give your own token with "
                              "--token or POLLUX_TOKEN") from exc
    return ServerInfo(state, running[1], token, running[0], info.get("rayhost_pid"),
                      info.get("ray_address", ""), info.get("run_as"))


def stop(state_dir: Path, *, timeout_s: float = 120.0, progress: Any = None) -> dict[str, Any]:
    """Stop the service, the embedded Ray host, what is left of its cluster, and any recorded replica
    still alive (by PID). Waits up to ``timeout_s`` for a start in progress to finish first."""
    say = progress or (lambda msg: None)
    state = Path(state_dir).resolve()
    report: dict[str, Any] = {"was_running": False, "service_pid": None, "service_pids": [],
                              "rayhost_pid": None, "service_killed": False, "rayhost_killed": False,
                              "ray_processes_killed": 0, "replicas_killed": 0}
    if not state.is_dir():
        return report
    lock = FolderLock(state / START_LOCK)
    try:
        lock.acquire(timeout_s=timeout_s)
    except LockedError as exc:
        raise ServerError(f"a `pollux server start`{f' (PID {exc.pid})' if exc.pid else ''} is still working "
                          f"on {state} after {timeout_s:g} s; try again when it has finished") from None
    with lock:
        info = read_json(state / "server.json") or {}
        pids = []
        running = _running_service(state)
        if running is not None:
            pids.append(running[0])
        if pid_alive(info.get("service_pid")) and info["service_pid"] not in pids:
            pids.append(int(info["service_pid"]))
        for pid in pids:
            say(f"stopping the service (PID {pid}); running jobs are preempted")
            report["service_killed"] |= stop_pid(pid, timeout_s)
        report["service_pids"] = pids
        report["service_pid"] = pids[0] if pids else None
        host = info.get("rayhost_pid") if info else (read_json(state / "ray.json") or {}).get("pid")
        embedded = info.get("embedded", True)
        if embedded and pid_alive(host):
            say(f"stopping the embedded Ray cluster (PID {host})")
            report["rayhost_pid"] = host
            report["rayhost_killed"] = stop_pid(host, 60)
        report["ray_processes_killed"] = sweep_cluster(state, host if embedded else None)
        if report["ray_processes_killed"]:
            say(f"killed {report['ray_processes_killed']} leftover process(es) of the embedded Ray cluster")
        report["replicas_killed"] = _stop_recorded_replicas(state)
        (state / "server.json").unlink(missing_ok=True)
        (state / "service.json").unlink(missing_ok=True)
    report["was_running"] = bool(pids or report["rayhost_pid"] or report["ray_processes_killed"]
                                 or report["replicas_killed"])
    return report


def _stop_recorded_replicas(state: Path) -> int:
    db = state / "jobs.db"
    if not db.exists():
        return 0
    try:
        check_store(state)   # never let opening the store turn a damaged file into an empty store
    except StoreError:
        return 0
    from pollux.cluster.state.store import JobStore
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


def status(state_dir: Path, *, probe_ray: bool = True) -> dict[str, Any]:
    """What runs from ``state_dir``: PIDs and liveness, the API's and Ray's health, the cluster and
    job counts. ``healthy`` is true when the service answers and its Ray cluster is not known to be
    down (``ray_healthy`` false, with ``ray_error`` saying why)."""
    import httpx
    state = Path(state_dir).resolve()
    info = read_json(state / "server.json") or {}
    running = _running_service(state)
    embedded = info.get("embedded", True)
    rayhost_pid = info.get("rayhost_pid")
    out: dict[str, Any] = {"state_dir": str(state), "url": running[1] if running else info.get("url"),
                           "service_pid": running[0] if running else info.get("service_pid"),
                           "service_alive": running is not None,
                           "rayhost_pid": rayhost_pid, "rayhost_alive": pid_alive(rayhost_pid),
                           "ray_address": info.get("ray_address"), "run_as": info.get("run_as"),
                           "api_ok": False, "ray_healthy": None, "ray_error": None, "healthy": False}
    if embedded and rayhost_pid and not out["rayhost_alive"]:
        out["ray_healthy"] = False
        out["ray_error"] = f"the Ray host (PID {rayhost_pid}) is not running"
    elif probe_ray and out["ray_address"] and (running is not None or out["rayhost_alive"]):
        from pollux.cluster.backends.rayhost import probe
        ray_token = state / RAY_TOKEN
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(ray_token)} \
            if embedded and ray_token.exists() else {}
        health = probe(out["ray_address"], env)
        out["ray_healthy"] = health["healthy"]
        out["ray_error"] = health.get("error")
        if "alive_nodes" in health:
            out["ray_nodes"] = health["alive_nodes"]
    if running is not None and out["url"]:
        try:
            token = (state / "admin-token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=out["url"], headers=headers, timeout=5.0) as client:
                out["api_ok"] = client.get("/v1/health").json().get("status") == "ok"
                out["cluster"] = client.get("/v1/cluster").json()
                counts: dict[str, int] = {}
                for job in client.get("/v1/jobs").json():
                    counts[job["state"]] = counts.get(job["state"], 0) + 1
                out["jobs"] = counts
        except (httpx.HTTPError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            out["error"] = str(exc)
    out["healthy"] = bool(out["api_ok"] and out["ray_healthy"] is not False)
    return out
