"""A job's own environment variables (``spec.env``): checked on submission, given to every replica,
and never able to override what the service sets (``POLLUX_*``, ``RAY_*``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pollux.cluster.backends.launcher import build_launches
from pollux.cluster.state.spec import MAX_ENV_VARS, JobSpec, SpecError

BASE = {"entrypoint": "train.py", "init_batch_size": 8}


def test_env_defaults_to_empty_and_round_trips():
    assert JobSpec.from_dict(BASE).env == {}
    spec = JobSpec.from_dict({**BASE, "env": {"LR": "0.01", "_X1": "", "PATH_EXTRA": "a b\tc"}})
    assert spec.env == {"LR": "0.01", "_X1": "", "PATH_EXTRA": "a b\tc"}
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert JobSpec.from_dict({**BASE, "env": None}).env == {}


@pytest.mark.parametrize(("env", "field"), [
    ("LR=1", "env"),
    (["LR"], "env"),
    ({"1LR": "1"}, "env.1LR"),
    ({"L-R": "1"}, "env.L-R"),
    ({"": "1"}, "env."),
    ({"LR": 1}, "env.LR"),
    ({"LR": None}, "env.LR"),
    ({"LR": "a\x00b"}, "env.LR"),
    ({"POLLUX_JOB_ID": "x"}, "env.POLLUX_JOB_ID"),
    ({"RAY_ADDRESS": "x"}, "env.RAY_ADDRESS"),
    ({"X" * 129: "1"}, "env." + "X" * 129),
])
def test_bad_env_is_refused_naming_the_variable(env, field):
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({**BASE, "env": env})
    assert err.value.field.startswith(field[:60]), err.value


def test_too_many_variables_are_refused():
    with pytest.raises(SpecError, match=r"^env: too many variables"):
        JobSpec.from_dict({**BASE, "env": {f"V{i}": "1" for i in range(MAX_ENV_VARS + 1)}})


def test_every_replica_gets_the_env_and_the_service_variables_win(tmp_path: Path):
    spec = JobSpec.from_dict({**BASE, "env": {"LR": "0.01", "WIDTH": "2"}})
    base_env = {"POLLUX_JOB_ID": "job-1", "HOME": "/home/me"}
    launches = build_launches(spec, {"node-0": 1, "node-1": 1}, command=["python", "train.py"],
                              base_env=base_env, log_root=tmp_path)
    assert len(launches) == 2
    for launch in launches:
        assert launch.env["LR"] == "0.01" and launch.env["WIDTH"] == "2"
        assert launch.env["POLLUX_JOB_ID"] == "job-1"
    # A spec built in code (not through from_dict) cannot override the service's variables either.
    sneaky = JobSpec("train.py", 8, env={"POLLUX_JOB_ID": "other", "LR": "1"})
    (launch,) = build_launches(sneaky, {"node-0": 1}, command=["python", "train.py"], base_env=base_env,
                               log_root=tmp_path)
    assert launch.env["POLLUX_JOB_ID"] == "job-1" and launch.env["LR"] == "1"


def test_an_elastic_jobs_master_gets_the_env_too(tmp_path: Path):
    spec = JobSpec.from_dict({**BASE, "kind": "elastic", "env": {"LR": "0.5"}})
    (master,) = build_launches(spec, {"node-0": 2}, command=["python", "train.py"],
                               base_env={"POLLUX_JOB_ID": "job-2"}, log_root=tmp_path)
    assert master.env["LR"] == "0.5" and master.env["POLLUX_JOB_ID"] == "job-2"


def test_submit_env_option_splits_at_the_first_equals_and_names_itself_when_bad():
    from pollux.cli.cluster_commands import env_of
    from pollux.cli.errors import CliError

    assert env_of(["LR=0.01", "EXPR=a=b", "EMPTY="]) == {"LR": "0.01", "EXPR": "a=b", "EMPTY": ""}
    for bad in ("LR", "=1"):
        with pytest.raises(CliError, match=r"^--env: expected NAME=VALUE"):
            env_of([bad])
