"""``bastion credentials set USER SERVER NAME``, ``list``, ``revoke USER [SERVER]``: the per-user upstream
credentials in the encrypted store (tokens Bastion obtained for a user, and the secrets ``identity_env`` gives a
user's process).

``set`` reads the value from stdin (a pipe, or typed without echo at a terminal), so it is never in the shell's
history or the process list. ``list`` shows what is stored, never a value. ``revoke`` forgets it: a running gateway
reads the store on each request and stops using what is gone (a per-user process started with a revoked secret is
stopped before its next call).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from typing import Any

from bastion.cli.conventions import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    credentials = subparsers.add_parser(
        "credentials", help="per-user upstream credentials: set a user's secret, list, revoke",
        description="Per-user upstream credentials, kept encrypted in the state directory (key: "
                    "BASTION_CREDENTIALS_KEY, else credentials.key beside the store). Values are never shown.")
    commands = credentials.add_subparsers(dest="credentials_command", required=True)
    set_ = commands.add_parser("set", help="store USER's secret NAME for SERVER, read from stdin")
    set_.add_argument("user", help="the identity's name, as policy and audit records name it")
    set_.add_argument("server", help="the server's name in the configuration")
    set_.add_argument("name", help="the secret's name, as the server's identity_env maps it")
    set_.add_argument("--config", "-c", metavar="FILE", help="check that SERVER is configured there and its "
                      "identity_env names NAME (a typo would store a secret nothing reads)")
    listing = commands.add_parser("list", help="stored tokens and secrets: server, user, expiry, scope, name")
    listing.add_argument("--json", action="store_true", help="as a JSON object on stdout")
    revoke = commands.add_parser("revoke", help="forget a user's tokens and secrets, for one server or all")
    revoke.add_argument("user")
    revoke.add_argument("server", nargs="?", help="only this server's (default: every server's)")
    for command in (listing, revoke):
        command.add_argument("--config", "-c", metavar="FILE",
                             help="the configuration whose [state] names the store replicas share (the tokens are "
                                  "there, not in the state directory)")
    for command, handler in ((set_, _set), (listing, _list), (revoke, _revoke)):
        command.set_defaults(handler=handler)


def _say(message: str) -> None:
    print(f"bastion credentials: {message}", file=sys.stderr)


def _run(command: Any, config_path: str | None = None) -> int:
    """``command`` on the store: the shared state store's when ``config_path``'s ``[state]`` names one, else the
    file of the state directory."""
    from pathlib import Path

    from bastion.cli.shared_state import shared_state
    from bastion.config import ConfigError, load_config
    from bastion.credentials.store import TokenStore
    from bastion.transport.credentials import CredentialsError

    try:
        config = load_config(Path(config_path), log_notes=False) if config_path else None
        with shared_state(config) as shared:
            if shared is None:
                return int(command(TokenStore.default()))
            from bastion.credentials.state_store import StateTokenStore, required_key

            state, blocking = shared
            return int(command(StateTokenStore(state, required_key(), blocking)))
    except ConfigError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CredentialsError as exc:
        _say(str(exc))
        return EXIT_USAGE


def _read_value(name: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"{name}: ", stream=sys.stderr)
    value = sys.stdin.read()
    return value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value


def _check_against(config_path: str, server: str, name: str) -> str | None:
    """Why SERVER NAME would be read by nothing in the configuration at ``config_path``, or None."""
    from pathlib import Path

    from bastion.config import load_config

    config = load_config(Path(config_path), log_notes=False)
    entry = config.servers.get(server)
    if entry is None:
        return f"{config_path} has no server {server!r} (servers: {', '.join(sorted(config.servers)) or 'none'})"
    if name not in entry.identity_env.values():
        named = ", ".join(sorted(set(entry.identity_env.values()))) or "none"
        return (f"servers.{server}.identity_env in {config_path} names no secret {name!r} (it names: {named}); "
                f"add e.g. VARIABLE = \"{name}\" to it, or correct the name")
    return None


def _set(args: argparse.Namespace) -> int:
    def command(store: Any) -> int:
        if args.config is not None:
            from bastion.config import ConfigError

            try:
                problem = _check_against(args.config, args.server, args.name)
            except ConfigError as exc:
                problem = str(exc)
            if problem is not None:
                _say(problem)
                return EXIT_USAGE
        value = _read_value(args.name)
        if not value:
            _say(f"no value for {args.name} on stdin; pipe it in, e.g. `bastion credentials set {args.user} "
                 f"{args.server} {args.name} < secret-file`")
            return EXIT_USAGE
        store.set_secret(args.server, args.user, args.name, value)
        _say(f"stored {args.user}'s {args.name} for server {args.server!r}; their next process of it starts "
             "with it")
        return EXIT_OK

    return _run(command, args.config)


def _list(args: argparse.Namespace) -> int:
    def command(store: Any) -> int:
        tokens = store.list()
        secrets = store.list_secrets()
        if args.json:
            print(json.dumps({
                "tokens": [{"server": t.server, "user": t.user, "expires_at": t.expires_at, "scope": t.scope}
                           for t in tokens],
                "secrets": [{"server": s.server, "user": s.user, "name": s.name} for s in secrets]}, indent=2))
            return EXIT_OK
        if not tokens and not secrets:
            _say(f"nothing stored in {store.path}")
            return EXIT_OK
        now = time.time()
        rows = [("KIND", "SERVER", "USER", "DETAIL")]
        rows += [("token", t.server, t.user or "(bastion)", f"{_expiry(t.expires_at, now)}; scope: {t.scope or '-'}")
                 for t in tokens]
        rows += [("secret", s.server, s.user, s.name) for s in secrets]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
        return EXIT_OK

    return _run(command, args.config)


def _expiry(expires_at: float | None, now: float) -> str:
    if expires_at is None:
        return "no expiry given"
    left = expires_at - now
    if left <= 0:
        return "expired (renewed on next use)"
    return f"expires in {left / 60:.0f} min" if left < 7200 else f"expires in {left / 3600:.0f} h"


def _revoke(args: argparse.Namespace) -> int:
    def command(store: Any) -> int:
        removed = store.revoke(args.user, args.server)
        where = f"server {args.server!r}" if args.server else "every server"
        if not removed:
            _say(f"nothing stored for {args.user} on {where}")
            return EXIT_FAILED
        _say(f"forgot {removed} credential(s) of {args.user} for {where}; a running gateway stops using them on "
             "its next request")
        return EXIT_OK

    return _run(command, args.config)
