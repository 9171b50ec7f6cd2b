"""The simulator's built-in defaults: application profiles and a demo workload shipped in the package.

They let ``pollux simulate`` run with no external data. See ``default_profiles/README.md`` for
their provenance.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def profiles_dir() -> Path:
    return _HERE / "default_profiles"


def workload_file() -> Path:
    return _HERE / "default_workload.csv"
