"""The pure header decisions of the HTTP frontend: forwarded headers believed only from trusted proxies, Host and
Origin checks against DNS rebinding, and the 2026-07-28 routing headers."""

from __future__ import annotations

import base64

from bastion.frontends.http.guards import (
    OriginGuard,
    Peer,
    TrustedProxies,
    accepts,
    modern_header_mismatch,
    param_header_mismatch,
)

FORWARDED = {"host": "127.0.0.1:8080", "x-forwarded-for": "203.0.113.9, 10.0.0.7", "x-forwarded-proto": "https",
             "x-forwarded-host": "gateway.example.com"}


def test_forwarded_headers_from_an_untrusted_peer_are_ignored() -> None:
    assert TrustedProxies([]).resolve("10.0.0.5", "http", FORWARDED) == Peer("10.0.0.5", "http", "127.0.0.1")
    assert TrustedProxies(["192.168.0.0/16"]).resolve("10.0.0.5", "http", FORWARDED).address == "10.0.0.5"


def test_a_trusted_proxy_chain_is_walked_from_the_right_past_trusted_hops() -> None:
    peer = TrustedProxies(["10.0.0.0/8"]).resolve("10.0.0.5", "http", FORWARDED)
    assert peer == Peer("203.0.113.9", "https", "gateway.example.com")
    # A client cannot plant an address by sending its own X-Forwarded-For: only the hop the proxy added counts.
    planted = {**FORWARDED, "x-forwarded-for": "127.0.0.1, 198.51.100.4"}
    assert TrustedProxies(["10.0.0.0/8"]).resolve("10.0.0.5", "http", planted).address == "198.51.100.4"


def test_a_loopback_bind_answers_loopback_hosts_and_pages_only() -> None:
    guard = OriginGuard(bound_to_loopback=True, allowed_hosts=[], allowed_origins=[])
    local = Peer("127.0.0.1", "http", "localhost")
    assert guard.refusal(local, None) is None
    assert guard.refusal(local, "http://localhost:3000") is None
    assert "Origin" in guard.refusal(local, "https://evil.example")
    assert "Host" in guard.refusal(Peer("127.0.0.1", "http", "evil.example"), None)  # a rebound DNS name
    assert "Origin" in guard.refusal(local, "null")


def test_configured_hosts_and_origins() -> None:
    guard = OriginGuard(bound_to_loopback=False, allowed_hosts=["gateway.example.com:443"],
                        allowed_origins=["https://app.example.com/"])
    public = Peer("203.0.113.9", "https", "gateway.example.com")
    assert guard.refusal(public, "https://app.example.com") is None
    assert guard.refusal(public, "http://localhost:3000") is not None  # loopback pages only reach loopback names
    assert guard.refusal(Peer("203.0.113.9", "https", "other.example.com"), None) is not None
    anything = OriginGuard(bound_to_loopback=False, allowed_hosts=[], allowed_origins=["*"])
    assert anything.refusal(Peer("203.0.113.9", "https", "any.example"), "https://x.example") is None


def test_modern_routing_headers_must_agree_with_the_body() -> None:
    body = {"method": "tools/call", "params": {"name": "fx__café"}}
    encoded = "=?base64?" + base64.b64encode("fx__café".encode()).decode() + "?="
    good = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": encoded}
    assert modern_header_mismatch(body, good, "2026-07-28") is None
    assert "MCP-Protocol-Version" in modern_header_mismatch(body, {**good, "mcp-protocol-version": "2025-11-25"},
                                                            "2026-07-28")
    assert "Mcp-Method" in modern_header_mismatch(body, {**good, "mcp-method": "tools/list"}, "2026-07-28")
    assert "Mcp-Name" in modern_header_mismatch(body, {**good, "mcp-name": "fx__other"}, "2026-07-28")
    assert "MCP-Protocol-Version" in modern_header_mismatch(body, {"mcp-method": "tools/call"}, "2026-07-28")


def test_accept_headers() -> None:
    assert accepts(None, "application/json") and accepts("*/*", "text/event-stream")
    assert accepts("application/json, text/event-stream", "text/event-stream")
    assert accepts("text/*;q=0.5", "text/event-stream") and not accepts("text/html", "application/json")


def test_param_headers_must_agree_with_the_arguments_their_schema_marks() -> None:
    schema = {"type": "object", "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "count": {"type": "integer", "x-mcp-header": "Count"},
        "options": {"type": "object", "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry"}}},
        "note": {"type": "string"}}}
    arguments = {"region": "eu-west", "count": 3, "options": {"dry": True}, "note": "not mirrored"}
    good = {"mcp-param-region": "eu-west", "mcp-param-count": "3", "mcp-param-dry": "true"}
    assert param_header_mismatch(schema, arguments, good) is None
    assert param_header_mismatch(schema, arguments, {**good, "mcp-param-count": "3.0"}) is None  # numerically equal
    encoded = "=?base64?" + base64.b64encode(b"eu-west").decode() + "?="
    assert param_header_mismatch(schema, arguments, {**good, "mcp-param-region": encoded}) is None
    assert "does not match" in param_header_mismatch(schema, arguments, {**good, "mcp-param-region": "us-east"})
    assert "missing" in param_header_mismatch(schema, arguments, {k: v for k, v in good.items() if "dry" not in k})
    absent = {"count": 3, "options": {"dry": True}}
    assert "absent" in param_header_mismatch(schema, absent, good)
    assert param_header_mismatch(schema, absent, {k: v for k, v in good.items() if "region" not in k}) is None
    assert "malformed" in param_header_mismatch(schema, arguments, {**good, "mcp-param-region": "=?base64?%%?="})
    assert param_header_mismatch({"type": "object"}, arguments, {}) is None
