"""Bastion's HTTP frontend against a real OAuth 2.1 authorization server (tests/fixtures/oauth_server.py): first that
the server issues what the other tests rely on, then the gateway as a resource server with real tokens."""

from __future__ import annotations

import base64
import hashlib
import secrets
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from joserfc.jws import extract_compact

from tests.auth.conftest import GATEWAY_CLIENT, PUBLIC_CLIENT, SERVICE_CLIENT

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
