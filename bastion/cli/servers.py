"""``bastion servers [status]``: each running gateway's servers and their state (a failed one with why, its last
stderr lines and the command that retries it); ``bastion servers retry NAME``: start a failed server again now;
``bastion servers update [NAME...]``: move launcher servers (npx, uvx, ...) on to the newest version and lock it.

The answer goes to stdout (``memory: PKG 1.0.0 -> 1.1.0``, one line per server, for ``update``); progress and
errors go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bastion.cli.conventions import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    servers = subparsers.add_parser("servers", help="the running gateways' servers and their state; retry a failed "
                                                    "one; update the packages of servers started by npx, uvx, ...")
    servers.set_defaults(handler=run_status, names=[], json=False)
    commands = servers.add_subparsers(dest="servers_command")
    status = commands.add_parser(
        "status", help="each running gateway's servers: ready, starting, failed (why, and what retries it)",
        description="Read the status files of the gateways running for this user (bastion run, bastion serve) and "
                    "print each server's state; a failed one with why, its last stderr lines and the command that "
                    "starts it again.")
    status.add_argument("names", nargs="*", metavar="NAME", help="only these servers")
    status.add_argument("--json", action="store_true", help="the status files as one JSON list on stdout")
    status.set_defaults(handler=run_status)
    retry = commands.add_parser(
        "retry", help="start a failed server of the running gateways again now",
        description="Ask every running gateway with a server NAME whose starts failed to start it again now (a "
                    "gateway stops restarting a local server after 5 failed starts in a row). Exit 1 when no running "
                    "gateway has a server of that name.")
    retry.add_argument("name", metavar="NAME", help="the server's name, as `bastion servers` shows it")
    retry.set_defaults(handler=run_retry)
    update = commands.add_parser(
        "update", help="install the newest version of launcher servers and rewrite the lock file",
        description="For each NAME (default: every server started by npx, uvx, pipx run or bunx), resolve the newest "
                    "version its command line allows with the host's package client, install it, record it in the "
                    "lock file of the configuration (beside Bastion's own file; in Bastion's state directory for a "
                    "client's file) and print the old and new versions.")
    update.add_argument("names", nargs="*", metavar="NAME", help="servers to update (default: all launcher servers)")
    update.add_argument("--config", "-c", metavar="FILE",
                        help="the configuration (default: $XDG_CONFIG_HOME/bastion/bastion.toml)")
    update.set_defaults(handler=run_update)


def run_status(args: argparse.Namespace) -> int:
    import json

    from bastion.running import running_gateways, status_lines

    gateways = running_gateways()
    if args.json:
        print(json.dumps([{"pid": g.pid, "config": g.config, "servers": g.servers} for g in gateways], indent=2))
        return EXIT_OK
    if not gateways:
        print("bastion servers: no gateway is running (bastion run, bastion serve)", file=sys.stderr)
        return EXIT_OK
    wanted = set(args.names)
    for line in status_lines(gateways, lambda name: not wanted or name in wanted):
        print(line)
    return EXIT_OK


def run_retry(args: argparse.Namespace) -> int:
    from bastion.running import ask_retry, running_gateways

    asked = 0
    for gateway in running_gateways():
        if args.name not in gateway.servers:
            continue
        try:
            ask_retry(gateway, args.name)
        except OSError as exc:
            print(f"bastion servers retry: could not ask gateway {gateway.pid}: {exc}", file=sys.stderr)
            continue
        asked += 1
        state = gateway.servers[args.name].get("status")
        print(f"asked gateway {gateway.pid} ({gateway.config or 'the demo configuration'}) to start {args.name} "
              f"again (it was {state}); `bastion servers status {args.name}` shows how it went", file=sys.stderr)
    if not asked:
        print(f"bastion servers retry: no running gateway has a server {args.name!r}; `bastion servers` lists them",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def run_update(args: argparse.Namespace) -> int:
    from bastion.cli.gateway import run_loop
    from bastion.config import ConfigError, load_config
    from bastion.launchers.install import PackageInstallFailed
    from bastion.launchers.lock import LockFileError
    from bastion.launchers.prepare import config_lock_path, launcher_servers, update
    from bastion.paths import config_dir

    path = Path(args.config) if args.config else config_dir() / "bastion.toml"
    if not args.config and not path.exists():
        print(f"bastion servers update: no configuration at {path}; give one with --config FILE", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return EXIT_USAGE
    plans = launcher_servers(config)
    unknown = [name for name in args.names if name not in plans]
    if unknown:
        print(f"bastion servers update: {path}: {', '.join(unknown)} "
              f"{'is not a server' if len(unknown) == 1 else 'are not servers'} started by npx, uvx, pipx run or "
              f"bunx; launcher servers there: {', '.join(plans) or 'none'}", file=sys.stderr)
        return EXIT_USAGE
    names = args.names or list(plans)
    if not names:
        print(f"bastion servers update: {path} has no server started by npx, uvx, pipx run or bunx", file=sys.stderr)
        return EXIT_OK
    try:
        outcomes = run_loop(update(config, names))
    except LockFileError as exc:
        print(f"bastion servers update: {exc}", file=sys.stderr)
        return EXIT_FAILED
    # The lock of a client's file is in Bastion's state directory, not beside the file: say where it is.
    print(f"bastion servers update: lock file {config_lock_path(config)}", file=sys.stderr)
    failed = False
    for name, outcome in zip(names, outcomes, strict=True):
        if isinstance(outcome, PackageInstallFailed):
            failed = True
            print(f"bastion servers update: {name}: not updated: {outcome}", file=sys.stderr)
        else:
            print(outcome.describe())
    return EXIT_FAILED if failed else EXIT_OK
