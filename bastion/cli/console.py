"""``bastion console [CONFIG] [--port N]``: the web console beside a stdio deployment, on 127.0.0.1 only.

It prints one login link with a secret token to stderr (it opens one session, once); stdout stays empty. The pages
show what the running gateways of this user write to disk; the acts are Cedar's to decide for the configuration's
identity (docs/operations.md, "The web console") and are written to the configuration's audit trail.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from bastion.cli.conventions import add_global_flags

log = logging.getLogger("bastion")

LINK_SECONDS = 15 * 60.0


def register(sub: argparse._SubParsersAction) -> None:
    console = sub.add_parser(
        "console", help="the web console for the gateways a client started on stdio, on 127.0.0.1",
        description="Serve the web console on 127.0.0.1 and print a one-time login link to stderr. It shows the "
                    "servers, catalog and withheld tool changes of this user's running gateways, and acts on them "
                    "as the configuration's identity, as its policy allows; every act is audited.")
    console.add_argument("config", nargs="?", help="configuration file whose policy, pins and audit trail to use "
                                                   "(default: the built-in demo configuration)")
    console.add_argument("--port", type=int, default=0, metavar="N",
                         help="port on 127.0.0.1 (default 0: a free one, said in the link)")
    add_global_flags(console)
    console.set_defaults(handler=_console)


def _console(args: argparse.Namespace) -> int:
    from bastion.cli.gateway import _load, run_loop, setup_logging

    setup_logging(args)
    if not 0 <= args.port <= 65535:
        print(f"bastion: --port {args.port}: a port is 0 to 65535 (0 picks a free one)", file=sys.stderr)
        return 2
    config = _load(args)
    if config is None:
        return 2
    try:
        return run_loop(_serve(config, args.port))
    except OSError as exc:
        print(f"bastion: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1


async def _serve(config, port: int) -> int:
    import uvicorn

    from bastion.compose import build_policy
    from bastion.console.app import ConsoleApp
    from bastion.console.data import ConsoleData
    from bastion.console.login import LinkLogin
    from bastion.console.pages import console
    from bastion.console.sessions import LoginLink
    from bastion.console.standalone import LoopbackConsole, console_identity
    from bastion.model import Identity
    from bastion.transport.listener import QuietServer, listen

    sock = listen("127.0.0.1", port)
    policy = build_policy(config)
    configured = config.policy.identity if config.policy is not None else None
    identity = console_identity(Identity(configured.name, tuple(configured.groups)) if configured is not None
                                else Identity("local", ("local",)))
    link = LoginLink(LINK_SECONDS)
    app = ConsoleApp(console(), LinkLogin(link, identity), policy, ConsoleData(config))
    server = QuietServer(uvicorn.Config(LoopbackConsole(app), loop="none", lifespan="off", ws="none",
                                        server_header=False, access_log=False, log_config=None,
                                        proxy_headers=False))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    bound = sock.getsockname()[1]
    if policy is None:
        log.warning("bastion console: the policy of this configuration is off, so nobody may act or read here; "
                    "turn the policy on")
    print(f"bastion console: open http://127.0.0.1:{bound}/admin/login?token={link.token} (it logs in once, as "
          f"{identity.name}, within {LINK_SECONDS / 60:.0f} minutes)", file=sys.stderr, flush=True)
    try:
        await server.serve(sockets=[sock])
    finally:
        if policy is not None:
            await policy.aclose()
    return 0
