"""API keys through a real ``bastion serve --http``: the key's name is the Cedar principal (and its groups its
parents), unknown keys are refused, a key revoked or created with ``bastion keys`` while the gateway runs takes
effect on it, and no key ever reaches the gateway's log."""

from __future__ import annotations

import asyncio
import subprocess

import httpx2

from bastion.auth.api_keys import ApiKeyFile
from tests.auth.serving import (answer, modern_request, open_session, session_request, start, stop, tools_and_call,
                                write_config)
from tests.support import BASTION, RawClient


def make_key(file, name: str, *args: str) -> str:
    made = subprocess.run([BASTION, "keys", "create", name, "--file", str(file), *args], capture_output=True,
                          text=True, timeout=120, check=True)
    return made.stdout.strip()


async def refused_until_revoked(client: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> httpx2.Response:
    """The first answer to a new session that is not 200, asking again while the gateway has yet to see the change
    (it looks at the key file once a second)."""
    for _ in range(300):
        response = await open_session(client, url, headers)
        if response.status_code != 200:
            return response
        await asyncio.sleep(0.1)
    raise AssertionError("the revoked key was still accepted after 30 s")


async def test_api_keys_over_http(tmp_path) -> None:
    keys = tmp_path / "keys.json"
    alice = make_key(keys, "alice", "--scope", "mcp:tools")
    ops = make_key(keys, "deployer", "--groups", "ops")
    guest = make_key(keys, "guest")
    served = start(write_config(tmp_path, auth={"api_keys": "keys.json"}))
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            # alice by name, the deployer by its group: both may call; the guest sees no tool it may not call
            for headers in ({"authorization": f"Bearer {alice}"}, {"x-api-key": ops}):
                names, called = await tools_and_call(client, served.url, headers)
                assert "raw__echo" in names and called["result"]["content"][0]["text"] == "hello"
            names, called = await tools_and_call(client, served.url, {"x-api-key": guest})
            assert names == [] and "error" in called

            # a 2026-07-28 client: every request is authenticated on its own
            listed = await modern_request(client, served.url, {"x-api-key": alice}, "tools/list", {})
            assert "raw__echo" in {t["name"] for t in listed.json()["result"]["tools"]}
            listed = await modern_request(client, served.url, {"x-api-key": guest}, "tools/list", {})
            assert listed.json()["result"]["tools"] == []
            called = await modern_request(client, served.url, {"authorization": f"Bearer {ops}"}, "tools/call",
                                          {"name": "raw__echo", "arguments": {"text": "modern"}}, "raw__echo")
            assert answer(called)["result"]["content"][0]["text"] == "modern"
            assert (await modern_request(client, served.url, {}, "tools/list", {})).status_code == 401

            # the HTTP+SSE transport asks for the same credentials
            sse = served.url[: -len("/mcp")] + "/sse"
            async with client.stream("GET", sse, headers={"x-api-key": alice}) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                assert "event: endpoint" in [await anext(lines) for _ in range(3)]
            assert (await client.get(sse, headers={"x-api-key": "bst_" + "B" * 43})).status_code == 401

            nothing = await open_session(client, served.url, {})
            assert nothing.status_code == 401 and "API key" in nothing.json()["error"]["message"]
            assert nothing.headers["www-authenticate"] == 'Bearer realm="bastion"'  # RFC 9110: a 401 challenges
            unknown = await open_session(client, served.url, {"x-api-key": "bst_" + "A" * 43})
            assert unknown.status_code == 401

            # a session is its caller's: another key cannot use it
            opened = await open_session(client, served.url, {"x-api-key": alice})
            hijack = await session_request(client, served.url, {"x-api-key": guest},
                                           opened.headers["mcp-session-id"], "tools/list", {})
            assert hijack.status_code == 403

            # revoked while the gateway runs: new sessions and the requests of one already open are refused
            guests = (await open_session(client, served.url, {"x-api-key": guest})).headers["mcp-session-id"]
            subprocess.run([BASTION, "keys", "revoke", "guest", "--file", str(keys)], check=True, capture_output=True)
            assert (await refused_until_revoked(client, served.url, {"x-api-key": guest})).status_code == 401
            late_request = await session_request(client, served.url, {"x-api-key": guest}, guests, "tools/list", {})
            assert late_request.status_code == 401
            assert (await open_session(client, served.url, {"x-api-key": alice})).status_code == 200
            # and created while it runs
            late = make_key(keys, "late", "--groups", "ops")
            for _ in range(300):
                if (await open_session(client, served.url, {"x-api-key": late})).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("a key created while the gateway runs was never accepted")
    finally:
        stop(served)
    log = served.log()
    audit = (tmp_path / "audit.jsonl").read_text()
    assert '"deployer"' in audit and '"guest"' in audit  # decisions are recorded under the key's name
    for key in (alice, ops, guest, late):
        assert key not in log and key[4:] not in log and key[4:] not in audit
    assert ApiKeyFile(keys).load()[0].keys() == {"alice", "deployer", "late"}


def test_stdio_keeps_the_configured_identity(tmp_path) -> None:
    # the auth table is for HTTP: a stdio client presents nothing and is policy.identity, here alice
    keys = tmp_path / "keys.json"
    make_key(keys, "someone")
    config = write_config(tmp_path, auth={"api_keys": "keys.json"}, identity={"name": "alice"})
    client = RawClient(config)
    try:
        client.initialize()
        names = {t["name"] for t in client.request(1, "tools/list", {})["result"]["tools"]}
        assert "raw__echo" in names
        called = client.request(2, "tools/call", {"name": "raw__echo", "arguments": {"text": "hello"}})
        assert called["result"]["content"][0]["text"] == "hello"
    finally:
        client.close()
    # the same configuration with another configured identity: the policy gives it nothing
    config = write_config(tmp_path, auth={"api_keys": "keys.json"}, identity={"name": "mallory"})
    client = RawClient(config)
    try:
        client.initialize()
        assert client.request(1, "tools/list", {})["result"]["tools"] == []
    finally:
        client.close()


async def test_a_keys_scopes_meet_the_scopes_requests_need(tmp_path) -> None:
    keys = tmp_path / "keys.json"
    full = make_key(keys, "alice", "--scope", "mcp:use mcp:tools")
    reader = make_key(keys, "reader", "--scope", "mcp:use", "--groups", "ops")
    none = make_key(keys, "nothing", "--groups", "ops")
    served = start(write_config(tmp_path, auth={"api_keys": "keys.json", "scopes": ["mcp:use"],
                                                "method_scopes": {"tools/call": ["mcp:tools"]}}))
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            names, called = await tools_and_call(client, served.url, {"x-api-key": full})
            assert called["result"]["content"][0]["text"] == "hello"
            opened = await open_session(client, served.url, {"x-api-key": reader})
            assert opened.status_code == 200
            call = await session_request(client, served.url, {"x-api-key": reader}, opened.headers["mcp-session-id"],
                                         "tools/call", {"name": "raw__echo", "arguments": {"text": "x"}})
            assert call.status_code == 403 and 'error="insufficient_scope"' in call.headers["www-authenticate"]
            assert "mcp:tools" in call.json()["error"]["message"]
            refused = await open_session(client, served.url, {"x-api-key": none})
            assert refused.status_code == 403 and "mcp:use" in refused.json()["error"]["message"]
    finally:
        stop(served)
