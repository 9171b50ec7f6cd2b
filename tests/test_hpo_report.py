"""Inside a trial: ``pollux.hpo.report`` and ``pollux.hpo.params``, the trial's environment and the
storage URL (``pollux.hpo.trial_report``, ``trial_env``, ``storage``), on a real SQLite study."""

from __future__ import annotations

import json
import logging

import optuna
import pytest
from optuna.trial import TrialState

import pollux.hpo
from pollux.hpo import attrs
from pollux.hpo.storage import open_storage, storage_url
from pollux.hpo.study import trial_id
from pollux.hpo.trial_env import param_variable, read_identity, read_params, trial_env
from pollux.hpo.trial_report import Reporter


@pytest.fixture
def study_trial(tmp_path):
    """A study in an SQLite file with one RUNNING trial: (study, url, the trial's environment)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(tmp_path / "s.db")
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1.0, log=True)})
    env = trial_env(trial.params, storage_url=url, trial_id=trial_id(storage, study, trial.number),
                    number=trial.number, study="s")
    return study, url, env


def test_report_writes_intermediate_values_and_the_last_report(study_trial):
    study, _, env = study_trial
    reporter = Reporter({**env, "POLLUX_RANK": "0"})
    assert reporter.report(0.5, 0)
    assert reporter.report(0.7, 1)
    assert reporter.report(0.6, 0)             # a restarted job reports a step again: last in time wins
    (trial,) = study.get_trials()
    assert trial.intermediate_values == {0: 0.6, 1: 0.7}
    assert trial.user_attrs[attrs.LAST_VALUE] == 0.6 and trial.user_attrs[attrs.LAST_STEP] == 0


def test_only_rank_zero_reports(study_trial):
    study, _, env = study_trial
    assert not Reporter({**env, "POLLUX_RANK": "1"}).report(0.5, 0)
    assert not Reporter({**env, "RANK": "2"}).report(0.5, 0)             # torchrun's rank
    assert Reporter({**env, "RANK": "0"}).report(0.5, 3)
    assert study.get_trials()[0].intermediate_values == {3: 0.5}


def test_a_report_after_the_trial_finished_is_dropped_with_one_warning(study_trial, caplog):
    study, _, env = study_trial
    study.tell(0, state=TrialState.PRUNED)
    reporter = Reporter(env)
    with caplog.at_level(logging.WARNING, logger="pollux.hpo"):
        assert not reporter.report(0.5, 4)
        assert not reporter.report(0.5, 5)
    assert [r.getMessage() for r in caplog.records] == [
        f"pollux.hpo.report: trial {env['HPO_TRIAL_ID']} has already finished (pruned?); step 4 and later "
        "are not recorded"]


def test_alone_it_warns_once_and_params_are_the_defaults(caplog):
    reporter = Reporter({})
    with caplog.at_level(logging.WARNING, logger="pollux.hpo"):
        assert not reporter.report(0.9, 0)
        assert not reporter.report(0.9, 1)
    assert len(caplog.records) == 1 and "not running as a trial" in caplog.records[0].getMessage()
    defaults = {"lr": 0.02}
    got = reporter.params(defaults)
    assert got == defaults and got is not defaults
    assert reporter.params() == {}


def test_the_module_functions_use_the_process_environment(study_trial, monkeypatch):
    study, _, env = study_trial
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(pollux.hpo.trial_report, "REPORTER", Reporter())
    lr = study.get_trials()[0].params["lr"]
    assert pollux.hpo.params({"lr": 0.02, "width": 1}) == {"lr": lr, "width": 1}
    assert pollux.hpo.report(0.25, 2)
    assert study.get_trials()[0].intermediate_values == {2: 0.25}


@pytest.mark.parametrize(("value", "step", "error"), [
    (float("nan"), 0, ValueError), (float("inf"), 0, ValueError), ("high", 0, TypeError),
    (0.5, -1, ValueError), (0.5, 1.5, ValueError), (0.5, True, ValueError),
])
def test_bad_values_and_steps_are_refused(value, step, error):
    with pytest.raises(error):
        Reporter({}).report(value, step)


def test_a_number_like_value_is_taken():
    class Scalar:                          # a 0-d tensor, a numpy scalar
        def __float__(self) -> float:
            return 0.75

    assert not Reporter({}).report(Scalar(), 0)   # taken (alone: not recorded), not refused


class FlakyStorage:
    """Fails its first ``failures`` writes, then records them."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[tuple[str, object]] = []

    def set_trial_intermediate_value(self, trial_id: int, step: int, value: float) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("database is locked")
        self.written.append(("value", (step, value)))

    def set_trial_user_attr(self, trial_id: int, key: str, value: object) -> None:
        self.written.append((key, value))


def test_a_failing_storage_is_retried_then_the_error_is_raised(monkeypatch):
    env = {"HPO_STORAGE": "sqlite:////nowhere.db", "HPO_TRIAL_ID": "3"}
    pauses: list[float] = []
    storage = FlakyStorage(failures=2)
    reporter = Reporter(env, pause=pauses.append)
    monkeypatch.setattr(reporter, "_open", lambda identity: storage)
    assert reporter.report(0.5, 1)
    assert pauses == [0.5, 1.0]
    assert storage.written[0] == ("value", (1, 0.5))
    always = FlakyStorage(failures=99)
    reporter = Reporter(env, pause=pauses.append)
    monkeypatch.setattr(reporter, "_open", lambda identity: always)
    with pytest.raises(RuntimeError, match="database is locked"):
        reporter.report(0.5, 1)


def test_trial_env_round_trip():
    env = trial_env({"lr": 0.012345678901234, "width": 2, "opt": "sgd"}, storage_url="sqlite:////x.db",
                    trial_id=7, number=3, study="digits")
    assert env["HPO_LR"] == "0.012345678901234" and env["HPO_WIDTH"] == "2" and env["HPO_OPT"] == "sgd"
    assert json.loads(env["HPO_PARAMS"]) == {"lr": 0.012345678901234, "width": 2, "opt": "sgd"}
    assert env["HPO_TRIAL_NUMBER"] == "3" and env["HPO_STUDY"] == "digits"
    identity = read_identity(env)
    assert identity is not None and identity.trial_id == 7 and identity.storage_url == "sqlite:////x.db"
    assert read_params(env) == {"lr": 0.012345678901234, "width": 2, "opt": "sgd"}
    assert param_variable("weight_decay") == "HPO_WEIGHT_DECAY"
    assert all(not name.startswith("POLLUX_") for name in env)


@pytest.mark.parametrize(("env", "message"), [
    ({"HPO_TRIAL_ID": "1"}, "HPO_STORAGE is not set"),
    ({"HPO_STORAGE": "sqlite:////x.db"}, "HPO_TRIAL_ID is not set"),
    ({"HPO_STORAGE": "sqlite:////x.db", "HPO_TRIAL_ID": "one"}, "HPO_TRIAL_ID: expected an integer"),
])
def test_a_half_set_identity_is_an_error(env, message):
    with pytest.raises(ValueError, match=message):
        read_identity(env)


def test_malformed_params_are_an_error():
    with pytest.raises(ValueError, match="HPO_PARAMS: not valid JSON"):
        read_params({"HPO_PARAMS": "{"})
    with pytest.raises(ValueError, match="HPO_PARAMS: expected a JSON object"):
        read_params({"HPO_PARAMS": "[1]"})


def test_storage_urls_are_made_absolute(tmp_path):
    assert storage_url("study.db", cwd=tmp_path) == f"sqlite:///{tmp_path}/study.db"
    assert storage_url("sqlite:///rel/s.db", cwd=tmp_path) == f"sqlite:///{tmp_path}/rel/s.db"
    assert storage_url("sqlite:////abs/s.db", cwd=tmp_path) == "sqlite:////abs/s.db"
    assert storage_url("postgresql://u:p@db/hpo", cwd=tmp_path) == "postgresql://u:p@db/hpo"
