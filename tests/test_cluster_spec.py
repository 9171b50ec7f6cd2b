"""Tests of job-spec validation (pollux.cluster.state.spec): what issue 10 found accepted that could not run
or that broke the service for everyone: lone surrogates, control characters, huge strings, numbers
out of range, impossible resources, entrypoints that cannot start."""

from __future__ import annotations

import json
import os
import stat

import pytest

from pollux.cluster.state.spec import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    MAX_ARGS_TOTAL_CHARS,
    MAX_BATCH_SIZE,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    MAX_REPLICAS,
    JobSpec,
    SpecError,
    validate_name,
)

BASE = {"entrypoint": "/opt/train.py", "init_batch_size": 64}


def refused(change: dict, field: str) -> SpecError:
    """Assert that BASE updated by ``change`` is refused naming ``field``; the message is printable."""
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({**BASE, **change})
    err = info.value
    assert err.field == field and str(err).startswith(f"{field}: ")
    assert isinstance(err, ValueError)
    str(err).encode("utf-8")  # no lone surrogate in the message: it can be sent as JSON
    assert len(str(err)) < 400  # a 50 MB value is not echoed back
    return err


# ------------------------------------------------------------------------------------ text fields


@pytest.mark.parametrize("change,field", [
    ({"entrypoint": "/tmp/\ud800.py"}, "entrypoint"),
    ({"working_dir": "/tmp/\udfff"}, "working_dir"),
    ({"args": ["ok", "\ud800"]}, "args.1"),
    ({"resources": {"GPU": 1, "x\ud800": 1}}, "resources.x\\ud800"),
])
def test_lone_surrogates_are_refused_naming_the_field(change, field):
    """Item 2: a lone surrogate was stored and then broke every listing (it cannot be UTF-8)."""
    err = refused(change, field)
    assert "surrogate" in str(err)


@pytest.mark.parametrize("change,field", [
    ({"entrypoint": "/tmp/a\x00b.py"}, "entrypoint"),
    ({"entrypoint": "/tmp/train.py\n--evil"}, "entrypoint"),
    ({"entrypoint": "/tmp/\x1b[31mred.py"}, "entrypoint"),
    ({"working_dir": "/tmp/a\x00"}, "working_dir"),
    ({"working_dir": "/tmp/\u202eevil"}, "working_dir"),
    ({"args": ["a", "b", "c", "x\x00y"]}, "args.3"),
    ({"resources": {"GPU": 1, "C\nPU": 2}}, "resources.C\\nPU"),
])
def test_nul_and_control_characters_are_refused(change, field):
    """Item 4: a NUL byte in the entrypoint was accepted (and could never be executed)."""
    assert "control character" in str(refused(change, field))


def test_arguments_may_hold_newlines_and_tabs_and_any_printable_text():
    spec = JobSpec.from_dict({**BASE, "args": ["--text", "two\nlines\tand tab", "训练 ✓", ""]})
    assert spec.args[1] == "two\nlines\tand tab" and spec.args[3] == ""


@pytest.mark.parametrize("change,field", [
    ({"args": ["x" * (50 * 2**20)]}, "args.0"),
    ({"args": ["x"] * (MAX_ARGS + 1)}, "args"),
    ({"args": ["x" * MAX_ARG_CHARS] * (MAX_ARGS_TOTAL_CHARS // MAX_ARG_CHARS + 1)}, "args"),
    ({"entrypoint": "/" + "e" * (50 * 2**20)}, "entrypoint"),
    ({"working_dir": "/" + "w" * MAX_PATH_CHARS}, "working_dir"),
    ({"resources": {"r" * 1000: 1.0}}, "resources." + "r" * 64 + "..."),
    ({"resources": {f"r{i}": 1.0 for i in range(100)}}, "resources"),
])
def test_sizes_are_bounded(change, field):
    """Item 9: a 50 MB name or argument was accepted and grew jobs.db to 159 MB."""
    assert "too" in str(refused(change, field))


def test_largest_allowed_values_are_accepted_and_round_trip():
    data = {**BASE, "entrypoint": "/" + "e" * (MAX_PATH_CHARS - 1), "args": ["a" * MAX_ARG_CHARS] * 4,
            "init_batch_size": MAX_BATCH_SIZE, "max_replicas": MAX_REPLICAS, "min_replicas": MAX_REPLICAS,
            "local_bsz_bounds": [1, MAX_BATCH_SIZE], "resources": {"GPU": 8, "memory": 2.0**53}}
    spec = JobSpec.from_dict(data)
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_unknown_field_with_a_hostile_name_is_named_printably():
    err = refused({"\x1b[2J" + "k" * 100: 1}, ("\\x1b[2J" + "k" * 100)[:64] + "...")
    assert err.detail == "unknown field"


# --------------------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["evil\x1b[31m\nname", "a\rb", "tab\there", "x\x00", "\ud800",
                                  "bidi\u202eevil", "line\u2028sep", "", "   ", "n" * (MAX_NAME_CHARS + 1),
                                  3, None])
def test_bad_names_are_refused(name):
    """Item 10: a name with a newline and ANSI escapes was accepted and broke `pollux ls`."""
    with pytest.raises(SpecError, match=r"^name: ") as info:
        validate_name(name)
    assert info.value.field == "name"
    str(info.value).encode("utf-8")


@pytest.mark.parametrize("name", ["resnet-50", "résumé 训练 ✓", "n" * MAX_NAME_CHARS, "a b_c.d"])
def test_good_names_pass_unchanged(name):
    assert validate_name(name) == name


# ------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("change,field", [
    ({"min_replicas": 1e20}, "min_replicas"),
    ({"min_replicas": 10**30}, "min_replicas"),
    ({"max_replicas": MAX_REPLICAS + 1}, "max_replicas"),
    ({"init_batch_size": 2**40}, "init_batch_size"),
    ({"init_batch_size": float("inf")}, "init_batch_size"),
    ({"init_batch_size": float("nan")}, "init_batch_size"),
    ({"max_batch_size": 1e300}, "max_batch_size"),
    ({"local_bsz_bounds": [1, 1e20]}, "local_bsz_bounds.1"),
    ({"local_bsz_bounds": [True, 4]}, "local_bsz_bounds.0"),
    ({"init_batch_size": True}, "init_batch_size"),
    ({"min_replicas": 2.5}, "min_replicas"),
    ({"init_batch_size": "64"}, "init_batch_size"),
])
def test_integers_are_bounded_and_exact(change, field):
    """Item 3: min_replicas 1e20 was accepted, and then every scheduling round overflowed."""
    refused(change, field)


def test_integral_floats_are_accepted_as_integers():
    spec = JobSpec.from_dict({**BASE, "init_batch_size": 64.0, "min_replicas": 2.0, "max_replicas": 4.0,
                              "local_bsz_bounds": [8.0, None]})
    assert spec.init_batch_size == 64 and isinstance(spec.min_replicas, int) and spec.max_replicas == 4
    assert spec.local_bsz_bounds == (8, None)


@pytest.mark.parametrize("resources,field", [
    ({"GPU": 0}, "resources.GPU"),
    ({"GPU": 1.5}, "resources.GPU"),
    ({"GPU": True}, "resources.GPU"),
    ({"GPU": 10**6}, "resources.GPU"),
    ({"CPU": 0}, "resources.CPU"),
    ({"CPU": -1}, "resources.CPU"),
    ({"CPU": float("inf")}, "resources.CPU"),
    ({"CPU": float("nan")}, "resources.CPU"),
    ({"memory": 1e300}, "resources.memory"),
    ({"custom": 1e-9}, "resources.custom"),
    ({"custom": "1"}, "resources.custom"),
    ({"": 1}, "resources."),
])
def test_resources_are_positive_finite_and_gpus_whole(resources, field):
    """Item 4: resources such as GPU: 0 were accepted (a replica with no GPU slot)."""
    refused({"resources": resources}, field)


def test_resources_default_to_one_gpu_per_replica():
    assert JobSpec.from_dict(BASE).resources == {"GPU": 1.0}
    assert JobSpec.from_dict({**BASE, "resources": {"CPU": 2}}).resources == {"GPU": 1.0, "CPU": 2.0}
    two = {"GPU": 2.0, "c": 0.5}
    assert JobSpec.from_dict({**BASE, "resources": two}).resources == two


def test_working_dir_must_be_absolute():
    refused({"working_dir": "relative/dir"}, "working_dir")


# ---------------------------------------------------------------------------------- feasibility

NODES = [{"GPU": 2.0, "CPU": 16.0, "memory": 64e9}, {"GPU": 2.0, "CPU": 8.0, "memory": 32e9, "ib": 1.0}]


def spec(**change) -> JobSpec:
    return JobSpec.from_dict({**BASE, **change})


@pytest.mark.parametrize("change,field", [
    ({"resources": {"GPU": 3}}, "resources.GPU"),               # --gpus-per-replica 3 on 2-slot nodes
    ({"resources": {"CPU": 1e9}}, "resources.CPU"),
    ({"resources": {"memory": 100e9}}, "resources.memory"),
    ({"resources": {"tpu": 1}}, "resources.tpu"),                # a resource no node has
    ({"resources": {"CPU": 12, "ib": 1}}, "resources"),           # each exists, never together
    ({"min_replicas": 5}, "min_replicas"),                       # 4 GPU slots in all
    ({"min_replicas": 3, "resources": {"GPU": 2}}, "min_replicas"),  # 2 replicas of 2 GPUs at most
    ({"min_replicas": 3, "resources": {"CPU": 9}}, "min_replicas"),  # only node 0 has 9 CPUs
])
def test_check_feasible_refuses_what_no_cluster_of_these_nodes_can_run(change, field):
    """Item 4: `--gpus-per-replica 3` on 2-slot nodes and CPU: 1e9 were accepted, then relaunched in
    a loop; now they are refused at submission."""
    with pytest.raises(SpecError) as info:
        spec(**change).check_feasible(NODES)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize("change", [
    {}, {"min_replicas": 4}, {"resources": {"GPU": 2}, "min_replicas": 2},
    {"resources": {"CPU": 8, "ib": 1}, "min_replicas": 1}, {"resources": {"CPU": 0.5, "memory": 1e9}},
])
def test_check_feasible_accepts_what_fits(change):
    spec(**change).check_feasible(NODES)


def test_check_feasible_without_nodes_checks_nothing():
    spec(resources={"GPU": 64}, min_replicas=MAX_REPLICAS).check_feasible([])


# ---------------------------------------------------------------------------------------- files


@pytest.fixture
def work(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    run = tmp_path / "run.sh"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho hi\n")
    plain.chmod(0o644)
    (tmp_path / "folder.py").mkdir()
    return tmp_path


@pytest.mark.parametrize("entry,working_dir,message", [
    ("{w}/plain.sh", None, "not executable"),
    ("plain.sh", "{w}", "command not found.*write ./plain.sh"),
    ("./plain.sh", "{w}", "not executable"),
    ("{w}/missing.py", None, "no such file"),
    ("missing.py", "{w}", "no such file"),
    ("{w}/folder.py", None, "is a directory"),
    ("{w}", None, "is a directory"),
    ("no-such-command-pollux-test", None, "command not found"),
    ("/dev/null", None, "not a regular file"),
])
def test_check_files_refuses_entrypoints_that_cannot_start(work, entry, working_dir, message):
    """Item 4: a non-executable, missing or directory entrypoint was accepted and then relaunched in
    a tight loop."""
    s = spec(entrypoint=entry.format(w=work),
             working_dir=None if working_dir is None else working_dir.format(w=work))
    with pytest.raises(SpecError, match=f"^entrypoint: .*{message}") as info:
        s.check_files()
    assert info.value.field == "entrypoint"


@pytest.mark.parametrize("working_dir,message", [("{w}/nope", "no such file or directory"),
                                                 ("{w}/train.py", "not a directory")])
def test_check_files_refuses_a_missing_working_dir(work, working_dir, message):
    s = spec(entrypoint="train.py", working_dir=working_dir.format(w=work))
    with pytest.raises(SpecError, match=f"^working_dir: .*{message}"):
        s.check_files()


def test_check_files_refuses_nul_even_in_a_spec_built_in_code(work):
    with pytest.raises(SpecError, match=r"^entrypoint: contains a control character"):
        JobSpec(entrypoint=f"{work}/train.py\x00x", init_batch_size=1).check_files()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_check_files_refuses_an_unreadable_script(work):
    (work / "train.py").chmod(0)
    try:
        with pytest.raises(SpecError, match="not readable"):
            spec(entrypoint=str(work / "train.py")).check_files()
    finally:
        (work / "train.py").chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_check_files_accepts_what_can_start(work, monkeypatch):
    spec(entrypoint="train.py", working_dir=str(work)).check_files()   # relative to working_dir
    spec(entrypoint="./run.sh", working_dir=str(work)).check_files()
    spec(entrypoint=str(work / "run.sh")).check_files()
    spec(entrypoint="sh", working_dir=str(work)).check_files()          # a command on the PATH
    monkeypatch.chdir(work)                                             # no working_dir: the cwd
    spec(entrypoint="train.py").check_files()
    with pytest.raises(SpecError):
        spec(entrypoint="train.py", working_dir="/").check_files()


# ------------------------------------------------------------------------------- stored specs


@pytest.mark.parametrize("text", [
    "not json", "[" * 100_000, "null", "[]", '"x"', "{}", json.dumps({"entrypoint": "\ud800"}),
    json.dumps({**BASE, "min_replicas": 1e20, "colour": "red", "resources": {"GPU": 0}}),
    json.dumps({**BASE, "max_batch_size": 1, "local_bsz_bounds": [9, 1], "max_replicas": 0}), None, 42,
])
def test_from_stored_never_raises_and_gives_a_printable_spec(text):
    got, error = JobSpec.from_stored(text)
    assert isinstance(got, JobSpec) and isinstance(error, str) and error
    json.dumps(got.to_dict(), ensure_ascii=False).encode("utf-8")
    assert JobSpec.from_dict(got.to_dict()) == got


def test_from_stored_keeps_the_fields_that_still_validate():
    text = json.dumps({**BASE, "args": ["--x"], "min_replicas": 1e20, "resources": {"GPU": 0}})
    got, error = JobSpec.from_stored(text)
    assert error.startswith("min_replicas:")
    assert got.entrypoint == BASE["entrypoint"] and got.args == ("--x",) and got.min_replicas == 0
    assert got.resources == {"GPU": 1.0}
    assert JobSpec.from_stored(json.dumps(BASE)) == (JobSpec.from_dict(BASE), None)
    got, error = JobSpec.from_stored(json.dumps({"init_batch_size": 8, "args": ["a"], "x.y": 1}))
    assert error == "x.y: unknown field"  # the first problem; the missing entrypoint comes next
    assert (got.entrypoint, got.init_batch_size, got.args) == ("<invalid>", 8, ("a",))


@pytest.mark.parametrize("args", [0, False, "", {}])
def test_falsy_args_that_are_not_a_list_are_refused(args):
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({**BASE, "args": args})
    assert err.value.field == "args"


# ------------------------------------------------------------------------------ balance (issue 12)


def test_balance_defaults_to_off_and_accepts_the_contract_modes():
    from pollux.contract import BALANCE_MODES

    base = {"entrypoint": "t.py", "init_batch_size": 8}
    assert JobSpec.from_dict(base).balance == "off"
    assert JobSpec.from_dict({**base, "balance": None}).balance == "off"
    for mode in BALANCE_MODES:
        spec = JobSpec.from_dict({**base, "balance": mode})
        assert spec.balance == mode and spec.to_dict()["balance"] == mode
        assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize("value", ["fast", "AUTO", "", 1, True, ["gpu"]])
def test_bad_balance_is_refused_naming_the_field(value):
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"entrypoint": "t.py", "init_batch_size": 8, "balance": value})
    assert info.value.field == "balance"
    assert str(info.value).startswith("balance: expected one of auto, gpu, cpu, off")


def test_stored_spec_with_a_bad_balance_keeps_the_rest():
    spec, problem = JobSpec.from_stored(json.dumps({"entrypoint": "t.py", "init_batch_size": 8,
                                                    "balance": "turbo"}))
    assert problem is not None and problem.startswith("balance:")
    assert spec.balance == "off" and spec.init_batch_size == 8
