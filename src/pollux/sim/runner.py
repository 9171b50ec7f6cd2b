"""Run several workloads × policies, in parallel processes; same seed ⇒ same results."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.policy.registry import make_policy
from pollux.sim.engine import SimConfig, SimResult, log_progress, simulate
from pollux.sim.profiles import AppProfile, load_profiles
from pollux.sim.typed_profiles import TypedProfiles, load_typed_profiles
from pollux.sim.workload import read_workload

_PROFILE_CACHE: dict[str, dict[str, AppProfile]] = {}
_TYPED_CACHE: dict[tuple[str, tuple[str, ...]], TypedProfiles] = {}


@dataclass(frozen=True)
class RunSpec:
    workload: Path
    policy: str
    config: SimConfig
    policy_options: tuple[tuple[str, Any], ...] = ()


def _profiles(root: Path) -> dict[str, AppProfile]:
    key = str(root.resolve())
    if key not in _PROFILE_CACHE:
        _PROFILE_CACHE[key] = load_profiles(root)
    return _PROFILE_CACHE[key]


def _profiles_or_empty(root: Path) -> dict[str, AppProfile]:
    """The untyped profiles, or none when no application has un-suffixed files (typed data only)."""
    try:
        return _profiles(root)
    except FileNotFoundError:
        return {}


def typed_profiles(root: Path, types: tuple[str, ...]) -> TypedProfiles:
    """:func:`pollux.sim.typed_profiles.load_typed_profiles` of ``types``, cached per process."""
    key = (str(root.resolve()), tuple(types))
    if key not in _TYPED_CACHE:
        _TYPED_CACHE[key] = load_typed_profiles(root, types)
    return _TYPED_CACHE[key]


def run_one(spec: RunSpec, profiles_dir: Path, progress: bool = False) -> SimResult:
    cluster = spec.config.cluster
    typed = typed_profiles(profiles_dir, cluster.type_names) if cluster is not None and cluster.types \
        else None
    profiles = _profiles_or_empty(profiles_dir) if typed is not None else _profiles(profiles_dir)
    known = set(profiles) | set(typed or {})
    jobs = read_workload(spec.workload, applications=known)
    policy = make_policy(spec.policy, **dict(spec.policy_options))
    return simulate(jobs, profiles, policy, spec.config, workload_name=spec.workload.stem,
                    progress=log_progress if progress else None, typed_profiles=typed)


def _worker(args: tuple[RunSpec, Path, bool]) -> SimResult:
    return run_one(*args)


def run_many(specs: Sequence[RunSpec], profiles_dir: Path, processes: int | None = None,
             progress: bool = True, runs_done: Callable[[int], None] | None = None) -> list[SimResult]:
    """Run every spec; results come back in the order of ``specs``.

    ``progress``: each run prints its engine's progress lines on stderr. ``runs_done`` is told, in
    this process, how many runs have finished: 0 once they have started (the worker processes exist
    by then, so a progress display may start its own thread without it being copied into a child),
    then again after each run, in the order they finish.
    """
    report = runs_done if runs_done is not None else _ignore
    if processes is None:
        processes = min(len(specs), os.cpu_count() or 1)
    if processes <= 1 or len(specs) == 1:
        results = []
        report(0)
        for s in specs:
            results.append(run_one(s, profiles_dir, progress))
            report(len(results))
        return results
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = [pool.submit(_worker, (s, profiles_dir, progress)) for s in specs]
        report(0)
        for done, _future in enumerate(as_completed(futures), start=1):
            report(done)
        return [f.result() for f in futures]


def _ignore(_done: int) -> None:
    """The ``runs_done`` of a caller that does not count runs."""


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr meanwhile (worker processes included): a solver library
    may print from C (HiGHS 1.12 prints a debug line during ``milp``, ERGO-Code/HiGHS#2783), which
    would land in the middle of a report or of JSON on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
