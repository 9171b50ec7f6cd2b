"""Helpers shared by the tests of the service's API and CLI: a bearer header, a valid hints body, the
API served on loopback and the state folder the CLI reads."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pollux.cluster.api.listener import api_socket
from pollux.goodput import GradStats, ThroughputParams
from pollux.hints import build_hints


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sample_hints(init_batch_size: int = 128) -> dict:
    """Hints as a running job would send them (a fitted model of a real profile, 4 replicas seen)."""
    return build_hints(params=ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23),
                       grad=GradStats(sqr=8.95, var=5.07), init_batch_size=init_batch_size,
                       max_batch_size=4096, local_bsz_bounds=(32, 1024), accumulation=True,
                       max_replicas_seen=4, progress=12345.5, epoch=3)


def wait_started(server: Any, thread: threading.Thread, timeout_s: float = 10.0) -> None:
    """Wait until the uvicorn `server` running in `thread` listens; fail if it dies or is late."""
    deadline = time.monotonic() + timeout_s
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)


@contextlib.contextmanager
def serve_on_loopback(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on 127.0.0.1 (a free port); yields its URL and stops
    the server (and closes its socket) on exit."""
    import uvicorn

    sock = api_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_started(server, thread)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def write_state(state: Path, url: str, token: str, pid: int | None = None) -> None:
    """The state folder of a running server as the CLI reads it (``server.json`` and the admin token)."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "server.json").write_text(json.dumps({
        "service_pid": os.getpid() if pid is None else pid, "url": url, "rayhost_pid": None,
        "ray_address": "", "embedded": False}))
    fd = os.open(state / "admin-token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
