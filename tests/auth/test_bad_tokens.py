"""Bearer tokens checked by Bastion's resource server, against a real issuer on 127.0.0.1 (its metadata, JWKS and
introspection served by the test's loop): what is accepted, what is refused with which status and reason, what
the key set and introspection endpoint are asked, and that no token reaches a log line."""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator

import pytest
from pydantic import ValidationError

from bastion.auth.base import AuthFailure, Credentials
from bastion.auth.build import HttpAuth, build_http_auth
from bastion.auth.config import AuthConfig
from bastion.model import Identity
from tests.auth.resource_server_issuer import RESOURCE, Issuer

LOCAL = Identity("local")


@pytest.fixture
async def issuer() -> AsyncIterator[Issuer]:
    server = await Issuer().start()
    try:
        yield server
    finally:
        await server.stop()


class FakeClock:
    """The monotonic clock the key sets' intervals are measured by, moved by the test alone."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def auth_for(*issuers: Issuer, introspect: bool = False, clock: Any = None, **settings: Any) -> HttpAuth:
    entries = []
    for server in issuers:
        entry: dict[str, Any] = {"issuer": server.issuer}
        if introspect:
            entry.update(validation="introspection", client_id=server.introspection_auth[0],
                         client_secret=server.introspection_auth[1],
                         introspection_cache_seconds=settings.pop("introspection_cache_seconds", 60))
        entries.append(entry)
    config = AuthConfig(resource=RESOURCE, issuers=entries, **settings)
    if clock is None:
        return build_http_auth(config, identity_header=None, identity=LOCAL)
    return build_http_auth(config, identity_header=None, identity=LOCAL, clock=clock)


def bearer(token: str) -> Credentials:
    return Credentials({"authorization": f"Bearer {token}"}, "mcp", "127.0.0.1")


async def refused(auth: HttpAuth, credentials: Credentials) -> AuthFailure:
    with pytest.raises(AuthFailure) as caught:
        await auth.authenticator.authenticate(credentials)
    return caught.value


async def test_a_valid_token_is_the_identity_its_claims_name(issuer: Issuer) -> None:
    auth = auth_for(issuer, claims={"attributes": {"tenant": "tid"}})
    token = issuer.token(scope="mcp mcp:tools", groups=["eng", "ops"], tid="acme")
    identity = await auth.authenticator.authenticate(bearer(token))
    assert (identity.name, identity.groups, identity.authenticated_by, identity.issuer) == (
        "alice", ("eng", "ops"), "oauth", issuer.issuer)
    assert identity.scopes == {"mcp", "mcp:tools"} and identity.claims == {"tenant": "acme"}
    assert identity.subject_token == token and token not in repr(identity)
    assert issuer.hits["metadata"] == 1 and issuer.hits["jwks"] == 1  # keys found through the issuer's metadata
    await auth.close()


@pytest.mark.parametrize("make, status, reason", [
    (lambda i: i.token(exp=int(time.time()) - 120), 401, "expired"),
    (lambda i: i.token(nbf=int(time.time()) + 120), 401, "not_yet_valid"),
    (lambda i: i.token(aud="https://other.example.test/mcp"), 401, "wrong_audience"),
    (lambda i: i.token(aud=None), 401, "wrong_audience"),
    (lambda i: i.token(exp=None), 401, "no_expiry"),
    (lambda i: i.token(iss="https://evil.example.test"), 401, "unknown_issuer"),
    (lambda i: i.token(sub=None), 401, "no_name_claim"),
    (lambda i: i.unsigned_token(), 401, "algorithm_not_allowed"),
    (lambda i: i.hs256_with_public_key(), 401, "algorithm_not_allowed"),
    (lambda i: "not-a-jwt.but.dots", 401, "malformed_token"),
    (lambda i: i.token(header={"typ": "dpop+jwt"}), 401, "not_an_access_token"),
    (lambda i: i.token(header={"typ": "logout+jwt"}), 401, "not_an_access_token"),
    (lambda i: _tampered_payload(i.token()), 401, "bad_signature"),
    (lambda i: _tampered_signature(i.token()), 401, "bad_signature"),
    (lambda i: i.token(key=i.new_key()), 401, "unknown_key"),  # signed by a key the issuer never published
])
async def test_bad_tokens_are_refused_with_a_challenge(issuer: Issuer, make, status: int, reason: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    auth = auth_for(issuer)
    token = make(issuer)
    with caplog.at_level(logging.DEBUG):
        failure = await refused(auth, bearer(token))
    assert (failure.status, failure.reason) == (status, reason)
    assert failure.www_authenticate.startswith('Bearer error="invalid_token"')
    assert 'resource_metadata="https://mcp.example.test/.well-known/oauth-protected-resource/mcp"' \
        in failure.www_authenticate
    assert token not in failure.message and token not in failure.www_authenticate
    assert token not in caplog.text
    await auth.close()


def _tampered_payload(token: str) -> str:
    import base64
    import json
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def _tampered_signature(token: str) -> str:
    header, payload, signature = token.split(".")
    flipped = ("A" if signature[10] != "A" else "B")
    return f"{header}.{payload}.{signature[:10]}{flipped}{signature[11:]}"


async def test_access_tokens_typed_either_way_are_accepted(issuer: Issuer) -> None:
    auth = auth_for(issuer)
    for typ in ("at+jwt", "JWT", "application/at+jwt", None):
        assert (await auth.authenticator.authenticate(bearer(issuer.token(header={"typ": typ})))).name == "alice"
    await auth.close()


async def test_signature_key_and_format_failures_say_the_same_words(issuer: Issuer) -> None:
    auth = auth_for(issuer)
    messages = {(await refused(auth, bearer(t))).message for t in (
        _tampered_signature(issuer.token()), issuer.token(key=issuer.new_key()), issuer.unsigned_token(),
        issuer.hs256_with_public_key())}
    assert messages == {"the access token could not be verified"}
    await auth.close()


async def test_clock_skew_admits_a_token_just_past_exp_or_before_nbf(issuer: Issuer) -> None:
    auth = auth_for(issuer, clock_skew_seconds=60)
    now = int(time.time())
    assert (await auth.authenticator.authenticate(bearer(issuer.token(exp=now - 20)))).name == "alice"
    assert (await auth.authenticator.authenticate(bearer(issuer.token(nbf=now + 20)))).name == "alice"
    strict = auth_for(issuer, clock_skew_seconds=0)
    assert (await refused(strict, bearer(issuer.token(exp=now - 20)))).reason == "expired"
    await auth.close()
    await strict.close()


async def test_an_es256_token_checks_against_its_ec_key_and_a_mislabelled_one_does_not(issuer: Issuer) -> None:
    ec = issuer.rotate(kind="EC")
    auth = auth_for(issuer)
    assert (await auth.authenticator.authenticate(bearer(issuer.token(key=ec)))).name == "alice"
    # An RS256 header naming the EC key's kid: the key's type decides, whatever the header says.
    rsa = issuer.keys[1]
    forged = issuer.token(key=rsa, header={"kid": ec.kid})
    assert (await refused(auth, bearer(forged))).reason == "key_type_mismatch"
    await auth.close()


async def test_an_algorithm_outside_the_issuers_list_is_refused(issuer: Issuer) -> None:
    config = AuthConfig(resource=RESOURCE, issuers=[{"issuer": issuer.issuer, "algorithms": ["ES256"]}])
    auth = build_http_auth(config, identity_header=None, identity=LOCAL)
    assert (await refused(auth, bearer(issuer.token()))).reason == "algorithm_not_allowed"
    await auth.close()


@pytest.mark.parametrize("algorithms", [["none"], ["HS256"], ["RS256", "HS512"], ["XX1"], []])
def test_the_configuration_refuses_none_and_symmetric_algorithms(algorithms: list[str]) -> None:
    with pytest.raises(ValidationError, match="algorithms"):
        AuthConfig(resource=RESOURCE, issuers=[{"issuer": "https://id.example.test", "algorithms": algorithms}])


def test_issuers_need_a_resource_and_the_identity_header_cannot_join_them() -> None:
    with pytest.raises(ValidationError, match="auth.resource"):
        AuthConfig(issuers=[{"issuer": "https://id.example.test"}])
    config = AuthConfig(resource=RESOURCE, issuers=[{"issuer": "https://id.example.test"}])
    with pytest.raises(ValueError, match="http.identity_header"):
        build_http_auth(config, identity_header="X-Bastion-Identity", identity=LOCAL)


async def test_a_rotated_in_key_is_found_with_one_refetch_and_an_unknown_kid_never_loops(issuer: Issuer) -> None:
    import asyncio
    clock = FakeClock()
    auth = auth_for(issuer, jwks_min_refetch_seconds=1, clock=clock)
    assert (await auth.authenticator.authenticate(bearer(issuer.token()))).name == "alice"
    assert issuer.hits["jwks"] == 1
    new = issuer.rotate()
    clock.now += 1.1  # past the refetch interval, so the new kid may fetch the set
    assert (await auth.authenticator.authenticate(bearer(issuer.token(key=new)))).name == "alice"
    assert issuer.hits["jwks"] == 2  # the new kid fetched the set once
    stranger = issuer.new_key()
    for _ in range(5):
        clock.now += 0.15  # within the interval, however long the machine takes to sign each token
        assert (await refused(auth, bearer(issuer.token(key=stranger)))).reason == "unknown_key"
    assert issuer.hits["jwks"] == 2  # the refetch is rate-limited: unknown kids are refused without a fetch
    clock.now += 0.5  # past the interval again: the next unknown kid may look once more
    assert (await refused(auth, bearer(issuer.token(key=stranger)))).reason == "unknown_key"
    assert issuer.hits["jwks"] == 3
    await auth.close()


async def test_unknown_kids_at_once_share_one_fetch(issuer: Issuer) -> None:
    import asyncio
    clock = FakeClock()
    auth = auth_for(issuer, jwks_min_refetch_seconds=1, clock=clock)
    assert (await auth.authenticator.authenticate(bearer(issuer.token()))).name == "alice"
    new = issuer.rotate()
    clock.now += 1.1  # past the refetch interval: the first of them may fetch, the others wait for it
    tokens = [issuer.token(key=new, sub=f"user{i}") for i in range(8)]
    issuer.mode, issuer.delay = "slow", 0.5
    first = asyncio.ensure_future(auth.authenticator.authenticate(bearer(tokens[0])))
    while issuer.hits["jwks"] < 2:  # the refetch has begun: the others come while it is under way
        await asyncio.sleep(0.01)
    names = await asyncio.gather(first, *(auth.authenticator.authenticate(bearer(t)) for t in tokens[1:]))
    assert [n.name for n in names] == [f"user{i}" for i in range(8)]
    assert issuer.hits["jwks"] == 2
    await auth.close()


async def test_a_key_dropped_from_the_set_no_longer_checks_tokens_it_signed(issuer: Issuer) -> None:
    auth = auth_for(issuer, jwks_min_refetch_seconds=0)
    old_token = issuer.token()
    assert (await auth.authenticator.authenticate(bearer(old_token))).name == "alice"
    new = issuer.rotate(drop_old=True)
    assert (await auth.authenticator.authenticate(bearer(issuer.token(key=new)))).name == "alice"
    assert (await refused(auth, bearer(old_token))).reason == "unknown_key"  # even though it was verified once
    await auth.close()


async def test_a_jwks_endpoint_that_goes_down_leaves_the_cached_keys_working(issuer: Issuer) -> None:
    auth = auth_for(issuer, jwks_min_refetch_seconds=0)
    assert (await auth.authenticator.authenticate(bearer(issuer.token()))).name == "alice"
    issuer.mode = "down"
    assert (await auth.authenticator.authenticate(bearer(issuer.token(sub="bob")))).name == "bob"
    assert (await refused(auth, bearer(issuer.token(key=issuer.new_key())))).reason == "unknown_key"
    await auth.close()


async def test_keys_never_fetched_from_a_down_endpoint_answer_503_and_recover(issuer: Issuer) -> None:
    issuer.mode = "down"
    auth = auth_for(issuer, jwks_min_refetch_seconds=0)
    failure = await refused(auth, bearer(issuer.token()))
    assert (failure.status, failure.reason) == (503, "keys_unavailable")
    issuer.mode = "ok"
    assert (await auth.authenticator.authenticate(bearer(issuer.token()))).name == "alice"
    await auth.close()


async def test_a_down_endpoint_is_not_asked_again_on_every_request(issuer: Issuer) -> None:
    issuer.mode = "down"
    auth = auth_for(issuer, jwks_min_refetch_seconds=3600)
    for _ in range(4):
        assert (await refused(auth, bearer(issuer.token()))).status == 503
    assert issuer.hits["jwks"] == 1
    await auth.close()


@pytest.mark.slow
async def test_a_slow_jwks_endpoint_is_given_up_after_the_fetch_timeout(issuer: Issuer) -> None:
    issuer.mode, issuer.delay = "slow", 30
    auth = auth_for(issuer, fetch_timeout_seconds=0.5, jwks_min_refetch_seconds=0)
    failure = await refused(auth, bearer(issuer.token()))
    assert (failure.status, failure.reason) == (503, "keys_unavailable")
    await auth.close()


@pytest.mark.parametrize("header, status, reason", [
    ("Bearer", 400, "malformed_header"),
    ("Bearer ", 400, "malformed_header"),
    ("Bearer two tokens", 400, "malformed_header"),
    ("Bearer tok\u00e9n", 400, "malformed_header"),
    ("Bearer " + "a" * 20000, 400, "token_too_long"),
    ("Basic YWxpY2U6c2VjcmV0", 401, "no_credentials"),
    ("", 401, "no_credentials"),
])
async def test_malformed_authorization_headers(issuer: Issuer, header: str, status: int, reason: str) -> None:
    auth = auth_for(issuer, scopes=["mcp"])
    failure = await refused(auth, Credentials({"authorization": header} if header else {}, "mcp"))
    assert (failure.status, failure.reason) == (status, reason)
    if reason == "no_credentials":  # RFC 6750 3.1: a request without credentials gets no error code
        assert failure.www_authenticate == ('Bearer scope="mcp", resource_metadata='
                                            '"https://mcp.example.test/.well-known/oauth-protected-resource/mcp"')
    assert issuer.hits["jwks"] == 0
    await auth.close()


async def test_several_issuers_each_check_their_own_tokens(issuer: Issuer) -> None:
    other = await Issuer().start()
    try:
        auth = auth_for(issuer, other)
        first = await auth.authenticator.authenticate(bearer(issuer.token()))
        second = await auth.authenticator.authenticate(bearer(other.token(sub="bob")))
        assert (first.issuer, second.issuer) == (issuer.issuer, other.issuer)
        assert first != Identity("alice", ("engineering",), "oauth", other.issuer)
        # One issuer's key never checks a token that claims the other issuer.
        forged = other.token(key=issuer.keys[0], iss=other.issuer)
        assert (await refused(auth, bearer(forged))).reason == "unknown_key"
        await auth.close()
    finally:
        await other.stop()


async def test_introspection_accepts_an_active_token_and_reuses_the_answer(issuer: Issuer) -> None:
    auth = auth_for(issuer, introspect=True)
    token = issuer.opaque(scope="mcp mcp:tools", groups=["ops"])
    for _ in range(3):
        identity = await auth.authenticator.authenticate(bearer(token))
    assert (identity.name, identity.groups, identity.issuer, identity.scopes) == (
        "carol", ("ops",), issuer.issuer, {"mcp", "mcp:tools"})
    assert issuer.hits["introspect"] == 1
    await auth.close()


async def test_introspection_without_a_cache_sees_a_revocation_at_once(issuer: Issuer) -> None:
    auth = auth_for(issuer, introspect=True, introspection_cache_seconds=0)
    token = issuer.opaque()
    assert (await auth.authenticator.authenticate(bearer(token))).name == "carol"
    del issuer.active[token]  # revoked at the issuer
    assert (await refused(auth, bearer(token))).reason == "inactive"
    assert issuer.hits["introspect"] == 2
    await auth.close()


async def test_the_introspection_cache_never_outlives_the_tokens_exp(issuer: Issuer) -> None:
    auth = auth_for(issuer, introspect=True, introspection_cache_seconds=3600, clock_skew_seconds=0)
    token = issuer.opaque(exp=int(time.time()) + 1)
    assert (await auth.authenticator.authenticate(bearer(token))).name == "carol"
    import asyncio
    await asyncio.sleep(1.5)
    assert (await refused(auth, bearer(token))).reason == "expired"
    assert issuer.hits["introspect"] == 2  # asked again once the cached answer ran out with exp
    await auth.close()


@pytest.mark.parametrize("answer, reason", [
    ({"active": False}, "inactive"),
    ({"aud": "https://other.example.test/mcp"}, "wrong_audience"),
    ({"aud": None}, "wrong_audience"),
    ({"iss": "https://evil.example.test"}, "wrong_issuer"),
    ({"exp": int(time.time()) - 3600}, "expired"),
])
async def test_introspection_refuses_what_is_not_for_this_resource(issuer: Issuer, answer: dict,
                                                                   reason: str) -> None:
    auth = auth_for(issuer, introspect=True)
    token = issuer.opaque(**answer)
    if answer.get("aud", "") is None:
        del issuer.active[token]["aud"]
    failure = await refused(auth, bearer(token))
    assert (failure.status, failure.reason) == (401, reason)
    await auth.close()


async def test_introspection_that_cannot_be_asked_answers_503(issuer: Issuer) -> None:
    auth = auth_for(issuer, introspect=True)
    issuer.mode = "down"
    assert (await refused(auth, bearer(issuer.opaque()))).reason == "introspection_unavailable"
    issuer.mode = "ok"
    issuer.introspection_auth = ("bastion", "rotated-secret")  # the gateway's credentials no longer work
    assert (await refused(auth, bearer(issuer.opaque()))).status == 503
    await auth.close()


async def test_an_api_key_shaped_bearer_is_not_taken_for_an_access_token(issuer: Issuer) -> None:
    auth = auth_for(issuer)
    failure = await refused(auth, bearer("bst_0123456789abcdef"))
    assert failure.reason == "no_credentials" and issuer.hits["jwks"] == 0
    await auth.close()


async def test_requests_before_the_first_fetch_wait_for_it(issuer: Issuer) -> None:
    import asyncio
    issuer.mode, issuer.delay = "slow", 0.5
    auth = auth_for(issuer, jwks_min_refetch_seconds=3600)
    first = asyncio.ensure_future(auth.authenticator.authenticate(bearer(issuer.token())))
    while issuer.hits["jwks"] < 1:
        await asyncio.sleep(0.01)
    names = await asyncio.gather(first, *(auth.authenticator.authenticate(bearer(issuer.token(sub=f"u{i}")))
                                          for i in range(4)))
    assert [n.name for n in names] == ["alice", "u0", "u1", "u2", "u3"] and issuer.hits["jwks"] == 1
    await auth.close()


async def test_an_issuers_own_audience_is_accepted_for_that_issuer_only(issuer: Issuer) -> None:
    other = await Issuer().start()
    try:
        config = AuthConfig(resource=RESOURCE, issuers=[
            {"issuer": issuer.issuer, "audiences": ["6731de76-14a6-49ae-97bc-6eba6914391e"]},
            {"issuer": other.issuer}])
        auth = build_http_auth(config, identity_header=None, identity=LOCAL)
        entra_like = issuer.token(aud="6731de76-14a6-49ae-97bc-6eba6914391e")
        assert (await auth.authenticator.authenticate(bearer(entra_like))).name == "alice"
        assert (await refused(auth, bearer(other.token(aud="6731de76-14a6-49ae-97bc-6eba6914391e")))).reason \
            == "wrong_audience"
        await auth.close()
    finally:
        await other.stop()


async def test_a_flood_of_opaque_tokens_asks_the_issuer_a_bounded_number_of_times_at_once(issuer: Issuer) -> None:
    import asyncio

    from bastion.auth import introspection
    auth = auth_for(issuer, introspect=True)
    answer = issuer._answer

    async def slow_introspection(method: str, path: str, headers: dict, body: bytes):
        if path == "/introspect":
            await asyncio.sleep(0.3)
        return await answer(method, path, headers, body)

    issuer._answer = slow_introspection  # type: ignore[method-assign]  # each answer takes a while
    flood = introspection.IN_FLIGHT + introspection.WAITING + 20
    results = await asyncio.gather(*(auth.authenticator.authenticate(bearer(f"opaque-{i}")) for i in range(flood)),
                                   return_exceptions=True)
    statuses = sorted(r.status for r in results if isinstance(r, AuthFailure))
    assert len(statuses) == flood  # none of the made-up tokens is accepted
    assert statuses.count(503) == 20 and statuses.count(401) == introspection.IN_FLIGHT + introspection.WAITING
    assert issuer.hits["introspect"] == introspection.IN_FLIGHT + introspection.WAITING
    await auth.close()


async def test_a_key_or_key_set_named_by_the_token_itself_is_never_used(issuer: Issuer) -> None:
    """A token may not bring its own key: an embedded ``jwk``, or a ``jku`` naming a key set the attacker serves,
    is ignored; only the issuer's published keys verify, and the attacker's key set is never fetched."""
    attacker = await Issuer().start()
    try:
        auth = auth_for(issuer)
        stolen_kid = issuer.keys[0].kid
        own_key = attacker.keys[0]
        public = {k: v for k, v in own_key.as_dict(private=False).items()}
        forged = {
            "embedded jwk, its own kid": issuer.token(key=own_key, header={"jwk": public}),
            "embedded jwk, the issuer's kid": issuer.token(key=own_key, header={"kid": stolen_kid, "jwk": public}),
            "jku to the attacker's keys": issuer.token(key=own_key, header={"jku": f"{attacker.base}/jwks"}),
            "jku and the issuer's kid": issuer.token(key=own_key, header={"kid": stolen_kid,
                                                                          "jku": f"{attacker.base}/jwks"}),
            "x5u to the attacker": issuer.token(key=own_key, header={"x5u": f"{attacker.base}/jwks"}),
        }
        for name, token in forged.items():
            failure = await refused(auth, bearer(token))
            assert (failure.status, failure.reason) in {(401, "unknown_key"), (401, "bad_signature")}, name
        assert attacker.hits == {"jwks": 0, "introspect": 0, "metadata": 0}
        await auth.close()
    finally:
        await attacker.stop()


async def test_a_critical_header_the_verifier_does_not_understand_is_refused(issuer: Issuer) -> None:
    """RFC 7515 section 4.1.11: a token that marks a header parameter critical must be refused by a verifier that
    does not understand it, even when its signature is the issuer's own."""
    auth = auth_for(issuer)
    for extra in ({"crit": ["urn:example:policy"], "urn:example:policy": "none"}, {"crit": ["urn:example:absent"]},
                  {"crit": []}, {"crit": "urn:example:policy"}):
        failure = await refused(auth, bearer(_signed_with_header(issuer, extra)))
        assert failure.status == 401, extra
    # the same token without the critical header: accepted, so the refusals above are the header's
    assert (await auth.authenticator.authenticate(bearer(_signed_with_header(issuer, {})))).name == "alice"
    await auth.close()


def _signed_with_header(issuer: Issuer, extra: dict[str, Any]) -> str:
    """An RS256 token signed with the issuer's own key whatever its header says (the signing library refuses to
    write a ``crit`` it does not know, so the signature is made here)."""
    import base64
    import json

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    key = issuer.keys[0]
    header = {"alg": "RS256", "kid": key.kid, "typ": "at+jwt", **extra}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(issuer.claims()).encode())}"
    signature = key.get_op_key("sign").sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{b64(signature)}"
