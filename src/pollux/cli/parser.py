"""The parts every ``pollux`` subcommand's parser is built from: the parser class (its usage errors
go through :class:`~pollux.cli.errors.CliError`), option value types and the policy choices.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, overload

from pollux.cli.errors import CliError


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors raise :class:`CliError` instead of exiting.

    So :func:`pollux.cli.entry.main` prints them (as argparse would: the usage line, then
    ``pollux CMD: error: ...``) and returns 2 like every other error, instead of ``sys.exit``
    from inside the parser. Subparsers are of this class too (argparse makes them of the parent's).
    """

    def error(self, message: str) -> NoReturn:
        raise CliError(message, usage=True, parser=self)


def command(parser: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int]) -> None:
    """Make ``func`` the command run by ``parser``; the entry uses ``parser`` for usage errors."""
    parser.set_defaults(func=func, command_parser=parser)


class PolicyChoices(Sequence[str]):
    """The registered policy names (filtered as :func:`pollux.policy.registry.policy_names`), read
    from the registry the first time argparse needs them.

    Only a ``--policy`` value, a help page or a usage error needs them, and the registry imports the
    policies and the goodput model (numpy, scipy: about 0.4 s): ``pollux ls`` should not pay that.
    """

    def __init__(self, *, live: bool | None = None, compare: bool | None = None) -> None:
        self._filters = {"live": live, "compare": compare}
        self._names: tuple[str, ...] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        if self._names is None:
            from pollux.policy.registry import policy_names

            self._names = policy_names(**self._filters)
        return self._names

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self.names[index]

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, value: object) -> bool:
        return value in self.names


def add_policy_option(parser: argparse.ArgumentParser, *, live: bool | None = None,
                      metavar: str | None = None, **kwargs: Any) -> argparse.Action:
    """Add ``--policy`` with the registered policies (``live``: only those the service can run) as
    its choices, read lazily (:class:`PolicyChoices`).

    argparse formats a new option's metavar once, to check it, which without a metavar lists the
    choices (and would import the registry now): it is added with a stand-in metavar, then given
    ``metavar`` (``None``: argparse's own ``{pollux,tiresias,...}`` when help or usage is shown).
    """
    action = parser.add_argument("--policy", choices=PolicyChoices(live=live), metavar="NAME", **kwargs)
    action.metavar = metavar
    return action


def _typed(name: str, convert: Callable[[str], Any], ok: Callable[[Any], bool],
           expected: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert``, then ``ok`` or a usage error ``expected ..., got TEXT``.

    argparse names the function in its message for a value that does not convert ("invalid
    positive integer value: 'x'"), hence ``name``.
    """

    def parse(text: str) -> Any:
        value = convert(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    parse.__name__ = name
    return parse


positive_int = _typed("positive integer", int, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = _typed("non-negative integer", int, lambda v: v >= 0, "an integer >= 0")
port = _typed("port", int, lambda v: 0 <= v <= 65535, "a port 0..65535")
positive_float = _typed("positive number", float, lambda v: math.isfinite(v) and v > 0,
                        "a number > 0")
nonnegative_float = _typed("non-negative number", float, lambda v: math.isfinite(v) and v >= 0,
                           "a number >= 0")
fraction = _typed("fraction", float, lambda v: 0 <= v < 1, "a number in [0, 1)")
