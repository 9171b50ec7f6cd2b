"""Ray's real autoscaler with its fake multi-node provider, on this machine, for tests (issue 36).

Why not ``ray.cluster_utils.AutoscalingCluster``: its ``start`` and ``shutdown`` run ``ray stop
--force``, which kills every Ray process on the machine (other tests' clusters too), and the Ray
wheel does not ship the ``fake_multi_node/example.yaml`` it builds its config from. So
:class:`FakeCluster` builds the same config from
:func:`pollux.cluster.backends.ray_autoscaler_nodes.fake_cluster_config` (the arguments it would pass
to ``AutoscalingCluster``), starts the head with the ``ray start`` command and environment that
``AutoscalingCluster.start`` uses (plus ``--block``, free ports and a temp folder of its own), and
stops only the processes it started. The missing file also keeps Ray's v2 autoscaler from loading a
``fake_multinode`` config, so this runs the v1 autoscaler, ``AutoscalingCluster``'s default; both
honour ``request_resources`` and remove only idle nodes the request does not need.

Use :func:`run_fake_cluster` in a fixture (``tests/test_cluster_autoscale_live.py``) or
:class:`FakeCluster` directly. Keep the pytest process itself from being a Ray driver of it: the
driver's authentication setting stays with the process and breaks later in-process Ray clusters.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pollux.cluster.backends.processes import descendants, pid_alive, session_of
from pollux.cluster.backends.ray_autoscaler_nodes import fake_cluster_config
from pollux.raylink import LOOPBACK_ENV


def autoscaling_config(args: dict[str, Any], gcs_address: str) -> dict[str, Any]:
    """The autoscaling config ``AutoscalingCluster(**args)`` would write, built without the
    ``fake_multi_node/example.yaml`` it reads (missing from the wheel): that file's fixed fields,
    ``available_node_types`` from ``args`` with the head type added as ``AutoscalingCluster`` adds
    it, and the remaining ``args`` merged at the top. The provider also gets ``gcs_address``: the
    fake provider starts its nodes against ``<this host>:6379`` unless told otherwise."""
    extra = {k: v for k, v in args.items() if k not in ("head_resources", "worker_node_types")}
    head = {"resources": dict(args["head_resources"]), "node_config": {}, "max_workers": 0}
    types = {**args["worker_node_types"], "ray.head.default": head}
    config: dict[str, Any] = {
        "cluster_name": "pollux-fake", "max_workers": 8,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": gcs_address},
        "available_node_types": types, "head_node_type": "ray.head.default",
        "auth": {}, "upscaling_speed": 1.0, "idle_timeout_minutes": 0.1, "docker": {},
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": []}
    config.update(extra)
    return config



#: The fake nodes' idle timeout: the autoscaler removes an idle node beyond the floor after this.
#: 0.01 min (0.6 s) works; the test's time goes to starting the head (about 6 s) and to the fake
#: provider starting one node per autoscaler update (about 3 s each), not to this.
IDLE_TIMEOUT_MIN = 0.01
#: How often the autoscaler updates (seconds, a whole number: Ray reads it with int()).
UPDATE_INTERVAL_S = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def head_command(args: dict[str, Any], config_path: Path, temp_dir: Path, port: int) -> list[str]:
    """``ray start --head`` as ``AutoscalingCluster.start`` builds it from the head's resources, plus
    ``--block`` (the process owns the head's processes and stops them on SIGTERM), 127.0.0.1, a temp
    folder and free ports of its own (the defaults would clash with other clusters on the machine)."""
    head = dict(args["head_resources"])
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
           f"--autoscaling-config={config_path}", f"--port={port}", "--node-ip-address=127.0.0.1",
           f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats",
           f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
           f"--ray-client-server-port={free_port()}"]
    flags = {"CPU": "--num-cpus", "GPU": "--num-gpus", "object_store_memory": "--object-store-memory"}
    for key, flag in flags.items():
        if key in head:
            cmd.append(f"{flag}={head.pop(key)}")
    if head:
        cmd.append(f"--resources={json.dumps(head)}")
    return cmd


class FakeCluster:
    """A head running Ray's autoscaler with the fake multi-node provider, owned by this test."""

    def __init__(self, args: dict[str, Any]) -> None:
        # A short folder of its own: Ray's socket paths must stay under the kernel's length limit.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="pollux-ras-", dir="/tmp"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        config = self.temp_dir / "autoscaling.json"
        config.write_text(json.dumps(autoscaling_config(args, self.address)))
        env = {**os.environ, **LOOPBACK_ENV,
               # What AutoscalingCluster.start sets: the fake provider refuses to run without
               # RAY_FAKE_CLUSTER, and the autoscaler updates every second instead of every 5.
               "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": str(UPDATE_INTERVAL_S),
               # The autoscaler terminates its nodes when it is stopped.
               "RAY_AUTOSCALER_FATESHARE_WORKERS": "1",
               # Loopback only; without this, `ray start` turns token auth on when ~/.ray has a token.
               "RAY_AUTH_MODE": "disabled"}
        self.log = self.temp_dir / "head.log"
        with open(self.log, "wb") as out:
            self.head = subprocess.Popen(head_command(args, config, self.temp_dir, self.port), env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: set[int] = {self.head.pid}

    def check_alive(self) -> None:
        """Fail at once if ``ray start`` exited (it stops everything when a head process dies, and
        a driver left connected to a dead cluster kills its own process after a minute)."""
        assert self.head.poll() is None, "the head exited:\n" + self.log.read_text()[-3000:]

    def wait_up(self, timeout_s: float) -> None:
        """Until ``ray start`` says the head runs (its autoscaler started) and the GCS answers."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            if "Ray runtime started" in self.log.read_text():
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return
                except OSError:
                    pass
            assert time.monotonic() < deadline, "the head did not start:\n" + self.log.read_text()[-3000:]
            time.sleep(0.2)

    def ours(self) -> set[int]:
        """Live processes of this cluster: below the head, in its session, or run from its folder."""
        found = set(descendants(self.head.pid))
        marker = str(self.temp_dir).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if session_of(pid) == self.head.pid:
                found.add(pid)
                continue
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(pid)
            except OSError:
                continue
        self.seen |= found
        return found

    def stop(self) -> list[int]:
        """SIGTERM ``ray start`` (it stops the head's processes; the autoscaler, stopped, terminates
        its nodes), SIGKILL by PID whatever of ours outlives a grace period; returns those PIDs."""
        self.ours()
        if self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)
            try:
                self.head.wait(60)
            except subprocess.TimeoutExpired:
                self.head.kill()
                self.head.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(pid_alive(p) for p in self.seen | self.ours()):
            time.sleep(0.2)
        left = sorted(p for p in self.seen | self.ours() if pid_alive(p))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return left


def run_fake_cluster(monkeypatch: pytest.MonkeyPatch, max_nodes: int = 2,
                     gpus_per_node: int = 1) -> Iterator[FakeCluster]:
    """A fixture's body: a :class:`FakeCluster` of up to
    ``max_nodes`` nodes, the test process made a driver without a token; everything stopped after."""
    pytest.importorskip("ray")
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux only (/proc)")
    import ray

    if ray.is_initialized():
        pytest.skip("this process is a Ray driver of another cluster already")
    # This process is the test's driver: no token, like the cluster.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    args = fake_cluster_config(max_nodes=max_nodes, gpus_per_node=gpus_per_node,
                               idle_timeout_minutes=IDLE_TIMEOUT_MIN)
    cluster = FakeCluster(args)
    try:
        cluster.wait_up(60)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        left = cluster.stop()
    assert not left, f"processes of the fake cluster outlived it (killed now): {left}"
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)   # its config and Ray's logs
