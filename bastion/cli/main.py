"""The ``bastion`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bastion", description="MCP security gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    from bastion.cli import commands

    for register in commands.registrars():
        register(sub)
    args = parser.parse_args(argv)
    from bastion.policy.config import PolicyStartError

    try:
        return int(args.handler(args) or 0)
    except PolicyStartError as error:
        # Policy files, pins, keys and the audit trail are read when the gateway is built: a problem with
        # one of them is the configuration's, reported like one.
        print(f"bastion: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
