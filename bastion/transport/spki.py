"""Public-key pinning of a remote server: its certificate's key must be one the configuration names.

The pin is the SHA-256 of the leaf certificate's SubjectPublicKeyInfo, base64, written ``sha256//BASE64`` as HPKP
and ``curl --pinnedpubkey`` write it. Only the leaf counts: a pin of a CA's key would accept every certificate that
CA issues, and a certificate from the same CA as the real server's is exactly the impersonation pinning is there to
stop. The certificate is still verified against the trust store first (pinning narrows trust, never replaces it).

The check runs when the TLS handshake completes, inside the connection's own ``start_tls``, before httpcore writes a
byte of HTTP on it (HTTP/1.1 and HTTP/2 alike, and every new connection: a server restarted with another key is
refused at its next handshake).
"""

from __future__ import annotations

import base64
import hashlib
import ssl
from typing import Any, Iterable, Sequence

import httpcore2
import httpx2
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bastion.public_key_pins import HOW_TO_PIN, PIN_PREFIX


class PinMismatch(httpcore2.ConnectError):
    """The server presented a key no pin names; raised as a connection error, so nothing is sent and it is retried
    (the operator may be mid-rotation), each attempt saying why."""


def spki_pin(der_certificate: bytes) -> str:
    """The ``sha256//BASE64`` pin of a DER certificate's public key."""
    key = x509.load_der_x509_certificate(der_certificate).public_key()
    info = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return PIN_PREFIX + base64.b64encode(hashlib.sha256(info).digest()).decode()


def presented_pin(ssl_object: ssl.SSLObject | None) -> str | None:
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return spki_pin(der) if der else None


def mismatch(server: str, pins: Sequence[str], presented: str | None) -> str:
    return (f"server {server!r} presented a certificate whose public key is {presented or 'unknown (no certificate)'}, "
            f"which its pinned_public_keys ({', '.join(pins)}) do not name: refused before any request was sent; if "
            f"the server's key was rotated on purpose, add the new pin ({HOW_TO_PIN})")


class _PinnedStream(httpcore2.AsyncNetworkStream):
    """A connection whose TLS handshake must present a pinned key; everything else is the stream it wraps."""

    def __init__(self, stream: httpcore2.AsyncNetworkStream, server: str, pins: Sequence[str]) -> None:
        self._stream = stream
        self._server = server
        self._pins = pins

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore2.AsyncNetworkStream:
        secured = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        presented = presented_pin(secured.get_extra_info("ssl_object"))
        if presented not in self._pins:
            await secured.aclose()
            raise PinMismatch(mismatch(self._server, self._pins, presented))
        return secured


class _PinningBackend(httpcore2.AsyncNetworkBackend):
    def __init__(self, server: str, pins: Sequence[str]) -> None:
        self._backend = httpcore2.AnyIOBackend()
        self._server = server
        self._pins = tuple(pins)

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout=timeout, local_address=local_address,
                                                 socket_options=socket_options)
        return _PinnedStream(stream, self._server, self._pins)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class PinnedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport, its connections made through the pinning backend (the one change)."""

    def __init__(self, server: str, pins: Sequence[str], *, verify: ssl.SSLContext | bool, http2: bool,
                 limits: httpx2.Limits) -> None:
        super().__init__(verify=verify, http2=http2, limits=limits)
        # Its pool again, with the pinning backend: httpx2 offers no other way to give the pool a network backend.
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(verify=verify), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            http1=True, http2=http2, network_backend=_PinningBackend(server, pins))
