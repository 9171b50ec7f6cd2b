"""Tests of the persistent job store (pollux.cluster.state.store)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import threading

import numpy as np
import pytest

from pollux.cluster.state.store import (
    SCHEMA_VERSION,
    JobSpec,
    JobStore,
    SchemaVersionError,
    SpecError,
    UnknownJobError,
    hash_token,
)
from pollux.goodput.records import GradStats, ThroughputParams
from pollux.hints import HintsError, build_hints
from pollux.policy.base import decode_state, encode_state

SPEC = {"entrypoint": "train.py", "args": ["--lr", "0.1"], "working_dir": "/tmp", "init_batch_size": 128,
        "max_batch_size": 1024, "local_bsz_bounds": [32, 256], "min_replicas": 0, "max_replicas": 8,
        "resources": {"GPU": 1, "CPU": 4}, "preemptible": True}


def hints_body(**overrides):
    kwargs = dict(params=ThroughputParams(0.0177, 0.000697, 0.0342, 0.00165, 0.128, 0.0026, 2.23),
                  grad=GradStats(sqr=8.95, var=5.07), init_batch_size=128, max_batch_size=4096,
                  local_bsz_bounds=(32, 1024), accumulation=True, max_replicas_seen=4,
                  progress=123.5, epoch=3)
    kwargs.update(overrides)
    return build_hints(**kwargs)


@pytest.fixture
def store(tmp_path):
    s = JobStore(tmp_path / "jobs.db")
    yield s
    s.close()


def test_submit_defaults_and_get(store):
    job = store.submit(SPEC, name="resnet", now=10.0)
    assert re.fullmatch(r"job-[0-9a-f]{8}", job.id)
    assert job.state == "pending" and job.name == "resnet" and job.submit_time == 10.0
    assert job.spec == JobSpec.from_dict(SPEC) and job.spec.resources == {"GPU": 1.0, "CPU": 4.0}
    assert len(job.token) >= 32 and job.restarts == 0 and job.allocation == {}
    other = store.submit(SPEC, job_id="mine")
    assert other.id == "mine" and other.token != job.token and other.name == "mine"
    with pytest.raises(ValueError, match="already exists"):
        store.submit(SPEC, job_id="mine")
    assert store.get_job(job.id) == dataclasses.replace(job, token=None)  # only the hash is kept
    with pytest.raises(KeyError, match="unknown job 'nope'") as info:
        store.get_job("nope")
    assert isinstance(info.value, UnknownJobError)


def test_lifecycle_legal_path_and_history(store):
    job = store.submit(SPEC, job_id="a", now=0.0)
    for i, state in enumerate(["starting", "pending", "starting", "running", "rescaling", "running",
                               "pending", "starting", "running", "succeeded"], start=1):
        job = store.transition("a", state, reason=f"r{i}", now=float(i))
    assert job.state == "succeeded" and job.start_time == 4.0 and job.end_time == 10.0 and job.terminal
    hist = store.transitions("a")
    assert [(h.from_state, h.to_state) for h in hist][:3] == [
        (None, "pending"), ("pending", "starting"), ("starting", "pending")]
    assert hist[-1].to_state == "succeeded" and hist[-1].reason == "r10" and hist[-1].time == 10.0
    assert len(hist) == 11


@pytest.mark.parametrize("path,bad", [
    ([], "running"), ([], "succeeded"), ([], "rescaling"), (["starting"], "rescaling"),
    (["starting"], "succeeded"), (["starting", "running", "rescaling"], "succeeded"),
    (["starting", "running", "rescaling"], "starting"), (["cancelled"], "pending"),
    (["starting", "running", "succeeded"], "running"), (["failed"], "cancelled"),
])
def test_illegal_transitions_name_from_and_to(store, path, bad):
    store.submit(SPEC, job_id="j")
    for state in path:
        store.transition("j", state)
    before = store.get_job("j")
    with pytest.raises(ValueError, match=f"from '{before.state}' to '{bad}'"):
        store.transition("j", bad)
    assert store.get_job("j") == before
    assert len(store.transitions("j")) == len(path) + 1


def test_cancel_and_fail_from_every_active_state(store):
    paths = [[], ["starting"], ["starting", "running"], ["starting", "running", "rescaling"]]
    for i, path in enumerate(paths):
        for final in ("cancelled", "failed"):
            jid = f"j{i}{final}"
            store.submit(SPEC, job_id=jid)
            for state in path:
                store.transition(jid, state)
            job = store.transition(jid, final, reason="boom", now=5.0)
            assert job.end_time == 5.0
            assert job.failure_reason == ("boom" if final == "failed" else None)
    with pytest.raises(ValueError, match="unknown job state"):
        store.transition("j0failed", "exploded")
    with pytest.raises(UnknownJobError):
        store.transition("ghost", "starting")


def test_allocation_history_and_current(store):
    store.submit(SPEC, job_id="a", now=0.0)
    store.submit(SPEC, job_id="b", now=1.0)
    store.transition("a", "starting")
    store.transition("a", "running")
    store.set_allocation("a", {"n1": 2, "n0": 1, "n2": 0}, now=3.0)
    store.set_allocation("b", {"n0": 1}, now=3.0)
    store.set_allocation("a", {"n1": 4}, now=4.0)
    assert store.current_allocations() == {"a": {"n1": 4}, "b": {"n0": 1}}
    assert [(r.time, r.allocation) for r in store.allocation_history("a")] == [
        (3.0, {"n0": 1, "n1": 2}), (4.0, {"n1": 4})]
    store.transition("a", "pending", reason="preempted", now=5.0)  # preempted to zero GPUs
    assert store.current_allocations() == {"b": {"n0": 1}}
    assert store.allocation_history("a")[-1].allocation == {} and store.get_job("a").allocation == {}
    store.set_allocation("b", {}, now=6.0)
    assert store.current_allocations() == {}
    with pytest.raises(ValueError, match=r"allocation\.n0"):
        store.set_allocation("b", {"n0": -1})
    with pytest.raises(UnknownJobError):
        store.set_allocation("ghost", {"n0": 1})


def test_hints_validated_and_latest_kept(store):
    store.submit(SPEC, job_id="a")
    assert store.get_hints("a") is None
    store.put_hints("a", hints_body(epoch=1), now=1.0)
    store.put_hints("a", hints_body(epoch=2), now=2.0)
    assert store.get_hints("a") == hints_body(epoch=2)
    bad = hints_body()
    bad["throughput"]["gamma"] = float("nan")
    with pytest.raises(HintsError, match=r"throughput\.gamma") as info:
        store.put_hints("a", bad)
    assert info.value.field == "throughput.gamma"
    bad = hints_body()
    bad["progress"] = float("inf")
    with pytest.raises(ValueError, match="progress"):
        store.put_hints("a", bad)
    assert store.get_hints("a") == hints_body(epoch=2)
    with pytest.raises(UnknownJobError):
        store.put_hints("ghost", hints_body())


def test_policy_state_round_trip_with_numpy(store):
    # A policy's state is opaque JSON: the policy encodes its arrays itself (pollux.policy.base), the
    # store persists what it is given without knowing any codec.
    state = {"population": np.arange(12, dtype=np.int64).reshape(3, 4),
             "weights": np.linspace(0.0, 1.0, 5, dtype=np.float32),
             "nested": {"rounds": 3, "best": [np.float64(1.5), np.zeros((2, 2))]}, "name": "pollux"}
    assert store.load_policy_state("pollux") is None
    store.save_policy_state("pollux", encode_state(state))
    assert store.load_policy_state("pollux") == json.loads(json.dumps(encode_state(state)))
    got = decode_state(store.load_policy_state("pollux"))
    assert got["population"].dtype == np.int64 and np.array_equal(got["population"], state["population"])
    assert got["weights"].dtype == np.float32 and np.array_equal(got["weights"], state["weights"])
    assert got["nested"]["rounds"] == 3 and got["nested"]["best"][0] == 1.5
    assert np.array_equal(got["nested"]["best"][1], np.zeros((2, 2))) and got["name"] == "pollux"
    store.save_policy_state("pollux", {"x": 1})
    assert store.load_policy_state("pollux") == {"x": 1}


def test_replicas(store):
    store.submit(SPEC, job_id="a")
    store.record_replica("a", 0, 1, "n1", 4321, "/logs/a-0-1.log", now=1.0)
    store.record_replica("a", 0, 0, "n0", 4320, "/logs/a-0-0.log", now=1.0)
    store.record_replica("a", 1, 0, "n2", 5000, None, now=7.0)
    store.set_replica_exit("a", 0, 1, 143, now=6.0)
    reps = store.replicas("a")
    assert [(r.restart, r.rank, r.node, r.pid) for r in reps] == [
        (0, 0, "n0", 4320), (0, 1, "n1", 4321), (1, 0, "n2", 5000)]
    assert reps[1].exit_code == 143 and reps[1].end_time == 6.0 and reps[0].exit_code is None
    assert [r.rank for r in store.replicas("a", restart=1)] == [0]
    with pytest.raises(KeyError, match="rank 5"):
        store.set_replica_exit("a", 0, 5, 1)
    assert store.add_restart("a") == 1
    assert store.add_service("a", 12.5) == 12.5


def test_service_added_to_many_jobs_in_one_write_or_not_at_all(store):
    for jid in ("a", "b", "c"):
        store.submit(SPEC, job_id=jid)
    store.add_service("a", 1.0)
    store.add_services({"a": 2.5, "b": 4.0})
    store.add_services({})
    assert [store.get_job(j).attained_service for j in ("a", "b", "c")] == [3.5, 4.0, 0.0]
    with pytest.raises(KeyError, match="nope"):
        store.add_services({"c": 1.0, "nope": 1.0})
    with pytest.raises(ValueError, match=r"gpu_seconds\['b'\]"):
        store.add_services({"c": 1.0, "b": float("nan")})
    with pytest.raises(ValueError, match="finite non-negative"):
        store.add_services({"b": -1.0})
    assert [store.get_job(j).attained_service for j in ("a", "b", "c")] == [3.5, 4.0, 0.0]


def test_persistence_across_reopen_and_processes(tmp_path):
    path = tmp_path / "jobs.db"
    with JobStore(path) as s:
        job = s.submit(SPEC, job_id="a", now=1.0)
        s.transition("a", "starting", now=2.0)
        s.set_allocation("a", {"n0": 2}, now=2.0)
        s.put_hints("a", hints_body())
        s.save_policy_state("p", encode_state({"v": np.ones(3)}))
        s.record_replica("a", 0, 0, "n0", 99, "log", now=2.0)
    with JobStore(path) as s:
        with JobStore(path) as second:
            assert s.get_job("a") == second.get_job("a")
        got = s.get_job("a")
        assert got.state == "starting" and got.allocation == {"n0": 2}
        assert got.token is None and s.token_matches("a", job.token)
        assert s.get_hints("a") == hints_body()
        assert np.array_equal(decode_state(s.load_policy_state("p"))["v"], np.ones(3))
        assert len(s.transitions("a")) == 2 and s.replicas("a")[0].pid == 99
        assert s.schema_version == SCHEMA_VERSION
        # A second store on the same file, in another process, sees and writes through.
        code = ("import sys; from pollux.cluster.state.store import JobStore; s = JobStore(sys.argv[1]); "
                "print(s.get_job('a').state); s.transition('a', 'running', now=3.0)")
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                             check=True, timeout=60)
        assert out.stdout.strip() == "starting"
        assert s.get_job("a").state == "running"
        raw = sqlite3.connect(path)
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        raw.close()


def test_migrates_empty_v0_db_and_refuses_future(tmp_path):
    path = tmp_path / "old.db"
    sqlite3.connect(path).close()  # a v0 database: a file with no tables
    with JobStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        s.submit(SPEC, job_id="a")
    with JobStore(path) as s:  # reopening does not migrate twice
        assert [j.id for j in s.list_jobs()] == ["a"]
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(SchemaVersionError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade"):
        JobStore(path)


def database_at(path, version: int) -> sqlite3.Connection:
    """A connection to a new database at ``path`` built by the first ``version`` migration steps,
    as a Pollux of that schema version left it (the caller adds rows, commits and closes)."""
    from pollux.cluster.state.store import MIGRATIONS
    conn = sqlite3.connect(path)
    for steps in MIGRATIONS[:version]:
        for step in steps:
            if callable(step):
                step(conn)
            else:
                conn.execute(step)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
    return conn


def test_migrates_a_v1_database_keeping_its_jobs(tmp_path):
    """A store written by schema version 1 (before failures were counted) opens with its jobs intact."""
    path = tmp_path / "v1.db"
    conn = database_at(path, 1)
    conn.execute("INSERT INTO jobs (id, name, spec, state, token, submit_time, restarts) "
                 "VALUES ('old', 'old', ?, 'running', 't', 1.0, 2)", (json.dumps(SPEC),))
    conn.commit()
    conn.close()
    with JobStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 2
        job = s.get_job("old")
        assert job.state == "running" and job.restarts == 2 and job.failures == 0
        assert s.add_failure("old") == 1 and s.get_job("old").failures == 1
        assert s.token_matches("old", "t") and s.job_of_token("t") == "old"


def test_a_v4_database_gains_users_keeping_its_jobs_as_the_admins(tmp_path):
    """A state folder from before users (schema version 4) upgrades in place: every job stays, owned
    by the admin, its token still its own, and users can be added."""
    path = tmp_path / "v4.db"
    conn = database_at(path, 4)
    conn.execute("INSERT INTO jobs (id, name, spec, state, token_hash, submit_time) "
                 "VALUES ('old', 'old', ?, 'running', ?, 1.0)", (json.dumps(SPEC), hash_token("t")))
    conn.commit()
    conn.close()
    with JobStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 5
        job = s.get_job("old")
        assert job.state == "running" and job.owner is None and s.token_matches("old", "t")
        alice = s.add_user("alice")
        assert s.user_of_token(alice.token) == "alice" and s.list_jobs(owner="alice") == []
        assert [j.id for j in s.list_jobs()] == ["old"]


def test_users_tokens_are_kept_hashed_and_revocation_is_final_for_the_token(tmp_path):
    with JobStore(tmp_path / "jobs.db") as s:
        alice = s.add_user("alice", now=5.0)
        assert alice.token and alice.created == 5.0
        raw = sqlite3.connect(tmp_path / "jobs.db").execute("SELECT token_hash FROM users").fetchone()[0]
        assert raw == hash_token(alice.token) and alice.token not in raw
        with pytest.raises(ValueError, match="already exists"):
            s.add_user("alice")
        for bad in ("Alice", "admin", "", "a" * 65, "9lives", "a b"):
            with pytest.raises(SpecError, match=r"^name: "):
                s.add_user(bad)
        assert s.user_of_token(alice.token) == "alice" and s.user_of_token("nope") is None
        assert s.revoke_user("alice", now=9.0).revoked == 9.0
        assert s.user_of_token(alice.token) is None
        with pytest.raises(ValueError, match="already revoked"):
            s.revoke_user("alice")
        again = s.add_user("alice")
        assert again.token != alice.token and s.user_of_token(again.token) == "alice"
        assert [u.name for u in s.users()] == ["alice"]


def test_list_jobs_filters_by_state(store):
    for i in range(4):
        store.submit(SPEC, job_id=f"j{i}", now=float(i))
    store.transition("j1", "starting")
    store.transition("j2", "cancelled")
    assert [j.id for j in store.list_jobs()] == ["j0", "j1", "j2", "j3"]
    assert [j.id for j in store.list_jobs(["pending"])] == ["j0", "j3"]
    assert [j.id for j in store.list_jobs({"starting", "cancelled"})] == ["j1", "j2"]
    with pytest.raises(ValueError, match="bogus"):
        store.list_jobs(["bogus"])


def test_concurrent_writers_from_two_threads(tmp_path):
    path = tmp_path / "jobs.db"
    shared = JobStore(path)
    errors: list[BaseException] = []

    def work(prefix: str, own_store: bool) -> None:
        s = JobStore(path) if own_store else shared
        try:
            for i in range(40):
                jid = f"{prefix}{i}"
                s.submit(SPEC, job_id=jid)
                s.transition(jid, "starting")
                s.set_allocation(jid, {"n0": 1})
                s.save_policy_state("p", {"last": jid})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            if own_store:
                s.close()

    threads = [threading.Thread(target=work, args=(p, own)) for p, own in
               [("x", True), ("y", True), ("z", False), ("w", False)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(shared.list_jobs(["starting"])) == 160
    assert len(shared.current_allocations()) == 160
    shared.close()


@pytest.mark.parametrize("change,field", [
    ({"entrypoint": None}, "entrypoint"), ({"entrypoint": ""}, "entrypoint"),
    ({"init_batch_size": None}, "init_batch_size"), ({"init_batch_size": 0}, "init_batch_size"),
    ({"init_batch_size": 1.5}, "init_batch_size"), ({"max_batch_size": 64}, "max_batch_size"),
    ({"local_bsz_bounds": [64, 32]}, "local_bsz_bounds"), ({"local_bsz_bounds": [1]}, "local_bsz_bounds"),
    ({"args": "x"}, "args"), ({"max_replicas": 0}, "max_replicas"), ({"min_replicas": -1}, "min_replicas"),
    ({"resources": {"GPU": -1}}, "resources.GPU"), ({"preemptible": "yes"}, "preemptible"),
    ({"working_dir": 3}, "working_dir"), ({"colour": "red"}, "colour"),
])
def test_job_spec_errors_name_the_field(change, field):
    data = {**SPEC, **change}
    data = {k: v for k, v in data.items() if not (k in ("entrypoint", "init_batch_size") and v is None)}
    with pytest.raises(SpecError, match=rf"^{re.escape(field)}:") as info:
        JobSpec.from_dict(data)
    assert info.value.field == field


def test_job_spec_minimal_and_round_trip():
    spec = JobSpec.from_dict({"entrypoint": "t.py", "init_batch_size": 32})
    assert spec.args == () and spec.max_batch_size is None and spec.resources == {"GPU": 1.0}
    assert spec.preemptible and spec.min_replicas == 0 and spec.max_replicas is None
    full = JobSpec.from_dict(SPEC)
    assert JobSpec.from_dict(full.to_dict()) == full and full.local_bsz_bounds == (32, 256)


# ----------------------------------------------------------------------------- issue 10: tokens at rest


def _file_bytes(path) -> bytes:
    """The database file and its WAL/shared-memory companions, as they lie on disk."""
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def test_tokens_are_stored_only_as_hashes(tmp_path):
    """Issue 10 item 1: a reader of jobs.db (or of its WAL) must not find a job's token in it."""
    path = tmp_path / "jobs.db"
    with JobStore(path) as s:
        jobs = [s.submit(SPEC, job_id=f"j{i}") for i in range(5)]
        tokens = [j.token for j in jobs]
        assert all(isinstance(t, str) and len(t) >= 32 for t in tokens) and len(set(tokens)) == 5
        raw = sqlite3.connect(path)
        columns = [r[1] for r in raw.execute("PRAGMA table_info(jobs)")]
        rows = raw.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        raw.close()
        assert "token_hash" in columns and "token" not in columns
        hashes = {row[0]: row[columns.index("token_hash")] for row in rows}
        assert hashes == {j.id: hashlib.sha256(j.token.encode()).hexdigest() for j in jobs}
        for token in tokens:
            assert not any(token in str(cell) for row in rows for cell in row)
            assert token.encode() not in _file_bytes(path)
        assert all(j.token is None for j in s.list_jobs()) and s.get_job("j0").token is None
        # Matching and finding the job of a token work on the hashes.
        assert s.token_matches("j0", tokens[0]) and not s.token_matches("j0", tokens[1])
        assert not s.token_matches("ghost", tokens[0]) and not s.token_matches("j0", None)
        assert not s.token_matches("j0", "") and not s.token_matches("j0", "\ud800")
        assert s.job_of_token(tokens[3]) == "j3" and s.job_of_token("nope") is None
        assert s.job_of_token(None) is None
        # A new token (a new launch) replaces the old one, which stops working.
        fresh = s.issue_token("j0")
        assert fresh != tokens[0] and s.token_matches("j0", fresh) and not s.token_matches("j0", tokens[0])
        assert s.job_of_token(fresh) == "j0" and s.job_of_token(tokens[0]) is None
        assert fresh.encode() not in _file_bytes(path)
        with pytest.raises(UnknownJobError):
            s.issue_token("ghost")
    for token in [*tokens, fresh]:
        assert token.encode() not in _file_bytes(path)


def test_migrates_plain_tokens_of_a_v2_database_to_hashes(tmp_path):
    """A store written by schema version 2 (plain tokens) opens with every token hashed, the jobs
    intact, an index for finding a job by token, and no plain token left anywhere in the file."""
    path = tmp_path / "v2.db"
    conn = database_at(path, 2)
    plain = {f"old{i}": f"plain-token-{i:03d}-" + "x" * 30 for i in range(40)}
    for jid, token in plain.items():
        conn.execute("INSERT INTO jobs (id, name, spec, state, token, submit_time) "
                     "VALUES (?, ?, ?, 'pending', ?, 1.0)", (jid, jid, json.dumps(SPEC), token))
    conn.commit()
    conn.close()
    assert b"plain-token-007-" in path.read_bytes()
    with JobStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 3
        assert [j.id for j in s.list_jobs()] == list(plain)
        assert all(s.token_matches(jid, token) for jid, token in plain.items())
        assert s.job_of_token(plain["old7"]) == "old7"
        raw = sqlite3.connect(path)
        stored = dict(raw.execute("SELECT id, token_hash FROM jobs"))
        plan = " ".join(str(r) for r in raw.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE token_hash = 'x'"))
        raw.close()
        assert stored == {jid: hashlib.sha256(t.encode()).hexdigest() for jid, t in plain.items()}
        assert "jobs_token_hash" in plan
        assert b"plain-token-" not in _file_bytes(path)
    assert b"plain-token-" not in _file_bytes(path)


def test_count_by_state(store):
    assert store.count_by_state() == dict.fromkeys(
        ("pending", "starting", "running", "rescaling", "succeeded", "failed", "cancelled"), 0)
    for i in range(5):
        store.submit(SPEC, job_id=f"j{i}")
    store.transition("j1", "starting")
    store.transition("j2", "cancelled")
    store.transition("j3", "starting")
    store.transition("j3", "running")
    counts = store.count_by_state()
    assert counts["pending"] == 2 and counts["starting"] == 1 and counts["running"] == 1
    assert counts["cancelled"] == 1 and sum(counts.values()) == 5 and counts["failed"] == 0


def test_submit_validates_name_and_spec_objects(store):
    """A name with a newline and escape sequences (item 10) is refused, and so is a JobSpec object
    built in code with values from_dict would refuse (item 3); nothing is stored."""
    with pytest.raises(SpecError, match=r"^name:") as info:
        store.submit(SPEC, name="evil\x1b[31m\nname")
    assert info.value.field == "name"
    with pytest.raises(SpecError, match=r"^min_replicas:"):
        store.submit(JobSpec(entrypoint="t.py", init_batch_size=8, min_replicas=10**20))
    with pytest.raises(ValueError, match=r"^job_id:"):
        store.submit(SPEC, job_id="a/b")
    assert store.list_jobs() == []


# ------------------------------------------------------------------- issue 10: one bad row lists


def test_a_row_whose_spec_no_longer_validates_does_not_break_listing(tmp_path):
    """Issue 10 item 2: one stored job whose spec does not validate (an older Pollux stored a lone
    surrogate and min_replicas 1e20; a hand edit left no JSON at all) must not make every listing
    fail. Such a job is listed with ``spec_error``; if it could still run it is failed instead."""
    path = tmp_path / "jobs.db"
    with JobStore(path) as s:
        for jid in ("good", "poison", "broken", "done"):
            s.submit(SPEC, job_id=jid)
        s.transition("done", "cancelled")
    raw = sqlite3.connect(path)
    poison = {**SPEC, "entrypoint": "/tmp/\ud800.py", "min_replicas": 1e20}
    raw.execute("UPDATE jobs SET spec = ? WHERE id = 'poison'", (json.dumps(poison),))
    raw.execute("UPDATE jobs SET spec = '{\"entrypoint\": [' WHERE id = 'broken'")
    raw.execute("UPDATE jobs SET spec = 'null', name = CAST(X'66ff6f' AS TEXT) WHERE id = 'done'")
    raw.commit()
    raw.close()
    with JobStore(path) as s:
        assert [j.id for j in s.list_jobs(["pending"])] == ["good"]
        jobs = {j.id: j for j in s.list_jobs()}
        assert list(jobs) == ["good", "poison", "broken", "done"]
        assert jobs["good"].spec_error is None and jobs["good"].spec == JobSpec.from_dict(SPEC)
        bad = jobs["poison"]
        assert bad.state == "failed" and bad.spec_error.startswith("entrypoint:")
        assert bad.failure_reason.startswith("invalid spec: entrypoint:")
        # The best-effort spec keeps what still validates and is printable JSON.
        assert bad.spec.init_batch_size == 128 and bad.spec.min_replicas == 0
        assert bad.spec.args == ("--lr", "0.1")
        for job in jobs.values():
            json.dumps(job.spec.to_dict(), ensure_ascii=False).encode("utf-8")
            job.name.encode("utf-8")
        assert jobs["broken"].state == "failed" and "not valid JSON" in jobs["broken"].spec_error
        assert jobs["done"].state == "cancelled" and jobs["done"].spec_error.startswith("spec:")
        assert s.get_job("done").name == "f\ufffdo"
        assert s.get_job("poison").state == "failed" and s.count_by_state()["failed"] == 2


def test_a_v7_database_keeps_its_rounds_and_gains_their_objective(tmp_path):
    """Schema version 8 adds each round's objective: rounds written before read as None, rounds
    written after keep the objective given, and a round without one stays None."""
    path = tmp_path / "v7.db"
    conn = database_at(path, 7)
    conn.execute("INSERT INTO rounds (time, duration_s, policy, jobs, changed) "
                 "VALUES (5.0, 0.1, 'pollux', 2, 1)")
    conn.commit()
    conn.close()
    with JobStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION >= 8
        s.apply_round("pollux", {"objective": 0.5}, {}, now=6.0, jobs=2, objective=0.75)
        s.apply_round("fifo", None, {}, now=7.0, jobs=2)
        assert [(r.time, r.policy, r.objective) for r in s.rounds()] == [
            (5.0, "pollux", None), (6.0, "pollux", 0.75), (7.0, "fifo", None)]
