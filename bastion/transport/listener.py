"""A listening socket and uvicorn on the running loop, for whatever ASGI app is to be served (the HTTP frontend,
the loopback listener of the authorization-code flow): bytes and TLS, nothing of MCP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Iterator

import uvicorn


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: Bastion ends its streams and sessions first, then stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


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


def http_protocol() -> type[asyncio.Protocol]:
    try:
        # measured: about twice the requests per second of h11 here
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as parser
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as parser  # type: ignore[assignment]
    return type("BastionHttpProtocol", (PeerCertificate, parser), {})
