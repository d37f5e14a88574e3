"""The ``bastion`` command."""

from __future__ import annotations

import argparse
import sys

from bastion.cli.conventions import EXIT_INTERRUPTED, EXIT_USAGE, add_global_flags, configure_logging, global_flags


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C: whatever was running has unwound (servers stopped, files closed); one line says why it ended.
        return _interrupted()


def build_parser() -> argparse.ArgumentParser:
    from bastion import __version__
    from bastion.cli import commands

    parser = argparse.ArgumentParser(
        prog="bastion", description="MCP security gateway",
        epilog="-v/-q may also follow the subcommand. Exit status: 0 done (yes), 1 done (no: a server down, a tool "
               "error, a trail not intact), 2 cannot run as given (the message names the file, key and fix), "
               "130 interrupted; docs/cli.md lists each command's.")
    parser.add_argument("--version", action="version", version=f"bastion {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in commands.registrars():
        register(sub)
    add_global_flags(parser)
    return parser


def _main(argv: list[str] | None) -> int:
    args = global_flags(build_parser().parse_args(argv))
    configure_logging(args.verbose, args.quiet)
    from bastion.policy.config import PolicyStartError

    try:
        return int(args.handler(args) or 0)
    except PolicyStartError as error:
        # Policy files, pins, keys and the audit trail are read when the gateway is built: a problem with
        # one of them is the configuration's, reported like one.
        print(f"bastion: {error}", file=sys.stderr)
        return EXIT_USAGE


def _interrupted() -> int:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed or broken stdout is no reason for a traceback now
        pass
    print("bastion: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
