"""Terminal output of `pollux` (issue 35): rich's tables, progress bars and status lines on a terminal,
plain text everywhere else, and `--json` untouched.

A "terminal" here is a string stream that says it is one (``isatty``), which is all `pollux` and rich
look at; nothing needs a real terminal, a service or Ray, and every test takes well under a second
or two.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path

import pytest

from pollux.cli import cluster_commands, main
from pollux.cli.formatting import describe_text, table
from pollux.cli.terminal import ProgressBar, StatusLine, is_terminal, render_table
from pollux.sim.table import render_rows

#: Characters of rich's boxes (HEAVY_HEAD: heavy header, light body) and the start of an SGR code.
BOX = set("┏━┳┓┃┡╇┩│└─┴┘")
SGR = "\x1b["

#: `pollux scar experiment --json --trials 5 --quiet`, saved before rich drew anything (issue 35), at
#: the plain MLR defaults of issue 39 (standardised features) and with their `perturbation_mean`.
SCAR_JSON_BEFORE = {"model": "mlr", "layout": "rows", "recovery": "partial", "strategy": "full",
                    "fraction": 1.0, "lost_fraction": 0.5, "trials": 5, "seed": 0, "mean": 4.4,
                    "ci95": 5.4548, "unconverged": 0, "perturbation_mean": 1.511348,
                    "baseline_iterations": 80, "threshold": 0.07151518047569441}


class FakeTerminal(io.StringIO):
    """A text stream that says it is a terminal, as a person's would."""

    def isatty(self) -> bool:
        return True


def plain(text: str) -> str:
    """``text`` without SGR colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# ----------------------------------------------------------------------------------------------- tables


def test_a_table_on_a_terminal_has_boxes_and_colour_and_in_a_pipe_is_plain():
    headers = ["ID", "NAME", "GPUS"]
    rows = [["job-1", "resnet-50", 3], ["job-22", "a\x1b[31mb", 12]]
    piped = table(headers, rows, right=(2,))
    assert piped.splitlines() == ["ID      NAME        GPUS",
                                  "job-1   resnet-50      3",
                                  "job-22  a\\x1b[31mb    12"]
    assert not BOX & set(piped) and SGR not in piped
    shown = table(headers, rows, right=(2,), terminal=True)
    assert BOX & set(shown) and SGR in shown
    assert "\x1b[31mb" not in shown                      # a cell's own escape stays visible there too
    cells = [[c.strip() for c in re.split("[┃│]", line)[1:-1]] for line in plain(shown).splitlines()
             if line[:1] in "┃│"]
    assert cells == [headers, ["job-1", "resnet-50", "3"], ["job-22", "a\\x1b[31mb", "12"]]


def test_a_long_cell_is_never_wrapped_or_cut():
    long = "node-" + "x" * 300
    assert table(["A", "B"], [[long, "b"]]).splitlines()[1] == f"{long}  b"
    shown = plain(table(["A", "B"], [[long, "b"]], terminal=True))
    assert long in shown and "…" not in shown


def test_markup_and_emoji_codes_print_as_written():
    text = render_table(["A"], [["[bold]x[/bold] :smile:"]])
    assert text.splitlines()[1] == "[bold]x[/bold] :smile:"


def test_the_simulator_report_table_plain_and_on_a_terminal():
    header, rows = ["policy", "jobs", "avg JCT s (h)"], [["pollux", "5", "844 (0.23 h)"], ["fifo", "12", "-"]]
    assert render_rows(header, rows, left=1) == ["policy  jobs  avg JCT s (h)",
                                                 "------  ----  -------------",
                                                 "pollux     5   844 (0.23 h)",
                                                 "fifo      12              -"]
    shown = "\n".join(render_rows(header, rows, left=1, terminal=True))
    assert BOX & set(shown) and SGR in shown and "------" not in shown
    assert "844 (0.23 h)" in plain(shown)                 # wide enough: the cell is on one line


def test_is_terminal_of_odd_streams():
    assert is_terminal(FakeTerminal()) and not is_terminal(io.StringIO())
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)


# ------------------------------------------------------------------------------------------------ describe

JOB = {"id": "job-1", "name": "demo", "state": "running",
       "spec": {"entrypoint": "/w/t.py", "init_batch_size": 8},
       "submit_time": 0.0, "start_time": 1.0, "end_time": None, "restarts": 0, "failures": 0,
       "attained_service": 2.0, "allocation": {"node-0": 1},
       "replicas": [{"restart": 0, "rank": 0, "node": "node-0", "pid": 7, "start_time": 1.0,
                     "exit_code": None}]}


def test_describe_shows_the_tensorboard_dir_only_when_set():
    lines = describe_text({**JOB, "tensorboard_dir": "/runs/job-1\x1b[2J"}).splitlines()
    assert [line.strip() for line in lines if "TensorBoard" in line] == ["TensorBoard: /runs/job-1\\x1b[2J"]
    assert "TensorBoard" not in describe_text({**JOB, "tensorboard_dir": None})
    assert "TensorBoard" not in describe_text(JOB)


def test_describe_tables_follow_the_terminal():
    piped = describe_text(JOB)
    assert not BOX & set(piped) and SGR not in piped
    assert ["0", "0", "node-0", "7"] in [line.split()[:4] for line in piped.splitlines()]
    shown = describe_text(JOB, terminal=True)
    assert BOX & set(shown) and SGR in shown
    assert all(line.startswith("  ") for line in shown.splitlines() if BOX & set(line))   # still nested


# --------------------------------------------------------------------------------------------- progress


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    path.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,0,cifar10,1,128\n")
    return path


@pytest.mark.parametrize("processes", ["1", "2"])
def test_simulate_draws_a_bar_on_a_terminal_and_plain_lines_elsewhere(tiny_workload, capsys, monkeypatch,
                                                                      processes):
    argv = ["simulate", "--workload", str(tiny_workload), "--policy", "fifo", "--policy", "tiresias",
            "--processes", processes]
    assert main(argv) == 0
    captured = capsys.readouterr()
    if processes == "1":     # (worker processes write to the real stderr, which capsys does not see)
        assert "fifo      tiny: t=" in captured.err             # the engine's plain lines, as before
    assert not BOX & set(captured.err) and SGR not in captured.err
    report = captured.out

    err = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(argv) == 0
    shown = plain(err.getvalue())
    assert "runs" in shown and "2/2" in shown and "━" in shown and "elapsed" in shown and "ETA" in shown
    assert "tiny: t=" not in shown                            # the bar replaces the engine's lines
    out = capsys.readouterr().out                              # stdout is a pipe: the same plain report
    assert re.sub(r"\d+\.\d+\n", "\n", out) == re.sub(r"\d+\.\d+\n", "\n", report)   # but wall s


def test_simulate_quiet_prints_no_bar(tiny_workload, monkeypatch):
    err = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["simulate", "--workload", str(tiny_workload), "--policy", "fifo", "--quiet"]) == 0
    text = err.getvalue()
    assert text.startswith("simulating ") and "━" not in text and SGR not in text


def test_scar_sweep_counts_every_trial_on_a_terminal(monkeypatch, capsys):
    err = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["scar", "experiment", "--model", "qp", "--sweep", "--trials", "3"]) == 0
    shown = plain(err.getvalue())
    points = 1 + 3 + 3 * 3                                   # full, partial x 3 losses, 3 strategies x 3 r
    assert f"{points * 3}/{points * 3}" in shown              # the bar's total was the sweep's size
    assert "priority r=1/8" in shown                          # each point's line, above the bar
    assert "checks" in capsys.readouterr().out


def test_progress_bar_is_silent_off_a_terminal():
    stream = io.StringIO()
    with ProgressBar("runs", 3, stream) as bar:
        bar.update(0)
        bar.advance(2)
        bar.note("not shown")
    assert not bar.shown and stream.getvalue() == ""


def test_progress_bar_grows_a_short_total():
    stream = FakeTerminal()
    with ProgressBar("trials", 2, stream) as bar:
        bar.advance(3)
    assert "3/3" in plain(stream.getvalue())


# ----------------------------------------------------------------------------------------- logs -f


class FakeClient:
    """The two calls `pollux logs -f` makes, over a job that runs for two polls and then succeeds."""

    def __init__(self) -> None:
        self.polls = 0

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def job(self, job_id: str) -> dict[str, str]:
        self.polls += 1
        return {"state": "running" if self.polls < 3 else "succeeded"}

    def logs(self, job_id: str, restart: int | None = None, rank: int | None = None) -> str:
        lines = ["one\n", "two \x1b[31mred\n", "three\n"][: self.polls]
        return "==> restart 0 rank 0 (node n) <==\n" + "".join(lines)


@pytest.mark.parametrize("stdout_is_terminal", [True, False])
def test_logs_follow_status_line_never_mixes_into_the_logs(monkeypatch, stdout_is_terminal):
    monkeypatch.setattr(cluster_commands, "_client", lambda args: FakeClient())
    out = FakeTerminal() if stdout_is_terminal else io.StringIO()
    err = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    args = argparse.Namespace(job="job-1", restart=None, rank=None, follow=True, interval=0.01, raw=False)
    assert cluster_commands.cmd_logs(args) == 0
    red = "\\x1b[31m" if stdout_is_terminal else "\x1b[31m"     # escaped on a terminal only, as before
    assert out.getvalue() == f"==> restart 0 rank 0 (node n) <==\none\ntwo {red}red\nthree\n"
    status = plain(err.getvalue())
    assert "job-1: running, following its logs" in status
    assert status.rstrip().endswith("(job-1 succeeded)")


def test_logs_follow_prints_no_status_off_a_terminal(monkeypatch):
    monkeypatch.setattr(cluster_commands, "_client", lambda args: FakeClient())
    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", err)
    args = argparse.Namespace(job="job-1", restart=None, rank=None, follow=True, interval=0.01, raw=False)
    assert cluster_commands.cmd_logs(args) == 0
    assert err.getvalue() == "(job-1 succeeded)\n"


def test_status_line_is_taken_away_while_text_is_written():
    err = FakeTerminal()
    with StatusLine(err) as status:
        status.update("waiting")
        before = len(err.getvalue())
        with status.cleared():
            written = err.getvalue()[before:]
        status.wait(0.01)
    assert "\x1b[2K" in written                              # the line was erased before the caller wrote
    assert "waiting" in err.getvalue()[before + len(written):]  # and drawn again after


# ----------------------------------------------------------------------------------------------- --json


def test_json_is_byte_for_byte_the_same_on_a_terminal(monkeypatch, capsys):
    argv = ["scar", "experiment", "--json", "--trials", "5", "--quiet"]
    assert main(argv) == 0
    piped = capsys.readouterr().out
    assert piped == json.dumps(json.loads(piped)) + "\n"       # plain json.dumps, one line
    assert json.loads(piped) == pytest.approx(SCAR_JSON_BEFORE)
    assert list(json.loads(piped)) == list(SCAR_JSON_BEFORE)
    out = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    assert main(argv) == 0
    assert out.getvalue() == piped
