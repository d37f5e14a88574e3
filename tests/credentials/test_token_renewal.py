"""How a per-user exchanged token is renewed, against the real authorization server: kept until ``refresh_before``
its expiry, then exchanged again with the caller's latest token; a stored refresh token is used first, and one the
server refuses falls back to a new exchange."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx2

from bastion.credentials.client_credentials import TokenEndpoint
from bastion.credentials.config import UpstreamAuth
from bastion.credentials.store import TokenSet, TokenStore
from bastion.credentials.token_exchange import GRANT_TYPE, TokenExchange
from bastion.model import Identity
from tests.credentials.conftest import GATEWAY_CLIENT, GATEWAY_RESOURCE, UPSTREAM_RESOURCE, client_auth


def _exchange(server, store: TokenStore, subject: str, clock) -> TokenExchange:
    auth = UpstreamAuth.model_validate(client_auth(server.issuer, "token_exchange", refresh_before=60))
    return TokenExchange("up", "alice", auth, UPSTREAM_RESOURCE, TokenEndpoint(auth, "servers.up.auth"), store,
                         subject, clock=clock)


def _grants(server, grant_type: str) -> list[dict]:
    return [r["form"] for r in server.requests() if r["form"].get("grant_type") == grant_type]


async def test_kept_until_near_expiry_then_exchanged_again_with_the_callers_latest_token(
        authorization_server, tmp_path: Path) -> None:
    authorization_server.configure(expires_in=600)
    store = TokenStore.default(tmp_path, environ={})
    first = authorization_server.token(sub="alice", aud=GATEWAY_RESOURCE, scope="mcp")
    now = [time.time()]
    credentials = _exchange(authorization_server, store, first, lambda: now[0])

    issued = (await credentials.headers())["Authorization"]
    expires_at = store.get("up", "alice").expires_at
    now[0] = expires_at - 61
    assert (await credentials.headers())["Authorization"] == issued

    later = authorization_server.token(sub="alice", aud=GATEWAY_RESOURCE, scope="mcp")
    credentials.present(Identity("alice", subject_token=later))  # the caller's next request, with a newer token
    now[0] = expires_at - 59
    renewed = (await credentials.headers())["Authorization"]
    assert renewed != issued
    assert [form["subject_token"] for form in _grants(authorization_server, GRANT_TYPE)] == [first, later]
    assert store.get("up", "alice").access_token == renewed.removeprefix("Bearer ")


async def test_a_stored_refresh_token_is_used_before_a_new_exchange(authorization_server, tmp_path: Path) -> None:
    store = TokenStore.default(tmp_path, environ={})
    granted = _authorization_code_tokens(authorization_server)
    store.put("up", "alice", TokenSet(granted["access_token"], granted["refresh_token"], time.time() + 5))
    subject = authorization_server.token(sub="alice", aud=GATEWAY_RESOURCE, scope="mcp")
    credentials = _exchange(authorization_server, store, subject, time.time)

    headers = await credentials.headers()
    assert headers["Authorization"] != f"Bearer {granted['access_token']}"
    [refresh] = _grants(authorization_server, "refresh_token")
    assert refresh["refresh_token"] == granted["refresh_token"]
    assert not _grants(authorization_server, GRANT_TYPE)
    assert store.get("up", "alice").refresh_token not in (None, granted["refresh_token"])  # rotated, kept

    # a refresh token the server no longer honours: a new exchange instead, not an error
    store.put("up", "alice", TokenSet("stale", "refresh-token-nobody-issued", time.time()))
    fresh = await credentials.headers()
    assert fresh["Authorization"] not in ("Bearer stale", headers["Authorization"])
    assert [form["subject_token"] for form in _grants(authorization_server, GRANT_TYPE)] == [subject]


def _authorization_code_tokens(server) -> dict:
    """Tokens for alice granted to Bastion's client by the authorization-code flow (with a refresh token)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    redirect = "http://127.0.0.1:9/oauth/callback"
    answer = httpx2.get(server.authorization_endpoint, params={
        "response_type": "code", "client_id": GATEWAY_CLIENT[0], "redirect_uri": redirect, "state": "s",
        "code_challenge": challenge, "code_challenge_method": "S256", "login_hint": "alice",
        "resource": UPSTREAM_RESOURCE})
    code = parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
    tokens = httpx2.post(server.token_endpoint, auth=GATEWAY_CLIENT, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": redirect, "code_verifier": verifier}).json()
    assert tokens.get("refresh_token"), tokens
    return tokens


async def test_a_401_for_a_token_just_exchanged_is_the_answer_and_one_for_an_older_token_exchanges_again(
        authorization_server, tmp_path: Path) -> None:
    store = TokenStore.default(tmp_path, environ={})
    subject = authorization_server.token(sub="alice", aud=GATEWAY_RESOURCE, scope="mcp")
    now = [time.time()]
    credentials = _exchange(authorization_server, store, subject, lambda: now[0])
    first = (await credentials.headers())["Authorization"]
    assert await credentials.refused(401, 'Bearer error="invalid_token"') is False
    assert len(_grants(authorization_server, GRANT_TYPE)) == 1  # no exchange at the rate of the refusals
    now[0] += 30
    assert await credentials.refused(401, 'Bearer error="invalid_token"') is True
    assert (await credentials.headers())["Authorization"] != first
    assert len(_grants(authorization_server, GRANT_TYPE)) == 2
