"""How a CLI command reaches the service: the state folder it runs from and the token to call it
with (``--token``, else ``$POLLUX_TOKEN``, else the folder's admin token)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pollux.cluster.client import PolluxClient

__all__ = ["TOKEN_ENV", "client_of", "json_option", "service_options"]

#: The environment variable a user keeps its token in.
TOKEN_ENV = "POLLUX_TOKEN"


def service_options() -> argparse.ArgumentParser:
    """The options every command that talks to the service takes (a parent parser)."""
    from pollux.cluster.server import default_state_dir

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state-dir", metavar="DIR", type=Path, default=default_state_dir(),
                        help="the server's state folder (default: $POLLUX_STATE_DIR or ~/.pollux; now "
                             "%(default)s)")
    common.add_argument("--token", metavar="TOKEN", default=None,
                        help=f"call the service with this token (a user's); default: ${TOKEN_ENV}, else the "
                             "state folder's admin token")
    return common


def json_option() -> argparse.ArgumentParser:
    """``--json`` for the service commands that print data (a parent parser)."""
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")
    return as_json


def client_of(args: argparse.Namespace) -> PolluxClient:
    """The client of the service of ``args.state_dir``, with the token the options name."""
    from pollux.cluster.client import PolluxClient

    token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or None
    return PolluxClient.from_state_dir(args.state_dir, token=token)
