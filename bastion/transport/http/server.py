"""Running the HTTP frontend: the listening socket, TLS, uvicorn on the running loop, and a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from typing import Any, Iterator

import uvicorn

from bastion.auth.build import HttpAuth
from bastion.gateway.core import Gateway
from bastion.transport.http.app import HttpFrontend
from bastion.transport.http.config import HttpConfig

log = logging.getLogger("bastion.http")


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: Bastion ends its streams and sessions first, then stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve_http(gateway: Gateway, settings: HttpConfig, host: str, port: int, *, auth: HttpAuth | None = None,
                     callback: Any = None) -> signal.Signals | None:
    """Serve until SIGTERM, SIGINT or SIGHUP; the signal that stopped it."""
    sock = listen(host, port)  # first: an address in use is said before any server starts
    gateway.start()
    frontend = HttpFrontend(gateway, settings, bound_to_loopback=is_loopback(host), auth=auth, callback=callback)
    tls = settings.tls_cert is not None
    config = uvicorn.Config(
        frontend, http=_http_parser(), loop="none", lifespan="off", proxy_headers=False, server_header=False,
        access_log=False, log_config=None, timeout_keep_alive=30, timeout_graceful_shutdown=5,
        ssl_certfile=str(settings.tls_cert) if tls else None, ssl_keyfile=str(settings.tls_key) if tls else None,
        h11_max_incomplete_event_size=64 * 1024,
    )
    server = QuietServer(config)
    stopped_by: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        if not stopped_by:
            stopped_by.append(sig)
            loop.create_task(_stop(frontend, server))

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop, sig)
    frontend.start()
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # One line a person (or a test) reads for the address, the port 0 asked for included.
    print(f"bastion: serving MCP on {'https' if tls else 'http'}://{shown}:{bound_port}/mcp "
          f"({len(gateway.config.servers)} server(s))", file=sys.stderr, flush=True)
    if not is_loopback(host) and not settings.allowed_hosts:
        log.warning("listening on %s with no http.allowed_hosts: any Host header is accepted", host)
    try:
        await server.serve(sockets=[sock])
    finally:
        await frontend.stop()
        await gateway.close()
    return stopped_by[0] if stopped_by else None


async def _stop(frontend: HttpFrontend, server: uvicorn.Server) -> None:
    await frontend.stop()
    server.should_exit = True


def _http_parser() -> str:
    try:
        import httptools  # noqa: F401 - measured: about twice the requests per second of h11 here
    except ImportError:
        return "h11"
    return "httptools"
