"""A user's own token for a remote server by the authorization-code flow, end to end: the real authorization server
of tests/fixtures/oauth_server.py (authlib), a resource server on a loopback socket that checks its tokens as the
MCP specification asks (Protected Resource Metadata, signed JWTs for its own resource, a scope per method), Bastion's
HTTP transport with ``AuthorizationCodeCredentials``, its loopback callback, and the encrypted token store. The
person is played by an HTTP client that follows the link Bastion gives (the authorization server approves the user
named by ``login_hint`` at once and redirects to Bastion)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx2
import orjson
import pytest
import uvicorn
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from bastion.credentials.config import UpstreamAuth
from bastion.credentials.oauth_client import AuthorizationCodes
from bastion.credentials.store import STORE_NAME, TokenStore
from bastion.model import Identity
from bastion.transport.listener import QuietServer, listen
from bastion.transport.http_client import URL_ELICITATION_REQUIRED, HttpTransport
from tests.fixtures.oauth_server import AuthorizationServer, running

MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
NEEDS = {"tools/call": "mcp:write"}  # every other method needs mcp:read


class ResourceServer:
    """An MCP endpoint at /mcp guarded as a resource server: its metadata at the well-known path, 401 naming it,
    tokens verified against the issuer's JWKS for iss, aud (this resource) and expiry, 403 insufficient_scope
    naming the scope a method needs. Its answer says whose token it was; it records every Authorization header."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self.url = ""
        self.published_resource: str | None = None  # None: the server's own URL
        self.seen: list[str | None] = []
        self._keys: KeySet | None = None

    @property
    def metadata_url(self) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource/mcp", "", ""))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/.well-known/oauth-protected-resource/mcp":
            await self._json(send, 200, {"resource": self.published_resource or self.url,
                                         "authorization_servers": [self.issuer],
                                         "scopes_supported": ["mcp:read", "mcp:write"]})
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append(headers.get("authorization"))
        request = orjson.loads(body)
        claims = await self._verified(headers.get("authorization"))
        if claims is None:
            await self._refuse(send, 401, f'Bearer resource_metadata="{self.metadata_url}", scope="mcp:read"')
            return
        needed = NEEDS.get(request["method"], "mcp:read")
        if needed not in str(claims.get("scope", "")).split():
            await self._refuse(send, 403, f'Bearer error="insufficient_scope", scope="{needed}", '
                                          f'resource_metadata="{self.metadata_url}"')
            return
        await self._json(send, 200, {"jsonrpc": "2.0", "id": request["id"],
                                     "result": {"sub": claims["sub"], "scope": claims.get("scope")}})

    async def _verified(self, authorization: str | None) -> dict | None:
        if not authorization or not authorization.startswith("Bearer "):
            return None
        if self._keys is None:
            async with httpx2.AsyncClient() as http:
                self._keys = KeySet.import_key_set((await http.get(f"{self.issuer}/jwks")).json())
        try:
            claims = jwt.decode(authorization[len("Bearer "):], self._keys, algorithms=["RS256"]).claims
        except (JoseError, ValueError):
            return None
        audiences = claims.get("aud") if isinstance(claims.get("aud"), list) else [claims.get("aud")]
        if claims.get("iss") != self.issuer or self.url not in audiences:
            return None
        return claims

    @staticmethod
    async def _json(send, status: int, document: dict) -> None:
        body = orjson.dumps(document)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _refuse(send, status: int, challenge: str) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"www-authenticate", challenge.encode()), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def authorization_server() -> Iterator[AuthorizationServer]:
    with running() as server:  # no pre-registered client: Bastion registers itself (RFC 7591)
        yield server


@pytest.fixture
async def resource_server(authorization_server) -> AsyncIterator[ResourceServer]:
    app = ResourceServer(authorization_server.issuer)
    sock = listen("127.0.0.1", 0)
    app.url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = QuietServer(uvicorn.Config(app, loop="none", lifespan="off", log_config=None, access_log=False))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        yield app
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 60)


@pytest.fixture
async def codes() -> AsyncIterator[AuthorizationCodes]:
    made = AuthorizationCodes("operator")
    yield made
    await made.close()


class Caller:
    """One user's transport to the resource server, through Bastion's credentials for them."""

    def __init__(self, url: str, credentials) -> None:
        self.transport = HttpTransport("remote", url, {}, kind="streamable-http", credentials=credentials)
        self.frames: asyncio.Queue[dict] = asyncio.Queue()
        self._next = 0

    def frames_received(self, frames) -> None:
        for frame in frames:
            self.frames.put_nowait(orjson.loads(frame))

    async def call(self, method: str) -> dict:
        self._next += 1
        self.transport.send(orjson.dumps({"jsonrpc": "2.0", "id": self._next, "method": method,
                                          "params": {"name": "x", "_meta": MODERN}}))
        return await asyncio.wait_for(self.frames.get(), 60)


@pytest.fixture
async def caller_for(resource_server, codes, tmp_path):
    store = TokenStore.default(tmp_path)
    auth = UpstreamAuth(type="authorization_code")
    opened: list[Caller] = []

    async def open_for(user: str) -> Caller:
        caller = Caller(resource_server.url, codes("remote", _Server(resource_server.url, auth), Identity(user),
                                                   store))
        await caller.transport.start(caller)
        opened.append(caller)
        return caller

    yield open_for
    for caller in opened:
        await caller.transport.close()


class _Server:
    def __init__(self, url: str, auth: UpstreamAuth) -> None:
        self.url = url
        self.auth = auth


def the_link(answer: dict) -> str:
    error = answer["error"]
    assert error["code"] == URL_ELICITATION_REQUIRED, answer
    [elicitation] = error["data"]["elicitations"]
    assert elicitation["mode"] == "url" and elicitation["url"] in error["message"]
    return elicitation["url"]


async def follow(link: str, user: str) -> httpx2.Response:
    """The person approves at the authorization server and the browser goes where it redirects (Bastion)."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=30) as browser:
        return await browser.get(f"{link}&{urlencode({'login_hint': user})}")


async def test_a_user_authorizes_once_through_the_link_and_their_own_token_is_used(
        caller_for, resource_server, authorization_server, tmp_path) -> None:
    alice = await caller_for("alice")
    link = the_link(await alice.call("tools/list"))
    query = parse_qs(urlsplit(link).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"]
    assert query["resource"] == [resource_server.url]
    # the challenge's scope, and offline_access as the authorization server offers it (a refresh token)
    assert query["scope"] == ["mcp:read offline_access"]
    assert urlsplit(query["redirect_uri"][0]).hostname == "127.0.0.1"

    page = await follow(link, "alice")
    assert page.status_code == 200 and "may now reach remote for alice" in page.text
    answer = await alice.call("tools/list")
    assert answer["result"]["sub"] == "alice"

    [exchange] = [r for r in authorization_server.requests() if r["form"].get("grant_type") == "authorization_code"]
    assert exchange["form"]["code_verifier"] and exchange["form"]["resource"] == resource_server.url
    stored = (tmp_path / STORE_NAME).read_bytes()
    token = resource_server.seen[-1].split()[1]
    assert token.encode() not in stored  # kept encrypted


async def test_each_user_has_their_own_authorization_and_token(caller_for) -> None:
    alice, bob = await caller_for("alice"), await caller_for("bob")
    alice_link = the_link(await alice.call("tools/list"))
    bob_link = the_link(await bob.call("tools/list"))
    assert alice_link != bob_link
    await follow(alice_link, "alice")
    assert (await alice.call("tools/list"))["result"]["sub"] == "alice"
    assert the_link(await bob.call("tools/list")) == bob_link  # still waiting for bob: the same link again
    await follow(bob_link, "bob")
    assert (await bob.call("tools/list"))["result"]["sub"] == "bob"


async def test_a_missing_scope_asks_for_the_union_once_and_the_call_passes_after(caller_for) -> None:
    alice = await caller_for("alice")
    await follow(the_link(await alice.call("tools/list")), "alice")
    step_up = the_link(await alice.call("tools/call"))
    assert parse_qs(urlsplit(step_up).query)["scope"] == ["mcp:read offline_access mcp:write"]
    assert the_link(await alice.call("tools/call")) == step_up  # one link while it waits
    await follow(step_up, "alice")
    answer = await alice.call("tools/call")
    assert set(answer["result"]["scope"].split()) >= {"mcp:read", "mcp:write"}


async def test_a_token_near_its_expiry_is_refreshed_before_it_is_sent(caller_for, authorization_server,
                                                                      resource_server) -> None:
    authorization_server.configure(expires_in=30)  # within refresh_before (60 s): every use renews it
    alice = await caller_for("alice")
    await follow(the_link(await alice.call("tools/list")), "alice")
    first = resource_server.seen[-1]
    assert (await alice.call("tools/list"))["result"]["sub"] == "alice"
    assert resource_server.seen[-1] != first
    grants = [r["form"].get("grant_type") for r in authorization_server.requests()]
    assert "refresh_token" in grants


async def test_an_answer_naming_another_issuer_is_refused_and_its_code_never_exchanged(
        caller_for, authorization_server, tmp_path) -> None:
    alice = await caller_for("alice")
    link = the_link(await alice.call("tools/list"))
    async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as browser:
        redirect = (await browser.get(f"{link}&login_hint=alice")).headers["location"]
        parts = urlsplit(redirect)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        assert query["iss"] == authorization_server.issuer
        forged = urlunsplit(parts._replace(query=urlencode({**query, "iss": "https://attacker.example"})))
        page = await browser.get(forged)
        assert page.status_code == 400 and "another issuer" in page.text
        replayed = await browser.get(redirect)  # the state was used: the real answer no longer completes it
        assert replayed.status_code == 400
    assert not [r for r in authorization_server.requests() if r["form"].get("grant_type") == "authorization_code"]
    assert "error" in await alice.call("tools/list")


async def test_metadata_naming_another_resource_is_refused_without_a_link(caller_for, resource_server) -> None:
    resource_server.published_resource = "https://elsewhere.example/mcp"
    alice = await caller_for("alice")
    answer = await alice.call("tools/list")
    assert answer["error"]["code"] != URL_ELICITATION_REQUIRED
    assert "another resource" in answer["error"]["message"]
