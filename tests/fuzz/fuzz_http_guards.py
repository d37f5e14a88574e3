"""The HTTP frontend's pure header checks (``bastion.frontends.http.guards``, ``wire.headers_of`` and the mirrored
headers' value form) on random headers.

Oracle: each returns what it documents and nothing else (a reason string or None, a bool, a ``Peer``); the Host
check refuses every host outside the allowed set; a forwarded header is believed only from a trusted proxy; the
``=?base64?…?=`` form decodes back to every text it encodes; the mirrored-header checks find no mismatch in the
headers written from the same body, and a mismatch once a mirrored value is changed; a ``Last-Event-ID`` gives a
number only when it is ASCII digits, and then the number they spell."""

from __future__ import annotations

import atheris

from bastion.frontends.http.guards import (
    LOOPBACK_NAMES,
    OriginGuard,
    TrustedProxies,
    accepts,
    host_without_port,
    is_json_content,
    modern_header_mismatch,
    param_header_mismatch,
)
from bastion.frontends.http.streams import event_number
from bastion.frontends.http.wire import headers_of
from bastion.protocol.mirrored_headers import decode_header_value, encode_header_value, rendered
from tests.fuzz.common import json_value

HOSTS = ["localhost", "127.0.0.1", "[::1]:8080", "LOCALHOST:1", "example.com", "evil.com:80", "[::1", "::1", "", " "]
ORIGINS = ["http://localhost:3000", "null", "https://app.example.com/", "http://[::1]", "*", "http://127.0.0.1."]
PROXIES = TrustedProxies(["10.0.0.0/8", "::1/128"])
ALLOWED = ["app.example.com", "localhost"]


def _text(fdp: atheris.FuzzedDataProvider, choices: list[str]) -> str:
    return fdp.PickValueInList(choices) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(
        fdp.ConsumeIntInRange(0, 40))


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    raw = [(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)).lower() or b"host",
            fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    headers = headers_of({"headers": raw})
    for name, value in raw:  # every field kept, under its name in lower case, without the whitespace around it
        assert value.decode("latin-1").strip() in headers[name.decode("latin-1").lower()], (raw, headers)
    headers["host"] = _text(fdp, HOSTS)
    if fdp.ConsumeBool():
        headers["x-forwarded-for"] = ", ".join(_text(fdp, ["10.1.1.1", "8.8.8.8", "::1", ""]) for _ in range(3))
        headers["x-forwarded-host"] = _text(fdp, HOSTS)
        headers["x-forwarded-proto"] = _text(fdp, ["https", "http", "gopher"])
    address = _text(fdp, ["10.0.0.1", "8.8.8.8", "::1", "not an address"])
    peer = PROXIES.resolve(address, "http", headers)
    assert peer.scheme in ("http", "https")
    if not PROXIES.trusts(address):
        assert peer.address == address and peer.host == host_without_port(headers["host"]), peer
    guard = OriginGuard(bound_to_loopback=fdp.ConsumeBool(), allowed_hosts=ALLOWED if fdp.ConsumeBool() else [],
                        allowed_origins=[fdp.PickValueInList(ORIGINS)] if fdp.ConsumeBool() else [])
    origin = _text(fdp, ORIGINS) if fdp.ConsumeBool() else None
    refusal = guard.refusal(peer, origin)
    assert refusal is None or isinstance(refusal, str)
    if guard._hosts and peer.host not in guard._hosts:
        assert refusal is not None and "Host" in refusal
    if refusal is None and origin is not None and not guard._any_origin:
        allowed = origin.rstrip("/").lower() in guard._origins
        assert allowed or peer.host in LOOPBACK_NAMES, (origin, peer)
    assert accepts(_text(fdp, ["application/json", "*/*", "text/*;q=1", ""]), "text/event-stream") in (True, False)
    assert is_json_content(_text(fdp, ["application/json; charset=utf-8", "APPLICATION/JSON", "text/json"])) in (
        True, False)
    event_id = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24)).decode("latin-1")  # Last-Event-ID, as headers_of reads it
    number = event_number(event_id)
    assert number is None or (event_id.isascii() and event_id.isdigit() and number == int(event_id)), event_id
    _mirrored(fdp)


def _mirrored(fdp: atheris.FuzzedDataProvider) -> None:
    text = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 30))
    encoded = encode_header_value(text)
    assert encoded.isascii() and encoded == encoded.strip() and decode_header_value(encoded) == text, (text, encoded)
    decode_header_value(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 30)))  # None or text, never raises
    value = json_value(fdp, 4)
    schema = {"type": "object", "properties": {"q": {"type": "string", "x-mcp-header": "Q"},
                                               "deep": {"properties": {"n": {"x-mcp-header": "N"}}}}}
    arguments = {"q": value, "deep": {"n": json_value(fdp, 4)}} if fdp.ConsumeBool() else json_value(fdp, 3)
    params = {"name": fdp.ConsumeUnicodeNoSurrogates(8), "arguments": arguments,
              "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    written = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
               "mcp-name": encode_header_value(params["name"])}
    if isinstance(arguments, dict):
        for token, at in (("q", arguments.get("q")), ("n", (arguments.get("deep") or {}).get("n")
                                                        if isinstance(arguments.get("deep"), dict) else None)):
            if rendered(at) is not None:
                written[f"mcp-param-{token}"] = encode_header_value(rendered(at))
    assert modern_header_mismatch(body, written, "2026-07-28") is None, (body, written)
    assert param_header_mismatch(schema, arguments, written) is None, (arguments, written)
    if "mcp-param-q" in written:
        changed = dict(written, **{"mcp-param-q": encode_header_value(rendered(value) + "x")})
        assert param_header_mismatch(schema, arguments, changed) is not None, (arguments, changed)
    fuzzed = {name: fdp.ConsumeUnicodeNoSurrogates(12) for name in list(written)[:fdp.ConsumeIntInRange(0, 5)]}
    for verdict in (modern_header_mismatch(body, fuzzed, json_value(fdp, 5)), param_header_mismatch(
            json_value(fdp, 2), arguments, fuzzed)):
        assert verdict is None or isinstance(verdict, str)
