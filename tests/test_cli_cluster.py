"""The cluster commands of `pollux` (server, submit, ls, describe, logs, cancel) and the HTTP client.

No Ray: the real REST API over a real SQLite store is served by uvicorn in a thread, and a state folder
is written the way `pollux server start` writes it, so that the CLI finds the service as it would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from api_helpers import sample_hints, serve_on_loopback, write_state
from pollux.cli import cluster_commands, formatting, main
from pollux.cluster.api.app import create_app
from pollux.cluster.client import ClientError, PolluxClient
from pollux.cluster.state.store import JOB_STATES, TERMINAL_STATES, JobStore
from pollux.policy.registry import policy_names

TOKEN = "cli-test-admin-token"
CLUSTER = {"nodes": [{"name": "node-0", "gpus": 2, "address": "10.0.0.1"},
                     {"name": "node-1", "gpus": 2, "address": "10.0.0.2"}],
           "total_gpus": 4, "policy": "pollux", "interval_s": 30.0, "rounds": 7, "ray_address": "x:1",
           "running_jobs": 0}


@dataclass
class Service:
    store: JobStore
    state: Path
    url: str
    log_dir: Path
    work: Path

    def args(self, *argv: str) -> list[str]:
        """``argv`` with ``--state-dir`` inserted after the (sub)command words."""
        argv = list(argv)
        at = 2 if argv[0] == "server" else 1
        return [*argv[:at], "--state-dir", str(self.state), *argv[at:]]


@pytest.fixture
def service(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    app = create_app(store, TOKEN, log_dir=log_dir, cluster_info=lambda: CLUSTER)
    with serve_on_loopback(app) as url:
        state = tmp_path / "state"
        write_state(state, url, TOKEN)
        work = tmp_path / "work"
        work.mkdir()
        (work / "train.py").write_text("print('hello')\n")
        try:
            yield Service(store, state, url, log_dir, work)
        finally:
            store.close()


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def submit(service: Service, capsys, *extra: str, name: str = "demo") -> str:
    code, out, err = run(capsys, service.args("submit", "--json", "--name", name, "--batch-size", "64",
                                              "--working-dir", str(service.work), *extra, "train.py"))
    assert code == 0, err
    return json.loads(out)["id"]


def make_hints() -> dict:
    return sample_hints(64)


# ----------------------------------------------------------------------------------------------- submit


def test_submit_human_resolves_script_and_passes_args(service, capsys, monkeypatch):
    monkeypatch.chdir(service.work)
    code, out, err = run(capsys, service.args(
        "submit", "--batch-size", "128", "--max-batch-size", "4096", "--local-bsz-bounds", "16", "256",
        "--min-replicas", "1", "--max-replicas", "8", "--gpus-per-replica", "2", "--no-preempt",
        "--name", "resnet", "train.py", "--epochs", "3", "--batch-size", "7", "--name", "x", "--", "-h"))
    assert code == 0, err
    assert out.startswith("submitted job-") and out.strip().endswith("(resnet)")
    job_id = out.split()[1]
    job = service.store.get_job(job_id)
    assert job.name == "resnet" and job.state == "pending"
    spec = job.spec
    assert spec.entrypoint == str(service.work / "train.py")
    assert spec.working_dir == str(service.work)
    # everything after SCRIPT goes to the script, even options pollux itself knows
    assert spec.args == ("--epochs", "3", "--batch-size", "7", "--name", "x", "--", "-h")
    assert spec.init_batch_size == 128 and spec.max_batch_size == 4096
    assert spec.local_bsz_bounds == (16, 256)
    assert (spec.min_replicas, spec.max_replicas) == (1, 8)
    assert spec.resources == {"GPU": 2.0} and spec.preemptible is False


def test_submit_json_has_no_token_and_defaults(service, capsys, monkeypatch):
    sub = service.work / "sub"
    sub.mkdir()
    (sub / "job.py").write_text("")
    monkeypatch.chdir(service.work)
    code, out, err = run(capsys, service.args("submit", "--json", "--batch-size", "32", "sub/job.py"))
    assert code == 0, err
    job = json.loads(out)
    assert "token" not in job and job["id"].startswith("job-") and job["state"] == "pending"
    assert job["spec"]["entrypoint"] == str(sub / "job.py")
    assert job["spec"]["working_dir"] == str(service.work)
    assert job["spec"]["resources"] == {"GPU": 1.0} and job["spec"]["preemptible"] is True
    assert job["spec"]["max_batch_size"] is None and job["spec"]["args"] == []
    assert service.store.get_job(job["id"]).spec.init_batch_size == 32


def test_submit_relative_working_dir_made_absolute(service, capsys, monkeypatch):
    monkeypatch.chdir(service.work.parent)
    job_id = submit(service, capsys)  # --working-dir is absolute here; now a relative one
    code, out, err = run(capsys, service.args("submit", "--batch-size", "8", "--working-dir", "work",
                                              "train.py"))
    assert code == 0, err
    other = service.store.get_job(out.split()[1])
    assert other.spec.working_dir == str(service.work) == service.store.get_job(job_id).spec.working_dir
    assert out.strip() == f"submitted {other.id}"   # no name: only the id


def test_submit_missing_script_is_an_error(service, capsys, monkeypatch):
    monkeypatch.chdir(service.work)
    code, out, err = run(capsys, service.args("submit", "--batch-size", "8", "nope.py"))
    assert code == 1 and out == ""
    assert err.startswith("pollux: error: ") and "nope.py" in err and "no such file" in err
    assert str(service.work / "nope.py") in err
    assert service.store.list_jobs() == []


def test_submit_bad_batch_size_names_the_field(service, capsys):
    code, out, err = run(capsys, service.args("submit", "--batch-size", "0", "--working-dir",
                                              str(service.work), "train.py"))
    assert code == 1 and out == ""
    assert err.strip() == "pollux: error: 422 spec.init_batch_size: must be >= 1, got 0"
    code, _, err = run(capsys, service.args("submit", "--batch-size", "64", "--max-batch-size", "32",
                                            "--working-dir", str(service.work), "train.py"))
    assert code == 1 and "422 spec.max_batch_size:" in err


def test_submit_usage_errors_exit_2(service, capsys):
    code, out, err = run(capsys, service.args("submit", str(service.work / "train.py")))  # no --batch-size
    assert code == 2 and out == ""
    assert err.startswith("usage: pollux submit ") and "pollux submit: error: " in err
    assert "--batch-size" in err
    code, out, err = run(capsys, service.args("submit", "--batch-size", "8", "--gpus-per-replica", "0",
                                              "train.py"))
    assert code == 2 and "pollux submit: error: argument --gpus-per-replica: expected an integer >= 1" in err


# --------------------------------------------------------------------------------------------- ls, describe


def test_ls_table_and_json(service, capsys):
    a = submit(service, capsys, name="alpha")
    b = submit(service, capsys, name="beta")
    st = service.store
    st.transition(a, "starting")
    st.set_allocation(a, {"node-1": 1, "node-0": 2})
    st.transition(a, "running")
    st.add_restart(a)

    code, out, err = run(capsys, service.args("ls"))
    assert code == 0, err
    lines = out.splitlines()
    header = lines[0]
    assert header.split() == ["ID", "NAME", "STATE", "GPUS", "ALLOCATION", "RESTARTS", "AGE", "RUNTIME"]
    row_a = next(line for line in lines if line.startswith(a))
    row_b = next(line for line in lines if line.startswith(b))
    assert row_a.split()[:6] == [a, "alpha", "running", "3", "node-0:2,node-1:1", "1"]
    assert row_b.split()[:6] == [b, "beta", "pending", "0", "-", "0"]
    assert row_b.split()[7] == "-"                       # never started: no runtime
    # aligned columns: every value starts where its header does
    for col in ("NAME", "STATE", "ALLOCATION", "AGE"):
        at = header.index(col)
        assert row_a[at - 2:at] == "  " and row_a[at] != " " and row_b[at] != " "

    code, out, _ = run(capsys, service.args("ls", "--json"))
    jobs = json.loads(out)
    assert [j["id"] for j in jobs] == [a, b]
    assert jobs[0]["allocation"] == {"node-0": 2, "node-1": 1} and "token" not in jobs[0]

    code, out, _ = run(capsys, service.args("ls", "--json", "--state", "pending", "--state", "succeeded"))
    assert [j["id"] for j in json.loads(out)] == [b]
    code, out, _ = run(capsys, service.args("ls", "--state", "failed"))
    assert code == 0 and out.strip() == "no jobs in state failed"
    code, out, err = run(capsys, service.args("ls", "--state", "bogus"))
    assert code == 2 and out == "" and "pollux ls: error: argument --state: invalid choice: 'bogus'" in err


def test_describe_shows_history(service, capsys):
    job_id = submit(service, capsys, "--max-batch-size", "4096", "--local-bsz-bounds", "32", "1024",
                    "--max-replicas", "4", name="resnet")
    st = service.store
    t0 = time.time()
    st.transition(job_id, "starting", reason="allocated", now=t0)
    st.set_allocation(job_id, {"node-0": 2}, now=t0)
    st.transition(job_id, "running", now=t0 + 1)
    st.record_replica(job_id, 0, 0, "node-0", 4242, "r0.log", now=t0 + 1)
    st.record_replica(job_id, 0, 1, "node-0", 4243, "r1.log", now=t0 + 1)
    st.set_replica_exit(job_id, 0, 1, 143, now=t0 + 5)
    st.transition(job_id, "rescaling", reason="rescale to 3 GPUs", now=t0 + 5)
    st.set_allocation(job_id, {"node-0": 2, "node-1": 1}, now=t0 + 5)
    st.put_hints(job_id, make_hints())

    code, out, err = run(capsys, service.args("describe", job_id))
    assert code == 0, err
    assert out.startswith(f"{job_id} (resnet)")
    assert "rescaling" in out and "rescale to 3 GPUs" in out
    assert "node-0:2,node-1:1 (3 GPU(s))" in out
    assert str(service.work / "train.py") in out
    assert "64 (max 4096)" in out and "32..1024" in out and "0..4" in out
    for section in ("spec", "transitions", "allocation history", "replicas", "hints"):
        assert section in out.splitlines(), section
    replica_rows = [line.split() for line in out.splitlines() if "4242" in line or "4243" in line]
    assert replica_rows[0][:4] == ["0", "0", "node-0", "4242"] and replica_rows[0][-1] == "-"
    assert replica_rows[1][:4] == ["0", "1", "node-0", "4243"] and replica_rows[1][-1] == "143"
    assert f"{5.07 * 64 / 8.95:.1f}" in out and "epoch 3" in out      # noise scale, progress

    code, out, _ = run(capsys, service.args("describe", "--json", job_id))
    full = json.loads(out)
    assert full["state"] == "rescaling"
    assert [a["allocation"] for a in full["allocation_history"]] == [{"node-0": 2},
                                                                     {"node-0": 2, "node-1": 1}]
    assert [t["to_state"] for t in full["transitions"]] == ["pending", "starting", "running", "rescaling"]
    assert len(full["replicas"]) == 2 and full["hints"]["epoch"] == 3

    st.transition(job_id, "failed", reason="replica 0 exited with code 1 (3 failures)")
    code, out, _ = run(capsys, service.args("describe", job_id))
    assert "failure" in out and "replica 0 exited with code 1 (3 failures)" in out

    code, out, err = run(capsys, service.args("describe", "job-nope"))
    assert code == 1 and err.strip() == "pollux: error: 404 unknown job 'job-nope'"


# ------------------------------------------------------------------------------- control characters

HOSTILE = "evil\n\x1b[31mred\x1b[0m\u202e\x07"


def test_control_characters_are_escaped_in_human_output(service, capsys, monkeypatch):
    """A job name, failure reason, node name or error detail with a newline or ANSI escapes (from a
    store written before names were checked, or fields never checked) prints as visible escapes."""
    job_id = submit(service, capsys, name="plain")
    with sqlite3.connect(service.store.path) as db:     # as an older version of the service stored it
        db.execute("UPDATE jobs SET name = ? WHERE id = ?", (HOSTILE, job_id))
    st = service.store
    st.transition(job_id, "starting")
    st.set_allocation(job_id, {"node\x1b[1m": 1})
    st.transition(job_id, "running")
    st.transition(job_id, "failed", reason="boom\x1b[2J\rgone")
    visible = "evil\\n\\x1b[31mred\\x1b[0m\\u202e\\x07"

    def clean(text: str) -> None:
        assert not any(c in text for c in "\x1b\x07\r\u202e"), text

    code, out, err = run(capsys, service.args("ls"))
    assert code == 0, err
    clean(out)
    assert len(out.splitlines()) == 2 and visible in out          # one header, one row: no broken table

    code, out, err = run(capsys, service.args("describe", job_id))
    assert code == 0, err
    clean(out)
    assert out.splitlines()[0] == f"{job_id} ({visible})"
    assert "boom\\x1b[2J\\rgone" in out and "node\\x1b[1m" in out

    code, out, _ = run(capsys, service.args("ls", "--json"))     # JSON stays exact
    assert json.loads(out)[0]["name"] == HOSTILE and "\x1b" not in out

    code, out, err = run(capsys, service.args("describe", "job-\x1b[2J\n"))
    assert code == 1 and out == ""
    clean(err)
    assert len(err.strip().splitlines()) == 1 and "404" in err

    monkeypatch.setitem(CLUSTER, "nodes", [{"name": "n\x1b]0;title\x07", "gpus": 2, "address": "x"}])
    code, out, err = run(capsys, service.args("server", "status"))
    clean(out)
    assert "n\\x1b]0;title\\x07:2" in out


def test_logs_print_the_job_output_raw_unless_on_a_terminal(service, capsys):
    job_id = submit(service, capsys)
    (service.log_dir / "c0.log").write_text("red \x1b[31mtext\ttab\n")
    service.store.record_replica(job_id, 0, 0, "node-0", 11, "c0.log")
    code, out, _ = run(capsys, service.args("logs", job_id))            # piped: the output as it is
    assert code == 0 and out.endswith("red \x1b[31mtext\ttab\n")
    assert formatting.escape_log("red \x1b[31mtext\ttab\n") == "red \\x1b[31mtext\ttab\n"


# ------------------------------------------------------------------------------------------------- logs


def test_logs_print_and_filter(service, capsys):
    job_id = submit(service, capsys)
    st = service.store
    (service.log_dir / "r0.log").write_text("zero-a\nzero-b\n")
    (service.log_dir / "r1.log").write_text("one-a")               # no final newline
    st.record_replica(job_id, 0, 0, "node-0", 11, "r0.log")
    st.record_replica(job_id, 0, 1, "node-1", 12, str(service.log_dir / "r1.log"))  # absolute path

    code, out, err = run(capsys, service.args("logs", job_id))
    assert code == 0, err
    assert out == ("==> restart 0 rank 0 (node node-0) <==\nzero-a\nzero-b\n"
                   "==> restart 0 rank 1 (node node-1) <==\none-a\n")
    code, out, _ = run(capsys, service.args("logs", job_id, "--rank", "1"))
    assert out == "==> restart 0 rank 1 (node node-1) <==\none-a\n"
    code, out, _ = run(capsys, service.args("logs", job_id, "--restart", "1"))
    assert code == 0 and out == ""

    # -f on a job that has already ended prints everything, the same, and exits
    st.transition(job_id, "cancelled")
    code, out_f, _ = run(capsys, service.args("logs", job_id, "-f", "--interval", "0.05"))
    code2, out, _ = run(capsys, service.args("logs", job_id))
    assert code == code2 == 0 and out_f == out


def test_logs_follow_prints_new_text_until_terminal(service, capsys):
    job_id = submit(service, capsys)
    st = service.store
    st.transition(job_id, "starting")
    st.transition(job_id, "running")
    log0 = service.log_dir / "f0.log"
    log0.write_text("line 1\n")
    st.record_replica(job_id, 0, 0, "node-0", 21, "f0.log")

    def writer() -> None:
        time.sleep(0.3)
        with log0.open("a") as f:
            f.write("line 2\nline ")                     # a line half written ...
        time.sleep(0.3)
        with log0.open("a") as f:
            f.write("3\n")                               # ... and finished
        (service.log_dir / "f1.log").write_text("rank one\n")
        st.record_replica(job_id, 0, 1, "node-1", 22, "f1.log")
        time.sleep(0.3)
        with log0.open("a") as f:
            f.write("line 4\n")
        st.transition(job_id, "succeeded")

    thread = threading.Thread(target=writer)
    thread.start()
    started = time.monotonic()
    code, out, err = run(capsys, service.args("logs", job_id, "--follow", "--interval", "0.05"))
    thread.join()
    assert code == 0, err
    assert time.monotonic() - started < 5
    assert f"{job_id} succeeded" in err
    # every line exactly once, nothing lost; a header whenever the replica changes. The line written
    # in two parts, 0.3 s apart (six polls), may come out in two parts.
    h0, h1 = "==> restart 0 rank 0 (node node-0) <==\n", "==> restart 0 rank 1 (node node-1) <==\n"
    assert out.startswith(h0 + "line 1\nline 2\nline ")
    assert out.count(h1) == 1 and out.count("rank one\n") == 1
    rank0 = out.replace(h1 + "rank one\n", "").replace(h0, "")
    assert rank0 in ("line 1\nline 2\nline 3\nline 4\n", "line 1\nline 2\nline \n3\nline 4\n")
    assert out.endswith("line 4\n")


def test_log_follower_holds_back_the_last_line_and_loses_nothing():
    out: list[str] = []
    f = formatting.LogFollower(out.append)
    h = "==> restart 0 rank 0 (node n) <==\n"
    h1 = "==> restart 0 rank 1 (node n) <==\n"
    f.feed(h + "a\nb", final=False)          # the service ends "b" with a newline of its own
    assert "".join(out) == h + "a\n"
    f.feed(h + "a\nbc\n", final=False)       # "b" grew: still held back, now as "bc"
    assert "".join(out) == h + "a\n"
    f.feed(h + "a\nbc\n", final=False)       # the same for one poll: printed
    assert "".join(out) == h + "a\nbc\n"
    f.feed(h + "a\nbcd\n" + h1 + "x\ny\n", final=False)   # printed "bc" grows; rank 1 appears
    assert "".join(out) == h + "a\nbc\n" + h1 + "x\n"
    f.feed(h + "a\nbcde\nf\n" + h1 + "x\ny\nz\n", final=True)
    assert "".join(out) == h + "a\nbc\n" + h1 + "x\n" + h + "de\nf\n" + h1 + "y\nz\n"
    f.feed(h + "a\nbcde\nf\n" + h1 + "x\ny\nz\n", final=True)   # nothing new: nothing printed
    assert "".join(out) == h + "a\nbc\n" + h1 + "x\n" + h + "de\nf\n" + h1 + "y\nz\n"


def test_logs_follow_ctrl_c_exits_130_without_traceback(service, capsys):
    """Through the console entry, in its own process: SIGINT while following."""
    job_id = submit(service, capsys)
    st = service.store
    st.transition(job_id, "starting")
    st.transition(job_id, "running")
    (service.log_dir / "c.log").write_text("first\nsecond\n")
    st.record_replica(job_id, 0, 0, "node-0", 31, "c.log")
    exe = Path(sys.executable).parent / "pollux"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pollux.cli"]
    # As from a terminal: SIGINT at its default. A suite run as a background job of a non-interactive
    # shell (`make test &`) inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored, so the
    # child would never see this Ctrl-C (how this test failed twice on 2026-11-29).
    proc = subprocess.Popen([*cmd, "logs", "--state-dir", str(service.state), "-f", "--interval", "0.1",
                             job_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "==> restart 0 rank 0 (node node-0) <==\n"
        assert proc.stdout.readline() == "first\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err


# ----------------------------------------------------------------------------------------------- cancel


def test_cancel_then_cancel_again(service, capsys):
    job_id = submit(service, capsys)
    code, out, err = run(capsys, service.args("cancel", job_id))
    assert code == 0, err
    assert out.strip() == f"{job_id}: cancelled"
    assert service.store.get_job(job_id).state == "cancelled"
    code, out, err = run(capsys, service.args("cancel", job_id))
    assert code == 1 and out == ""
    assert err.strip() == f"pollux: error: 409 job '{job_id}' is already cancelled"
    other = submit(service, capsys)
    code, out, _ = run(capsys, service.args("cancel", "--json", other))
    assert json.loads(out)["state"] == "cancelled"


# ---------------------------------------------------------------------------------- errors, server status


def test_wrong_token_is_a_401(service, capsys):
    write_state(service.state, service.url, "not-the-token")
    code, out, err = run(capsys, service.args("ls"))
    assert code == 1 and out == ""
    assert err.strip() == "pollux: error: 401 invalid token"


def test_no_service_running(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["ls"], ["describe", "job-x"], ["cancel", "job-x"], ["logs", "job-x"]):
        code, out, err = run(capsys, [argv[0], "--state-dir", str(empty), *argv[1:]])
        assert code == 1 and out == "", argv
        assert err.startswith("pollux: error: ") and "no Pollux service runs" in err, argv
        assert len(err.strip().splitlines()) == 1
    code, out, err = run(capsys, ["server", "status", "--state-dir", str(empty)])
    assert code == 1 and "no Pollux service runs" in out
    code, out, _ = run(capsys, ["server", "status", "--json", "--state-dir", str(empty)])
    assert code == 1 and json.loads(out)["service_alive"] is False
    code, out, err = run(capsys, ["server", "stop", "--state-dir", str(empty)])
    assert code == 0, err
    assert "nothing to stop" in out
    code, out, _ = run(capsys, ["server", "stop", "--json", "--state-dir", str(empty)])
    assert code == 0 and json.loads(out)["was_running"] is False


def test_service_not_answering(tmp_path, capsys):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()                                   # nothing listens there now
    state = tmp_path / "state"
    write_state(state, url, TOKEN)
    code, _, err = run(capsys, ["ls", "--state-dir", str(state)])
    assert code == 1
    assert err.startswith(f"pollux: error: cannot reach the Pollux service at {url}")
    with pytest.raises(ClientError) as exc:
        PolluxClient(url, TOKEN, timeout=2).health()
    assert exc.value.status == 0 and url in str(exc.value)


def test_cluster_usage_errors_exit_2_after_the_commands_usage(service, capsys):
    """docs/cli.md, "Errors and exit statuses": the same form as the simulator's commands."""
    code, out, err = run(capsys, service.args("ls", "--bogus"))
    assert code == 2 and out == ""
    assert err.startswith("usage: pollux ls ")
    assert err.strip().splitlines()[-1] == "pollux ls: error: unrecognized arguments: --bogus"
    code, out, err = run(capsys, service.args("server", "start", "--policy", "optimus"))
    live = ", ".join(repr(n) for n in policy_names(live=True))     # the registry's live policies
    assert code == 2 and out == "" and "optimus" not in live
    assert err.strip().splitlines()[-1] == ("pollux server start: error: argument --policy: invalid choice: "
                                            f"'optimus' (choose from {live})")
    assert not (service.state / "start.lock").exists()           # nothing was started
    with pytest.raises(SystemExit) as exc:                        # --help: argparse prints and exits 0
        main(["server", "start", "--help"])
    assert exc.value.code == 0
    assert f"--policy {{{','.join(policy_names(live=True))}}}" in capsys.readouterr().out


def test_cluster_runtime_errors_exit_1_in_one_line(service, capsys, tmp_path):
    nowhere = tmp_path / "nowhere"
    code, out, err = run(capsys, service.args("submit", "--batch-size", "8", "--working-dir", str(nowhere),
                                              "train.py"))
    assert code == 1 and out == ""
    assert err == f"pollux: error: --working-dir {nowhere}: no such folder\n"
    token = service.state / "admin-token"                        # an unreadable file: an OSError
    token.unlink()
    token.mkdir()
    code, out, err = run(capsys, service.args("ls"))
    assert code == 1 and out == ""
    assert err.startswith("pollux: error: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "usage:" not in err


def test_server_status_summary(service, capsys):
    a = submit(service, capsys)
    submit(service, capsys)
    service.store.transition(a, "starting")
    service.store.transition(a, "running")
    code, out, err = run(capsys, service.args("server", "status"))
    assert code == 0, err
    assert "running, healthy" in out and service.url in out and str(os.getpid()) in out
    assert "2 node(s), 4 GPU slot(s): node-0:2, node-1:2" in out
    assert "policy        pollux, rounds every 30 s, 7 round(s) run" in out
    assert "jobs          1 pending, 1 running" in out
    code, out, _ = run(capsys, service.args("server", "status", "--json"))
    st = json.loads(out)
    assert code == 0 and st["healthy"] is True and st["jobs"] == {"running": 1, "pending": 1}


# ----------------------------------------------------------------------------------------------- client


def test_client_methods_and_errors(service):
    with PolluxClient.from_state_dir(service.state) as client:
        assert client.health() == {"status": "ok"}
        assert client.cluster() == CLUSTER
        job = client.submit({"entrypoint": str(service.work / "train.py"), "init_batch_size": 8}, name="c")
        assert job["token"] and job["name"] == "c"
        assert [j["id"] for j in client.jobs()] == [job["id"]]
        assert client.jobs(["running"]) == []
        assert client.job(job["id"])["transitions"][0]["to_state"] == "pending"
        assert client.logs(job["id"]) == ""
        with pytest.raises(ClientError) as exc:
            client.submit({"entrypoint": str(service.work / "train.py"), "init_batch_size": 0})
        err = exc.value
        assert (err.status, err.field) == (422, "spec.init_batch_size")
        assert str(err) == "422 spec.init_batch_size: must be >= 1, got 0"
        with pytest.raises(ClientError) as exc:
            client.jobs(["bogus"])
        assert exc.value.status == 422 and exc.value.field == "state"
        with pytest.raises(ClientError) as exc:
            client.job("../jobs")                  # quoted into one path segment: an unknown job
        assert exc.value.status == 404
        assert client.cancel(job["id"])["state"] == "cancelled"
    assert str(ClientError(422, "bad value", "spec.x")) == "422 spec.x: bad value"
    assert str(ClientError(404, "unknown job 'j'")) == "404 unknown job 'j'"


def test_cli_state_lists_match_the_store():
    assert cluster_commands.JOB_STATES == JOB_STATES
    assert cluster_commands.TERMINAL_STATES == TERMINAL_STATES


# ------------------------------------------------------------------------------ LB-BSP balance (issue 12)


def test_submit_balance_reaches_the_spec(service, capsys):
    job_id = submit(service, capsys, "--balance", "auto")
    assert service.store.get_job(job_id).spec.balance == "auto"
    plain = submit(service, capsys)
    assert service.store.get_job(plain).spec.balance == "off"           # default: off
    code, out, _ = run(capsys, service.args("describe", "--json", job_id))
    assert code == 0 and json.loads(out)["spec"]["balance"] == "auto"
    code, out, err = run(capsys, service.args("submit", "--balance", "fast", "--batch-size", "8",
                                              "--working-dir", str(service.work), "train.py"))
    assert code == 2 and out == ""
    assert "pollux submit: error: argument --balance: invalid choice: 'fast'" in err


def test_describe_shows_balance_info_only_when_present(service, capsys):
    job_id = submit(service, capsys, "--balance", "gpu", name="lb")
    service.store.put_hints(job_id, make_hints())
    code, out, err = run(capsys, service.args("describe", job_id))
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.split() == ["balance", "gpu"] for line in lines)          # the spec's mode
    assert "stragglers" not in out and "SHARE" not in out                   # no balance in the hints
    balance = {"mode": "gpu", "shares": [40, 20, 4], "step_times": [0.21, 0.2, 0.35],
               "predicted_step_time": 0.205, "stragglers": [2]}
    hints = {**make_hints(), "balance": balance}
    service.store.put_hints(job_id, hints)
    code, out, err = run(capsys, service.args("describe", job_id))
    assert code == 0, err
    hint_part = out.split("\nhints\n", 1)[1]
    assert "gpu, 3 rank(s), 64 examples per step, predicted step 0.205 s" in hint_part
    assert "rank(s) 2 at the minimum share" in hint_part
    rows = [line.split() for line in hint_part.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"])]
    assert rows == [["0", "40", "0.210"], ["1", "20", "0.200"], ["2", "4", "0.350", "straggler"]]
    code, out, _ = run(capsys, service.args("describe", "--json", job_id))
    assert json.loads(out)["hints"]["balance"]["shares"] == [40, 20, 4]
