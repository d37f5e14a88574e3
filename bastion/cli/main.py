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
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
