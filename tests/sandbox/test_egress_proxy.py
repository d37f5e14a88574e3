"""The egress proxy with real sockets: a UNIX-socket proxy in front of loopback test servers only."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from bastion.sandbox import SandboxConfig, spawn
from bastion.sandbox.egress import EgressProxy
from bastion.sandbox.egress_policy import parse_allow_rule
from tests.sandbox.conftest import MALICIOUS_SERVER, require_gvisor
from tests.sandbox.rpc import RpcClient


# Allowlisted by name; it resolves to loopback, which no IP rule allows on this port (nothing listens).
INWARD_NAME = "localhost:9"


@pytest.fixture
async def origin():
    """A loopback HTTP server answering every request with its own marker."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line = head.split(b"\r\n", 1)[0].decode()
        body = f"origin saw: {request_line}".encode()
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


@pytest.fixture
async def proxy(tmp_path: Path, origin: int):
    rules = tuple(parse_allow_rule(e) for e in (f"127.0.0.1:{origin}", INWARD_NAME, "api.example.com:443"))
    egress = EgressProxy("test-server", rules, str(tmp_path / "egress.sock"))
    await egress.start()
    yield egress
    await egress.close()


async def exchange(proxy: EgressProxy, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(proxy.socket_path)
    writer.write(request)
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return response


async def test_connect_to_an_allowlisted_ip(proxy, origin):
    reader, writer = await asyncio.open_unix_connection(proxy.socket_path)
    writer.write(f"CONNECT 127.0.0.1:{origin} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.write(b"GET /through-tunnel HTTP/1.0\r\n\r\n")
    assert b"origin saw: GET /through-tunnel" in await asyncio.wait_for(reader.read(), 10)
    writer.close()


async def test_plain_http_is_rewritten_to_origin_form(proxy, origin):
    response = await exchange(proxy, f"GET http://127.0.0.1:{origin}/a?b=1 HTTP/1.1\r\nHost: x\r\n"
                                     f"Proxy-Authorization: secret\r\n\r\n".encode())
    assert response.startswith(b"HTTP/1.0 200") and b"origin saw: GET /a?b=1 HTTP/1.1" in response


@pytest.mark.parametrize("encoding", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]"])
async def test_other_encodings_of_an_allowlisted_ip(proxy, origin, encoding):
    reader, writer = await asyncio.open_unix_connection(proxy.socket_path)
    writer.write(f"CONNECT {encoding}:{origin} HTTP/1.1\r\n\r\n".encode())
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
    writer.close()


@pytest.mark.parametrize("target, reason", [
    ("127.0.0.1:{other}", b"not on the allowlist"),
    (INWARD_NAME, b"loopback address"),                   # allowed name, but it resolves inward
    ("169.254.169.254:80", b"not on the allowlist"),
    ("0xa9fea9fe:80", b"not on the allowlist"),
    ("example.org:443", b"not on the allowlist"),
])
async def test_refusals_name_their_reason(proxy, origin, target, reason, caplog):
    caplog.set_level(logging.INFO, logger="bastion.sandbox.egress")
    address = target.format(origin=origin, other=origin + 1 if origin < 65535 else origin - 1)
    response = await exchange(proxy, f"CONNECT {address} HTTP/1.1\r\n\r\n".encode())
    assert response.startswith(b"HTTP/1.1 403") and reason in response
    assert any("egress denied for server 'test-server'" in r.getMessage() for r in caplog.records)


async def test_allowed_requests_are_logged(proxy, origin, caplog):
    caplog.set_level(logging.INFO, logger="bastion.sandbox.egress")
    await exchange(proxy, f"GET http://127.0.0.1:{origin}/ HTTP/1.1\r\n\r\n".encode())
    assert any("egress allowed for server 'test-server'" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("request_bytes", [b"NONSENSE\r\n\r\n", b"GET ftp://x/ HTTP/1.1\r\n\r\n",
                                           b"GET /relative HTTP/1.1\r\n\r\n"])
async def test_malformed_requests_get_400(proxy, request_bytes):
    assert (await exchange(proxy, request_bytes)).startswith(b"HTTP/1.1 400")


async def test_oversized_head_gets_400(proxy):
    assert (await exchange(proxy, b"GET http://x/ HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")).startswith(
        b"HTTP/1.1 400")


# --- end to end, from inside a sandbox ----------------------------------------------------------------

@pytest.fixture(params=["bubblewrap", "gvisor"])
async def networked_attacker(request: pytest.FixtureRequest, origin: int):
    """The same attacker under either runtime: under gVisor the proxy's socket is reached through runsc's host
    UNIX socket support (``--host-uds=open``), by the same forwarder inside."""
    if request.param == "gvisor":
        require_gvisor()
    config = SandboxConfig(network=(f"127.0.0.1:{origin}", INWARD_NAME), runtime=request.param)
    process = await spawn("malicious", sys.executable, [MALICIOUS_SERVER], {}, None, config)
    client = RpcClient(process)
    await client.initialize()
    yield client
    await process.terminate(grace=0.5)


async def test_sandbox_reaches_an_allowed_server_through_the_proxy(networked_attacker, origin):
    outcome = await networked_attacker.call("http_get", {"url": f"http://127.0.0.1:{origin}/hello"})
    assert outcome["ok"] and "origin saw: GET /hello" in outcome["body"], outcome
    tunnel = await networked_attacker.call("proxy_connect", {"host": "127.0.0.1", "port": origin})
    assert tunnel["ok"] and "origin saw: GET /" in tunnel["body"], tunnel


async def test_sandbox_is_refused_everything_else(networked_attacker, origin):
    other = origin + 1 if origin < 65535 else origin - 1
    for host, port in (("127.0.0.1", other), ("localhost", 9), ("169.254.169.254", 80),
                       ("2852039166", 80), ("example.org", 443)):
        outcome = await networked_attacker.call("proxy_connect", {"host": host, "port": port})
        assert not outcome["ok"] and " 403 " in outcome["status"], (host, port, outcome)
    refused = await networked_attacker.call("http_get", {"url": f"http://127.0.0.1:{other}/"})
    assert refused["status"] == 403


async def test_sandbox_cannot_bypass_the_proxy(networked_attacker, origin):
    """The sandbox's loopback is its own: the host's service is not there, whatever the allowlist says."""
    outcome = await networked_attacker.call("tcp_connect", {"host": "127.0.0.1", "port": origin})
    assert not outcome["ok"] and "refused" in outcome["error"].lower(), outcome
