"""Workload CSV reading: sorted jobs, and errors that name the file, line and field."""

from __future__ import annotations

import pytest

from pollux.sim.workload import WorkloadJob, read_workload, write_workload

HEADER = "name,time,application,num_replicas,batch_size\n"


def write(tmp_path, body: str):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + body)
    return path


def test_reads_and_sorts_by_time(tmp_path):
    jobs = read_workload(write(tmp_path, "b,60,cifar10,2,256\na,0,ncf,1,256\n"))
    assert [j.name for j in jobs] == ["a", "b"]
    assert jobs[1] == WorkloadJob("b", 60.0, "cifar10", 2, 256)


def test_round_trip(tmp_path):
    jobs = [WorkloadJob("x", 5.0, "bert", 4, 48), WorkloadJob("y", 7.0, "ncf", 1, 256)]
    write_workload(tmp_path / "o.csv", jobs)
    assert read_workload(tmp_path / "o.csv") == jobs


@pytest.mark.parametrize(("body", "needle"), [
    ("a,x,cifar10,1,128\n", ":2: field 'time'"),
    ("a,-5,cifar10,1,128\n", ":2: field 'time'"),
    ("a,nan,cifar10,1,128\n", ":2: field 'time'"),
    ("a,0,cifar10,0,128\n", ":2: field 'num_replicas'"),
    ("a,0,cifar10,1.5,128\n", ":2: field 'num_replicas'"),
    ("a,0,cifar10,1,big\n", ":2: field 'batch_size'"),
    ("a,0,cifar10,1,128\na,1,cifar10,1,128\n", ":3: field 'name'"),
    (",0,cifar10,1,128\n", ":2: field 'name'"),
    ("a,0,mnist,1,128\n", ":2: field 'application'"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, body, needle):
    path = write(tmp_path, body)
    with pytest.raises(ValueError) as exc:
        read_workload(path, applications={"cifar10", "ncf"})
    assert str(path) in str(exc.value)
    assert needle in str(exc.value)


def test_missing_column_and_file(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("name,time,application\na,0,ncf\n")
    with pytest.raises(ValueError, match="missing column"):
        read_workload(path)
    with pytest.raises(FileNotFoundError, match="no such workload"):
        read_workload(tmp_path / "nope.csv")
    empty = write(tmp_path, "")
    with pytest.raises(ValueError, match="no jobs"):
        read_workload(empty)


def test_rows_are_checked_like_every_simulator_csv(tmp_path):
    """Workloads share the profile and trace reader: field counts, encoding and true line numbers."""
    with pytest.raises(ValueError, match=r"w\.csv:2: expected 5 fields, got 3"):
        read_workload(write(tmp_path, "a,0,ncf\n"))
    with pytest.raises(ValueError, match=r"w\.csv:4: field 'time'"):      # blank lines still count
        read_workload(write(tmp_path, "a,0,ncf,1,128\n\nb,soon,ncf,1,128\n"))
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"name,time,application,num_replicas,batch_size\n\xe9,0,ncf,1,128\n")
    with pytest.raises(ValueError, match=r"latin\.csv: not UTF-8 text"):
        read_workload(latin)
