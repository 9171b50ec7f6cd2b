"""New random tokens: the users', the admin's and each job's.

People pass tokens on the command line (``pollux submit --token T``), and ``argparse`` reads a value
that starts with ``-`` as an option: ``secrets.token_urlsafe`` starts one token in 64 with ``-``, so
about one user in 64 got a token the CLI refused ("argument --token: expected one argument"). A token
drawn with a leading ``-`` is drawn again; the rest keeps its 256 random bits.
"""

from __future__ import annotations

import secrets

__all__ = ["TOKEN_BYTES", "new_token"]

#: Random bytes in a token (256 bits).
TOKEN_BYTES = 32


def new_token() -> str:
    """A URL-safe random token of :data:`TOKEN_BYTES` bytes that does not start with ``-``."""
    while True:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        if not token.startswith("-"):
            return token
