"""The benchmark scripts as the tests use them: as modules (for their pure parts) and as processes.

A script under ``benchmarks/`` is not in a package, so a test imports it from its file. It is
registered in ``sys.modules`` before it runs, because dataclasses look their module up there; one that
imports the scripts beside it (``scale.py`` reuses ``sim_profile.py``) gets its folder on ``sys.path``
while it loads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def load_script(path: Path, name: str, *, with_siblings: bool = False) -> ModuleType:
    """The script at ``path`` imported afresh as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.parent)
    added = with_siblings and folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if added:
            sys.path.remove(folder)
    return module


def run_benchmark(script: Path, *args: str, timeout_s: float, cleanup_s: float = 60.0,
                  env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """Run a benchmark script to its end: (exit status, stdout, stderr). One that overruns
    ``timeout_s`` gets SIGTERM — its own clean-up stops what it started — then ``cleanup_s`` more
    before it is killed, and the test fails with its stderr."""
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=None if env is None else {**os.environ, **env})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=cleanup_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"{script.name} overran {timeout_s:.0f} s; its stderr:\n{err[-4000:]}")
    return proc.returncode, out, err


def run_quick_json(script: Path, timeout_s: float) -> tuple[dict[str, Any], str]:
    """``script --quick --json`` with one BLAS thread: its report and its stderr (the run must succeed)."""
    proc = subprocess.run([sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout), proc.stderr


def ray_session_pids(session: str) -> list[int]:
    """Processes whose command line names the Ray session ``session`` (Ray's head processes do)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if session.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def assert_ray_session_gone(session: str | None, before: set[int], timeout_s: float = 20.0) -> None:
    """A benchmark stops its own Ray before it exits: within ``timeout_s`` no process of its session
    may be left, nor any child of this process that was not there ``before`` (orphans are not our
    children, hence the session's names too)."""
    from pollux.cluster.backends.processes import descendants

    assert session, "the benchmark must report its Ray session"
    deadline = time.monotonic() + timeout_s
    while True:
        left = ray_session_pids(session) + [p for p in descendants(os.getpid()) if p not in before]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    assert left == [], f"processes of Ray session {session} left behind by the benchmark: {left}"
