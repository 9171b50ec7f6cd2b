"""The search-space file of ``pollux hpo run`` (``pollux.hpo.space``): distributions, flags, and an
error naming the file and the parameter for every bad entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from pollux.hpo.space import SpaceError, load_space, parse_space

ROOT = Path(__file__).resolve().parents[1]


def test_the_digits_space_file_has_the_four_parameters_as_flags():
    space = load_space(ROOT / "examples" / "digits" / "space.yaml")
    dists = space.distributions()
    assert list(dists) == ["lr", "momentum", "weight_decay", "width"]
    assert dists["lr"] == FloatDistribution(1e-3, 0.3, log=True)
    assert dists["momentum"] == FloatDistribution(0.5, 0.99)
    assert dists["weight_decay"] == FloatDistribution(1e-6, 1e-2, log=True)
    assert dists["width"] == IntDistribution(1, 4)
    args = space.args_of({"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "width": 2})
    assert args == ["--lr", "0.1", "--momentum", "0.9", "--weight-decay", "0.0001", "--width", "2"]


def test_types_steps_and_choices():
    space = parse_space({
        "lr": {"type": "float", "low": "1e-3", "high": 1, "step": None},   # PyYAML's 1e-3 is a string
        "layers": {"type": "int", "low": 2, "high": 8, "step": 2},
        "opt": {"type": "categorical", "choices": ["sgd", "adam", None, True, 3]},
    }, "s.yaml")
    d = space.distributions()
    assert d["lr"] == FloatDistribution(1e-3, 1.0)
    assert d["layers"] == IntDistribution(2, 8, step=2)
    assert d["opt"] == CategoricalDistribution(["sgd", "adam", None, True, 3])
    assert space.args_of({"lr": 0.5}) == []                    # environment only without args or flag


def test_flags_per_parameter_and_args_true_with_an_exception():
    space = parse_space({"args": True,
                         "lr": {"type": "float", "low": 0.1, "high": 1, "flag": "--learning-rate"},
                         "batch_norm": {"type": "categorical", "choices": [True, False]},
                         "secret": {"type": "int", "low": 0, "high": 3, "flag": False}}, "s.yaml")
    assert space.args_of({"lr": 0.25, "batch_norm": True, "secret": 1}) == [
        "--learning-rate", "0.25", "--batch-norm", "True"]
    only = parse_space({"lr": {"type": "float", "low": 0.1, "high": 1, "flag": True},
                        "wd": {"type": "float", "low": 0.1, "high": 1}}, "s.yaml")
    assert only.args_of({"lr": 1.0, "wd": 0.5}) == ["--lr", "1.0"]


@pytest.mark.parametrize(("data", "message"), [
    (None, "s.yaml: expected a mapping of parameter names to their ranges, got an empty file"),
    ([1, 2], "s.yaml: expected a mapping"),
    ({"args": True}, "s.yaml: no parameters"),
    ({"args": "yes", "lr": {"type": "float", "low": 0, "high": 1}}, "s.yaml: args: expected true or false"),
    ({"lr": {"type": "double", "low": 0, "high": 1}}, "s.yaml: parameter 'lr': type: expected one of float"),
    ({"lr": {"type": "float", "high": 1}}, "s.yaml: parameter 'lr': low: missing"),
    ({"lr": {"type": "float", "low": 2, "high": 1}}, "s.yaml: parameter 'lr': "),
    ({"lr": {"type": "float", "low": 0, "high": 1, "log": True}}, "s.yaml: parameter 'lr': "),
    ({"lr": {"type": "float", "low": "x", "high": 1}}, "s.yaml: parameter 'lr': low: expected a number"),
    ({"lr": {"type": "float", "low": 0, "high": float("inf")}}, "parameter 'lr': high: expected a finite"),
    ({"lr": {"type": "float", "low": 0, "high": 1, "lgo": True}}, "parameter 'lr': unknown key(s) lgo"),
    ({"n": {"type": "int", "low": 0.5, "high": 3}}, "s.yaml: parameter 'n': low: expected an integer"),
    ({"n": {"type": "int", "low": True, "high": 3}}, "parameter 'n': low: expected a number"),
    ({"c": {"type": "categorical", "choices": []}}, "parameter 'c': choices: expected a non-empty list"),
    ({"c": {"type": "categorical", "choices": [[1]]}}, "parameter 'c': choices: expected numbers"),
    ({"my-lr": {"type": "float", "low": 0, "high": 1}}, "parameter 'my-lr': expected a name"),
    ({"params": {"type": "float", "low": 0, "high": 1}}, "HPO_PARAMS is one of the trial's own variables"),
    ({"lr": {"type": "float", "low": 0, "high": 1}, "LR": {"type": "float", "low": 0, "high": 1}},
     "parameter 'LR': clashes with 'lr'"),
    ({"lr": "0.1"}, "parameter 'lr': expected a mapping"),
    ({"lr": {"type": "float", "low": 0, "high": 1, "flag": "lr"}}, "parameter 'lr': flag: expected a flag"),
    ({"a": {"type": "float", "low": 0, "high": 1, "flag": "--x"},
      "b": {"type": "float", "low": 0, "high": 1, "flag": "--x"}}, "parameter 'b': flag --x is also 'a'"),
])
def test_bad_spaces_name_the_file_and_the_parameter(data, message):
    with pytest.raises(SpaceError) as info:
        parse_space(data, "s.yaml")
    assert message in str(info.value)


def test_bad_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: {type: float, low: 0\n")
    with pytest.raises(SpaceError, match=r"bad\.yaml: not valid YAML"):
        load_space(bad)
    with pytest.raises(SpaceError, match=r"missing\.yaml: cannot read the search space"):
        load_space(tmp_path / "missing.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpaceError, match=r"bin\.yaml: not a text file"):
        load_space(binary)
