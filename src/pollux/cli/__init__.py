"""The ``pollux`` command (``docs/cli.md``).

* :mod:`pollux.cli.entry` — :func:`main` and the parser; the one place errors are reported.
* :mod:`pollux.cli.errors` — :class:`CliError`, the exit statuses.
* :mod:`pollux.cli.parser` — the parser class, option value types, the policy choices.
* :mod:`pollux.cli.sim_commands` — ``goodput``, ``simulate``, ``workload generate``.
* :mod:`pollux.cli.cluster_commands` — ``server start|stop|status``, ``submit``, ``ls``,
  ``describe``, ``logs``, ``cancel``.
* :mod:`pollux.cli.formatting` — tables, durations, ``describe``/``status`` text, escaping.
"""

from pollux.cli.entry import build_parser, main
from pollux.cli.errors import CliError

__all__ = ["CliError", "build_parser", "main"]
