"""Running the HTTP frontend: the listening socket, TLS, uvicorn on the running loop, and a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Any, Iterator

import uvicorn

from bastion.auth.build import HttpAuth
from bastion.auth.config import AuthConfig
from bastion.gateway.core import Gateway
from bastion.transport.http.app import HttpFrontend
from bastion.transport.http.config import HttpConfig, client_certificate_contradiction

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
        frontend, http=_http_protocol(), loop="none", lifespan="off", proxy_headers=False, server_header=False,
        access_log=False, log_config=None, timeout_keep_alive=30, timeout_graceful_shutdown=5,
        ssl_certfile=str(settings.tls_cert) if tls else None, ssl_keyfile=str(settings.tls_key) if tls else None,
        **_client_certificates(settings), h11_max_incomplete_event_size=64 * 1024,
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


def with_client_ca(settings: HttpConfig, auth: AuthConfig | None, base: Path) -> HttpConfig:
    """``settings`` with http.client_ca_file read from the configuration's folder; a ValueError names the
    contradiction and the fix (mutual TLS without TLS, certificates mapped that nobody asks for)."""
    if (contradiction := client_certificate_contradiction(settings, auth)) is not None:
        raise ValueError(contradiction)
    if settings.client_ca_file is None:
        return settings
    if settings.tls_cert is None:
        raise ValueError("http.client_ca_file asks clients for a certificate in the TLS handshake, but the gateway "
                         "serves plain HTTP: set http.tls_cert and http.tls_key (or --tls-cert and --tls-key)")
    ca_file = (base / settings.client_ca_file.expanduser()).resolve()
    if not ca_file.is_file():
        raise ValueError(f"http.client_ca_file: {ca_file} does not exist or is not a file")
    return settings.model_copy(update={"client_ca_file": ca_file})


def _client_certificates(settings: HttpConfig) -> dict[str, Any]:
    """uvicorn's TLS settings for mutual TLS: the client CA, and whether a certificate is required."""
    if settings.client_ca_file is None:
        return {}
    required = settings.client_cert_mode == "required"
    return {"ssl_ca_certs": str(settings.client_ca_file),
            "ssl_cert_reqs": ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL}


class PeerCertificate:
    """Puts the client certificate the TLS handshake verified into every request's ASGI scope, as
    ``scope["bastion.peer_certificate"]`` (``ssl.getpeercert()`` form), where the frontend reads it for
    authentication: uvicorn reads no peer certificate of its own. Mixed into uvicorn's HTTP protocol class."""

    app: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # asyncio calls it after the handshake
        super().connection_made(transport)  # type: ignore[misc]
        certificate = verified_certificate(transport)
        if certificate:
            app = self.app

            async def with_certificate(scope: Any, receive: Any, send: Any) -> None:
                scope[PEER_CERTIFICATE] = certificate
                await app(scope, receive, send)

            self.app = with_certificate


PEER_CERTIFICATE = "bastion.peer_certificate"


def verified_certificate(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The peer's certificate when the handshake verified one: getpeercert() is empty or None otherwise (no TLS, no
    certificate, or no verification asked for)."""
    ssl_object = transport.get_extra_info("ssl_object")
    return (ssl_object.getpeercert() or None) if ssl_object is not None else None


def _http_protocol() -> type[asyncio.Protocol]:
    try:
        # measured: about twice the requests per second of h11 here
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as parser
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as parser  # type: ignore[assignment]
    return type("BastionHttpProtocol", (PeerCertificate, parser), {})
