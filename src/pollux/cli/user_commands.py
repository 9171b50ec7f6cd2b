"""``pollux user add|list|revoke``: the admin's commands for the service's users."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pollux.cli.formatting import escape, table, when
from pollux.cli.parser import command
from pollux.cli.service_access import client_of, json_option, service_options

__all__ = ["add_user_commands"]


def cmd_user_add(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        user = client.add_user(args.name)
    if args.json:
        print(json.dumps({"name": user["name"], "token": user["token"]}))
    else:
        print(f"user {escape(user['name'])} created; its token (shown only now):")
        print(user["token"])
    return 0


def _user_rows(users: list[dict[str, Any]]) -> list[list[str]]:
    return [[escape(user["name"]), when(user["created"]), when(user["revoked"])] for user in users]


def cmd_user_list(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        users = client.users()
    if args.json:
        print(json.dumps(users))
    else:
        print(table(["NAME", "CREATED", "REVOKED"], _user_rows(users)))
    return 0


def cmd_user_revoke(args: argparse.Namespace) -> int:
    with client_of(args) as client:
        user = client.revoke_user(args.name)
    if args.json:
        print(json.dumps(user))
    else:
        print(f"user {escape(user['name'])} revoked (its jobs stay)")
    return 0


def add_user_commands(sub: Any) -> None:
    """Add ``user add|list|revoke`` to ``sub``."""
    common = service_options()
    as_json = json_option()
    p = sub.add_parser("user", help="manage the service's users (admin)",
                       description="Users of the service: each submits and sees only its own jobs. "
                                   "Only the admin manages them.")
    usub = p.add_subparsers(dest="user_command", required=True)
    u = usub.add_parser("add", parents=[common, as_json], help="create a user and print its token once",
                        description="Create a user and print its token, once (the service keeps only "
                                    "its hash). Give it to the user, who passes it as --token or "
                                    "POLLUX_TOKEN.")
    u.add_argument("name", metavar="NAME", help="user name: [a-z][a-z0-9._-]{0,63}, not 'admin'")
    command(u, cmd_user_add)
    u = usub.add_parser("list", parents=[common, as_json], help="list the users",
                        description="Every user, with when it was created and revoked.")
    command(u, cmd_user_list)
    u = usub.add_parser("revoke", parents=[common, as_json], help="revoke a user's token",
                        description="Revoke a user's token: it is refused from now on; the user's "
                                    "jobs stay and keep running.")
    u.add_argument("name", metavar="NAME", help="user name")
    command(u, cmd_user_revoke)
