"""Two (and three) agents of different identities on one ``bastion serve --http`` at the same time: they are shown
different tools and may do different things, by name, by their tokens' scopes and tenant claim, and by an API
key's groups; one's rate limit is not the other's; the audit trail names each with how it authenticated, and no
token reaches any log. Real processes throughout: the gateway, the raw fixture server, the authorization server."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.auth.conftest import GATEWAY_CLIENT
from tests.auth.serving import Served, answer, modern_request, open_session, session_request, start, stop
from tests.fixtures.oauth_server import running
from tests.support import BASTION, READY_TIMEOUT, free_port, raw_server

pytestmark = pytest.mark.slow

LISTS = '''
@id("anyone-lists")
permit (principal, action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources",
                              Bastion::Action::"list_prompts"], resource);
'''

BY_NAME = LISTS + '''
@id("everyone-echoes")
permit (principal, action == Bastion::Action::"call_tool", resource) when { resource.name == "echo" };

@id("alice-big")
permit (principal == Bastion::User::"alice", action == Bastion::Action::"call_tool", resource)
when { resource.name == "big" };
'''

BY_TOKEN = LISTS + '''
@id("readers-echo")
permit (principal, action == Bastion::Action::"call_tool", resource)
when { resource.name == "echo" && principal.scopes.contains("mcp:read") };

@id("acme-writers-big")
permit (principal, action == Bastion::Action::"call_tool", resource)
when { resource.name == "big" && principal.scopes.contains("mcp:write") && principal.tenant == "acme" };

@id("ops-keys-garbage")
permit (principal in Bastion::Group::"ops", action == Bastion::Action::"call_tool", resource)
when { resource.name == "garbage" && principal.authenticated_by == "api_key" };
'''


def _config(tmp: Path, policy: str, *, auth: dict[str, Any] | None = None, http: dict[str, Any] | None = None,
            exposure: str = "all") -> Path:
    (tmp / "team.cedar").write_text(policy)
    config: dict[str, Any] = {
        "servers": {"raw": raw_server(trust="trusted")}, "ready_timeout": READY_TIMEOUT, "guardrails": "off",
        "tools": {"exposure": exposure}, "http": http or {},
        "policy": {"policy_files": ["team.cedar"], "audit": {"path": str(tmp / "audit.jsonl")},
                   # a bucket per caller: one agent spending its calls leaves the other's untouched
                   "rate_limits": [{"scope": "principal", "rate": 0.001, "burst": 6}]},
    }
    if auth is not None:
        config["auth"] = auth
    path = tmp / "bastion.json"
    path.write_text(json.dumps(config))
    return path


class Agent:
    """One agent's handshake-era session, opened and used with its own credentials."""

    def __init__(self, client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> None:
        self.client, self.url, self.headers = client, url, headers
        self.session = ""
        self._ids = iter(range(2, 10_000))

    async def open(self) -> "Agent":
        opened = await open_session(self.client, self.url, self.headers)
        assert opened.status_code == 200, (opened.status_code, opened.text)
        self.session = opened.headers["mcp-session-id"]
        await self.client.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={
            "accept": "application/json, text/event-stream", "content-type": "application/json", **self.headers,
            "mcp-session-id": self.session, "mcp-protocol-version": "2025-11-25"})
        return self

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await session_request(self.client, self.url, self.headers, self.session, method, params,
                                         next(self._ids))
        assert response.status_code == 200, (response.status_code, response.text)
        return answer(response)

    async def tools(self) -> list[str]:
        return sorted(t["name"] for t in (await self.request("tools/list", {}))["result"]["tools"])

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments})


async def _modern_tools(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> tuple[list[str], dict]:
    response = await modern_request(client, url, headers, "tools/list", {})
    assert response.status_code == 200, response.text
    assert "private" in response.headers.get("cache-control", "")
    result = answer(response)["result"]
    return sorted(t["name"] for t in result["tools"]), result


def _calls(audit: Path) -> list[dict]:
    return [r for r in map(json.loads, audit.read_text().splitlines()) if r.get("kind") == "call"]


def _refused(reply: dict, code: int) -> bool:
    return reply.get("error", {}).get("code") == code


async def _spend(agent: Agent, calls: int) -> list[dict]:
    return [await agent.call("raw__echo", {"text": f"{n}"}) for n in range(calls)]


async def test_two_agents_named_by_a_header_see_and_do_different_things(tmp_path: Path) -> None:
    served = start(_config(tmp_path, BY_NAME, http={"identity_header": "X-Agent"}))
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            alice, bob = await asyncio.gather(Agent(client, served.url, {"x-agent": "alice"}).open(),
                                              Agent(client, served.url, {"x-agent": "bob"}).open())
            seen = await asyncio.gather(alice.tools(), bob.tools())
            assert seen == [["raw__big", "raw__echo"], ["raw__echo"]]
            big_alice, big_bob = await asyncio.gather(alice.call("raw__big", {"size": 3}),
                                                      bob.call("raw__big", {"size": 3}))
            assert big_alice["result"]["content"][0]["text"] == "xxx"
            assert _refused(big_bob, -32001) and big_bob["error"]["data"]["rule"] == "default-deny"
            # bob spends his six calls (the refused one took none); alice, at the same time, still has hers
            bobs, alices = await asyncio.gather(_spend(bob, 7), _spend(alice, 4))
            assert [_refused(r, -32000) for r in bobs] == [False] * 6 + [True]
            assert not any("error" in r for r in alices)
            # the same two in the 2026-07-28 era, one request at a time each
            modern = await asyncio.gather(_modern_tools(client, served.url, {"x-agent": "alice"}),
                                          _modern_tools(client, served.url, {"x-agent": "bob"}))
            assert [names for names, _ in modern] == [["raw__big", "raw__echo"], ["raw__echo"]]
            assert all(result["cacheScope"] == "private" for _, result in modern)
            # bob cannot ride on alice's session
            hijack = await session_request(client, served.url, {"x-agent": "bob"}, alice.session, "tools/list", {}, 99)
            assert hijack.status_code == 403
    finally:
        stop(served)
    calls = _calls(tmp_path / "audit.jsonl")
    assert {(c["who"]["name"], c["who"]["authenticated_by"]) for c in calls} == {("alice", "header"),
                                                                               ("bob", "header")}
    big = [c for c in calls if c["what"].get("target") == "raw__big"]
    assert {c["who"]["name"]: c["outcome"] for c in big} == {"alice": "complete", "bob": -32001}


def _make_key(file: Path, name: str, *args: str) -> str:
    made = subprocess.run([BASTION, "keys", "create", name, "--file", str(file), *args], capture_output=True,
                          text=True, timeout=120, check=True)
    return made.stdout.strip()


async def test_agents_with_tokens_and_an_api_key_are_decided_by_scopes_claims_and_groups(tmp_path: Path) -> None:
    with running(":".join(GATEWAY_CLIENT)) as issuer:
        port = free_port()
        resource = f"http://127.0.0.1:{port}/mcp"
        key = _make_key(tmp_path / "keys.json", "carol", "--scope", "mcp:read", "--groups", "ops")
        auth = {"resource": resource, "issuers": [{"issuer": issuer.issuer}], "api_keys": "keys.json",
                "claims": {"attributes": {"tenant": "tid"}}}
        alice_token = issuer.token(sub="alice", aud=resource, scope="mcp:read mcp:write", claims={"tid": "acme"})
        bob_token = issuer.token(sub="bob", aud=resource, scope="mcp:read mcp:write", claims={"tid": "globex"})
        reader_token = issuer.token(sub="alice", aud=resource, scope="mcp:read", claims={"tid": "acme"})
        tokens = {"alice": alice_token, "bob": bob_token, "reader": reader_token, "carol": key}
        served = start(_config(tmp_path, BY_TOKEN, auth=auth), "--http", f"127.0.0.1:{port}")  # the last --http counts
        assert served.url == resource, (served.url, resource)
        try:
            await _three_agents(served, tokens)
        finally:
            stop(served)
    logged = served.log() + (tmp_path / "audit.jsonl").read_text()
    for secret in tokens.values():
        assert secret not in logged
    calls = _calls(tmp_path / "audit.jsonl")
    who = {(c["who"]["name"], c["who"]["authenticated_by"], c["who"].get("issuer")) for c in calls}
    assert who == {("alice", "oauth", issuer.issuer), ("bob", "oauth", issuer.issuer), ("carol", "api_key", None)}
    assert '"acme"' not in (tmp_path / "audit.jsonl").read_text()  # claims are the policy's, not the trail's


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def _three_agents(served: Served, tokens: dict[str, str]) -> None:
    async with httpx2.AsyncClient(timeout=60) as client:
        alice, bob, carol = await asyncio.gather(
            Agent(client, served.url, _bearer(tokens["alice"])).open(),
            Agent(client, served.url, _bearer(tokens["bob"])).open(),
            Agent(client, served.url, {"x-api-key": tokens["carol"]}).open())
        seen = await asyncio.gather(alice.tools(), bob.tools(), carol.tools())
        # alice: write scope and tenant acme; bob: the write scope but tenant globex; carol: a key in ops
        assert seen == [["raw__big", "raw__echo"], ["raw__echo"], ["raw__echo", "raw__garbage"]]
        replies = await asyncio.gather(alice.call("raw__big", {"size": 2}), bob.call("raw__big", {"size": 2}),
                                       carol.call("raw__big", {"size": 2}), carol.call("raw__echo", {"text": "c"}))
        assert replies[0]["result"]["content"][0]["text"] == "xx"
        assert _refused(replies[1], -32001) and _refused(replies[2], -32001)
        assert replies[3]["result"]["content"][0]["text"] == "c"
        # alice's read-only token is the same caller to the session layer, but decided by its own scopes
        names, _ = await _modern_tools(client, served.url, _bearer(tokens["reader"]))
        assert names == ["raw__echo"]
        names, result = await _modern_tools(client, served.url, _bearer(tokens["alice"]))
        assert names == ["raw__big", "raw__echo"] and result["cacheScope"] == "private"
        call = await modern_request(client, served.url, _bearer(tokens["reader"]), "tools/call",
                                    {"name": "raw__big", "arguments": {"size": 1}}, name="raw__big")
        assert _refused(answer(call), -32001)
        # the same in alice's handshake-era session: a request with her read-only token is decided by its scopes
        alice.headers = _bearer(tokens["reader"])
        assert await alice.tools() == ["raw__echo"]
        assert _refused(await alice.call("raw__big", {"size": 1}), -32001)
        alice.headers = _bearer(tokens["alice"])
        assert (await alice.call("raw__big", {"size": 1}))["result"]["content"][0]["text"] == "x"


def _found(reply: dict) -> list[str]:
    return [tool["name"] for tool in json.loads(reply["result"]["content"][0]["text"])["tools"]]


async def test_in_search_mode_each_agent_finds_and_calls_only_its_own_tools(tmp_path: Path) -> None:
    served = start(_config(tmp_path, BY_NAME, http={"identity_header": "X-Agent"}, exposure="search"))
    try:
        async with httpx2.AsyncClient(timeout=120) as client:
            alice, bob = await asyncio.gather(Agent(client, served.url, {"x-agent": "alice"}).open(),
                                              Agent(client, served.url, {"x-agent": "bob"}).open())
            query = {"query": "return a text of the given size", "k": 10}
            found = await asyncio.gather(alice.call("search_tools", query), bob.call("search_tools", query))
            assert "raw__big" in _found(found[0])
            assert "raw__big" not in _found(found[1]) and set(_found(found[1])) <= {"raw__echo"}
            via_meta = await asyncio.gather(
                alice.call("call_tool", {"name": "raw__big", "arguments": {"size": 2}}),
                bob.call("call_tool", {"name": "raw__big", "arguments": {"size": 2}}))
            assert via_meta[0]["result"]["content"][0]["text"] == "xx"
            assert via_meta[1]["result"]["isError"] and "raw__big" in via_meta[1]["result"]["content"][0]["text"]
    finally:
        stop(served)


BY_CERTIFICATE = LISTS + '''
@id("everyone-echoes")
permit (principal, action == Bastion::Action::"call_tool", resource) when { resource.name == "echo" };

@id("ops-by-certificate-big")
permit (principal in Bastion::Group::"ops", action == Bastion::Action::"call_tool", resource)
when { resource.name == "big" && principal.authenticated_by == "mtls" };
'''


async def test_two_agents_with_client_certificates_over_https(tmp_path: Path) -> None:
    from tests.auth.test_mtls_end_to_end import Pki

    pki = Pki(tmp_path)
    mapping = {"email:alice@example.com": "alice", "cn:deploy-agent": {"name": "deployer", "groups": ["ops"]}}
    served = start(_config(tmp_path, BY_CERTIFICATE, auth={"client_certificates": mapping}, http=pki.http()))
    try:
        assert served.url.startswith("https://")
        alice_certificate = pki.client_ca.issue_cert("alice@example.com", common_name="alice-laptop")
        deployer_certificate = pki.client_ca.issue_cert(common_name="deploy-agent")
        async with pki.client(alice_certificate) as for_alice, pki.client(deployer_certificate) as for_deployer:
            alice, deployer = await asyncio.gather(Agent(for_alice, served.url, {}).open(),
                                                   Agent(for_deployer, served.url, {}).open())
            assert await asyncio.gather(alice.tools(), deployer.tools()) == [["raw__echo"], ["raw__big", "raw__echo"]]
            big = await asyncio.gather(alice.call("raw__big", {"size": 2}), deployer.call("raw__big", {"size": 2}))
            assert _refused(big[0], -32001) and big[1]["result"]["content"][0]["text"] == "xx"
    finally:
        stop(served)
    who = {(c["who"]["name"], c["who"]["authenticated_by"], tuple(c["who"]["groups"]))
           for c in _calls(tmp_path / "audit.jsonl")}
    assert who == {("alice", "mtls", ()), ("deployer", "mtls", ("ops",))}
