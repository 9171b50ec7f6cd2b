"""``pollux user add|list|revoke`` and ``--token`` / ``POLLUX_TOKEN``: the CLI as a team uses it, against
a real server on loopback over a real store."""

from __future__ import annotations

import json

import pytest

from api_helpers import serve_on_loopback, write_state
from pollux.cli import main
from pollux.cluster.api.app import create_app
from pollux.cluster.state.store import JobStore

ADMIN = "cli-users-admin-token"


@pytest.fixture
def state(tmp_path):
    with JobStore(tmp_path / "jobs.db") as store:
        with serve_on_loopback(create_app(store, ADMIN)) as url:
            folder = tmp_path / "state"
            write_state(folder, url, ADMIN)
            work = tmp_path / "work"
            work.mkdir()
            (work / "train.py").write_text("print('hello')\n")
            yield folder, work


def pollux(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_users_are_added_listed_used_and_revoked_from_the_cli(state, capsys, monkeypatch):
    folder, work = state
    at = ("--state-dir", str(folder))
    code, out, err = pollux(capsys, "user", "add", *at, "--json", "alice")
    assert code == 0, err
    alice = json.loads(out)
    assert set(alice) == {"name", "token"} and alice["name"] == "alice" and len(alice["token"]) > 20
    code, out, _ = pollux(capsys, "user", "add", *at, "bob")
    bob_token = out.strip().splitlines()[-1]
    assert code == 0 and "shown only now" in out

    code, out, err = pollux(capsys, "submit", *at, "--token", alice["token"], "--json", "--batch-size", "64",
                            "--working-dir", str(work), "train.py")
    assert code == 0, err
    job = json.loads(out)["id"]
    code, out, _ = pollux(capsys, "ls", *at, "--token", alice["token"], "--json")
    assert [j["id"] for j in json.loads(out)] == [job]

    monkeypatch.setenv("POLLUX_TOKEN", bob_token)                  # bob, from the environment
    code, out, _ = pollux(capsys, "ls", *at, "--json")
    assert code == 0 and json.loads(out) == []
    code, out, err = pollux(capsys, "describe", *at, job)
    assert code == 1 and out == "" and "404" in err and "unknown job" in err
    code, out, err = pollux(capsys, "user", "list", *at)
    assert code == 1 and "403" in err                               # users are the admin's business
    monkeypatch.delenv("POLLUX_TOKEN")

    code, out, _ = pollux(capsys, "user", "list", *at, "--json")       # the admin, from the folder
    assert [u["name"] for u in json.loads(out)] == ["alice", "bob"]
    code, out, _ = pollux(capsys, "user", "revoke", *at, "alice")
    assert code == 0 and "revoked" in out
    code, out, err = pollux(capsys, "ls", *at, "--token", alice["token"])
    assert code == 1 and err.strip() == "pollux: error: 401 invalid token"
    code, out, _ = pollux(capsys, "ls", *at, "--json")
    assert [j["id"] for j in json.loads(out)] == [job]               # the admin still sees the job


def test_a_bad_user_name_is_refused_naming_the_field(state, capsys):
    folder, _ = state
    code, out, err = pollux(capsys, "user", "add", "--state-dir", str(folder), "Not OK")
    assert code == 1 and out == "" and "422" in err and "name" in err


def test_a_token_drawn_with_a_leading_dash_is_drawn_again_so_the_cli_takes_it(state, capsys, monkeypatch):
    """``secrets.token_urlsafe`` starts one token in 64 with ``-``, which ``argparse`` reads as an
    option after ``--token``: such a draw is thrown away (:mod:`pollux.cluster.state.tokens`)."""
    import pollux.cluster.state.tokens as tokens

    draws = iter(["-" + "a" * 42, "-" + "b" * 42, "c" * 43])
    monkeypatch.setattr(tokens.secrets, "token_urlsafe", lambda n: next(draws))
    folder, _ = state
    at = ("--state-dir", str(folder))
    code, out, err = pollux(capsys, "user", "add", *at, "--json", "carol")
    assert code == 0, err
    token = json.loads(out)["token"]
    assert token == "c" * 43
    code, out, err = pollux(capsys, "ls", *at, "--token", token, "--json")
    assert code == 0, err
