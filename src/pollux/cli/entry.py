"""The ``pollux`` command's entry: the parser of every subcommand and the one place errors are
reported (``docs/cli.md``, "Errors and exit statuses").

=====================================  ==================================================  ======
what went wrong                        printed on stderr                                   status
=====================================  ==================================================  ======
nothing                                                                                    0
a usage error (the command line)       the usage line, then ``pollux CMD: error: MSG``     2
a runtime error (a file, the service)  ``pollux: error: MSG``                              1
Ctrl-C                                 an empty line                                       130
=====================================  ==================================================  ======

A command raises :class:`~pollux.cli.errors.CliError` for bad input it finds; argparse's usage errors
arrive as one too (:class:`~pollux.cli.parser.Parser`); an ``OSError`` (a missing or unreadable file)
and the service's ``ClientError``/``ServerError`` are runtime errors. Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pollux.cli.cluster_commands import add_cluster_commands
from pollux.cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, CliError
from pollux.cli.formatting import escape_lines
from pollux.cli.hpo_commands import add_hpo_commands
from pollux.cli.litz_commands import add_litz_commands
from pollux.cli.parser import Parser
from pollux.cli.scar_commands import add_scar_commands
from pollux.cli.sim_commands import add_sim_commands
from pollux.cli.user_commands import add_user_commands


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pollux",
                    description="Goodput-optimised, co-adaptive scheduling for deep learning.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_sim_commands(sub)
    add_cluster_commands(sub)
    add_user_commands(sub)
    add_litz_commands(sub)
    add_scar_commands(sub)
    add_hpo_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pollux ARGV``; the exit status (``--help`` alone exits from inside argparse, with 0)."""
    parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:          # name the subcommand, not just ``pollux``, as its own errors do
            raise CliError(f"unrecognized arguments: {' '.join(extra)}", usage=True)
        return int(args.func(args))
    except CliError as exc:
        return _report(exc, args, parser)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:                     # `pollux logs JOB | head`: stop quietly
        _silence_stdout()
        return EXIT_ERROR
    except Exception as exc:
        from pollux.cluster.client import ClientError
        from pollux.cluster.server import ServerError

        if not isinstance(exc, (OSError, ClientError, ServerError)):
            raise                               # a bug: keep the traceback
        return _report(CliError(str(exc)), args, parser)


def _report(exc: CliError, args: argparse.Namespace | None, top: argparse.ArgumentParser) -> int:
    """Print ``exc`` the one way every command does; its exit status."""
    if exc.usage:
        command = exc.parser or getattr(args, "command_parser", None) or top
        command.print_usage(sys.stderr)
        print(f"{command.prog}: error: {escape_lines(exc.message)}", file=sys.stderr)
    else:
        print(f"pollux: error: {escape_lines(exc.message)}", file=sys.stderr)
    return exc.exit_status


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
