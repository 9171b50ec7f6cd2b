"""Workloads: the jobs a simulation submits, in the Pollux OSDI'21 CSV format (SPEC §7).

``name,time,application,num_replicas,batch_size`` — submission time in seconds from the trace start;
``num_replicas,batch_size`` is the user's ("TunedJobs") configuration that rigid baseline policies use.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pollux.sim.csvrows import read_rows

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    name: str
    submit_time: float
    application: str
    num_replicas: int
    batch_size: int


def _int_field(path: Path, line: int, field: str, text: str, minimum: int = 1) -> int:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{path}:{line}: field {field!r}: not a number: {text!r}") from None
    if not math.isfinite(value) or value != int(value) or value < minimum:
        raise ValueError(f"{path}:{line}: field {field!r}: expected an integer >= {minimum}, got {text!r}")
    return int(value)


def read_workload(path: Path | str, applications: Iterable[str] | None = None) -> list[WorkloadJob]:
    """Read a workload CSV; errors name the file, line and field. Jobs come back sorted by time."""
    path = Path(path)
    idx, rows = read_rows(path, COLUMNS, kind="workload", loc=lambda n: f"{path}:{n}",
                          empty_message="no jobs")
    known = set(applications) if applications is not None else None
    jobs: list[WorkloadJob] = []
    names: set[str] = set()
    for line, fields in rows:
        row = {c: fields[i] for c, i in idx.items()}
        name = row["name"].strip()
        if not name:
            raise ValueError(f"{path}:{line}: field 'name': empty")
        if name in names:
            raise ValueError(f"{path}:{line}: field 'name': duplicate job name {name!r}")
        names.add(name)
        try:
            submit = float(row["time"])
        except ValueError:
            raise ValueError(f"{path}:{line}: field 'time': not a number: {row['time']!r}") from None
        if not math.isfinite(submit) or submit < 0:
            raise ValueError(f"{path}:{line}: field 'time': must be finite and >= 0, got {row['time']!r}")
        app = row["application"].strip()
        if known is not None and app not in known:
            raise ValueError(f"{path}:{line}: field 'application': unknown application {app!r} "
                             f"(profiles: {', '.join(sorted(known))})")
        jobs.append(WorkloadJob(
            name=name, submit_time=submit, application=app,
            num_replicas=_int_field(path, line, "num_replicas", row["num_replicas"]),
            batch_size=_int_field(path, line, "batch_size", row["batch_size"]),
        ))
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return jobs


def write_workload(path: Path | str, jobs: Iterable[WorkloadJob]) -> None:
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for j in jobs:
            w.writerow([j.name, round(j.submit_time), j.application, j.num_replicas, j.batch_size])
