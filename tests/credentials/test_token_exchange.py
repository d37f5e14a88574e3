"""Per-user tokens by RFC 8693 token exchange: the caller's own token is only the subject of the exchange at a real
authorization server; the remote server (a real process checking every token against the issuer's keys) sees a
token made out to it, naming the caller, never the caller's token. One exchange per caller until the token nears
expiry; a missing scope is asked for once; a revocation means the next call exchanges anew.

Callers are sessions of OAuth identities sent through the gateway's request path, as ``bastion serve --http`` sends
the requests it authenticated; tests/credentials/test_serve_token_exchange.py runs the same through a real
``bastion serve --http`` process."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.credentials.store import TokenStore
from bastion.model import GatewayError, GatewayRequest, Identity, Session
from tests.credentials.conftest import GATEWAY_CLIENT, GATEWAY_RESOURCE, UPSTREAM_RESOURCE, client_auth
from tests.support import BASTION

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


def caller(server, name: str) -> Identity:
    """An identity as the resource server makes it from a valid token of ``name``'s, with that token kept."""
    token = server.token(sub=name, aud=GATEWAY_RESOURCE, scope="mcp")
    return Identity(name, (), authenticated_by="oauth", issuer=server.issuer, scopes=frozenset({"mcp"}),
                    subject_token=token)


async def call(gateway: Any, who: Identity, tool: str = "up__whoami") -> dict[str, Any]:
    session = Session(who, "legacy", "2025-11-25", {}, {"name": "test"}, f"s-{who.name}")
    result = await gateway.handle(GatewayRequest("tools/call", {"name": tool, "arguments": {}}, session,
                                                 gateway.catalog, request_id=1))
    return result.decoded().result if hasattr(result, "decoded") else result


@pytest.fixture
async def gateways():
    made = []

    async def start(upstream_url: str, auth: dict[str, Any]):
        store = TokenStore.default()  # the test session's state directory: no token of another test's is kept
        for name in ("alice", "bob", "carol"):
            store.revoke(name, "up")
        entry = {"url": upstream_url, "scope": "per_identity", "auth": auth}
        gateway = build_gateway(GatewayConfig(servers={"up": ServerConfig.model_validate(entry)}, policy=None,
                                              guardrails=None))
        made.append(gateway)
        gateway.start()
        await gateway.wait_ready(120)
        assert gateway.upstreams["up"].ready.is_set(), gateway.upstreams["up"].failure
        return gateway

    yield start
    for gateway in made:
        await gateway.close()


def exchanges(server) -> list[dict]:
    return [r["form"] for r in server.requests() if r["form"].get("grant_type") == EXCHANGE]


async def test_the_upstream_sees_a_token_made_out_to_it_for_the_caller_never_the_callers_own(
        authorization_server, bearer_server, gateways) -> None:
    upstream = bearer_server(authorization_server.issuer)
    gateway = await gateways(upstream.url, client_auth(authorization_server.issuer, "token_exchange"))
    alice, bob = caller(authorization_server, "alice"), caller(authorization_server, "bob")

    assert (await call(gateway, alice))["content"][0]["text"] == "alice"
    assert (await call(gateway, alice))["content"][0]["text"] == "alice"
    assert (await call(gateway, bob))["content"][0]["text"] == "bob"

    seen = upstream.seen()
    sent = {event["authorization"] for event in seen}
    assert f"Bearer {alice.subject_token}" not in sent and f"Bearer {bob.subject_token}" not in sent
    assert all(event["status"] == 200 for event in seen)
    subjects = {event["claims"]["sub"] for event in seen}
    assert subjects == {GATEWAY_CLIENT[0], "alice", "bob"}  # Bastion's own connection lists the tools
    for event in seen:
        assert event["claims"]["aud"] == UPSTREAM_RESOURCE
        if event["claims"]["sub"] in ("alice", "bob"):
            assert event["claims"]["act"] == {"sub": GATEWAY_CLIENT[0]}

    made = exchanges(authorization_server)
    assert [form["subject_token"] for form in made] == [alice.subject_token, bob.subject_token]  # one each
    assert all(form["resource"] == UPSTREAM_RESOURCE for form in made)
    assert all(form["subject_token_type"] == "urn:ietf:params:oauth:token-type:access_token" for form in made)

    # kept encrypted in the store, under the caller's name
    stored = {(t.server, t.user) for t in TokenStore.default().list()}
    assert {("up", "alice"), ("up", "bob")} <= stored


async def test_a_caller_without_a_token_gets_an_error_saying_so(authorization_server, bearer_server,
                                                                gateways) -> None:
    upstream = bearer_server(authorization_server.issuer)
    gateway = await gateways(upstream.url, client_auth(authorization_server.issuer, "token_exchange"))
    with pytest.raises(GatewayError) as refused:
        await call(gateway, Identity("carol"))
    assert "presented none" in refused.value.message
    assert not exchanges(authorization_server)


async def test_a_missing_scope_is_asked_for_in_a_new_exchange(authorization_server, bearer_server,
                                                              gateways) -> None:
    upstream = bearer_server(authorization_server.issuer, scopes=("files:read",))
    gateway = await gateways(upstream.url, client_auth(authorization_server.issuer, "token_exchange"))
    alice = caller(authorization_server, "alice")
    assert (await call(gateway, alice))["content"][0]["text"] == "alice"
    made = exchanges(authorization_server)
    assert [form.get("scope") for form in made] == [None, "files:read"]
    statuses = [e["status"] for e in upstream.seen() if e["claims"] and e["claims"]["sub"] == "alice"]
    assert statuses[0] == 403 and set(statuses[1:]) == {200}  # refused once, then every request passes


async def test_a_revoked_token_is_exchanged_anew_on_the_next_call(authorization_server, bearer_server,
                                                                  gateways) -> None:
    upstream = bearer_server(authorization_server.issuer)
    gateway = await gateways(upstream.url, client_auth(authorization_server.issuer, "token_exchange"))
    alice = caller(authorization_server, "alice")
    await call(gateway, alice)
    await call(gateway, alice)
    assert len(exchanges(authorization_server)) == 1

    revoked = subprocess.run([BASTION, "credentials", "revoke", "alice", "up"], capture_output=True, text=True,
                             timeout=60)
    assert revoked.returncode == 0, revoked.stderr
    await call(gateway, alice)
    assert len(exchanges(authorization_server)) == 2
    alice_tokens = [e["authorization"] for e in upstream.seen() if e["claims"] and e["claims"]["sub"] == "alice"]
    assert len(set(alice_tokens)) == 2  # the revoked token was not sent again


async def test_a_token_the_authorization_server_will_not_exchange_is_refused_with_why(
        authorization_server, bearer_server, gateways) -> None:
    upstream = bearer_server(authorization_server.issuer)
    gateway = await gateways(upstream.url, client_auth(authorization_server.issuer, "token_exchange"))
    alice = caller(authorization_server, "alice")
    authorization_server.revoke(alice.subject_token)  # revoked at the authorization server since it was checked
    with pytest.raises(GatewayError) as refused:
        await call(gateway, alice)
    message = refused.value.message
    assert "invalid_grant" in message and "alice" in message
    assert alice.subject_token not in message and GATEWAY_CLIENT[1] not in message
    assert not [e for e in upstream.seen() if e["claims"] and e["claims"]["sub"] == "alice"]
