"""Pieces of the live service's launcher and Ray backend that need no Ray: replica environments,
process trees, how allocations form replicas, what fits where, and the state folder for run-as."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pollux.cluster.backends import launcher as lch
from pollux.cluster.backends.ray_backend import NodeInfo, replica_environment
from pollux.cluster.state.spec import JobSpec


def test_replica_environment_drops_service_secrets_keeps_the_rest_and_sets_the_user():
    inherited = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root",
                 "USER": "root", "SUDO_USER": "admin", "RAY_AUTH_TOKEN": "r", "RAY_ADDRESS": "x:1",
                 "POLLUX_ADMIN_TOKEN": "a", "POLLUX_STATE_DIR": "/srv/pollux", "GITHUB_TOKEN": "g",
                 "AWS_SECRET_ACCESS_KEY": "s", "DB_PASSWORD": "p", "OPENAI_API_KEY": "k",
                 "POLLUX_JOB_TOKEN": "an-old-one"}
    job = {"POLLUX_JOB_ID": "j", "POLLUX_JOB_TOKEN": "fresh"}
    env = replica_environment(inherited, job)
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root",
                   "USER": "root", "SUDO_USER": "admin", "POLLUX_JOB_ID": "j", "POLLUX_JOB_TOKEN": "fresh"}
    nobody = pwd.struct_passwd(("nobody", "x", 65534, 65534, "", "/nonexistent", "/usr/sbin/nologin"))
    env = replica_environment(inherited, job, nobody)
    assert env["HOME"] == "/nonexistent" and env["USER"] == env["LOGNAME"] == "nobody"
    assert "SUDO_USER" not in env and env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_gpus_per_replica_group_slots_and_an_allocation_forming_none_is_refused(tmp_path):
    spec = JobSpec.from_dict({"entrypoint": "train.py", "init_batch_size": 8, "resources": {"GPU": 2}})
    assert lch.gpus_per_replica(spec) == 2
    assert lch.rank_nodes({"b": 2, "a": 5}, 2) == ["a", "a", "b"]          # 5 slots on a: 2 replicas
    launches = lch.build_launches(spec, {"a": 4, "b": 3}, command=["x"], base_env={"K": "v"},
                                  log_root=tmp_path, user="nobody")
    assert [(s.rank, s.node, s.env["POLLUX_NODE_RANK"]) for s in launches] == [(0, "a", "0"), (1, "a", "0"),
                                                                               (2, "b", "1")]
    assert all(s.env["POLLUX_NUM_REPLICAS"] == "3" and s.env["POLLUX_NUM_NODES"] == "2" for s in launches)
    assert all(s.user == "nobody" and s.resources == {"GPU": 2.0} for s in launches)
    with pytest.raises(lch.LaunchError, match="forms no replica: each replica needs 2 GPU slots"):
        lch.build_launches(spec, {"a": 1, "b": 1}, command=["x"], base_env={}, log_root=tmp_path)
    one = JobSpec.from_dict({"entrypoint": "train.py", "init_batch_size": 8})
    assert lch.rank_nodes({"a": 2, "b": 1}, lch.gpus_per_replica(one)) == ["a", "a", "b"]


def test_never_fits_and_busy_reason_compare_with_node_totals_and_held_runs():
    nodes = {"a": NodeInfo("a", "id-a", "127.0.0.1", 2, {"GPU": 2.0, "CPU": 4.0}),
             "b": NodeInfo("b", "id-b", "127.0.0.1", 2, {"GPU": 2.0})}
    cpu = lch.usage_of({"a": 1}, [("a", {"GPU": 1.0, "CPU": 3.0})])
    assert cpu == {"a": {"GPU": 1.0, "CPU": 3.0}}
    assert lch.never_fits(cpu, nodes) is None
    assert "node b has 0 CPU in total" in lch.never_fits(lch.usage_of({"b": 1}, [("b", {"CPU": 1.0})]), nodes)
    assert "not an alive node" in lch.never_fits({"c": {"GPU": 1.0}}, nodes)
    assert lch.busy_reason(cpu, [{"a": {"GPU": 1.0}}], nodes) is None
    assert "2 of 2 GPU still held" in lch.busy_reason(cpu, [{"a": {"GPU": 2.0}}], nodes)
    assert "CPU still held" in lch.busy_reason(cpu, [{"a": {"GPU": 0.0, "CPU": 2.0}}], nodes)


def test_backoff_doubles_up_to_its_cap():
    assert [lch.backoff_s(n, 1.0, 5.0) for n in (1, 2, 3, 4, 50)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert lch.backoff_s(3, 0.0, 5.0) == 0.0


SUBREAPER = r"""
import ctypes, json, os, subprocess, sys, time
from pollux.cluster.backends.processes import descendants, kill_tree
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
main = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & setsid sleep 301 & (sleep 302 &) ; exit 0"],
                        start_new_session=True)
main.wait()
time.sleep(0.3)
orphans = descendants(os.getpid())          # re-parented to this subreaper
found = kill_tree(main.pid)
left = [p for p in orphans if os.path.exists(f"/proc/{p}")]
print(json.dumps({"orphans": len(orphans), "found": found, "left": left, "now": descendants(os.getpid())}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only (prctl, /proc)")
def test_kill_tree_kills_and_reaps_every_orphan_of_a_subreaper():
    out = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["orphans"] == 3 and res["found"] == 3 and res["left"] == [] and res["now"] == []


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another user)")


@needs_root
def test_checkpoint_folder_is_handed_to_the_user_without_following_links(tmp_path):
    nobody = pwd.getpwnam("nobody")
    ckpt = tmp_path / "checkpoints" / "job-1"
    ckpt.mkdir(parents=True)
    (ckpt / "old").write_text("from a run as root")
    target = tmp_path / "precious"
    target.write_text("root's")
    (ckpt / "link").symlink_to(target)
    lch.prepare_checkpoint_dir(ckpt, "nobody")
    assert ckpt.stat().st_uid == nobody.pw_uid and stat.S_IMODE(ckpt.stat().st_mode) == 0o700
    assert (ckpt / "old").stat().st_uid == nobody.pw_uid
    assert target.stat().st_uid == 0                             # the link itself changed, not its target
    fresh = tmp_path / "checkpoints" / "job-2"
    lch.prepare_checkpoint_dir(fresh, None)
    assert fresh.is_dir() and fresh.stat().st_uid == 0


@needs_root
def test_prepare_run_as_closes_the_state_folder_and_refuses_an_unreachable_one():
    base = Path(tempfile.mkdtemp(prefix="pollux-runas-"))     # /tmp/pollux-runas-*: mode 0700
    try:
        state = base / "state"
        state.mkdir()
        (state / "jobs.db").write_text("")
        (state / "jobs.db").chmod(0o644)
        with pytest.raises(ValueError, match=r"run_as: user 'nobody' cannot reach .* is not searchable"):
            lch.prepare_run_as(state, "nobody")
        base.chmod(0o755)
        lch.prepare_run_as(state, "nobody")
        assert stat.S_IMODE(state.stat().st_mode) == 0o711
        assert stat.S_IMODE((state / "checkpoints").stat().st_mode) == 0o711
        assert stat.S_IMODE((state / "logs").stat().st_mode) == 0o700
        assert stat.S_IMODE((state / "jobs.db").stat().st_mode) == 0o600
        with pytest.raises(ValueError, match="run_as: no such user"):
            lch.prepare_run_as(state, "no-such-user-here")
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)
