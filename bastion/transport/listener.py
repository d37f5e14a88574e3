"""A listening socket and uvicorn on the running loop, for whatever ASGI app is to be served (the HTTP frontend,
the loopback listener of the authorization-code flow): bytes and TLS, nothing of MCP."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from typing import Any, Callable, Iterator

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

try:
    import resource
except ImportError:  # not on POSIX: the open-file limit is left as it is
    resource = None  # type: ignore[assignment]

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


def raw_response(status: int, reason: str, body: bytes, content_type: bytes,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A whole HTTP/1.1 response that ends its connection, written as it is: for answers given before any request
    reaches the ASGI app (a connection refused, headers too late)."""
    lines = [f"HTTP/1.1 {status} {reason}".encode(), b"content-type: " + content_type,
             b"content-length: " + str(len(body)).encode(), b"connection: close",
             *(name + b": " + value for name, value in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def address_key(host: str) -> str:
    """What the per-address bound counts a peer under: an IPv4 address as it is (also one an IPv6 socket writes
    as ::ffff:a.b.c.d), an IPv6 address by its /64, which one host or one customer usually holds whole."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return f"{ipaddress.IPv6Address(int(address) >> 64 << 64)}/64"


class ConnectionBounds:
    """What one listener allows its connections: how many are open at once, in all and from one address (an
    IPv6 peer: its /64), and how long a connection has until the request line and headers of its next request
    are complete, and how large they may grow before they are. Shared by every connection of the listener (one
    event loop: plain counters)."""

    def __init__(self, *, header_timeout: float, max_connections: int, max_per_address: int,
                 max_header_bytes: int, late_answer: bytes, too_large_answer: bytes, full_answer: bytes,
                 address_full_answer: bytes, exempt: Callable[[str], bool] | None = None) -> None:
        """``late_answer`` is written to a connection whose request is incomplete at the timeout,
        ``too_large_answer`` to one whose request line and headers pass ``max_header_bytes`` unfinished,
        ``full_answer`` to one past ``max_connections`` and ``address_full_answer`` to one past
        ``max_per_address``, each a whole response (``raw_response``); ``exempt`` says which peers (trusted
        proxies, whose connections carry many clients) the per-address bound does not apply to."""
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.max_header_bytes = max_header_bytes
        self.late_answer = late_answer
        self.too_large_answer = too_large_answer
        self.full_answer = full_answer
        self.address_full_answer = address_full_answer
        self.exempt = exempt
        self.open = 0
        self.per_address: dict[str, int] = {}
        self._refused = 0
        self._warned_at: float | None = None

    def admit(self, transport: asyncio.BaseTransport) -> str | None:
        """The key the connection is counted under; None when a bound is reached, and then the connection has been
        answered 503 and closed."""
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else ""
        key = address_key(host)
        if self.open >= self.max_connections:
            self._refuse(transport, self.full_answer, f"{self.open} connections are open (http.max_connections)")
            return None
        count = self.per_address.get(key, 0)
        if count >= self.max_per_address and not (self.exempt is not None and self.exempt(host)):
            self._refuse(transport, self.address_full_answer,
                         f"{count} connections from {key} are open (http.max_connections_per_address)")
            return None
        self.per_address[key] = count + 1
        self.open += 1
        return key

    def release(self, key: str) -> None:
        self.open -= 1
        count = self.per_address[key] - 1
        if count:
            self.per_address[key] = count
        else:
            del self.per_address[key]

    def _refuse(self, transport: asyncio.BaseTransport, answer: bytes, why: str) -> None:
        transport.write(answer)  # type: ignore[attr-defined]
        transport.close()
        # Said at most once a minute: a flood of refusals must not become a flood of log lines.
        self._refused += 1
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= 60:
            log.warning("refused %d connection(s) since the last such warning; the last because %s",
                        self._refused, why)
            self._refused, self._warned_at = 0, now


class BoundedConnection:
    """A connection within its listener's ``ConnectionBounds``: refused at once past a bound, and closed when the
    request line and headers of a request are not complete ``header_timeout`` seconds after the connection
    opened or its previous response ended (408 when any byte came since, just closed when none did, as an idle
    keep-alive connection is), or when they pass ``max_header_bytes`` unfinished (431). One timer per request,
    armed when the connection waits for a request and cancelled when httptools has read the headers. Mixed into
    uvicorn's httptools protocol class."""

    bounds: ConnectionBounds
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    pipeline: Any
    _key: str | None = None  # None: never admitted
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0  # received since the connection began waiting for a request

    def connection_made(self, transport: asyncio.Transport) -> None:
        key = self.bounds.admit(transport)
        if key is None:
            return  # answered and closed; uvicorn never counts it
        self._key = key
        super().connection_made(transport)  # type: ignore[misc]
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._key is None:
            return
        self.bounds.release(self._key)
        self._key = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None:  # a request's body, or a refused connection's bytes (TLS can hand some over
            if self._key is not None:   # after the close), which are dropped
                super().data_received(data)  # type: ignore[misc]
            return
        # Waiting for a request's line and headers: every byte since is theirs until httptools has read them.
        self._header_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        if self._header_timer is not None and self._header_bytes > self.bounds.max_header_bytes:
            self._header_timer.cancel()
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.write(self.bounds.too_large_answer)
                self.transport.close()

    def on_headers_complete(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        # A request read while this one ran (pipelined) starts now, its headers complete: no wait for headers.
        idle = not self.pipeline
        super().on_response_complete()  # type: ignore[misc]
        if idle and not self.transport.is_closing():
            self._await_headers()

    def _await_headers(self) -> None:
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.bounds.header_timeout, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._header_bytes:  # something came: a request begun (or blank lines), answered; nothing: just closed
            self.transport.write(self.bounds.late_answer)
        self.transport.close()


class NoWebSocket:
    """With uvicorn's ``ws="none"`` an upgrade request is answered as the plain HTTP request it also is; uvicorn
    would log two warnings for each (one advising to install a WebSocket library), from any client that asks."""

    def _unsupported_upgrade_warning(self) -> None:
        pass


def http_protocol(bounds: ConnectionBounds) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol (measured: about twice the requests per second of h11 here) with the client
    certificate in the scope and ``bounds`` kept; httptools is required, since the header timeout needs its
    callbacks. Used with uvicorn's ``ws="none"``: a connection handed to a WebSocket protocol would leave the
    bounds without ever being released."""
    return type("BastionHttpProtocol", (BoundedConnection, NoWebSocket, PeerCertificate, HttpToolsProtocol),
                {"bounds": bounds})


def raise_file_limit(wanted: int) -> int:
    """Raises this process's soft limit on open files toward ``wanted`` (never past the hard limit, never lower
    than it is); the soft limit then."""
    if resource is None:
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft
