"""Sessions are held to a quota per caller, so that one caller cannot take every session: an authenticated identity
may hold http.max_sessions_per_identity, and without authentication (every caller the configured identity) one
client address http.max_sessions_per_address. A session past the quota is refused with 429, Retry-After and a
-32000 error naming the setting, while another caller still gets one; the quota frees when a session ends. Both
kinds count: handshake-era Streamable HTTP sessions and HTTP+SSE streams (and 2026-07-28 listen streams), against the quota and against
http.max_sessions. Real ``bastion serve`` processes on loopback, real HTTP clients."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from typing import AsyncIterator

import httpx2
import pytest
from pydantic import ValidationError

from bastion.auth.api_keys import ApiKeyFile
from bastion.config import HttpConfig
from bastion.frontends.http.quotas import address_block
from tests.http.conftest import Served, start_bastion, stop_bastion

ACCEPT = "application/json, text/event-stream"
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def initialize(id_: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "quota", "version": "1"}}}


async def open_session(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> httpx2.Response:
    """initialize; when accepted, the handshake completed too (the response names the session)."""
    opened = await http.post(url, headers={**headers, "accept": ACCEPT}, json=initialize())
    if opened.status_code == 200:
        done = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={
            **headers, "accept": ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25"})
        assert done.status_code == 202, done.text
    return opened


def in_session(headers: dict[str, str], opened: httpx2.Response) -> dict[str, str]:
    return {**headers, "accept": ACCEPT, "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25"}


def assert_over_quota(refused: httpx2.Response, setting: str, limit: int, request_id: object = 1) -> None:
    assert refused.status_code == 429, (refused.status_code, refused.text)
    retry_after = int(refused.headers["retry-after"])
    assert retry_after >= 1
    body = refused.json()
    assert body["id"] == request_id and body["error"]["code"] == -32000
    assert f"({setting})" in body["error"]["message"]
    assert body["error"]["data"] == {"retryAfterSeconds": retry_after, "setting": setting, "limit": limit}


async def wait_for_log(served: Served, text: str) -> None:
    """Until the gateway has written ``text`` to its log: the event the next step depends on."""
    deadline = time.monotonic() + 60
    while text not in served.stderr.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"the gateway never logged {text!r}"
        await asyncio.sleep(0.05)


class SseOpen:
    """An HTTP+SSE session held open: its stream (and the reader of its lines, which would close the stream if it
    were dropped), until ``close``."""

    def __init__(self, stack: AsyncExitStack, lines: AsyncIterator[str], session_id: str) -> None:
        self.stack, self.lines, self.id = stack, lines, session_id

    async def close(self) -> None:
        await self.stack.aclose()


async def open_sse(http: httpx2.AsyncClient, served: Served, headers: dict[str, str]) -> SseOpen | httpx2.Response:
    """GET /sse: the open session once its endpoint event names it, or the refusal read whole."""
    stack = AsyncExitStack()
    response = await stack.enter_async_context(http.stream(
        "GET", f"{served.base}/sse", headers={**headers, "accept": "text/event-stream"}))
    if response.status_code != 200:
        await response.aread()
        await stack.aclose()
        return response
    lines = response.aiter_lines()
    async for line in lines:
        if line.startswith("data: /messages?session_id="):
            return SseOpen(stack, lines, line.split("session_id=", 1)[1])
    raise AssertionError("the HTTP+SSE stream ended before its endpoint event")


def from_address(address: str) -> httpx2.AsyncClient:
    """A client whose connections leave from ``address`` (any of 127.0.0.0/8 is this machine's loopback)."""
    return httpx2.AsyncClient(timeout=120, transport=httpx2.AsyncHTTPTransport(local_address=address))


def make_keys(tmp_path, *names: str) -> dict[str, dict[str, str]]:
    keys = ApiKeyFile(tmp_path / "keys.json")
    return {name: {"x-api-key": keys.create(name)[0]} for name in names}


async def test_one_identity_at_its_quota_leaves_sessions_for_another(tmp_path) -> None:
    keys = make_keys(tmp_path, "alice", "bob")
    alice, bob = keys["alice"], keys["bob"]
    served = start_bastion(tmp_path, {"max_sessions_per_identity": 2}, auth={"api_keys": "keys.json"})
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            first = await open_session(http, served.url, alice)
            second = await open_session(http, served.url, alice)
            assert first.status_code == second.status_code == 200

            refused = await http.post(served.url, headers={**alice, "accept": ACCEPT}, json=initialize(7))
            assert_over_quota(refused, "http.max_sessions_per_identity", 2, 7)
            assert "alice (api_key) has 2 sessions open" in refused.json()["error"]["message"]
            # an HTTP+SSE session is a session too
            sse = await open_sse(http, served, alice)
            assert isinstance(sse, httpx2.Response)
            assert_over_quota(sse, "http.max_sessions_per_identity", 2, None)

            # the promise: another identity still gets a session, and alice's keep working
            other = await open_session(http, served.url, bob)
            assert other.status_code == 200, other.text
            assert (await http.post(served.url, headers=in_session(bob, other), json=LIST)).status_code == 200
            assert (await http.post(served.url, headers=in_session(alice, first), json=LIST)).status_code == 200

            # ending one of alice's sessions gives its place back to her
            assert (await http.delete(served.url, headers=in_session(alice, second))).status_code == 200
            again = await open_session(http, served.url, alice)
            assert again.status_code == 200, again.text
            assert (await http.post(served.url, headers=in_session(alice, again), json=LIST)).status_code == 200
            assert (await http.post(served.url, headers={**alice, "accept": ACCEPT},
                                    json=initialize())).status_code == 429
    finally:
        stop_bastion(served)
    assert "refused a new session to alice (api_key): it holds 2, its quota (http.max_sessions_per_identity)" in \
        served.stderr.read_text()


async def test_without_authentication_each_client_address_has_its_quota(tmp_path) -> None:
    served = start_bastion(tmp_path, {"max_sessions_per_address": 2})
    try:
        async with from_address("127.0.0.1") as one, from_address("127.0.0.2") as two:
            first = await open_session(one, served.url, {})
            second = await open_session(one, served.url, {})
            assert first.status_code == second.status_code == 200
            refused = await one.post(served.url, headers={"accept": ACCEPT}, json=initialize())
            assert_over_quota(refused, "http.max_sessions_per_address", 2)
            assert "address 127.0.0.1 has 2 sessions open" in refused.json()["error"]["message"]
            sse = await open_sse(one, served, {})
            assert isinstance(sse, httpx2.Response)
            assert_over_quota(sse, "http.max_sessions_per_address", 2, None)

            # the same configured identity from another address: a quota of its own
            other = await open_session(two, served.url, {})
            assert other.status_code == 200, other.text
            assert (await two.post(served.url, headers=in_session({}, other), json=LIST)).status_code == 200

            assert (await one.delete(served.url, headers=in_session({}, first))).status_code == 200
            assert (await open_session(one, served.url, {})).status_code == 200
    finally:
        stop_bastion(served)


async def test_http_sse_sessions_count_toward_the_quota_and_the_bound(tmp_path) -> None:
    keys = make_keys(tmp_path, "carol", "dave")
    carol, dave = keys["carol"], keys["dave"]
    served = start_bastion(tmp_path, {"max_sessions": 3, "max_sessions_per_identity": 2},
                           auth={"api_keys": "keys.json"}, extra_args=("-v",))
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            stream = await open_sse(http, served, carol)
            assert isinstance(stream, SseOpen)
            assert (await open_session(http, served.url, carol)).status_code == 200
            # the stream and the Streamable HTTP session are carol's two
            assert_over_quota(await http.post(served.url, headers={**carol, "accept": ACCEPT}, json=initialize()),
                              "http.max_sessions_per_identity", 2)
            assert_over_quota(await open_sse(http, served, carol), "http.max_sessions_per_identity", 2, None)

            assert (await open_session(http, served.url, dave)).status_code == 200
            # three sessions open, the stream among them: the gateway's bound, for everyone
            full = await open_sse(http, served, dave)
            assert isinstance(full, httpx2.Response) and full.status_code == 503
            assert "(http.max_sessions)" in full.json()["error"]["message"]
            assert full.headers["retry-after"] == str(full.json()["error"]["data"]["retryAfterSeconds"])

            # closing the stream ends that session, and its place is carol's again
            await stream.close()
            await wait_for_log(served, f"HTTP+SSE session {stream.id[:8]}… ended: its stream closed")
            assert (await open_session(http, served.url, carol)).status_code == 200
    finally:
        stop_bastion(served)


def test_the_quotas_are_validated_against_the_bound() -> None:
    defaults = HttpConfig()
    assert defaults.max_sessions_per_identity == defaults.max_sessions_per_address == 100 < defaults.max_sessions
    assert HttpConfig(max_sessions=2).max_sessions_per_identity == 100  # the default quota is simply never reached
    for key in ("max_sessions_per_identity", "max_sessions_per_address"):
        with pytest.raises(ValidationError, match=rf"http.{key} \(20\) is more than http.max_sessions \(10\)"):
            HttpConfig(max_sessions=10, **{key: 20})
        with pytest.raises(ValidationError):
            HttpConfig(**{key: 0})
        assert getattr(HttpConfig(max_sessions=10, **{key: 10}), key) == 10


def test_an_ipv6_client_counts_by_its_64() -> None:
    assert address_block("2001:db8:1:2:aaaa::1") == address_block("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_block("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert address_block("fe80::1%eth0") == "fe80::/64"
    assert address_block("::ffff:192.0.2.7") == address_block("192.0.2.7") == "192.0.2.7"
    assert address_block("") == ""


async def open_listen(http: httpx2.AsyncClient, served: Served, headers: dict[str, str],
                      listen_id: str) -> SseOpen | httpx2.Response:
    """A 2026-07-28 subscriptions/listen held open once acknowledged, or the refusal read whole."""
    from tests.http.test_sdk_clients import MODERN_META
    stack = AsyncExitStack()
    response = await stack.enter_async_context(http.stream("POST", served.url, headers={
        **headers, "accept": ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": "subscriptions/listen"},
        json={"jsonrpc": "2.0", "id": listen_id, "method": "subscriptions/listen",
              "params": {"notifications": {"toolsListChanged": True}, "_meta": MODERN_META}}))
    if response.status_code != 200 or not response.headers["content-type"].startswith("text/event-stream"):
        await response.aread()
        await stack.aclose()
        return response
    lines = response.aiter_lines()
    async for line in lines:
        if line.startswith("data: ") and "notifications/subscriptions/acknowledged" in line:
            return SseOpen(stack, lines, listen_id)
    raise AssertionError("the listen stream ended before its acknowledgement")


async def test_an_open_listen_stream_counts_against_its_callers_quota(tmp_path) -> None:
    """A 2026-07-28 listen is state the gateway keeps as long as the client likes: without a quota one caller could
    hold every connection with them. It counts as a session does, and frees its place when it closes."""
    keys = make_keys(tmp_path, "alice", "bob")
    alice, bob = keys["alice"], keys["bob"]
    served = start_bastion(tmp_path, {"max_sessions_per_identity": 2}, auth={"api_keys": "keys.json"})
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            first = await open_listen(http, served, alice, "l1")
            assert isinstance(first, SseOpen)
            assert (await open_session(http, served.url, alice)).status_code == 200
            refused = await open_listen(http, served, alice, "l3")
            assert isinstance(refused, httpx2.Response)
            assert_over_quota(refused, "http.max_sessions_per_identity", 2, "l3")
            assert "subscriptions/listen stream" in refused.json()["error"]["message"]
            theirs = await open_listen(http, served, bob, "b1")  # another caller is not affected
            assert isinstance(theirs, SseOpen)
            await first.close()
            # the gateway sees the stream close a moment later: until then the place is still alice's
            deadline = time.monotonic() + 60
            while isinstance(again := await open_listen(http, served, alice, "l4"), httpx2.Response):
                assert again.status_code == 429 and time.monotonic() < deadline, again.text
            await again.close()
            await theirs.close()
    finally:
        stop_bastion(served)
