"""Start replicas as forks of one process that has already imported torch (for the multi-process
tests whose time is mostly start-up: about 5 s of imports a process on a 2-core machine, most of it
torch and the compiler stack that ``torch.optim`` loads, against a second or two of training).

Each replica is still a process of its own, started with the same ``POLLUX_*`` contract, working
directory, log and arguments as :func:`launch.launch` gives it: it runs the script as ``__main__``
from the top, makes its own gloo group, receives real signals and exits through the interpreter's
normal shutdown with its own status. Only the imports are shared, done once in the server before any
thread, process group or environment variable of a replica exists (``import pollux.torch`` reads no
environment variable; the agent reads them when the script starts it), and frozen out of the garbage
collector's reach (``gc.freeze``) so that a replica does not copy them page by page when it collects.

Run as a script, this file is the server: it reads one JSON request a line on stdin (``id``,
``script``, ``args``, ``env``, ``cwd``, ``log``), forks, and writes the child's PID on stdout; it reaps
its children and writes each one's exit status to ``<status dir>/<id>`` (the negative signal number
for a death by signal, as :mod:`subprocess` does). The status directory is its first line of output.
At the end of stdin it kills the children still running and exits.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, cast

if __name__ != "__main__":          # the client's side (the server, run as a script, needs none of it)
    from torch_workers.launch import ReplicaGroup, base_env, free_port, replica_env


class ForkedProcess:
    """The part of :class:`subprocess.Popen` that :class:`launch.ReplicaGroup` uses, for a fork."""

    def __init__(self, pid: int, status: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status = status

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", cast(float, timeout))
            time.sleep(0.02)
        return cast(int, self.returncode)


class ForkServer:
    """A server process (this file run as a script); :meth:`launch` is :func:`launch.launch` by fork."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=base_env(), text=True)
        self.status_dir = Path(self._stdout().readline().strip())
        self.count = 0

    def _stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def start(self, script: Path, args: list[str], env: dict[str, str], cwd: Path,
              log: Path) -> ForkedProcess:
        self.count += 1
        request = {"id": self.count, "script": str(script), "args": args, "env": env, "cwd": str(cwd),
                   "log": str(log)}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self._stdout().readline()
        assert line.strip().isdigit(), f"fork server answered {line!r}"
        return ForkedProcess(int(line), self.status_dir / str(self.count))

    def launch(self, script: Path, replicas: int, workdir: Path, *, args: list[str] | None = None,
               env: dict[str, str] | None = None, checkpoint_dir: Path | None = None,
               tag: str = "run") -> ReplicaGroup:
        """Like :func:`launch.launch` (one node): ``replicas`` forks with the contract on a fresh port."""
        port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        procs, logs = [], []
        for rank in range(replicas):
            extra = replica_env(rank, replicas, port, checkpoint_dir=checkpoint_dir, env=env)
            log = workdir / f"{tag}-rank{rank}.log"
            procs.append(self.start(script, args or [], base_env(extra), workdir, log))
            logs.append(log)
        return ReplicaGroup(procs=cast(list[subprocess.Popen], procs), logs=logs)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()
            self.proc.wait(timeout=10)


# ---------------------------------------------------------------- the server (this file as a script)


def serve() -> dict | None:
    """The server's loop; returns a request in a forked child (which then runs it), None at the end."""
    # What every replica imports (torch.optim's first optimiser loads torch._dynamo), once, before any fork.
    import torch
    import torch._dynamo
    import torch.distributed
    import torch.optim  # noqa: F401

    import pollux.torch.context  # noqa: F401

    # The imported objects go to the collector's permanent generation: a replica's collections (its
    # last one at exit above all) then leave their pages alone instead of copying them all from the
    # server (copy on write), which tripled the time a replica took to exit.
    gc.freeze()

    status_dir = Path(tempfile.mkdtemp(prefix="pollux-forkserver-"))
    print(status_dir, flush=True)
    children: dict[int, int] = {}
    buffer = b""
    done = False
    while not done:
        ready, _, _ = select.select([0], [], [], 0.02)
        if ready:
            data = os.read(0, 65536)
            done = not data
            buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return cast(dict, request)
            children[pid] = int(request["id"])
            print(pid, flush=True)
        reap(children, status_dir, block=False)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    reap(children, status_dir, block=True)
    shutil.rmtree(status_dir, ignore_errors=True)
    return None


def reap(children: dict[int, int], status_dir: Path, *, block: bool) -> None:
    """Write the status of every child that has exited (of all of them with ``block``)."""
    while children:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        temp = status_dir / f"{children.pop(pid)}.tmp"
        temp.write_text(str(code))
        temp.rename(temp.with_suffix(""))


def run_child(request: dict) -> None:
    """In the fork: become the replica the request describes and run its script as ``__main__``."""
    os.chdir(request["cwd"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    script = request["script"]
    sys.argv = [script, *request["args"]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    child = serve()
    if child is not None:
        run_child(child)
