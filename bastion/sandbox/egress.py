"""The egress proxy: HTTP and HTTPS (CONNECT) on a UNIX socket that only one sandbox can reach.

The sandbox has no network of its own; its only way out is this socket, bind-mounted into it and
exposed inside on loopback by ``forwarder.py``. Every request is checked with the pure decisions in
``egress_policy`` (allowlist before any name lookup, then the resolved addresses), connected to the
exact address that was checked, and logged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from urllib.parse import urlsplit

from bastion.sandbox.egress_policy import AllowRule, Decision, decide_addresses, decide_request

log = logging.getLogger("bastion.sandbox.egress")

MAX_HEAD = 64 * 1024
CONNECT_TIMEOUT = 10.0
HEAD_TIMEOUT = 30.0
HOP_BY_HOP = {"proxy-connection", "proxy-authorization", "connection", "keep-alive"}


class RequestRejected(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def split_host_port(authority: str, default_port: int) -> tuple[str, int]:
    """``example.com:443``, ``[::1]:8080``, ``example.com`` -> (host, port)."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    else:
        host, port_text = authority, ""
    if not host:
        raise RequestRejected(400, f"no host in {authority!r}")
    if not port_text:
        return host, default_port
    # ASCII digits only: str.isdigit admits "²", which int refuses
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 and 0 < int(port_text) < 65536):
        raise RequestRejected(400, f"bad port in {authority!r}")
    return host, int(port_text)


async def resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos))


class EgressProxy:
    """One proxy per sandbox, so every log line and decision belongs to one named server."""

    def __init__(self, server_name: str, rules: tuple[AllowRule, ...], socket_path: str) -> None:
        self.server_name = server_name
        self.rules = rules
        self.socket_path = socket_path
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self.socket_path, limit=MAX_HEAD)
        # connect() needs write permission on the socket; the directory holding it stays private (0700).
        os.chmod(self.socket_path, 0o666)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # so close() can cancel connections still relaying
        try:
            await self.handle(reader, writer)
        except asyncio.CancelledError:
            writer.close()  # the sandbox is shutting down; ending the connection is the point
        finally:
            self._tasks.discard(task)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            method, target, version, headers = parse_head(head)
            if method == "CONNECT":
                host, port = split_host_port(target, 443)
                upstream = await self.open_checked(host, port, method)
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                host, port, origin_head = absolute_to_origin(method, target, version, headers)
                upstream = await self.open_checked(host, port, method)
                upstream[1].write(origin_head)
            await relay(reader, writer, *upstream)
        except RequestRejected as rejected:
            await reply_error(writer, rejected.status, rejected.reason)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            await reply_error(writer, 400, "malformed or oversized request head")
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def open_checked(
        self, host: str, port: int, method: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Allowlist, resolve, check the addresses, connect to a checked address: or refuse with a reason."""
        decision = decide_request(self.rules, host, port)
        if decision.allowed and decision.explicit_ip is not None:
            addresses = [decision.explicit_ip]
        elif decision.allowed:
            try:
                addresses = await resolve(host, port)
            except (OSError, UnicodeError) as error:
                decision = Decision(False, f"could not resolve {host}: {error}")
                addresses = []
            else:
                decision = decide_addresses(self.rules, port, addresses)
        self._log(decision, method, host, port)
        if not decision.allowed:
            raise RequestRejected(403, decision.reason)
        last_error: Exception | None = None
        for address in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(str(address), port), CONNECT_TIMEOUT)
            except (TimeoutError, OSError) as error:
                last_error = error
        raise RequestRejected(502, f"could not connect to {host}:{port}: {last_error}")

    def _log(self, decision: Decision, method: str, host: str, port: int) -> None:
        verdict = "allowed" if decision.allowed else "denied"
        level = logging.INFO if decision.allowed else logging.WARNING
        log.log(level, "egress %s for server %r: %s %s:%d (%s)", verdict, self.server_name, method, host, port,
                decision.reason)


def parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise RequestRejected(400, "malformed request line")
    headers = []
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise RequestRejected(400, "malformed header")
            headers.append((name.strip(), value.strip()))
    return parts[0].upper(), parts[1], parts[2], headers


def absolute_to_origin(method: str, target: str, version: str,
                       headers: list[tuple[str, str]]) -> tuple[str, int, bytes]:
    """A proxied ``GET http://host/path`` rewritten for the origin server, one request per connection."""
    url = urlsplit(target)
    if url.scheme != "http" or not url.netloc:
        raise RequestRejected(400, "only http:// URLs or CONNECT are proxied")
    host, port = split_host_port(url.netloc.rpartition("@")[2], 80)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP]
    lines = [f"{method} {path} {version}", *(f"{name}: {value}" for name, value in kept), "Connection: close"]
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def reply_error(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    titles = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}
    body = f"bastion sandbox egress: {reason}\n".encode()
    head = (f"HTTP/1.1 {status} {titles.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        writer.write(head + body)
        await writer.drain()
    except (ConnectionError, OSError):
        pass


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter) -> None:
    try:
        await asyncio.gather(_pipe(client_reader, upstream_writer), _pipe(upstream_reader, client_writer))
    finally:
        upstream_writer.close()
