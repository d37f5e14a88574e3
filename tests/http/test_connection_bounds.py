"""A client that connects and never finishes a request, or holds many connections, never holds the gateway:
http.header_timeout closes a connection whose request line and headers are not complete in time (408 when part
of a request came), and http.max_connections / http.max_connections_per_address refuse a connection past them at
once (503), so a client from another address is still served. Real ``bastion serve`` processes and real sockets
on loopback; every wait ends on what the server does (a status line, the socket closing)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import httpx2
import pytest
from pydantic import ValidationError

from bastion.config import HttpConfig
from bastion.frontends.http.server import fit_to_file_limit
from bastion.transport.listener import address_key
from tests.http.conftest import IDENTITY_HEADER, Served, start_bastion, stop_bastion
from tests.http.test_sdk_clients import MODERN_META

# Long enough that no test waits on it: a connection the server is to keep is never closed by it mid-test.
SAFETY_SECONDS = 60
LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": MODERN_META}}).encode()
MODERN = {IDENTITY_HEADER: "tester", "content-type": "application/json",
          "accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
          "mcp-method": "tools/list"}
ATTACKER = "127.0.0.2"  # another loopback address on Linux: the per-address bound counts it apart from 127.0.0.1


@pytest.fixture(scope="module")
def quick_timeout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A gateway with a header timeout of half a second, and heartbeats as often."""
    served = start_bastion(tmp_path_factory.mktemp("header-timeout"), {
        "identity_header": IDENTITY_HEADER, "header_timeout": 0.5, "heartbeat_seconds": 0.5, "body_timeout": 1})
    try:
        yield served
    finally:
        stop_bastion(served)


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[Served]:
    """A gateway of its own per test (the bounds count every connection it has): 6 connections at most, 3 from
    one address, and a header timeout long enough that no held connection ends by it."""
    served = start_bastion(tmp_path, {"identity_header": IDENTITY_HEADER, "header_timeout": SAFETY_SECONDS * 2,
                                      "max_connections": 6, "max_connections_per_address": 3})
    try:
        yield served
    finally:
        stop_bastion(served)


def connect(served: Served, source: str = "127.0.0.1") -> socket.socket:
    address = urlsplit(served.url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(SAFETY_SECONDS)
    sock.bind((source, 0))
    sock.connect((address.hostname, address.port))
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (recv returns b"")."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def one_answer(sock: socket.socket) -> tuple[str, bytes]:
    """The status line and body of one response (framed by its Content-Length), the connection left open."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {received!r}"
        received += chunk
    head, body = received.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of an answer"
        body += chunk
    return head.split(b"\r\n", 1)[0].decode(), body


def request(path: str = "/nothing-here") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def served_list(served: Served) -> int:
    """The status of a tools/list POSTed from 127.0.0.1 on a new connection."""
    with httpx2.Client(timeout=SAFETY_SECONDS) as http:
        return http.post(served.url, headers=MODERN, content=LIST).status_code


# The header timeout

def test_a_request_line_sent_in_part_is_answered_408_and_closed(quick_timeout: Served) -> None:
    """Slowloris: a request line that never ends (one byte now, the next never, or one an interval)."""
    with connect(quick_timeout) as sock:
        sock.sendall(b"GET /mc")
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"connection: close" in answer.lower() and b"http.header_timeout" in answer


def test_headers_sent_in_part_are_answered_408_and_closed(quick_timeout: Served) -> None:
    with connect(quick_timeout) as sock:
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{IDENTITY_HEADER}: tester\r\nContent-Ty".encode())
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == -32600 and "http.header_timeout" in body["error"]["message"]


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(quick_timeout: Served) -> None:
    """Closed as an idle connection is, without a response no request asked for."""
    with connect(quick_timeout) as sock:
        assert until_closed(sock) == b""


def test_blank_lines_do_not_keep_a_connection(quick_timeout: Served) -> None:
    """The parser skips blank lines before a request without beginning one; they are bytes all the same."""
    with connect(quick_timeout) as sock:
        sock.sendall(b"\r\n\r\n")
        assert until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_an_idle_keep_alive_connection_is_closed(quick_timeout: Served) -> None:
    with connect(quick_timeout) as sock:
        sock.sendall(request())
        status, _ = one_answer(sock)
        assert status.startswith("HTTP/1.1 404 ")
        assert until_closed(sock) == b""  # no next request: closed, with nothing more said


def test_a_next_request_begun_on_a_keep_alive_connection_has_the_same_timeout(quick_timeout: Served) -> None:
    """uvicorn's own keep-alive timeout ends at the next request's first byte; the header timeout goes on."""
    with connect(quick_timeout) as sock:
        sock.sendall(request())
        status, _ = one_answer(sock)
        assert status.startswith("HTTP/1.1 404 ")
        sock.sendall(b"G")
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_requests_in_time_are_served_one_after_another_on_one_connection(quick_timeout: Served) -> None:
    with connect(quick_timeout) as sock:
        for _ in range(3):
            sock.sendall(request())
            status, _ = one_answer(sock)
            assert status.startswith("HTTP/1.1 404 ")


async def test_a_response_longer_than_the_header_timeout_is_not_cut(quick_timeout: Served) -> None:
    """The timeout is for a request's headers, not its answer: a stream outlives it by several heartbeats, each
    as long as the timeout."""
    listen = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
              "params": {"notifications": {"toolsListChanged": True}, "_meta": MODERN_META}}
    headers = {**MODERN, "mcp-method": "subscriptions/listen"}
    async with httpx2.AsyncClient(timeout=SAFETY_SECONDS) as http:
        async with http.stream("POST", quick_timeout.url, headers=headers, json=listen) as stream:
            assert stream.status_code == 200
            heartbeats = 0
            async for line in stream.aiter_lines():
                heartbeats += line.startswith(":")
                if heartbeats == 4:
                    break
            assert heartbeats == 4, "the stream ended"


def test_the_body_timeout_still_answers_a_stalled_body(quick_timeout: Served) -> None:
    """The headers came in time, the body does not: the body timeout's 408, not the header timeout's."""
    with connect(quick_timeout) as sock:
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"{IDENTITY_HEADER}: tester\r\nContent-Length: 50\r\n\r\n{{".encode())
        answer = b""
        while b"http.body_timeout" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ") and b"http.header_timeout" not in answer


def padding(size: int) -> bytes:
    """Header lines of about ``size`` bytes, each its own field."""
    return b"".join(b"X-Pad-%05d: %s\r\n" % (index, b"p" * 100) for index in range(size // 115))


def test_headers_that_grow_past_64_kib_unfinished_are_answered_431_at_once(quick_timeout: Served) -> None:
    """Not left to the header timeout (which would answer 408): the size is what refuses them."""
    with connect(quick_timeout) as sock:
        sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + padding(70 * 1024))
        answer = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_headers_below_64_kib_are_read(quick_timeout: Served) -> None:
    with connect(quick_timeout) as sock:
        sock.sendall(b"GET /nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\n" + padding(60 * 1024) + b"\r\n")
        assert one_answer(sock)[0].startswith("HTTP/1.1 404 ")


def test_a_websocket_upgrade_is_answered_as_plain_http(quick_timeout: Served) -> None:
    """Bastion serves no WebSocket: a connection is never handed to a protocol that would leave the bounds."""
    with connect(quick_timeout) as sock:
        sock.sendall(b"GET /nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        assert one_answer(sock)[0].startswith("HTTP/1.1 404 ")
    assert "WebSocket" not in quick_timeout.stderr.read_text()


# The connection bounds

def test_past_the_per_address_bound_a_connection_is_refused_and_others_are_served(bounded: Served) -> None:
    held = [connect(bounded, ATTACKER) for _ in range(3)]  # idle: not a byte of a request
    try:
        with connect(bounded, ATTACKER) as one_more:
            answer = until_closed(one_more)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"retry-after: 1" in answer.lower() and b"http.max_connections_per_address" in answer
        # A client from another address gets in, authenticated or not.
        assert served_list(bounded) == 200
        with httpx2.Client(timeout=SAFETY_SECONDS) as http:
            assert http.post(bounded.url, headers={k: v for k, v in MODERN.items() if k != IDENTITY_HEADER},
                             content=LIST).status_code == 401
        # The held connections were admitted: each is still served.
        for sock in held:
            sock.sendall(request())
            assert one_answer(sock)[0].startswith("HTTP/1.1 404 ")
    finally:
        for sock in held:
            sock.close()


def test_past_the_total_bound_a_connection_is_refused_until_one_closes(bounded: Served) -> None:
    held = [connect(bounded, source) for source in ("127.0.0.2", "127.0.0.3") for _ in range(3)]
    try:
        with connect(bounded, "127.0.0.4") as one_more:
            answer = until_closed(one_more)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"(http.max_connections)" in answer
        held.pop().close()
        # Once the server has seen that close, a new connection gets in (each attempt waits for its answer).
        for _ in range(1000):
            with connect(bounded) as sock:
                sock.sendall(request())
                status, _ = one_answer(sock)
            if not status.startswith("HTTP/1.1 503 "):
                break
        assert status.startswith("HTTP/1.1 404 "), status
    finally:
        for sock in held:
            sock.close()


# The settings

def test_the_per_address_bound_must_be_below_the_total() -> None:
    with pytest.raises(ValidationError, match="max_connections_per_address"):
        HttpConfig(max_connections=100, max_connections_per_address=100)
    with pytest.raises(ValidationError):
        HttpConfig(header_timeout=0)
    defaults = HttpConfig()
    assert defaults.header_timeout == 10 and defaults.max_connections_per_address < defaults.max_connections


@pytest.mark.parametrize("limit, expected", [
    (1_048_576, (4096, 256)),  # room for the defaults
    (20_000, (4096, 256)),
    (4096, (3072, 256)),  # 1024 kept for servers and files
    (1024, (768, 256)),  # a small limit: a quarter kept
    (256, (192, 96)),  # the total fell to the per-address bound: half the total from one address
])
def test_the_bounds_fit_the_open_file_limit(limit: int, expected: tuple[int, int]) -> None:
    assert fit_to_file_limit(4096, 256, limit) == expected


def test_an_address_is_counted_alone_an_ipv6_one_by_its_64() -> None:
    assert address_key("127.0.0.2") == "127.0.0.2"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"  # an IPv4 client of an IPv6 socket
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")


def test_the_soft_open_file_limit_is_raised_as_far_as_the_bounds_need() -> None:
    """In a process of its own: the limit is the process's."""
    script = ("import resource\n"
              "from bastion.transport.listener import raise_file_limit\n"
              "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
              "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
              "wanted = min(hard, 2048) if hard != resource.RLIM_INFINITY else 2048\n"
              "print(wanted, raise_file_limit(wanted), resource.getrlimit(resource.RLIMIT_NOFILE)[0],"
              " raise_file_limit(100), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    wanted, given, soft, smaller, after = map(int, done.stdout.split())
    assert given == soft == wanted  # raised to what was wanted (within the hard limit)
    assert smaller == after == wanted  # never lowered
