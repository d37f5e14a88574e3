"""The ``bastion`` command."""

from __future__ import annotations

import argparse
import os
import select
import sys

from bastion.cli.conventions import (EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED, EXIT_USAGE, add_global_flags,
                                     configure_logging, global_flags)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        # Asked by installers, scripts and health checks: answered before any command module is imported.
        from bastion import __version__

        print(f"bastion {__version__}")
        return 0
    try:
        status = _main(argv)
        sys.stdout.flush()  # a stdout closed by its reader shows here, where it is handled, not at exit
        return status
    except KeyboardInterrupt:
        # Ctrl-C: whatever was running has unwound (servers stopped, files closed); one line says why it ended.
        return _interrupted()
    except BrokenPipeError:
        # `bastion tools | head`: the reader of stdout has had what it wanted. Any other broken pipe is a fault.
        if not _stdout_gone():
            raise
        _silence_stdout()
        return EXIT_STDOUT_CLOSED


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


def _stdout_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit does not fail a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno())
    os.close(devnull)


def _interrupted() -> int:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed or broken stdout is no reason for a traceback now
        pass
    print("bastion: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
