"""``bastion servers update [NAME...]``: move launcher servers (npx, uvx, ...) on to the newest version and lock it.

What changed is the command's answer, printed on stdout, one line per server (``memory: PKG 1.0.0 -> 1.1.0``);
progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bastion.cli.conventions import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    servers = subparsers.add_parser("servers", help="the packages of servers started by npx, uvx, pipx run or bunx")
    commands = servers.add_subparsers(dest="servers_command", required=True)
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
