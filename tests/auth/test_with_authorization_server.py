"""Bastion's HTTP frontend against a real OAuth 2.1 authorization server (tests/fixtures/oauth_server.py): first that
the server issues what the other tests rely on, then the gateway as a resource server with real tokens."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from joserfc.jws import extract_compact
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.auth.conftest import GATEWAY_CLIENT, PUBLIC_CLIENT, SERVER, SERVICE_CLIENT, Gateway, gateway
from tests.fixtures.oauth_server import AuthorizationServer, running
from tests.support import free_port, wait_for

RESOURCE = "http://127.0.0.1:8931/mcp"


def _verify(server, token: str) -> dict:
    """The claims of ``token`` as a verifier that trusts only the server's published JWKS and RS256/ES256 sees
    them."""
    keys = KeySet.import_key_set(server.jwks())
    return dict(jwt.decode(token, keys, algorithms=["RS256", "ES256"]).claims)


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


# -- the authorization server itself ---------------------------------------------------------------------------


def test_metadata_names_the_issuer_and_every_endpoint(authorization_server):
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
        meta = httpx2.get(authorization_server.issuer + path).json()
        assert meta["issuer"] == authorization_server.issuer
        assert meta["jwks_uri"] == authorization_server.jwks_uri
        assert meta["token_endpoint"] == authorization_server.token_endpoint
        assert meta["introspection_endpoint"] == authorization_server.introspection_endpoint
        assert meta["code_challenge_methods_supported"] == ["S256"]
        assert meta["authorization_response_iss_parameter_supported"] is True


def test_client_credentials_token_verifies_against_its_jwks(authorization_server):
    answer = authorization_server.client_credentials(*SERVICE_CLIENT, scope="mcp:read mcp:tools", resource=RESOURCE)
    claims = _verify(authorization_server, answer["access_token"])
    assert claims["iss"] == authorization_server.issuer
    assert claims["aud"] == RESOURCE  # RFC 8707: the resource asked for is the audience
    assert claims["sub"] == SERVICE_CLIENT[0]
    assert claims["scope"] == "mcp:read mcp:tools"
    assert claims["exp"] > claims["iat"]
    header = extract_compact(answer["access_token"].encode()).protected
    assert header["alg"] == "RS256"
    assert header["kid"] in [k["kid"] for k in authorization_server.jwks()["keys"]]


def test_minted_tokens_are_what_they_claim_to_be(authorization_server):
    good = authorization_server.mint(sub="bob", aud=RESOURCE, scope=["mcp:read"], expires_in=-60)
    # expired, but correctly signed: a verifier that checks signatures only accepts it
    assert _verify(authorization_server, good["access_token"])["exp"] < good["claims"]["iat"]
    assert good["claims"]["groups"] == ["sales", "staff"]
    for forged in ("none", "hs256-with-public-key", "unpublished"):
        token = authorization_server.token(aud=RESOURCE, sign_with=forged)
        with pytest.raises((JoseError, ValueError)):
            _verify(authorization_server, token)


def test_rotation_publishes_the_new_key_and_keeps_the_old_until_dropped(authorization_server):
    before = authorization_server.token(aud=RESOURCE)
    rotated = authorization_server.rotate()
    after = authorization_server.token(aud=RESOURCE)
    assert extract_compact(after.encode()).protected["kid"] == rotated["kid"] != rotated["previous"]
    assert _verify(authorization_server, before) and _verify(authorization_server, after)
    authorization_server.rotate(drop_old=True)
    with pytest.raises((JoseError, ValueError)):
        _verify(authorization_server, before)


def test_authorization_code_with_pkce_refresh_and_token_exchange(authorization_server):
    verifier, challenge = _pkce()
    redirect = "http://127.0.0.1:9/callback"
    answer = httpx2.get(authorization_server.authorization_endpoint, params={
        "response_type": "code", "client_id": PUBLIC_CLIENT, "redirect_uri": redirect, "state": "s-1",
        "code_challenge": challenge, "code_challenge_method": "S256", "login_hint": "bob", "resource": RESOURCE,
        "scope": "mcp:read"})
    assert answer.status_code == 302
    query = parse_qs(urlsplit(answer.headers["location"]).query)
    assert query["state"] == ["s-1"] and query["iss"] == [authorization_server.issuer]
    form = {"grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": redirect,
            "client_id": PUBLIC_CLIENT}
    refused = httpx2.post(authorization_server.token_endpoint, data={**form, "code_verifier": "x" * 43})
    assert refused.status_code == 400  # PKCE: the wrong verifier gets nothing
    # (a failed verifier does not spend the code here; a fresh authorization would be needed on a stricter server)
    tokens = httpx2.post(authorization_server.token_endpoint, data={**form, "code_verifier": verifier}).json()
    claims = _verify(authorization_server, tokens["access_token"])
    assert (claims["sub"], claims["aud"], claims["groups"]) == ("bob", RESOURCE, ["sales", "staff"])

    refreshed = httpx2.post(authorization_server.token_endpoint, data={
        "grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], "client_id": PUBLIC_CLIENT}).json()
    assert _verify(authorization_server, refreshed["access_token"])["aud"] == RESOURCE
    replay = httpx2.post(authorization_server.token_endpoint, data={
        "grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], "client_id": PUBLIC_CLIENT})
    assert replay.status_code == 400  # refresh tokens rotate: the old one is spent

    exchanged = httpx2.post(authorization_server.token_endpoint, auth=GATEWAY_CLIENT, data={
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "subject_token": refreshed["access_token"],
        "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "resource": "http://127.0.0.1:9/upstream"}).json()
    claims = _verify(authorization_server, exchanged["access_token"])
    assert (claims["sub"], claims["aud"], claims["act"]) == ("bob", "http://127.0.0.1:9/upstream",
                                                             {"sub": GATEWAY_CLIENT[0]})


def test_a_user_who_refuses_is_redirected_with_access_denied(authorization_server):
    _, challenge = _pkce()
    answer = httpx2.get(authorization_server.authorization_endpoint, params={
        "response_type": "code", "client_id": PUBLIC_CLIENT, "redirect_uri": "http://127.0.0.1:9/cb", "state": "s-2",
        "code_challenge": challenge, "code_challenge_method": "S256", "login_hint": "deny"})
    query = parse_qs(urlsplit(answer.headers["location"]).query)
    assert (answer.status_code, query["error"], query["state"]) == (302, ["access_denied"], ["s-2"])
    assert "code" not in query


def test_introspection_and_revocation(authorization_server):
    token = authorization_server.token(aud=RESOURCE, scope="mcp:read", format="opaque")
    ask = lambda: httpx2.post(authorization_server.introspection_endpoint, data={"token": token},  # noqa: E731
                              auth=GATEWAY_CLIENT).json()
    assert ask()["active"] is True and ask()["aud"] == RESOURCE
    authorization_server.revoke(token)
    assert ask() == {"active": False}
    assert authorization_server.stats()["introspect"] == 3


def test_jwks_down_and_counted(authorization_server):
    authorization_server.stats(reset=True)
    authorization_server.jwks_mode("down")
    assert httpx2.get(authorization_server.jwks_uri).status_code == 503
    authorization_server.jwks_mode("ok")
    assert httpx2.get(authorization_server.jwks_uri).status_code == 200
    assert authorization_server.stats()["jwks"] == 2


# -- the gateway as a resource server, with real tokens ----------------------------------------------------------

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "auth-e2e", "version": "1"}}}
ACCEPT = "application/json, text/event-stream"
READ, TOOLS = "mcp:read", "mcp:tools"


def _auth_table(server, resource: str, **settings) -> dict:
    """Trust ``server`` (its jwks_uri found through its metadata); every request needs mcp:read, tools/call also
    mcp:tools."""
    return {"resource": resource, "issuers": [{"issuer": server.issuer}], "scopes": [READ],
            "method_scopes": {"tools/call": [TOOLS]}, **settings}


def _post(gw: Gateway, body: dict | None = None, *, token: str | None = None, authorization=None,
          headers: dict | None = None) -> httpx2.Response:
    sent = {"accept": ACCEPT, "content-type": "application/json", **(headers or {})}
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    if authorization is not None:
        sent["authorization"] = authorization
    return httpx2.post(gw.url, json=body or INITIALIZE, headers=sent, timeout=60)


def _params(challenge: str) -> dict[str, str]:
    """The auth-params of a Bearer challenge (RFC 6750 §3)."""
    assert challenge.startswith("Bearer"), challenge
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', challenge))


def _wait_until(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _tampered_payload(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"], claims["scope"] = "root", f"{READ} {TOOLS} mcp:admin"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def _tampered_signature(token: str) -> str:
    header, payload, signature = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[len(raw) // 2] ^= 0x01
    return f"{header}.{payload}." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@dataclass
class Shared:
    """One authorization server and one gateway for the tests that change neither; every token they used, to look
    for in the gateway's logs at the end."""

    server: AuthorizationServer
    gateway: Gateway
    resource: str
    other: AuthorizationServer  # a second, untrusted authorization server
    used: list[str]

    def token(self, **fields) -> str:
        fields.setdefault("aud", self.resource)
        fields.setdefault("scope", READ)
        token = self.server.token(**fields)
        self.used.append(token)
        return token

    def keep(self, token: str) -> str:
        self.used.append(token)
        return token


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[Shared]:
    with running(":".join(GATEWAY_CLIENT), PUBLIC_CLIENT, ":".join(SERVICE_CLIENT)) as server, \
            running(":".join(SERVICE_CLIENT)) as other:
        port = free_port()
        resource = f"http://127.0.0.1:{port}/mcp"
        with gateway(tmp_path_factory.mktemp("auth-e2e"), _auth_table(server, resource), port=port) as gw:
            yield Shared(server, gw, resource, other, [])


def test_protected_resource_metadata_names_the_resource_and_its_authorization_server(shared):
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        answer = httpx2.get(shared.gateway.base + path, timeout=30)
        assert answer.status_code == 200, path
        meta = answer.json()
        assert meta["resource"] == shared.resource
        assert meta["authorization_servers"] == [shared.server.issuer]
        assert set(meta.get("scopes_supported", [])) == {READ, TOOLS}


def test_no_token_is_401_with_a_challenge_naming_the_metadata(shared):
    answer = _post(shared.gateway)
    assert answer.status_code == 401
    params = _params(answer.headers["www-authenticate"])
    metadata = httpx2.get(params["resource_metadata"], timeout=30)
    assert metadata.status_code == 200 and metadata.json()["resource"] == shared.resource


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # auto speaks 2026-07-28 to Bastion: every request alone
async def test_an_sdk_client_with_a_real_token_lists_and_calls_tools(shared, mode):
    token = shared.token(sub="alice", scope=f"{READ} {TOOLS}")
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=120))
    async with Client(streamable_http_client(shared.gateway.url, http_client=http), mode=mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {f"{SERVER}__remember", f"{SERVER}__recall"} <= names
        await client.call_tool(f"{SERVER}__remember", {"text": "signed by a real authorization server"})
        recalled = await client.call_tool(f"{SERVER}__recall", {})
        assert "signed by a real authorization server" in recalled.content[0].text


def test_a_client_credentials_token_for_this_resource_is_accepted(shared):
    answer = shared.server.client_credentials(*SERVICE_CLIENT, scope=READ, resource=shared.resource)
    assert _post(shared.gateway, token=shared.keep(answer["access_token"])).status_code == 200


def test_an_es256_token_is_accepted_and_an_algorithm_off_the_allow_list_is_not(shared):
    assert _post(shared.gateway, token=shared.token(sign_with="ec")).status_code == 200
    _assert_refused(shared.gateway, shared.token(alg="RS384"), "algorithm_not_allowed")  # not in the default list


# case -> (what /admin/token is asked for, the reason kind the gateway's refusal log line names)
REFUSED = {
    "expired": (dict(expires_in=-3600), "expired"),
    "expired beyond the clock skew": (dict(expires_in=-120), "expired"),
    "not yet valid": (dict(nbf_in=3600), "not_yet_valid"),
    "issued in the future": (dict(claims={"iat": int(time.time()) + 3600}), "not_yet_valid"),
    "without exp": (dict(omit=["exp"]), "no_expiry"),
    "wrong audience": (dict(aud="http://127.0.0.1:1/another-resource/mcp"), "wrong_audience"),
    "no audience": (dict(omit=["aud"]), "wrong_audience"),
    "wrong issuer": (dict(claims={"iss": "http://127.0.0.1:1"}), "unknown_issuer"),
    "alg none": (dict(sign_with="none"), "algorithm_not_allowed"),
    "HS256 signed with the RSA public key": (dict(sign_with="hs256-with-public-key"), "algorithm_not_allowed"),
    "unknown kid": (dict(sign_with="unpublished"), "unknown_key"),
    "kid of the current key, signed by another": (dict(sign_with="unpublished", kid="__current__"),
                                                  "bad_signature"),
}


def _refusals(gw: Gateway, reason: str) -> int:
    return gw.stderr.read_text(errors="replace").count(f": {reason} (HTTP 401)")


def _assert_refused(gw: Gateway, token: str, reason: str) -> httpx2.Response:
    """401 invalid_token, for the right reason: which only the log says (the client is told as little as
    possible)."""
    before = _refusals(gw, reason)
    answer = _post(gw, token=token)
    assert answer.status_code == 401, (reason, answer.text)
    assert _params(answer.headers["www-authenticate"])["error"] == "invalid_token"
    assert _wait_until(lambda: _refusals(gw, reason) > before), reason
    return answer


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_tokens_are_refused_with_401_invalid_token(shared, case):
    fields, reason = dict(REFUSED[case][0]), REFUSED[case][1]
    if fields.get("kid") == "__current__":
        fields["kid"] = shared.server.jwks()["keys"][0]["kid"]
    token = shared.token(**fields)
    answer = _assert_refused(shared.gateway, token, reason)
    assert _params(answer.headers["www-authenticate"])["resource_metadata"].startswith(shared.gateway.base)
    signature = token.split(".")[-1]
    assert token not in answer.text and (not signature or signature not in answer.headers["www-authenticate"])


@pytest.mark.parametrize("tamper", [_tampered_payload, _tampered_signature])
def test_tampered_tokens_are_refused(shared, tamper):
    good = shared.token(scope=READ)
    assert _post(shared.gateway, token=good).status_code == 200
    _assert_refused(shared.gateway, shared.keep(tamper(good)), "bad_signature")


def test_a_token_for_another_resource_replayed_here_is_refused(shared):
    # A real grant for another MCP server (RFC 8707 resource), which that server could replay against this one.
    elsewhere = shared.server.client_credentials(*SERVICE_CLIENT, scope=READ,
                                                 resource="http://127.0.0.1:1/elsewhere/mcp")["access_token"]
    _assert_refused(shared.gateway, shared.keep(elsewhere), "wrong_audience")
    # ...and a grant without any resource names the client as its audience, not this gateway
    unbound = shared.server.client_credentials(*SERVICE_CLIENT, scope=READ)["access_token"]
    _assert_refused(shared.gateway, shared.keep(unbound), "wrong_audience")


def test_a_token_of_an_untrusted_authorization_server_is_refused(shared):
    foreign = shared.other.token(aud=shared.resource, scope=READ)
    _assert_refused(shared.gateway, shared.keep(foreign), "unknown_issuer")
    # the same server claiming the trusted issuer: its key is in no JWKS the gateway trusts
    claimed = shared.other.token(aud=shared.resource, scope=READ, claims={"iss": shared.server.issuer})
    _assert_refused(shared.gateway, shared.keep(claimed), "unknown_key")


def test_clock_skew_is_allowed_within_the_configured_bound(shared):
    # default auth.clock_skew_seconds = 60
    assert _post(shared.gateway, token=shared.token(expires_in=-20)).status_code == 200
    assert _post(shared.gateway, token=shared.token(nbf_in=20)).status_code == 200
    _assert_refused(shared.gateway, shared.token(nbf_in=600), "not_yet_valid")


def test_missing_scopes_are_403_insufficient_scope_naming_what_is_needed(shared):
    answer = _post(shared.gateway, token=shared.token(scope="mcp:other"))
    assert answer.status_code == 403
    params = _params(answer.headers["www-authenticate"])
    assert params["error"] == "insufficient_scope" and params["scope"].split() == [READ]
    assert params["resource_metadata"].startswith(shared.gateway.base)

    reader = shared.token(scope=READ)
    session = _post(shared.gateway, token=reader)
    assert session.status_code == 200
    sid = {"mcp-session-id": session.headers["mcp-session-id"]}
    _post(shared.gateway, {"jsonrpc": "2.0", "method": "notifications/initialized"}, token=reader, headers=sid)
    listed = _post(shared.gateway, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, token=reader, headers=sid)
    assert listed.status_code == 200
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": f"{SERVER}__recall",
                                                                          "arguments": {}}}
    refused = _post(shared.gateway, call, token=reader, headers=sid)
    assert refused.status_code == 403
    params = _params(refused.headers["www-authenticate"])
    assert params["error"] == "insufficient_scope" and set(params["scope"].split()) == {READ, TOOLS}


def test_a_session_belongs_to_the_caller_whose_token_opened_it(shared):
    alice = shared.token(sub="alice", scope=f"{READ} {TOOLS}")
    bob = shared.token(sub="bob", scope=f"{READ} {TOOLS}")
    opened = _post(shared.gateway, token=alice)
    sid = {"mcp-session-id": opened.headers["mcp-session-id"]}
    _post(shared.gateway, {"jsonrpc": "2.0", "method": "notifications/initialized"}, token=alice, headers=sid)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert _post(shared.gateway, listing, token=bob, headers=sid).status_code == 403
    assert _post(shared.gateway, listing, token=alice, headers=sid).status_code == 200
    # another token of alice's (a refreshed one) is still alice
    again = shared.token(sub="alice", scope=f"{READ} {TOOLS}")
    assert _post(shared.gateway, listing, token=again, headers=sid).status_code == 200


def _raw_status(gw: Gateway, *header_lines: bytes) -> int:
    """POST an initialize with exactly these header lines, over a plain socket (no client library tidies them)."""
    body = json.dumps(INITIALIZE).encode()
    host, port = urlsplit(gw.base).hostname, urlsplit(gw.base).port
    head = [b"POST /mcp HTTP/1.1", f"host: {host}:{port}".encode(), b"accept: " + ACCEPT.encode(),
            b"content-type: application/json", f"content-length: {len(body)}".encode(), b"connection: close",
            *header_lines]
    with socket.create_connection((host, port), timeout=60) as conn:
        conn.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        received = b""
        while b"\r\n" not in received:
            chunk = conn.recv(4096)
            if not chunk:
                break
            received += chunk
    return int(received.split(b" ", 2)[1])


def test_malformed_authorization_headers_are_refused_and_the_gateway_keeps_serving(shared):
    good = shared.token().encode()
    for lines, statuses in [
        ([b"authorization: Bearer"], (400, 401)),
        ([b"authorization: Bearer "], (400, 401)),
        ([b"authorization: Bearer " + good + b" extra"], (400,)),
        ([b"authorization: Bearer a,b"], (400,)),
        ([b"authorization: Bearer \xe4\xf6"], (400,)),
        ([b"authorization: Basic dXNlcjpwYXNzd29yZA=="], (401,)),  # no bearer token presented at all
        ([b"authorization: Bearer " + b"A" * 20000], (400,)),  # beyond auth.max_token_bytes
        ([b"authorization: Bearer x.y.z"], (401,)),  # the shape of a JWT, but none
        ([b"authorization: Bearer e30.e30."], (401,)),  # {}.{}. : empty claims, no signature
        ([b"authorization: Bearer " + good, b"authorization: Bearer another"], (400, 401)),  # two of them
    ]:
        assert _raw_status(shared.gateway, *lines) in statuses, lines[0][:40]
    assert _raw_status(shared.gateway, b"authorization: bearer " + good) == 200  # the scheme is case-blind
    assert _raw_status(shared.gateway, b"authorization: Bearer " + good) == 200


def test_a_huge_header_does_not_take_the_gateway_down(shared):
    try:
        answer = _post(shared.gateway, authorization="Bearer " + "A" * 200_000)
        assert answer.status_code in (400, 413, 431)
    except httpx2.HTTPError:
        pass  # the HTTP server may close a connection whose headers are too large: also a refusal
    assert _post(shared.gateway, token=shared.token()).status_code == 200


def test_zz_no_token_is_ever_in_the_gateways_logs(shared):
    """Last in the module: every token the tests above sent, good, bad or forged, is absent from everything the
    gateway wrote."""
    assert _post(shared.gateway, token=shared.token()).status_code == 200
    refusals = shared.gateway.logged().count(": expired (HTTP 401)")
    assert _post(shared.gateway, token=shared.token(expires_in=-3600)).status_code == 401
    # The refusal's log line is the gateway's last word on these requests: once it is in the file, all is.
    assert wait_for(lambda: shared.gateway.logged().count(": expired (HTTP 401)") > refusals)
    logged = shared.gateway.logged()
    assert "serving MCP on" in logged
    for token in shared.used:
        assert token not in logged
        signature = token.rsplit(".", 1)[-1]
        if len(signature) > 16:
            assert signature not in logged


# -- key rotation and an issuer in trouble: a gateway and an authorization server of their own -------------------


def test_a_rotated_in_key_is_found_by_one_refetch(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    auth = _auth_table(authorization_server, resource, jwks_min_refetch_seconds=1)
    with gateway(tmp_path, auth, port=port) as gw:
        before = authorization_server.token(aud=resource, scope=READ)
        assert _post(gw, token=before).status_code == 200
        assert authorization_server.stats()["jwks"] == 1
        time.sleep(1.2)  # past jwks_min_refetch_seconds, so an unknown kid may fetch the key set again
        rotated = authorization_server.rotate()
        after = authorization_server.token(aud=resource, scope=READ)
        assert extract_compact(after.encode()).protected["kid"] == rotated["kid"]
        assert _post(gw, token=after).status_code == 200
        assert authorization_server.stats()["jwks"] == 2
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ, sign_with="old")).status_code \
            == 200  # the old key is still published
        assert authorization_server.stats()["jwks"] == 2

        # the old key dropped: once the gateway has the new set, a token it accepted before is refused
        time.sleep(1.2)
        newest = authorization_server.rotate(drop_old=True)
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        assert authorization_server.stats()["jwks"] == 3
        assert before != after and rotated["kid"] != newest["kid"]
        _assert_refused(gw, before, "unknown_key")
        _assert_refused(gw, after, "unknown_key")


def test_an_unknown_kid_is_refused_without_fetching_the_keys_in_a_loop(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    with gateway(tmp_path, _auth_table(authorization_server, resource), port=port) as gw:  # default: 30 s
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        for _ in range(10):
            stranger = authorization_server.token(aud=resource, scope=READ, sign_with="unpublished")
            assert _post(gw, token=stranger).status_code == 401
        assert authorization_server.stats()["jwks"] <= 2  # at most one refetch for ten unknown kids, never ten


def test_cached_keys_keep_working_while_the_jwks_endpoint_is_down(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    auth = _auth_table(authorization_server, resource, jwks_refresh_seconds=1, jwks_min_refetch_seconds=1)
    with gateway(tmp_path, auth, port=port) as gw:
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        authorization_server.jwks_mode("down")
        time.sleep(1.2)  # the key set is now older than jwks_refresh_seconds: the next request refreshes it
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        assert _wait_until(lambda: authorization_server.stats()["jwks"] >= 2)  # it tried, and was answered 503
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200


@pytest.mark.parametrize("mode", ["garbage", "empty"])
def test_a_jwks_that_answers_nonsense_leaves_the_cached_keys_in_use(authorization_server, tmp_path, mode):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    auth = _auth_table(authorization_server, resource, jwks_refresh_seconds=1, jwks_min_refetch_seconds=1)
    with gateway(tmp_path, auth, port=port) as gw:
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        authorization_server.jwks_mode(mode)
        time.sleep(1.2)
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        assert _wait_until(lambda: authorization_server.stats()["jwks"] >= 2)
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        assert gw.process.poll() is None


async def test_many_requests_with_a_new_kid_at_once_fetch_the_keys_once(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    auth = _auth_table(authorization_server, resource, jwks_min_refetch_seconds=1)
    with gateway(tmp_path, auth, port=port) as gw:
        assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
        await asyncio.sleep(1.2)
        authorization_server.rotate()
        # a slow key set, so that all of them arrive while the one fetch is under way
        authorization_server.jwks_mode("slow", delay=1)
        tokens = [authorization_server.token(aud=resource, scope=READ, sub=f"agent-{i}") for i in range(12)]
        headers = {"accept": ACCEPT, "content-type": "application/json"}
        async with httpx2.AsyncClient(timeout=60) as http:
            answers = await asyncio.gather(*(http.post(gw.url, json=INITIALIZE, headers={
                **headers, "authorization": f"Bearer {token}"}) for token in tokens))
        assert [a.status_code for a in answers] == [200] * len(tokens)
        assert authorization_server.stats()["jwks"] == 2


def test_a_jwks_endpoint_down_from_the_start_is_503_until_it_answers(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    authorization_server.jwks_mode("down")
    auth = _auth_table(authorization_server, resource, jwks_min_refetch_seconds=1)
    with gateway(tmp_path, auth, port=port) as gw:
        token = authorization_server.token(aud=resource, scope=READ)
        answer = _post(gw, token=token)
        assert answer.status_code == 503  # the gateway cannot check it: not the caller's fault, so not a 401
        authorization_server.jwks_mode("ok")
        time.sleep(1.2)
        assert _post(gw, token=token).status_code == 200


def test_a_slow_jwks_endpoint_is_cut_off_by_the_fetch_timeout(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    # the delay is far beyond the timeout: had the gateway waited it out it would have had the keys and said 200
    authorization_server.jwks_mode("slow", delay=20)
    auth = _auth_table(authorization_server, resource, fetch_timeout_seconds=1, jwks_min_refetch_seconds=1)
    with gateway(tmp_path, auth, port=port) as gw:
        token = authorization_server.token(aud=resource, scope=READ)
        assert _post(gw, token=token).status_code == 503
        # the well-known metadata does not wait for the keys
        assert httpx2.get(gw.base + "/.well-known/oauth-protected-resource/mcp", timeout=30).status_code == 200
        authorization_server.jwks_mode("slow", delay=0.2)  # slow, but within the bound
        time.sleep(1.2)
        assert _post(gw, token=token).status_code == 200


@pytest.mark.parametrize("metadata", ["oauth", "oidc"])
def test_an_issuer_with_a_path_is_found_through_the_one_metadata_document_it_publishes(tmp_path, metadata):
    """As Keycloak's realms and Entra ID's tenants are: the issuer has a path, and only its RFC 8414 or only its
    OpenID Connect metadata exists; the gateway is given the issuer alone."""
    with running(":".join(GATEWAY_CLIENT), issuer_path="/realms/acme", metadata=metadata) as server:
        assert urlsplit(server.issuer).path == "/realms/acme"
        port = free_port()
        resource = f"http://127.0.0.1:{port}/mcp"
        with gateway(tmp_path, _auth_table(server, resource), port=port) as gw:
            assert _post(gw, token=server.token(aud=resource, scope=READ)).status_code == 200
            stats = server.stats()
            assert stats["metadata"] >= 1 and stats["jwks"] == 1
            prm = httpx2.get(gw.base + "/.well-known/oauth-protected-resource/mcp", timeout=30).json()
            assert prm["authorization_servers"] == [server.issuer]


# -- several issuers, one of them introspected ------------------------------------------------------------------


def test_several_issuers_and_a_revoked_token_replayed(authorization_server, tmp_path):
    with running(":".join(GATEWAY_CLIENT)) as introspected:
        port = free_port()
        resource = f"http://127.0.0.1:{port}/mcp"
        auth = _auth_table(authorization_server, resource)
        auth["issuers"].append({"issuer": introspected.issuer,
                                "introspection_endpoint": introspected.introspection_endpoint,
                                "client_id": GATEWAY_CLIENT[0], "client_secret": GATEWAY_CLIENT[1],
                                "introspection_cache_seconds": 0})
        with gateway(tmp_path, auth, port=port) as gw:
            assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
            opaque = introspected.token(aud=resource, scope=READ, format="opaque")
            assert _post(gw, token=opaque).status_code == 200
            jwt_of_it = introspected.token(aud=resource, scope=READ)
            assert _post(gw, token=jwt_of_it).status_code == 200
            assert introspected.stats()["introspect"] == 2 and introspected.stats()["jwks"] == 0

            introspected.revoke(opaque)
            _assert_refused(gw, opaque, "inactive")
            # an introspected token's audience is checked too: a live token of that issuer for another resource
            elsewhere = introspected.token(aud="http://127.0.0.1:1/mcp", scope=READ, format="opaque")
            _assert_refused(gw, elsewhere, "wrong_audience")
            # a token of the JWT issuer is never sent to the other issuer's introspection endpoint
            before = introspected.stats()["introspect"]
            assert _post(gw, token=authorization_server.token(aud=resource, scope=READ)).status_code == 200
            assert introspected.stats()["introspect"] == before
            logged = gw.logged()
            assert opaque not in logged and jwt_of_it not in logged


def test_an_introspected_answer_is_reused_until_the_cache_bound(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    auth = {"resource": resource, "issuers": [{
        "issuer": authorization_server.issuer, "introspection_endpoint": authorization_server.introspection_endpoint,
        "client_id": GATEWAY_CLIENT[0], "client_secret": GATEWAY_CLIENT[1], "introspection_cache_seconds": 300}]}
    with gateway(tmp_path, auth, port=port) as gw:
        opaque = authorization_server.token(aud=resource, format="opaque")
        for _ in range(3):
            assert _post(gw, token=opaque).status_code == 200
        assert authorization_server.stats()["introspect"] == 1
        minted = authorization_server.mint(aud=resource, format="opaque", expires_in=3)
        short = minted["access_token"]
        assert _post(gw, token=short).status_code == 200
        time.sleep(max(0.0, minted["claims"]["exp"] - time.time()) + 0.5)  # past its exp: now inactive
        _assert_refused(gw, short, "inactive")
        assert authorization_server.stats()["introspect"] == 3  # the cached answer did not outlive the token


# -- an MCP client that does the whole authorization itself ------------------------------------------------------


class _MemoryStorage:
    def __init__(self) -> None:
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens) -> None:
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info) -> None:
        self.client_info = client_info


def _sdk_oauth_http(gw: Gateway, scope: str) -> tuple[httpx2.AsyncClient, list[str]]:
    """An httpx2 client whose auth is the official SDK's OAuth client for ``gw``, registering itself as a public
    client; the user's browser is a GET that the authorization server answers with its redirect (it approves
    alice). Also the list of redirects the browser was sent to."""
    from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
    from mcp.shared.auth import OAuthClientMetadata

    redirects: list[str] = []

    async def follow(url: str) -> None:
        async with httpx2.AsyncClient(timeout=30) as browser:
            answer = await browser.get(url)
        assert answer.status_code == 302, answer.text
        redirects.append(answer.headers["location"])

    async def callback() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(redirects[-1]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0], iss=query["iss"][0])

    provider = OAuthClientProvider(
        server_url=gw.url, storage=_MemoryStorage(), redirect_handler=follow, callback_handler=callback,
        client_metadata=OAuthClientMetadata(client_name="auth-e2e", redirect_uris=["http://127.0.0.1:9/cb"],
                                            grant_types=["authorization_code", "refresh_token"],
                                            token_endpoint_auth_method="none", scope=scope))
    return httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(60, read=120)), redirects


async def test_the_sdk_client_discovers_registers_authorizes_and_steps_up(authorization_server, tmp_path):
    """The official SDK's OAuth client from nothing: the 401's resource_metadata, the authorization server's
    metadata, dynamic registration, authorization code with PKCE and resource, and on tools/call a 403
    insufficient_scope that sends it back for mcp:tools."""
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    with gateway(tmp_path, _auth_table(authorization_server, resource), port=port) as gw:
        http, redirects = _sdk_oauth_http(gw, READ)
        async with Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert f"{SERVER}__recall" in names
            result = await client.call_tool(f"{SERVER}__recall", {})
            assert not result.is_error
        assert len(redirects) == 2  # once for mcp:read, once more for mcp:tools (step-up)
        stats = authorization_server.stats()
        assert stats["register"] == 1 and stats["authorize"] == 2
        exchanges = [r["form"] for r in authorization_server.requests()
                     if r["form"].get("grant_type") == "authorization_code"]
        assert len(exchanges) == 2 and all(form.get("resource") == resource for form in exchanges)


async def test_the_sdk_client_refreshes_its_token_and_keeps_its_session(authorization_server, tmp_path):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    authorization_server.configure(expires_in=3)
    # mcp:read for everything: the client asks for what the 401 names, and needs no step-up here
    auth = _auth_table(authorization_server, resource, method_scopes={})
    with gateway(tmp_path, auth, port=port) as gw:
        http, redirects = _sdk_oauth_http(gw, READ)
        async with Client(streamable_http_client(gw.url, http_client=http), mode="legacy") as client:
            await client.call_tool(f"{SERVER}__remember", {"text": "kept across a refresh"})
            await asyncio.sleep(3.5)  # the access token's lifetime: the client refreshes before its next request
            recalled = await client.call_tool(f"{SERVER}__recall", {})
            assert "kept across a refresh" in recalled.content[0].text
        assert len(redirects) == 1  # refreshed, never sent back to the user
        grants = [r["form"]["grant_type"] for r in authorization_server.requests()]
        assert grants.count("refresh_token") >= 1 and grants.count("authorization_code") == 1
