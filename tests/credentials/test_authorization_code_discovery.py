"""The deciding parts of the authorization-code client, without I/O: reading a challenge, where metadata is looked
for, which resources cover a server, which scopes and which token endpoint authentication are asked for."""

from __future__ import annotations

from bastion.credentials.discovery import (
    AuthorizationServer,
    Challenge,
    ProtectedResource,
    authorization_server_urls,
    covers,
    protected_resource_urls,
)
from bastion.credentials.oauth_client import choose_auth_method, choose_scopes, pkce_pair


def test_a_bearer_challenge_is_read_with_quoted_and_bare_values_and_other_schemes_left_alone() -> None:
    challenge = Challenge.parse('Basic realm="x", Bearer error="insufficient_scope", scope="a b", '
                                'resource_metadata="https://rs.example/.well-known/oauth-protected-resource/mcp"')
    assert challenge == Challenge("https://rs.example/.well-known/oauth-protected-resource/mcp", ("a", "b"),
                                  "insufficient_scope")
    assert Challenge.parse("bearer scope=one").scope == ("one",)
    assert Challenge.parse('Bearer scope="x", DPoP algs="ES256"').scope == ("x",)
    assert Challenge.parse(None) == Challenge.parse("Basic realm=x") == Challenge()


def test_metadata_is_looked_for_where_the_specification_says_in_its_order() -> None:
    assert protected_resource_urls("https://rs.example/tenant/mcp", Challenge()) == [
        "https://rs.example/.well-known/oauth-protected-resource/tenant/mcp",
        "https://rs.example/.well-known/oauth-protected-resource"]
    named = Challenge(resource_metadata="https://rs.example/custom.json")
    assert protected_resource_urls("https://rs.example/mcp", named)[0] == "https://rs.example/custom.json"
    assert authorization_server_urls("https://as.example/tenant1") == [
        "https://as.example/.well-known/oauth-authorization-server/tenant1",
        "https://as.example/.well-known/openid-configuration/tenant1",
        "https://as.example/tenant1/.well-known/openid-configuration"]
    assert authorization_server_urls("https://as.example") == [
        "https://as.example/.well-known/oauth-authorization-server",
        "https://as.example/.well-known/openid-configuration"]


def test_a_resource_covers_its_own_url_and_its_parents_on_the_same_origin_only() -> None:
    assert covers("https://rs.example/mcp", "https://RS.example:443/mcp/")
    assert covers("https://rs.example", "https://rs.example/mcp")
    assert not covers("https://rs.example/mc", "https://rs.example/mcp")
    assert not covers("https://evil.example/mcp", "https://rs.example/mcp")
    assert not covers("http://rs.example/mcp", "https://rs.example/mcp")
    assert not covers("https://rs.example/other", "https://rs.example/mcp")


def server(scopes=None, methods=("client_secret_basic",)) -> AuthorizationServer:
    return AuthorizationServer("https://as.example", "https://as.example/authorize", "https://as.example/token",
                               scopes_supported=scopes, token_endpoint_auth_methods=methods)


def test_scopes_come_from_the_challenge_else_the_configuration_else_the_metadata_else_none() -> None:
    resource = ProtectedResource("https://rs.example/mcp", ("https://as.example",), ("r", "w"))
    assert choose_scopes(Challenge(scope=("r",)), ["c"], resource, server()) == ("r",)
    assert choose_scopes(Challenge(), ["c"], resource, server()) == ("c",)
    assert choose_scopes(Challenge(), [], resource, server()) == ("r", "w")
    bare = ProtectedResource("https://rs.example/mcp", ("https://as.example",))
    assert choose_scopes(Challenge(), [], bare, server(scopes=("offline_access",))) == ()
    assert choose_scopes(Challenge(scope=("r",)), [], bare, server(scopes=("r", "offline_access"))) == (
        "r", "offline_access")


def test_the_token_endpoint_is_authenticated_as_the_server_lists() -> None:
    assert choose_auth_method(("client_secret_post",), True, None) == "client_secret_post"
    assert choose_auth_method(("none",), True, None) == "none"
    assert choose_auth_method(("client_secret_basic", "client_secret_post"), True, "client_secret_post") == \
        "client_secret_post"
    assert choose_auth_method(("client_secret_basic", "none"), False, None) == "none"


def test_pkce_verifiers_are_long_random_and_their_challenge_is_s256() -> None:
    import base64
    import hashlib

    verifier, challenge = pkce_pair()
    assert 43 <= len(verifier) <= 128 and verifier != pkce_pair()[0]
    assert challenge == base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
