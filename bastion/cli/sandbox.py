"""``bastion sandbox doctor`` and ``bastion sandbox run``: inspect the host, try a profile on any command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from bastion.cli.conventions import RecordFormatter

if TYPE_CHECKING:  # imported by the command that uses it when it runs: `bastion --help` needs none of it
    from bastion.sandbox import SandboxConfig, ServerProcess


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("sandbox", help="inspect and try the OS sandbox for local MCP servers")
    commands = parser.add_subparsers(dest="sandbox_command", required=True)

    doctor = commands.add_parser("doctor", help="what this host supports and what Bastion will use")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    doctor.set_defaults(handler=run_doctor)

    run = commands.add_parser(
        "run", help="run any command under a sandbox profile",
        description="Run COMMAND as Bastion would run a local MCP server. Its stdin, stdout and stderr are "
                    "connected to this terminal; the exit status is the command's.")
    run.add_argument("--profile", default="default", help="default, strict or none (default: default)")
    run.add_argument("--runtime", default="bubblewrap", help="bubblewrap or gvisor (default: bubblewrap)")
    run.add_argument("--read-only", action="append", default=[], metavar="PATH", help="grant read access")
    run.add_argument("--writable", action="append", default=[], metavar="PATH", help="grant write access")
    run.add_argument("--allow", action="append", default=[], metavar="HOST:PORT",
                     help="allow egress to HOST:PORT (*.example.com:443 for subdomains)")
    run.add_argument("--env", action="append", default=[], metavar="NAME", help="pass a host variable through")
    run.add_argument("--set-env", action="append", default=[], metavar="NAME=VALUE", help="set a variable")
    run.add_argument("--memory", help="memory limit, e.g. 256MiB")
    run.add_argument("--cpu", type=float, help="CPU cores, e.g. 0.5")
    run.add_argument("--pids", type=int, help="process and thread limit")
    run.add_argument("--cwd", help="working directory (default: / inside the sandbox)")
    run.add_argument("--quiet", action="store_true", help="only warnings from the sandbox on stderr")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(handler=run_command)


def run_doctor(args: argparse.Namespace) -> int:
    from bastion.sandbox.doctor import diagnose

    report = diagnose()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return 0 if report.usable else 1
    for check in report.checks:
        print(f"  [{'ok' if check.ok else '--'}] {check.name}: {check.detail}", file=sys.stderr)
    print("Bastion will use:", file=sys.stderr)
    for key, value in report.will_use.items():
        print(f"  {key}: {value}", file=sys.stderr)
    print("sandbox usable" if report.usable else "sandbox NOT usable on this host", file=sys.stderr)
    return 0 if report.usable else 1


def config_from_args(args: argparse.Namespace) -> SandboxConfig:
    from bastion.sandbox import SandboxConfig

    values: dict[str, Any] = {"profile": args.profile, "runtime": args.runtime}
    for key, given in (("read_only", args.read_only), ("writable", args.writable), ("network", args.allow),
                       ("env", args.env), ("memory", args.memory), ("cpu", args.cpu), ("pids", args.pids)):
        if given:
            values[key] = given
    return SandboxConfig.model_validate(values)


def run_command(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from bastion.sandbox import SandboxError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("bastion sandbox run: give a command after --", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
    except ValidationError as error:
        print(f"bastion sandbox run: {error}", file=sys.stderr)
        return 2
    env = dict(item.split("=", 1) for item in args.set_env if "=" in item)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RecordFormatter("bastion: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING if args.quiet
                        else logging.INFO, handlers=[handler], force=True)
    try:
        return asyncio.run(_run(command, env, args.cwd, config))
    except SandboxError as error:
        print(f"bastion sandbox run: {error}", file=sys.stderr)
        return 126


async def _copy(reader: asyncio.StreamReader, fd: int) -> None:
    from bastion.transport.stdio import write_all

    while chunk := await reader.read(65536):
        await asyncio.to_thread(write_all, fd, chunk)  # a slow terminal must not stall the event loop


async def _feed_stdin(process: ServerProcess) -> None:
    """Our stdin to the command's; a pipe or terminal is watched by the loop, a file read in a thread."""
    from bastion.transport.stdio import loop_can_watch

    loop = asyncio.get_running_loop()
    try:
        if loop_can_watch(0):
            reader = asyncio.StreamReader()
            stdin = os.fdopen(0, "rb", closefd=False)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
            while chunk := await reader.read(65536):
                process.stdin.write(chunk)
                await process.stdin.drain()
        else:
            while chunk := await asyncio.to_thread(os.read, 0, 65536):
                process.stdin.write(chunk)
                await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass
    except OSError as exc:  # our own input failed (EIO, say): the command sees its input end
        print(f"bastion sandbox run: reading stdin failed ({exc}); closing the command's input", file=sys.stderr)
        process.stdin.close()


async def _run(command: list[str], env: dict[str, str], cwd: str | None, config: SandboxConfig) -> int:
    from bastion.sandbox import spawn

    process = await spawn("sandbox-run", command[0], command[1:], env, cwd, config)
    feeder = asyncio.create_task(_feed_stdin(process))
    await asyncio.gather(_copy(process.stdout, 1), _copy(process.stderr, 2))
    status = await process.wait()
    feeder.cancel()
    await process.terminate(grace=0.5)
    reason = process.termination_reason()
    if reason and reason != "exited with status 0":
        print(f"bastion: {reason}", file=sys.stderr)
    return 128 - status if status < 0 else status
