"""The one error type of the ``pollux`` command (see "Errors and exit statuses" in ``docs/cli.md``).

A command raises :class:`CliError` for bad input it finds itself; :func:`pollux.cli.entry.main` is the
only place that prints an error and picks the exit status, so every command reports the same way.
"""

from __future__ import annotations

import argparse

#: Exit statuses of every ``pollux`` command.
EXIT_OK = 0
EXIT_ERROR = 1          # a runtime error: a file, the service, the API refused the request
EXIT_USAGE = 2          # a usage error: a missing, unknown or malformed option or argument
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it


class CliError(Exception):
    """Bad input, reported as one message on stderr instead of a traceback.

    ``usage=True`` marks a usage error (the command line itself is wrong): it is printed after the
    command's usage line as ``pollux CMD: error: ...`` and exits 2. Otherwise it is a runtime error
    (a missing or malformed file, a service that cannot be reached, a refused request), printed as
    ``pollux: error: ...`` and exiting 1. ``parser`` is the (sub)command's parser, for the usage
    line; the entry fills it in when a command leaves it out.
    """

    def __init__(self, message: str, *, usage: bool = False,
                 parser: argparse.ArgumentParser | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage
        self.parser = parser

    @property
    def exit_status(self) -> int:
        return EXIT_USAGE if self.usage else EXIT_ERROR
